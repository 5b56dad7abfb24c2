//! `[X-Fleet] Requires=` and `After=`: units that wait for units, on any machine.
//!
//! `Requires=db.service` starts the unit only once `db.service` is up (active, and healthy
//! where it has a health check) wherever it runs; with `RequiresGrace=30s`, a unit that runs is
//! stopped once what it requires has not been up for that long, and waits again (without it,
//! never). `After=db.service` orders only: the unit starts once `db.service` is up or has
//! finished, and does not stop with it. A name may be a pattern over instances with a count:
//! `Requires=db@*.service:2` waits for two of them up. Several items on a line, several lines.
//! The unit's specifiers are its own: `Requires=db@%i.service` in `app@.service` makes
//! `app@3.service` wait for `db@3.service`.
//!
//! What the engine decides from this is [`waiting_for`]: given how each unit matching an item
//! stands, the first item not met and why, as a unit's reason says it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::glob::Glob;
use crate::required_places::{CHANGE_KEY, OnChange};
use crate::unit_file::{UnitOption, X_FLEET, last_value};

/// The option that starts a unit only once what it names is up, and stops it (after
/// [`GRACE_KEY`]) once that is no longer so.
pub const REQUIRES_KEY: &str = "Requires";
/// The option that only orders: start once what it names is up or has finished.
pub const AFTER_KEY: &str = "After";
/// How long what a unit requires may be down before the unit is stopped (never when absent).
pub const GRACE_KEY: &str = "RequiresGrace";

/// The most units an item may ask for.
pub const MOST_COUNT: u32 = 1000;
/// The most items a unit may name, over every line of both options.
pub const MOST_ITEMS: usize = 64;

/// How an item binds the unit to what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Starts once it is up; stops after the grace once it is not.
    Requires,
    /// Starts once it is up or finished; never stops with it.
    After,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::Requires => REQUIRES_KEY,
            Kind::After => AFTER_KEY,
        }
    }
}

/// One item: the units it names (a name, or a pattern over names) and how many of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dependency {
    pub kind: Kind,
    pub pattern: String,
    pub count: u32,
}

/// A unit's dependencies as its file states them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependencies {
    pub items: Vec<Dependency>,
    /// `RequiresGrace=`: `None`, never stopped for what it requires.
    pub grace: Option<Duration>,
    /// `RequiresChange=`: what the unit wants when what it requires moves.
    pub on_change: OnChange,
}

impl Dependencies {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items of one kind as written (`db.service`, `db@*.service:2`).
    pub fn written(&self, kind: Kind) -> Vec<String> {
        let items = self.items.iter().filter(|item| item.kind == kind);
        items
            .map(|item| if item.count == 1 { item.pattern.clone() } else { format!("{}:{}", item.pattern, item.count) })
            .collect()
    }

    /// One short line for a list: `db.service after:cache.service (grace 30s, reload)`; `-`
    /// for none.
    pub fn short(&self) -> String {
        if self.is_empty() {
            return "-".to_string();
        }
        let mut items = self.written(Kind::Requires);
        items.extend(self.written(Kind::After).into_iter().map(|item| format!("after:{item}")));
        let mut notes = Vec::new();
        if let Some(grace) = self.grace {
            notes.push(format!("grace {}", crate::duration::short_span(grace)));
        }
        if self.on_change != OnChange::default() {
            notes.push(self.on_change.word().to_string());
        }
        let mut text = items.join(" ");
        if !notes.is_empty() {
            text.push_str(&format!(" ({})", notes.join(", ")));
        }
        text
    }
}

/// The unit's dependencies; an error names the option and the value for an item that is no
/// unit name or pattern, a count of 0 or above [`MOST_COUNT`], more than [`MOST_ITEMS`] items,
/// an item that names the unit itself, a grace that is no time span, a grace without
/// `Requires=`, and a `RequiresChange=` it does not take.
pub fn dependencies_of(unit_name: &str, options: &[UnitOption]) -> Result<Dependencies, String> {
    let mut items = Vec::new();
    let name = crate::unit_name::UnitNameInfo::new(unit_name);
    for kind in [Kind::Requires, Kind::After] {
        let values = options.iter().filter(|option| option.section == X_FLEET && option.name == kind.key());
        for value in values.flat_map(|option| option.value.split_whitespace()) {
            // An instance names its own counterpart: `Requires=db@%i.service` in `app@.service`.
            let value = crate::unit_name::expand_specifiers(value, &name);
            let value = value.as_str();
            let item = item_of(kind, value)?;
            if Glob::new(&item.pattern).is_some_and(|glob| glob.matches(unit_name)) {
                return Err(format!(
                    "invalid value {value:?} for [X-Fleet] {}: it names {unit_name} itself",
                    kind.key()
                ));
            }
            items.push(item);
        }
    }
    if items.len() > MOST_ITEMS {
        return Err(format!("[X-Fleet] {REQUIRES_KEY}= and {AFTER_KEY}= name at most {MOST_ITEMS} items a unit"));
    }
    items.sort();
    items.dedup();
    let grace = match last_value(options, X_FLEET, GRACE_KEY) {
        None => None,
        Some(value) => {
            if !items.iter().any(|item| item.kind == Kind::Requires) {
                return Err(format!("[X-Fleet] {GRACE_KEY}= needs a {REQUIRES_KEY}= to wait for"));
            }
            let refused = |why: &str| format!("invalid value {value:?} for [X-Fleet] {GRACE_KEY}: {why}");
            match crate::service_values::parse_timespan(value.trim()) {
                Ok(Some(span)) if span <= crate::lost_after::LONGEST => Some(span).filter(|span| !span.is_zero()),
                Ok(_) => return Err(refused("expected a time span up to 30d")),
                Err(error) => return Err(refused(&error.to_string())),
            }
        }
    };
    let on_change = on_change_of(options, !items.is_empty())?;
    Ok(Dependencies { items, grace, on_change })
}

/// One item as written: `db.service`, `db@*.service`, `db@*.service:2`.
fn item_of(kind: Kind, value: &str) -> Result<Dependency, String> {
    let refused = |why: &str| format!("invalid value {value:?} for [X-Fleet] {}: {why}", kind.key());
    // A unit name may hold `:`; a count is the digits after the last one.
    let (pattern, count) = match value.rsplit_once(':') {
        Some((pattern, digits)) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            let count = digits.parse::<u32>().ok().filter(|count| (1..=MOST_COUNT).contains(count));
            (pattern, count.ok_or_else(|| refused(&format!("a count from 1 to {MOST_COUNT}")))?)
        }
        _ => (value, 1),
    };
    let Some(glob) = Glob::new(pattern) else { return Err(refused("not a name or a pattern")) };
    match glob.literal() {
        Some(name) => crate::unit_name::validate_name(&name).map_err(|error| refused(&error.to_string()))?,
        None => {
            let shape = pattern.replace(['*', '?', '[', ']', '^'], "x");
            crate::unit_name::validate_name(&shape.replace('\\', "")).map_err(|error| refused(&error.to_string()))?;
        }
    }
    if count > 1 && glob.literal().is_some() {
        return Err(refused("a count needs a pattern over instances (db@*.service:2)"));
    }
    Ok(Dependency { kind, pattern: pattern.to_string(), count })
}

/// `RequiresChange=` of a unit whose options are `options`: an error names a value other
/// than `restart`, `reload` or `none`, the option on a unit that names nothing to wait for
/// (`waits` false), and `reload` on a unit with no `ExecReload=` to run.
pub fn on_change_of(options: &[UnitOption], waits: bool) -> Result<OnChange, String> {
    let Some(value) = last_value(options, X_FLEET, CHANGE_KEY) else { return Ok(OnChange::default()) };
    let on_change = match value.trim() {
        "restart" => OnChange::Restart,
        "reload" => OnChange::Reload,
        "none" => OnChange::None,
        _ => {
            return Err(format!(
                "invalid value {value:?} for [X-Fleet] {CHANGE_KEY}: expected restart, reload or none"
            ));
        }
    };
    if !waits {
        return Err(format!("[X-Fleet] {CHANGE_KEY}= needs a {}= or {}= to follow", REQUIRES_KEY, AFTER_KEY));
    }
    if on_change == OnChange::Reload && last_value(options, "Service", "ExecReload").is_none_or(str::is_empty) {
        return Err(format!("[X-Fleet] {CHANGE_KEY}=reload needs an ExecReload= in [Service] to run"));
    }
    Ok(on_change)
}

/// Whether a unit with `options` names units to wait for (`Requires=` or `After=`): its
/// machine gives it the file then.
pub fn waits(options: &[UnitOption]) -> bool {
    options.iter().any(|option| option.section == X_FLEET && (option.name == REQUIRES_KEY || option.name == AFTER_KEY))
}

/// How a unit that an item names stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Active (and healthy, where it has a health check) where it is scheduled.
    Up,
    /// It ran to completion where it was scheduled.
    Finished,
    /// Neither, with how it is (`inactive on 3f2a1b0c`, `not placed`).
    Down(String),
}

/// How the unit `name` stands: up when the machine it is scheduled on reports its current
/// content active (and not unhealthy or unchecked yet), finished when it ran there to its end.
pub fn standing_of(
    on: Option<&str>,
    hash: Option<crate::UnitHash>,
    name: &str,
    states: &[std::sync::Arc<crate::UnitState>],
) -> Standing {
    let Some(on) = on else { return Standing::Down("not placed".to_string()) };
    let short = on.get(..8).unwrap_or(on);
    let Some(state) = states.iter().find(|state| state.name == name && state.machine_id == on) else {
        return Standing::Down(format!("not reported by {short}"));
    };
    if Some(state.hash) != hash {
        return Standing::Down(format!("{short} runs its earlier content"));
    }
    match (state.systemd.active.as_str(), state.health.as_ref().map(|health| health.status)) {
        ("active", None | Some(crate::health::HealthStatus::Healthy)) => Standing::Up,
        ("active", Some(crate::health::HealthStatus::Unhealthy)) => Standing::Down(format!("unhealthy on {short}")),
        ("active", Some(crate::health::HealthStatus::Unknown)) => Standing::Down(format!("not yet healthy on {short}")),
        ("inactive", _) if state.launched && state.systemd.sub == "dead" => Standing::Finished,
        (active, _) => Standing::Down(format!("{active} on {short}")),
    }
}

/// How the units one pattern matches stand, as much as an item's rule needs: how many are up
/// and how many finished, and the one it matches when it matches one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matched {
    pub up: usize,
    pub finished: usize,
    pub count: usize,
    /// How the one unit it matches stands, when it matches exactly one.
    pub only: Option<Standing>,
}

impl Matched {
    pub fn of<'a>(standings: impl IntoIterator<Item = &'a Standing>) -> Self {
        let mut matched = Self::default();
        for standing in standings {
            matched.count += 1;
            match standing {
                Standing::Up => matched.up += 1,
                Standing::Finished => matched.finished += 1,
                Standing::Down(_) => {}
            }
            matched.only = (matched.count == 1).then(|| standing.clone());
        }
        matched
    }
}

/// Why `item` is not met by what its pattern matches (`matched`), as the unit's reason says it;
/// `None` when it is.
pub fn unmet(item: &Dependency, matched: &Matched) -> Option<String> {
    let met = matched.up + if item.kind == Kind::After { matched.finished } else { 0 };
    if met >= item.count as usize {
        return None;
    }
    let wanted = if item.kind == Kind::After { "up or finished" } else { "up" };
    Some(match (matched.count, &matched.only, item.count) {
        (0, _, 1) => format!("waiting for {}: not in the cluster", item.pattern),
        (1, Some(Standing::Down(how)), 1) => format!("waiting for {}: {how}", item.pattern),
        (1, Some(Standing::Finished), 1) => format!("waiting for {}: finished, not {wanted}", item.pattern),
        _ => format!("waiting for {} of {} {wanted}: {met}", item.count, item.pattern),
    })
}

/// The first item of `dependencies` not met, and why, as the unit's reason says it
/// (`waiting for db.service: inactive on 3f2a1b0c`, `waiting for 2 of db@*.service up: 1`);
/// `None` when every item is met. `standing` gives each unit an item's pattern matches, with how
/// it stands (none: nothing in the cluster matches).
pub fn waiting_for<'a>(
    dependencies: &Dependencies,
    standing: impl Fn(&Dependency) -> Vec<(&'a str, &'a Standing)>,
) -> Option<String> {
    dependencies
        .items
        .iter()
        .find_map(|item| unmet(item, &Matched::of(standing(item).into_iter().map(|(_, standing)| standing))))
}

/// A cycle among units through their items, if there is one: the names around it, the first
/// again at the end (`a.service → b.service → a.service`). `units` gives each unit with
/// dependencies its items; an item's pattern binds a unit to every unit among `units` it
/// matches (a unit without dependencies is in no cycle).
pub fn find_cycle(units: &BTreeMap<String, Dependencies>) -> Option<Vec<String>> {
    let names: Vec<&str> = units.keys().map(String::as_str).collect();
    let edges: BTreeMap<&str, Vec<&str>> = units
        .iter()
        .map(|(name, dependencies)| {
            let targets = dependencies
                .items
                .iter()
                .filter_map(|item| Glob::new(&item.pattern))
                .flat_map(|glob| match glob.literal() {
                    Some(literal) => names.iter().filter(|other| **other == literal).copied().collect::<Vec<_>>(),
                    None => names.iter().filter(|other| glob.matches(other)).copied().collect(),
                })
                .filter(|target| target != name)
                .collect::<BTreeSet<&str>>()
                .into_iter()
                .collect();
            (name.as_str(), targets)
        })
        .collect();
    // Depth first, by colour: on the path (grey) or done (black).
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for start in &names {
        if done.contains(start) {
            continue;
        }
        let mut path: Vec<(&str, usize)> = vec![(start, 0)];
        let mut on_path: BTreeSet<&str> = BTreeSet::from([*start]);
        while let Some((node, next)) = path.last_mut() {
            let node = *node;
            let targets = edges.get(node).map_or(&[][..], Vec::as_slice);
            if let Some(&target) = targets.get(*next) {
                *next += 1;
                if on_path.contains(target) {
                    let from = path.iter().position(|(name, _)| *name == target).unwrap_or(0);
                    let mut cycle: Vec<String> = path[from..].iter().map(|(name, _)| name.to_string()).collect();
                    cycle.push(target.to_string());
                    return Some(cycle);
                }
                if !done.contains(target) {
                    path.push((target, 0));
                    on_path.insert(target);
                }
            } else {
                path.pop();
                on_path.remove(node);
                done.insert(node);
            }
        }
    }
    None
}

pub mod affected;
pub mod index;

#[cfg(test)]
mod tests;
