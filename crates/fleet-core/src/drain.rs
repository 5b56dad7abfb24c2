//! Draining a machine, sans I/O. A drained machine takes no new units, and the units on it
//! move elsewhere in waves bounded by a max-unavailable, by the rollout's rule: at most that
//! many of the drain's units are down at once (moving, or down for any reason), and a unit
//! that is down anyway moves first and costs nothing.
//!
//! The engine leader's drain driver steps a drain with [`advance`]: it lets units go (adds
//! them to [`Drain::released`]), and the engine moves the units let go where every placement
//! rule allows (a unit with nowhere to go stays, with the reason). A unit let go counts as
//! moving until the machine it moved to runs it; then it counts as moved. Units that cannot
//! leave stay and are named: global units (they run on every machine that matches) and units
//! whose `MachineID=` names this machine. `MachineOf=` followers move with their leader.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::disruption_budget::Budgets;
use crate::max_unavailable::MaxUnavailable;
use crate::{DesiredState, Requirements, UnitHash, UnitState};

/// A machine's drain, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub max_unavailable: MaxUnavailable,
    /// When it began (seconds since the Unix epoch).
    pub started: u64,
    /// The units let go, each with when: the engine moves them where it can.
    #[serde(default)]
    pub released: BTreeMap<String, u64>,
    /// How many units have moved off and run elsewhere.
    #[serde(default)]
    pub moved: usize,
    /// Why the next unit to go waits though the drain's own budget has room: its group's
    /// disruption budget ([`crate::disruption_budget`]), as of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

impl Drain {
    pub fn new(max_unavailable: MaxUnavailable, started: u64) -> Self {
        Self { max_unavailable, started, released: BTreeMap::new(), moved: 0, held: None }
    }

    /// Whether the engine may move `unit` off the drained machine now.
    pub fn lets_go(&self, unit: &str) -> bool {
        self.released.contains_key(unit)
    }
}

/// One unit as a drain sees it: a unit scheduled on the drained machine, or one the drain
/// let go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainUnit {
    pub name: String,
    /// The machine it is scheduled on now.
    pub on: Option<String>,
    /// Whether the machine it is on runs it as wanted (active, for a unit that should run).
    pub ready: bool,
    /// Whether it should run at all (a unit whose desired state is inactive leaves by itself).
    pub wanted: bool,
    /// Its `MachineID=`, if any.
    pub machine_id: Option<String>,
    /// Its `MachineOf=` leaders.
    pub follows: Vec<String>,
    /// The units with a disruption budget that `Requires=` it: letting it go takes from their
    /// budgets too (they lose what they require while it moves).
    pub required_by: Vec<String>,
}

impl DrainUnit {
    /// A unit as a drain sees it, from its record: scheduled on `on`, of content `hash`, and
    /// the states the machines report of it. It is ready when the machine it is on reports
    /// this content in the state it should be in (active, when it should run).
    pub fn of(
        name: &str,
        desired: DesiredState,
        hash: UnitHash,
        on: Option<&str>,
        requirements: &Requirements,
        reports: &[&UnitState],
    ) -> Self {
        let reported = reports.iter().find(|state| Some(state.machine_id.as_str()) == on && state.hash == hash);
        let ready = reported.is_some_and(|state| desired != DesiredState::Launched || state.systemd.active == "active");
        Self {
            name: name.to_string(),
            on: on.map(str::to_string),
            ready,
            wanted: desired != DesiredState::Inactive,
            machine_id: requirements.machine_id.clone(),
            follows: requirements.machine_of.clone(),
            required_by: Vec::new(),
        }
    }
}

/// Why a unit stays on a drained machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stays {
    /// `MachineID=` names the machine.
    Pinned,
    /// It follows (`MachineOf=`) a unit that stays.
    FollowsStaying(String),
}

impl std::fmt::Display for Stays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pinned => f.write_str("MachineID= names this machine"),
            Self::FollowsStaying(leader) => write!(f, "MachineOf={leader}, which stays"),
        }
    }
}

/// Where a drain stands: the units still to go, the ones moving, the ones that stay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Units on the machine that will move, not let go yet.
    pub left: Vec<String>,
    /// Units let go and not yet running elsewhere.
    pub moving: Vec<String>,
    pub stays: Vec<(String, Stays)>,
    pub moved: usize,
}

impl Progress {
    /// `draining` while units are left or moving, `drained` once none are.
    pub fn word(&self) -> &'static str {
        if self.left.is_empty() && self.moving.is_empty() { "drained" } else { "draining" }
    }
}

/// The units of `machine`, grouped: each group a leader and its `MachineOf=` followers there
/// (chains included), in the leader's name order; and the units that stay, with why.
struct Groups<'a> {
    groups: Vec<Vec<&'a DrainUnit>>,
    stays: Vec<(String, Stays)>,
}

fn groups<'a>(machine: &str, units: &'a [DrainUnit]) -> Groups<'a> {
    let here: BTreeMap<&str, &DrainUnit> = units
        .iter()
        .filter(|unit| unit.on.as_deref() == Some(machine))
        .map(|unit| (unit.name.as_str(), unit))
        .collect();
    // A unit's leader on this machine, if it follows one (the first that is here).
    let leader_of = |unit: &DrainUnit| unit.follows.iter().find(|leader| here.contains_key(leader.as_str())).cloned();
    let root_of = |unit: &'a DrainUnit| {
        let mut current = unit;
        let mut seen = BTreeSet::new();
        while let Some(leader) = leader_of(current) {
            if !seen.insert(current.name.as_str()) {
                break;
            }
            current = here[leader.as_str()];
        }
        current
    };
    let mut by_root: BTreeMap<&str, Vec<&DrainUnit>> = BTreeMap::new();
    for unit in here.values() {
        by_root.entry(root_of(unit).name.as_str()).or_default().push(unit);
    }
    let mut result = Groups { groups: Vec::new(), stays: Vec::new() };
    for (root, mut members) in by_root {
        let pinned = here[root].machine_id.as_deref().is_some_and(|wanted| names(machine, wanted));
        if pinned {
            for member in members {
                let why = if member.name == root { Stays::Pinned } else { Stays::FollowsStaying(root.to_string()) };
                result.stays.push((member.name.clone(), why));
            }
        } else {
            // The leader first, so that the engine places it before its followers.
            members.sort_by_key(|member| (member.name != root, member.name.clone()));
            result.groups.push(members);
        }
    }
    result
}

/// Whether `wanted` (a `MachineID=`) names `machine`, by full or 8-character short ID.
fn names(machine: &str, wanted: &str) -> bool {
    machine == wanted || (wanted.len() == 8 && machine.starts_with(wanted))
}

/// One step of the drain of `machine` at `now` (seconds), where no unit has a disruption
/// budget: [`advance_within`].
pub fn advance(drain: &mut Drain, machine: &str, units: &[DrainUnit], now: u64) -> Progress {
    advance_within(drain, machine, units, now, &mut Budgets::default())
}

/// One step of the drain of `machine` at `now` (seconds), given every unit on the machine and
/// every unit it let go: units that run elsewhere now count as moved, and the next units are
/// let go as the drain's budget allows. Each group let go is taken from `budgets` too: one its
/// disruption budget holds stays for now (the drain's `held` says why) and the next may go.
/// Returns where the drain stands after the step.
pub fn advance_within(
    drain: &mut Drain,
    machine: &str,
    units: &[DrainUnit],
    now: u64,
    budgets: &mut Budgets,
) -> Progress {
    let by_name: BTreeMap<&str, &DrainUnit> = units.iter().map(|unit| (unit.name.as_str(), unit)).collect();
    let arrived = |name: &str| match by_name.get(name) {
        None => true,
        Some(unit) if !unit.wanted => true,
        Some(unit) => unit.on.as_deref().is_some_and(|on| on != machine) && unit.ready,
    };
    let before = drain.released.len();
    drain.released.retain(|name, _| !arrived(name));
    drain.moved += before - drain.released.len();

    let grouped = groups(machine, units);
    let waiting: Vec<&Vec<&DrainUnit>> =
        grouped.groups.iter().filter(|group| !group.iter().any(|unit| drain.lets_go(&unit.name))).collect();
    let is_down = |unit: &DrainUnit| unit.wanted && !unit.ready;
    let waiting_units: usize = waiting.iter().map(|group| group.len()).sum();
    let total = drain.moved + drain.released.len() + waiting_units;
    let down =
        drain.released.len() + waiting.iter().flat_map(|group| group.iter()).filter(|unit| is_down(unit)).count();
    let limit = drain.max_unavailable.of(total);
    let mut budget = limit.saturating_sub(down);
    // A group down anyway goes first and costs nothing more than it already does.
    let (down_groups, up_groups): (Vec<_>, Vec<_>) =
        waiting.into_iter().partition(|group| group.iter().all(|unit| is_down(unit)));
    let mut held = None;
    let mut taken = |group: &[&DrainUnit]| match budgets.take(
        group
            .iter()
            .flat_map(|unit| std::iter::once(unit.name.as_str()).chain(unit.required_by.iter().map(String::as_str))),
    ) {
        Ok(()) => true,
        Err(why) => {
            held.get_or_insert_with(|| format!("{} waits: {why}", group[0].name));
            false
        }
    };
    for group in down_groups {
        if taken(group) {
            release(drain, group, now);
        }
    }
    for group in up_groups {
        let cost = group.iter().filter(|unit| !is_down(unit)).count();
        // A group larger than the whole budget goes alone, once nothing else is moving.
        let alone = cost > limit && drain.released.is_empty() && budget == limit;
        if cost > budget && !alone {
            break;
        }
        if !taken(group) {
            continue;
        }
        budget = budget.saturating_sub(cost);
        release(drain, group, now);
    }
    drain.held = held;
    standing(drain, grouped)
}

fn release(drain: &mut Drain, group: &[&DrainUnit], now: u64) {
    for unit in group {
        drain.released.insert(unit.name.clone(), now);
    }
}

/// Where `drain` of `machine` stands, given the same units as [`advance`], without stepping it.
pub fn progress(drain: &Drain, machine: &str, units: &[DrainUnit]) -> Progress {
    standing(drain, groups(machine, units))
}

/// Where `drain` stands, given its machine's units grouped.
fn standing(drain: &Drain, Groups { groups, stays }: Groups<'_>) -> Progress {
    let left = groups
        .iter()
        .flat_map(|group| group.iter())
        .map(|unit| unit.name.clone())
        .filter(|name| !drain.lets_go(name))
        .collect();
    Progress { left, moving: drain.released.keys().cloned().collect(), stays, moved: drain.moved }
}

#[cfg(test)]
mod tests;
