//! The `[X-Fleet]` section: where a unit may run, and the rules on combining options.

mod terms;

use std::collections::BTreeMap;

use crate::glob::glob_matches;
use crate::resources::{ResourceError, Resources, parse_bytes, parse_cores, parse_cpu_quota};
use crate::unit_file::{UnitFile, UnitOption, last_value};
use crate::unit_name::UnitNameInfo;

pub const SECTION: &str = crate::unit_file::X_FLEET;

/// Every key the original recognises in `[X-Fleet]`, legacy names included.
pub const KNOWN_KEYS: &[&str] = &[
    "MachineID",
    "X-ConditionMachineID",
    "X-ConditionMachineBootID",
    "MachineOf",
    "X-ConditionMachineOf",
    "Conflicts",
    "X-Conflicts",
    "MachineMetadata",
    "X-ConditionMachineMetadata",
    "Global",
    "Replaces",
];

/// The keys fleet adds to `[X-Fleet]` for placement. `AtMostOnce=true`: the unit never runs on
/// two machines at once, under any fault (docs/guarantees.md). `Memory=` and `CPU=`: what the
/// unit reserves on its machine (crate::resources). `SpreadBy=zone`: the instances of its
/// template spread evenly over the values of that metadata key; `SpreadGroup=web-*`: instead,
/// the units that name the same pattern (and match it) spread together. The health check's
/// keys are fleet's too ([`crate::health::check::KEYS`]); [`is_added_key`] knows both.
pub const ADDED_KEYS: &[&str] = &[
    AT_MOST_ONCE,
    "Memory",
    "CPU",
    "SpreadBy",
    "SpreadGroup",
    TOLERATE,
    PRIORITY,
    crate::lost_after::KEY,
    crate::disruption_budget::KEY,
    crate::disruption_budget::BY_KEY,
    crate::dependency::REQUIRES_KEY,
    crate::dependency::AFTER_KEY,
    crate::dependency::GRACE_KEY,
    crate::required_places::CHANGE_KEY,
];

/// `Priority=` (0 to 1000, [`DEFAULT_PRIORITY`] when absent): units of a higher priority are
/// placed first, and with preemption on (the engine leader's `preemption = on`) one that fits
/// nowhere may take the room of units of a lower one ([`crate::schedule`]).
pub const PRIORITY: &str = "Priority";

/// `AtMostOnce=true`: the unit never runs on two machines at once, at the cost of stopping it
/// whenever its machine may be out of touch.
pub const AT_MOST_ONCE: &str = "AtMostOnce";

/// A unit's priority when it sets none.
pub const DEFAULT_PRIORITY: u16 = 50;

/// The highest priority a unit may set.
pub const MAX_PRIORITY: u16 = 1000;

/// `Tolerate=gpu=yes` (or `Tolerate=gpu`, any value; several lines or items separated by
/// spaces): the machines' taints the unit may run beside ([`crate::taint`]).
pub const TOLERATE: &str = "Tolerate";

/// Every key fleet adds to `[X-Fleet]`: placement, the health check, runs (calendar and
/// batch) and secrets.
pub fn added_keys() -> impl Iterator<Item = &'static str> {
    ADDED_KEYS
        .iter()
        .chain(crate::health::check::KEYS)
        .chain(crate::job::KEYS)
        .chain(std::iter::once(&crate::secrets::KEY))
        .copied()
}

/// Whether `key` is one fleet adds to `[X-Fleet]` ([`added_keys`]).
pub fn is_added_key(key: &str) -> bool {
    added_keys().any(|added| added == key)
}

/// A unit's placement rules, with the unit's own specifiers already substituted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirements {
    /// `MachineID=`: full or 8-character short ID.
    pub machine_id: Option<String>,
    /// `MachineOf=`: units this one must share a machine with.
    pub machine_of: Vec<String>,
    /// `MachineMetadata=`: for each key, the values any one of which a machine must have.
    pub metadata: BTreeMap<String, Vec<String>>,
    /// `Conflicts=`: patterns of units this one may not share a machine with.
    pub conflicts: Vec<String>,
    /// `Global=`: runs on every machine whose metadata matches.
    pub global: bool,
    /// `Replaces=`: patterns of units this one pushes off its machine.
    pub replaces: Vec<String>,
    /// `AtMostOnce=`: its machine stops it as soon as its presence may have lapsed, and the
    /// engine starts it elsewhere only once that has certainly happened.
    pub at_most_once: bool,
    /// `SpreadBy=`: a metadata key whose values the instances of this unit's template spread
    /// over evenly (a machine without the key counts as one more value).
    pub spread_by: Option<String>,
    /// `SpreadGroup=`: a name pattern; the units that give the same one spread as one group
    /// (else a template's instances do). `Err` holds a pattern the unit's own name does not
    /// match, refused at submission.
    pub spread_group: Option<Result<String, String>>,
    /// What the unit reserves on its machine (`Memory=`, `CPU=`, else its systemd limits);
    /// nothing when a value cannot be read (such a unit is refused at submission).
    pub reservation: Resources,
    /// Keys of `[X-Fleet]` the original does not know (fleet's own among them).
    pub unknown_keys: Vec<String>,
    /// `MachineMetadata=` values that are not one `key=value` (`role`, `a=b=c`, `=x`): the
    /// original ignores them, and so does the planner; read for warnings, since the unit is
    /// not held to what its author meant.
    pub ignored_metadata: Vec<String>,
    /// What a unit that runs to completion or on a calendar asks for (`Schedule=` and its
    /// companions); `None` for a service, and for one whose job options cannot be read (such a
    /// unit is refused at submission).
    pub job: Option<crate::job::Job>,
    /// Machines the unit goes to only when no other machine takes it: the engine sets them for
    /// the retry of a run that failed there. Never read from a unit file.
    pub avoid: Vec<String>,
    /// `Tolerate=`: the taints it may run beside (those that cannot be read are left out; such
    /// a unit is refused at submission).
    pub tolerate: Vec<crate::taint::Toleration>,
    /// `Priority=`: [`DEFAULT_PRIORITY`] when absent or unreadable (such a unit is refused at
    /// submission).
    pub priority: u16,
    /// `LostAfter=`: how long its machine may be out of touch before it moves
    /// ([`crate::lost_after`]; the default when unreadable, and such a unit is refused at
    /// submission).
    pub lost_after: crate::lost_after::LostAfter,
    /// `DisruptionBudget=` and `DisruptionBudgetBy=`: how many of its group may be down at
    /// once by a voluntary disruption ([`crate::disruption_budget`]; none when unreadable, and
    /// such a unit is refused at submission).
    pub disruption_budget: Option<crate::disruption_budget::DisruptionBudget>,
    /// `Requires=`, `After=` and `RequiresGrace=`: the units it waits for, on any machine
    /// ([`crate::dependency`]; none when unreadable, and such a unit is refused at submission).
    pub dependencies: crate::dependency::Dependencies,
}

impl Default for Requirements {
    fn default() -> Self {
        Self {
            machine_id: None,
            machine_of: Vec::new(),
            metadata: BTreeMap::new(),
            conflicts: Vec::new(),
            global: false,
            replaces: Vec::new(),
            at_most_once: false,
            spread_by: None,
            spread_group: None,
            reservation: Resources::default(),
            unknown_keys: Vec::new(),
            ignored_metadata: Vec::new(),
            job: None,
            avoid: Vec::new(),
            tolerate: Vec::new(),
            priority: DEFAULT_PRIORITY,
            lost_after: crate::lost_after::LostAfter::AgentTtl,
            disruption_budget: None,
            dependencies: crate::dependency::Dependencies::default(),
        }
    }
}

/// Splits `"a=1" "b=2"` into its quoted parts, as the original does for `[X-Fleet]` values
/// that start and end with a double quote.
fn split_quoted(value: &str) -> Vec<String> {
    if !(value.len() >= 2 && value.starts_with('"') && value.ends_with('"')) {
        return vec![value.to_string()];
    }
    let mut values = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in value.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => values.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    values.push(current);
    values
}

pub use crate::unit_name::expand_specifiers;

/// The original's reading of `Global=` (its `[X-Fleet]` boolean grammar): true for `true`,
/// `yes`, `1`, `on` or `t` in any case, false for anything else (never an error).
fn x_fleet_bool(value: &str) -> bool {
    matches!(value.to_ascii_lowercase().as_str(), "true" | "yes" | "1" | "on" | "t")
}

/// `AtMostOnce=`, fleet's own: a value that is neither true nor false is refused at submission
/// (the original's booleans, such as `Global=`, read anything else as false, and still do).
pub fn check_at_most_once(options: &[UnitOption]) -> Result<(), String> {
    let Some(value) = last_value(options, SECTION, AT_MOST_ONCE) else {
        return Ok(());
    };
    let word = value.trim().to_ascii_lowercase();
    match x_fleet_bool(&word) || matches!(word.as_str(), "" | "false" | "no" | "0" | "off" | "f") {
        true => Ok(()),
        false => Err(format!("invalid value {value:?} for [X-Fleet] {AT_MOST_ONCE}: expected a boolean (yes or no)")),
    }
}

/// Whether `unit` asks to run at most once (`[X-Fleet] AtMostOnce=`), read without the rest
/// of its requirements: the agent asks it of every unit it holds.
pub fn asks_at_most_once(unit: &UnitFile) -> bool {
    unit.options()
        .iter()
        .rev()
        .find(|option| option.section == SECTION && option.name == AT_MOST_ONCE)
        .is_some_and(|option| x_fleet_bool(&option.value))
}

impl Requirements {
    /// Whether `self` and `other` place a unit alike: every rule the planner reads is the
    /// same (the keys the original does not know, read for warnings, may differ).
    pub fn places_alike(&self, other: &Self) -> bool {
        let Self {
            machine_id,
            machine_of,
            metadata,
            conflicts,
            global,
            replaces,
            at_most_once,
            spread_by,
            spread_group,
            reservation,
            unknown_keys: _,
            ignored_metadata: _,
            job,
            avoid,
            tolerate,
            priority,
            lost_after,
            disruption_budget,
            dependencies,
        } = self;
        *machine_id == other.machine_id
            && *machine_of == other.machine_of
            && *metadata == other.metadata
            && *conflicts == other.conflicts
            && *global == other.global
            && *replaces == other.replaces
            && *at_most_once == other.at_most_once
            && *spread_by == other.spread_by
            && *spread_group == other.spread_group
            && *reservation == other.reservation
            && *job == other.job
            && *avoid == other.avoid
            && *tolerate == other.tolerate
            && *priority == other.priority
            && *lost_after == other.lost_after
            && *disruption_budget == other.disruption_budget
            && *dependencies == other.dependencies
    }

    /// Reads the `[X-Fleet]` options of the unit named `unit_name`.
    pub fn from_unit(unit_name: &str, unit: &UnitFile) -> Self {
        Self::from_options(unit_name, unit.options())
    }

    pub fn from_options(unit_name: &str, options: &[UnitOption]) -> Self {
        let name = UnitNameInfo::new(unit_name);
        let mut values: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut requirements = Self::default();
        for option in options.iter().filter(|option| option.section == SECTION) {
            let added = is_added_key(&option.name);
            if !KNOWN_KEYS.contains(&option.name.as_str()) {
                if !requirements.unknown_keys.contains(&option.name) {
                    requirements.unknown_keys.push(option.name.clone());
                }
                if !added {
                    continue;
                }
            }
            let expanded = split_quoted(&option.value).into_iter().map(|value| expand_specifiers(&value, &name));
            values.entry(option.name.as_str()).or_default().extend(expanded);
        }
        let all = |keys: &[&str]| -> Vec<String> {
            keys.iter().flat_map(|key| values.get(key).into_iter().flatten().cloned()).collect()
        };
        requirements.machine_id = ["MachineID", "X-ConditionMachineID", "X-ConditionMachineBootID"]
            .iter()
            .find_map(|key| values.get(key).and_then(|list| list.first()).cloned());
        requirements.machine_of = all(&["MachineOf", "X-ConditionMachineOf"]);
        for item in all(&["MachineMetadata", "X-ConditionMachineMetadata"]) {
            let parts: Vec<&str> = item.split('=').collect();
            if let [key, value] = parts[..]
                && !key.is_empty()
                && !value.is_empty()
            {
                let allowed = requirements.metadata.entry(key.to_string()).or_default();
                if !allowed.iter().any(|known| known == value) {
                    allowed.push(value.to_string());
                }
            } else if !requirements.ignored_metadata.contains(&item) {
                requirements.ignored_metadata.push(item);
            }
        }
        requirements.conflicts = all(&["Conflicts", "X-Conflicts"])
            .iter()
            .flat_map(|value| value.split_whitespace().map(str::to_string))
            .collect();
        requirements.global =
            values.get("Global").and_then(|list| list.last()).is_some_and(|value| x_fleet_bool(value));
        requirements.replaces = all(&["Replaces"]);
        requirements.at_most_once =
            values.get(AT_MOST_ONCE).and_then(|list| list.last()).is_some_and(|value| x_fleet_bool(value));
        requirements.spread_by = values
            .get("SpreadBy")
            .and_then(|list| list.last())
            .map(|key| key.trim().to_string())
            .filter(|key| !key.is_empty());
        requirements.spread_group = values
            .get("SpreadGroup")
            .and_then(|list| list.last())
            .map(|pattern| pattern.trim().to_string())
            .filter(|pattern| !pattern.is_empty())
            .map(|pattern| if glob_matches(&pattern, unit_name) { Ok(pattern) } else { Err(pattern) });
        requirements.reservation = reservation_of(options).unwrap_or_default();
        requirements.job = crate::job::job_of(unit_name, options).ok().flatten();
        requirements.tolerate = tolerations_of(&all(&[TOLERATE])).unwrap_or_default();
        requirements.priority = priority_of(options).unwrap_or(DEFAULT_PRIORITY);
        requirements.lost_after = crate::lost_after::lost_after_of(options).unwrap_or_default();
        requirements.disruption_budget = crate::disruption_budget::budget_of(unit_name, options).ok().flatten();
        requirements.dependencies = crate::dependency::dependencies_of(unit_name, options).unwrap_or_default();
        requirements
    }

    /// The group a unit that spreads spreads with: its `SpreadGroup=` pattern, else its
    /// template, else itself.
    pub fn spread_group_of(&self, name: &str) -> String {
        match &self.spread_group {
            Some(Ok(pattern)) => pattern.clone(),
            _ => UnitNameInfo::new(name).template().unwrap_or_else(|| name.to_string()),
        }
    }

    /// Whether a global unit with these rules runs on `machine` by its metadata and taints: it
    /// has every `MachineMetadata=` asked for, and the unit tolerates each of its taints.
    pub fn admitted_by(&self, machine: &crate::MachineState) -> bool {
        self.metadata_matches(&machine.metadata)
            && crate::taint::first_untolerated(&machine.taints, &self.tolerate, false).is_none()
    }

    /// Whether a machine with `metadata` satisfies every `MachineMetadata=` key.
    pub fn metadata_matches(&self, metadata: &BTreeMap<String, String>) -> bool {
        self.metadata.iter().all(|(key, allowed)| metadata.get(key).is_some_and(|value| allowed.contains(value)))
    }

    /// Whether this unit and `other` may not share a machine: a `Conflicts=` or `Replaces=`
    /// pattern of either one matches the other's name. A unit never excludes itself.
    pub fn excludes(&self, own_name: &str, other_name: &str, other: &Requirements) -> bool {
        let any_match = |patterns: &[String], name: &str| patterns.iter().any(|pattern| glob_matches(pattern, name));
        own_name != other_name
            && (any_match(&self.conflicts, other_name)
                || any_match(&other.conflicts, own_name)
                || any_match(&self.replaces, other_name)
                || any_match(&other.replaces, own_name))
    }

    /// The original's combination rules, checked when a unit is created.
    pub fn validate(&self) -> Result<(), CombinationError> {
        for peer in &self.machine_of {
            if let Some(conflict) = self.conflicts.iter().find(|pattern| glob_matches(pattern, peer)) {
                return Err(CombinationError::PeerMatchesConflict(peer.clone(), conflict.clone()));
            }
            if let Some(replace) = self.replaces.iter().find(|pattern| glob_matches(pattern, peer)) {
                return Err(CombinationError::PeerMatchesReplace(peer.clone(), replace.clone()));
            }
        }
        let (peers, conflicts, replaces) =
            (!self.machine_of.is_empty(), !self.conflicts.is_empty(), !self.replaces.is_empty());
        let pinned = self.machine_id.is_some();
        let error = match () {
            _ if pinned && peers => CombinationError::MachineIdWith("Peers"),
            _ if pinned && conflicts => CombinationError::MachineIdWith("Conflicts"),
            _ if pinned && self.global => CombinationError::MachineIdWith("Global"),
            _ if pinned && replaces => CombinationError::MachineIdWith("Replaces"),
            _ if self.global && peers => CombinationError::GlobalWith("Peers"),
            _ if self.global && replaces => CombinationError::GlobalWith("Replaces"),
            _ if self.global && self.at_most_once => CombinationError::GlobalWith(AT_MOST_ONCE),
            _ if self.global && self.spread_by.is_some() => CombinationError::GlobalWith("SpreadBy"),
            _ if self.global && self.lost_after != crate::lost_after::LostAfter::AgentTtl => {
                CombinationError::GlobalWith(crate::lost_after::KEY)
            }
            _ if self.global && self.disruption_budget.is_some() => {
                CombinationError::GlobalWith(crate::disruption_budget::KEY)
            }
            _ if self.spread_by.as_deref().is_some_and(|key| !crate::metadata_key::valid_metadata_key(key)) => {
                CombinationError::SpreadKey(self.spread_by.clone().unwrap_or_default())
            }
            _ if self.spread_group.is_some() && self.spread_by.is_none() => CombinationError::SpreadGroupAlone,
            _ if matches!(&self.spread_group, Some(Err(_))) => {
                let pattern = self.spread_group.clone().and_then(Result::err).unwrap_or_default();
                CombinationError::SpreadGroupMisses(pattern)
            }
            _ if conflicts && replaces => CombinationError::ConflictsWithReplaces,
            _ => return Ok(()),
        };
        Err(error)
    }
}

/// The tolerations of `Tolerate=` values (each holding items separated by spaces), sorted
/// and without repeats; the first item that cannot be read refuses them all.
pub fn tolerations_of(values: &[String]) -> Result<Vec<crate::taint::Toleration>, crate::taint::TaintError> {
    let mut tolerations = values
        .iter()
        .flat_map(|value| value.split_whitespace())
        .map(crate::taint::parse_toleration)
        .collect::<Result<Vec<_>, _>>()?;
    tolerations.sort_unstable();
    tolerations.dedup();
    Ok(tolerations)
}

/// Whether the unit's `Tolerate=` lines can all be read, as admission asks.
pub fn check_tolerations(options: &[UnitOption]) -> Result<(), String> {
    let values: Vec<String> = options
        .iter()
        .filter(|option| option.section == SECTION && option.name == TOLERATE)
        .map(|option| option.value.clone())
        .collect();
    tolerations_of(&values).map(drop).map_err(|error| format!("invalid value for [X-Fleet] {TOLERATE}: {error}"))
}

/// The unit's `Priority=` (the last one), [`DEFAULT_PRIORITY`] without one; an error naming
/// the option and the value for anything but a whole number from 0 to [`MAX_PRIORITY`].
pub fn priority_of(options: &[UnitOption]) -> Result<u16, String> {
    let Some(value) = last_value(options, SECTION, PRIORITY) else {
        return Ok(DEFAULT_PRIORITY);
    };
    let trimmed = value.trim();
    trimmed
        .parse::<u16>()
        .ok()
        .filter(|priority| *priority <= MAX_PRIORITY && trimmed.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            format!(
                "invalid value {value:?} for [X-Fleet] {PRIORITY}: expected a whole number from 0 to {MAX_PRIORITY}"
            )
        })
}

/// An `[X-Fleet]` reservation whose value cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for [X-Fleet] {option}: {error}")]
pub struct ReservationError {
    pub option: &'static str,
    pub value: String,
    pub error: ResourceError,
}

/// What a unit with these options reserves: `[X-Fleet] Memory=` and `CPU=` (the last of
/// each), and where either is missing the unit's own systemd limit in its place (`MemoryMax=`,
/// else `MemoryHigh=`; `CPUQuota=`), so that a limit and a reservation never disagree. A limit
/// that is `infinity`, a percentage of the machine or unreadable reserves nothing.
pub fn reservation_of(options: &[UnitOption]) -> Result<Resources, ReservationError> {
    let last = |section: &str, name: &str| last_value(options, section, name);
    let memory = match last(SECTION, "Memory") {
        Some(value) => parse_bytes(value)
            .map_err(|error| ReservationError { option: "Memory", value: value.to_string(), error })?
            .unwrap_or(0),
        None => ["MemoryMax", "MemoryHigh"]
            .iter()
            .find_map(|name| last("Service", name).and_then(|value| parse_bytes(value).ok().flatten()))
            .unwrap_or(0),
    };
    let cpu_millis = match last(SECTION, "CPU") {
        Some(value) => {
            parse_cores(value).map_err(|error| ReservationError { option: "CPU", value: value.to_string(), error })?
        }
        None => last("Service", "CPUQuota").and_then(|value| parse_cpu_quota(value).ok()).unwrap_or(0),
    };
    Ok(Resources { memory, cpu_millis })
}

/// What fleet adds to a unit as limits: its reservation (`[X-Fleet] Memory=`, `CPU=`), in each
/// resource where the unit sets no limit of its own (`MemoryMax=` or `MemoryHigh=` for memory,
/// `CPUQuota=` for CPU: the unit's own always wins). Zero: nothing to add in that resource.
pub fn reservation_limits(options: &[UnitOption]) -> Resources {
    let last = |section: &str, name: &str| last_value(options, section, name);
    let own_memory = last("Service", "MemoryMax").is_some() || last("Service", "MemoryHigh").is_some();
    let memory = match (own_memory, last(SECTION, "Memory")) {
        (false, Some(value)) => parse_bytes(value).ok().flatten().unwrap_or(0),
        _ => 0,
    };
    let cpu_millis = match (last("Service", "CPUQuota"), last(SECTION, "CPU")) {
        (None, Some(value)) => parse_cores(value).unwrap_or(0),
        _ => 0,
    };
    Resources { memory, cpu_millis }
}

/// The hard limits a unit runs under where fleet enforces them itself (the native
/// supervisor): its own `MemoryMax=` and `CPUQuota=` where it sets them, else
/// [`reservation_limits`].
pub fn limits_of(options: &[UnitOption]) -> Resources {
    let last =
        |name: &str| options.iter().rev().find(|o| o.section == "Service" && o.name == name).map(|o| o.value.as_str());
    let added = reservation_limits(options);
    Resources {
        memory: last("MemoryMax").map_or(added.memory, |own| parse_bytes(own).ok().flatten().unwrap_or(0)),
        cpu_millis: last("CPUQuota").map_or(added.cpu_millis, |own| parse_cpu_quota(own).unwrap_or(0)),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CombinationError {
    #[error("MachineID cannot be used with {0}")]
    MachineIdWith(&'static str),
    #[error("Global cannot be used with {0}")]
    GlobalWith(&'static str),
    #[error("Conflicts cannot be used with Replaces")]
    ConflictsWithReplaces,
    #[error("SpreadBy needs a metadata key of letters, digits, '_', '.' and '-', not {0:?}")]
    SpreadKey(String),
    #[error("SpreadGroup needs SpreadBy")]
    SpreadGroupAlone,
    #[error("SpreadGroup {0:?} does not match the unit's own name")]
    SpreadGroupMisses(String),
    #[error("unresolvable requirements: peer {0:?} matches conflict {1:?}")]
    PeerMatchesConflict(String, String),
    #[error("unresolvable requirements: peer {0:?} matches replace {1:?}")]
    PeerMatchesReplace(String, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_units_own_limit_wins_and_its_reservation_limits_what_it_leaves_open() {
        let limits = |text: &str| limits_of(UnitFile::parse(text).unwrap().options());
        let mib = 1 << 20;
        assert_eq!(limits("[X-Fleet]\nMemory=64M\nCPU=0.5\n"), Resources { memory: 64 * mib, cpu_millis: 500 });
        assert_eq!(
            limits("[Service]\nMemoryMax=128M\nCPUQuota=25%\n[X-Fleet]\nMemory=64M\nCPU=2\n"),
            Resources { memory: 128 * mib, cpu_millis: 250 },
            "the unit's own limits win"
        );
        assert_eq!(
            limits("[Service]\nMemoryHigh=1G\n[X-Fleet]\nMemory=64M\n"),
            Resources::ZERO,
            "a throttle of its own"
        );
        assert_eq!(limits("[Service]\nMemoryMax=infinity\n[X-Fleet]\nMemory=64M\n").memory, 0);
        assert_eq!(limits("[Service]\nExecStart=/bin/true\n"), Resources::ZERO);
        let added = |text: &str| reservation_limits(UnitFile::parse(text).unwrap().options());
        assert_eq!(
            added("[Service]\nMemoryMax=128M\n[X-Fleet]\nMemory=64M\nCPU=0.5\n"),
            Resources { memory: 0, cpu_millis: 500 }
        );
        assert_eq!(
            added("[Service]\nCPUQuota=20%\n[X-Fleet]\nMemory=64M\nCPU=0.5\n"),
            Resources { memory: 64 * mib, cpu_millis: 0 }
        );
    }

    fn requirements(name: &str, x_fleet: &str) -> Requirements {
        let unit = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).unwrap();
        Requirements::from_unit(name, &unit)
    }

    #[test]
    fn at_most_once_is_read_as_global_is_and_cannot_be_global() {
        assert!(requirements("a.service", "AtMostOnce=true\n").at_most_once);
        assert!(requirements("a.service", "AtMostOnce=yes\n").at_most_once);
        assert!(!requirements("a.service", "AtMostOnce=false\n").at_most_once);
        assert!(!requirements("a.service", "MachineOf=b.service\n").at_most_once);
        for (x_fleet, asks) in [("AtMostOnce=true\n", true), ("AtMostOnce=true\nAtMostOnce=no\n", false), ("", false)] {
            let unit = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).unwrap();
            assert_eq!(asks_at_most_once(&unit), asks, "{x_fleet:?}");
            assert_eq!(Requirements::from_unit("a.service", &unit).at_most_once, asks, "read alike: {x_fleet:?}");
        }
        let both = requirements("a.service", "AtMostOnce=true\nGlobal=true\n");
        assert_eq!(both.validate(), Err(CombinationError::GlobalWith("AtMostOnce")));
        assert_eq!(both.unknown_keys, ["AtMostOnce"], "the original does not know it");
    }

    fn reserved(text: &str) -> Result<Resources, ReservationError> {
        let unit = UnitFile::parse(text).expect("a unit file");
        reservation_of(unit.options())
    }

    #[test]
    fn a_unit_reserves_what_it_says_else_its_own_limits() {
        let both = reserved("[Service]\nMemoryMax=2G\nCPUQuota=50%\n[X-Fleet]\nMemory=1G\nCPU=1.5\n");
        assert_eq!(both, Ok(Resources { memory: 1 << 30, cpu_millis: 1500 }), "the reservation wins");
        let limits = reserved("[Service]\nMemoryHigh=256M\nMemoryMax=512M\nCPUQuota=150%\n");
        assert_eq!(limits, Ok(Resources { memory: 512 << 20, cpu_millis: 1500 }), "MemoryMax before MemoryHigh");
        let high = reserved("[Service]\nMemoryHigh=256M\n");
        assert_eq!(high, Ok(Resources { memory: 256 << 20, cpu_millis: 0 }));
        let relative = reserved("[Service]\nMemoryMax=50%\nMemoryHigh=infinity\n");
        assert_eq!(relative, Ok(Resources::ZERO), "a share of the machine reserves nothing");
        assert_eq!(reserved("[Service]\nExecStart=/bin/true\n"), Ok(Resources::ZERO));
        let bad = reserved("[X-Fleet]\nMemory=lots\n").expect_err("refused");
        assert_eq!(
            bad.to_string(),
            "invalid value \"lots\" for [X-Fleet] Memory: expected a size in bytes with an optional K, M, G or T suffix, such as 512M"
        );
        let bad = reserved("[X-Fleet]\nCPU=-2\n").expect_err("refused");
        assert_eq!(bad.option, "CPU");
    }

    #[test]
    fn quoted_values_split() {
        let r = requirements("a.service", "MachineMetadata=\"region=us-east-1\" \"diskType=SSD\"\n");
        assert_eq!(r.metadata["region"], vec!["us-east-1"]);
        assert_eq!(r.metadata["diskType"], vec!["SSD"]);
    }

    #[test]
    fn metadata_or_within_a_key_and_across_keys() {
        let r = requirements(
            "a.service",
            "MachineMetadata=region=us\nMachineMetadata=region=eu\nX-ConditionMachineMetadata=disk=ssd\nMachineMetadata=bad=a=b\n",
        );
        assert_eq!(r.metadata.len(), 2);
        let machine = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(r.metadata_matches(&machine(&[("region", "eu"), ("disk", "ssd")])));
        assert!(!r.metadata_matches(&machine(&[("region", "eu")])));
        assert!(!r.metadata_matches(&machine(&[("region", "asia"), ("disk", "ssd")])));
        assert_eq!(r.ignored_metadata, ["bad=a=b"], "ignored, as the original does, and kept for a warning");
    }

    #[test]
    fn metadata_values_that_are_not_one_key_and_value_are_ignored_and_named() {
        let r = requirements(
            "a.service",
            "MachineMetadata=role\nMachineMetadata=\"=x\" \"y=\" \"zone=b\"\nMachineMetadata=role\n",
        );
        assert_eq!(r.ignored_metadata, ["role", "=x", "y="], "each once, in file order");
        assert_eq!(r.metadata.keys().collect::<Vec<_>>(), ["zone"]);
        let other = requirements("a.service", "MachineMetadata=zone=b\n");
        assert!(r.places_alike(&other), "what is ignored does not place the unit");
    }

    #[test]
    fn specifiers_come_from_the_instance() {
        let r = requirements("pin@3d1219c7.service", "MachineID=%i\nMachineMetadata=hostname=%p-%N\nConflicts=%n\n");
        assert_eq!(r.machine_id.as_deref(), Some("3d1219c7"));
        assert_eq!(r.metadata["hostname"], vec!["pin-pin@3d1219c7"]);
        assert_eq!(r.conflicts, vec!["pin@3d1219c7.service"]);
    }

    #[test]
    fn conflicts_split_on_whitespace_and_accumulate() {
        let r = requirements("a.service", "Conflicts=b.service c.service\nX-Conflicts=d*\nReplaces=e f\n");
        assert_eq!(r.conflicts, vec!["b.service", "c.service", "d*"]);
        assert_eq!(r.replaces, vec!["e f"]);
        let none = Requirements::default();
        assert!(r.excludes("a.service", "d1.service", &none));
        assert!(r.excludes("a.service", "e f", &none));
        assert!(!r.excludes("a.service", "x.service", &none));
        assert!(!r.excludes("d1.service", "d1.service", &none));
        let conflicting = requirements("x.service", "Conflicts=a.*\n");
        assert!(none.excludes("a.service", "x.service", &conflicting));
        let replacing = requirements("x.service", "Replaces=a.service\n");
        assert!(none.excludes("a.service", "x.service", &replacing));
    }

    #[test]
    fn global_and_machine_id_precedence() {
        let r = requirements("a.service", "Global=true\nGlobal=no\nX-ConditionMachineID=b\nMachineID=a\n");
        assert!(!r.global);
        assert_eq!(r.machine_id.as_deref(), Some("a"));
        assert!(requirements("a.service", "Global=ON\n").global);
        let r = requirements("a.service", "X-ConditionMachineBootID=boot\nBogus=1\n");
        assert_eq!(r.machine_id.as_deref(), Some("boot"));
        assert_eq!(r.unknown_keys, vec!["Bogus"]);
    }

    #[test]
    fn combination_rules() {
        let cases = [
            ("MachineID=a\nMachineOf=b.service\n", "MachineID cannot be used with Peers"),
            ("MachineID=a\nConflicts=b\n", "MachineID cannot be used with Conflicts"),
            ("MachineID=a\nGlobal=true\n", "MachineID cannot be used with Global"),
            ("MachineID=a\nReplaces=b\n", "MachineID cannot be used with Replaces"),
            ("Global=true\nMachineOf=b.service\n", "Global cannot be used with Peers"),
            ("Global=true\nReplaces=b\n", "Global cannot be used with Replaces"),
            ("Conflicts=b\nReplaces=c\n", "Conflicts cannot be used with Replaces"),
            (
                "MachineOf=b.service\nConflicts=b.*\n",
                "unresolvable requirements: peer \"b.service\" matches conflict \"b.*\"",
            ),
            (
                "MachineOf=b.service\nReplaces=b.*\n",
                "unresolvable requirements: peer \"b.service\" matches replace \"b.*\"",
            ),
        ];
        for (x_fleet, message) in cases {
            assert_eq!(requirements("a.service", x_fleet).validate().unwrap_err().to_string(), message);
        }
        assert!(requirements("a.service", "MachineOf=b.service\nConflicts=c*\n").validate().is_ok());
    }
}
