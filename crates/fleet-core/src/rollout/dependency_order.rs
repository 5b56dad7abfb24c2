//! A rollout of units that wait for one another (`[X-Fleet] Requires=`, `After=`): what a unit
//! names among the rollout's own units is replaced first, and the unit waits until each of
//! those is done (running its new content, active and healthy, for `min_ready`).
//!
//! [`required_first`] orders a new rollout so that what a unit names comes before it (a canary
//! is then made of whole chains); [`Blocked`] says, at a step, which waiting units must wait
//! still and for what. Both read each unit's dependencies from its new content (`to`).

use std::collections::{HashMap, HashSet};

use crate::UnitHash;
use crate::dependency::Dependencies;
use crate::glob::Glob;

use super::{RolloutUnit, Step};

/// The dependencies of a rollout's units' new contents: per content, or per unit where the
/// content's items hold specifiers (`Requires=db@%i.service` names another unit for each).
#[derive(Clone, Debug, Default)]
pub struct RolloutDependencies {
    by_content: HashMap<UnitHash, Dependencies>,
    by_unit: HashMap<String, Dependencies>,
}

impl RolloutDependencies {
    /// The dependencies `unit`'s new content states for it.
    pub fn of(&self, unit: &RolloutUnit) -> Option<&Dependencies> {
        self.by_unit.get(&unit.name).or_else(|| self.by_content.get(&unit.to))
    }

    fn is_empty(&self) -> bool {
        self.by_content.values().chain(self.by_unit.values()).all(Dependencies::is_empty)
    }
}

impl From<HashMap<UnitHash, Dependencies>> for RolloutDependencies {
    fn from(by_content: HashMap<UnitHash, Dependencies>) -> Self {
        Self { by_content, by_unit: HashMap::new() }
    }
}

/// The dependencies each new content of `units` states, from `bodies` (hash in hex → unit
/// file text, as a rollout record keeps them). Each content is read once, and its items once
/// unless they hold specifiers.
pub fn dependencies_by_content(
    units: &[RolloutUnit],
    bodies: &std::collections::BTreeMap<String, String>,
) -> RolloutDependencies {
    let mut files: HashMap<UnitHash, Option<(crate::UnitFile, bool)>> = HashMap::new();
    let mut table = RolloutDependencies::default();
    for unit in units {
        let file = files.entry(unit.to).or_insert_with(|| {
            let file = bodies.get(&unit.to.to_string()).and_then(|text| crate::UnitFile::parse(text).ok())?;
            let specific = file.options().iter().any(|option| {
                option.section == crate::unit_file::X_FLEET
                    && [crate::dependency::REQUIRES_KEY, crate::dependency::AFTER_KEY].contains(&option.name.as_str())
                    && option.value.contains('%')
            });
            Some((file, specific))
        });
        let Some((file, specific)) = file else { continue };
        if !*specific && table.by_content.contains_key(&unit.to) {
            continue;
        }
        let dependencies = crate::dependency::dependencies_of(&unit.name, file.options()).unwrap_or_default();
        if *specific {
            table.by_unit.insert(unit.name.clone(), dependencies);
        } else {
            table.by_content.insert(unit.to, dependencies);
        }
    }
    table
}

/// [`required_first`] over a new rollout's units, their new contents in `bodies`.
pub fn rollout_units_required_first(
    units: Vec<RolloutUnit>,
    bodies: &std::collections::BTreeMap<String, String>,
) -> Vec<RolloutUnit> {
    let table = dependencies_by_content(&units, bodies);
    required_first(units, |unit| unit.name.as_str(), |unit| table.of(unit))
}

/// For each unit of `names`, the positions of the other units its dependencies (`of`, by unit
/// position) name among `names`. Each pattern is matched once over the names.
fn named_within(names: &[&str], dependencies: &[Option<&Dependencies>]) -> Vec<Vec<usize>> {
    let mut matched: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut named = Vec::with_capacity(names.len());
    for (position, dependencies) in dependencies.iter().enumerate() {
        let mut within = Vec::new();
        for item in dependencies.iter().flat_map(|dependencies| &dependencies.items) {
            let found = matched.entry(item.pattern.as_str()).or_insert_with(|| match Glob::new(&item.pattern) {
                Some(glob) => {
                    names.iter().enumerate().filter(|(_, name)| glob.matches(name)).map(|(at, _)| at).collect()
                }
                None => Vec::new(),
            });
            within.extend(found.iter().copied().filter(|&at| at != position));
        }
        within.sort_unstable();
        within.dedup();
        named.push(within);
    }
    named
}

/// `units` reordered so that what each names among them comes before it, otherwise as given
/// (stable): the first `k` of the result hold everything they name, whatever `k`.
/// `dependencies` gives a unit's dependencies from its new content.
pub fn required_first<'d, T>(
    units: Vec<T>,
    name: impl Fn(&T) -> &str,
    dependencies: impl Fn(&T) -> Option<&'d Dependencies>,
) -> Vec<T> {
    let found: Vec<Option<&Dependencies>> = units.iter().map(&dependencies).collect();
    if found.iter().all(|dependencies| dependencies.is_none_or(Dependencies::is_empty)) {
        return units;
    }
    let names: Vec<&str> = units.iter().map(&name).collect();
    let named = named_within(&names, &found);
    // Depth first from each unit in turn, emitting what it names before it (a cycle, refused
    // at submission, cannot loop: a unit on the path is not entered again).
    let mut order = Vec::with_capacity(units.len());
    let mut placed = vec![false; units.len()];
    for start in 0..units.len() {
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        let mut on_path: HashSet<usize> = HashSet::from([start]);
        while let Some((unit, next)) = path.last_mut() {
            let unit = *unit;
            if placed[unit] {
                path.pop();
                on_path.remove(&unit);
                continue;
            }
            match named[unit].get(*next) {
                Some(&required) => {
                    *next += 1;
                    if !placed[required] && on_path.insert(required) {
                        path.push((required, 0));
                    }
                }
                None => {
                    placed[unit] = true;
                    order.push(unit);
                    path.pop();
                    on_path.remove(&unit);
                }
            }
        }
    }
    let mut slots: Vec<Option<T>> = units.into_iter().map(Some).collect();
    order.into_iter().filter_map(|position| slots[position].take()).collect()
}

/// At one step of a rollout, each unit still waiting that names units of the rollout not yet
/// done, with the first of those.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocked(HashMap<usize, String>);

impl Blocked {
    /// The units of `units` blocked now; `dependencies` gives the dependencies of each new
    /// content (by its hash).
    pub fn of(units: &[RolloutUnit], dependencies: &RolloutDependencies) -> Self {
        if dependencies.is_empty() {
            return Self::default();
        }
        let names: Vec<&str> = units.iter().map(|unit| unit.name.as_str()).collect();
        let found: Vec<Option<&Dependencies>> = units.iter().map(|unit| dependencies.of(unit)).collect();
        let named = named_within(&names, &found);
        let blocked = units
            .iter()
            .enumerate()
            .filter(|(_, unit)| unit.step == Step::Waiting)
            .filter_map(|(position, _)| {
                let first = named[position].iter().find(|&&required| units[required].step != Step::Done)?;
                Some((position, units[*first].name.clone()))
            })
            .collect();
        Self(blocked)
    }

    /// What the unit at `position` waits for first, if it must wait.
    pub fn waits_for(&self, position: usize) -> Option<&str> {
        self.0.get(&position).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UnitFile;
    use crate::dependency::dependencies_of;

    fn dependencies(name: &str, x_fleet: &str) -> Dependencies {
        let file = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}\n")).expect("a unit file");
        dependencies_of(name, file.options()).expect("dependencies")
    }

    #[test]
    fn what_a_unit_names_comes_first_and_the_rest_keep_their_order() {
        let app = dependencies("app@1.service", "Requires=db.service\nAfter=cache@*.service");
        let given = ["app@1.service", "web.service", "cache@1.service", "db.service", "cache@2.service"];
        let ordered = required_first(given.to_vec(), |name| name, |name| (name.starts_with("app")).then_some(&app));
        assert_eq!(ordered, ["cache@1.service", "db.service", "cache@2.service", "app@1.service", "web.service"]);
        let none = required_first(given.to_vec(), |name| name, |_| None);
        assert_eq!(none, given, "nothing named: as given");
    }

    #[test]
    fn a_waiting_unit_is_blocked_until_what_it_names_in_the_rollout_is_done() {
        let hash = |n: u8| UnitHash([n; 20]);
        let unit =
            |name: &str, to: u8, step: Step| RolloutUnit { name: name.into(), from: hash(0), to: hash(to), step };
        let table = RolloutDependencies::from(HashMap::from([
            (hash(1), dependencies("app.service", "Requires=db.service")),
            (hash(2), Dependencies::default()),
        ]));
        let mut units =
            vec![unit("db.service", 2, Step::Replacing { since: 1 }), unit("app.service", 1, Step::Waiting)];
        assert_eq!(Blocked::of(&units, &table).waits_for(1), Some("db.service"));
        assert_eq!(Blocked::of(&units, &table).waits_for(0), None);
        units[0].step = Step::Done;
        assert_eq!(Blocked::of(&units, &table).waits_for(1), None);
    }
}
