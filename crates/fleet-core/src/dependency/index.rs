//! What the engine keeps of units that wait for units between two looks at the cluster: each
//! unit with dependencies, the patterns its items name (each held once, whatever number of
//! units name it), the units each pattern matches, how each of those stands, and a summary of
//! that per pattern. Built once per cluster revision (a walk over every unit, and over the
//! names once per pattern); then a change of state costs the units named (to read and compare
//! their states), the patterns that match a unit whose standing moved, and the units that name
//! those patterns: not the cluster.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::{Dependencies, Kind, Matched, Standing, standing_of, unmet};
use crate::glob::Glob;
use crate::required_places::RequiredPlace;
use crate::schedule::UnitSpec;
use crate::{DesiredState, UnitHash, UnitState};

/// The most places a unit's file names: the first, by unit name, of what its items name up.
pub const MOST_PLACES: usize = 100;

/// A unit with dependencies, as the index holds it.
#[derive(Clone, Debug)]
struct Dependent {
    name: String,
    dependencies: Dependencies,
    placed: bool,
    /// The position in [`DependencyIndex::patterns`] of each item's pattern.
    items: Vec<usize>,
}

/// One pattern some item names: the units it matches and how they stand together.
#[derive(Clone, Debug)]
struct Pattern {
    /// Positions in [`DependencyIndex::required`], by unit name.
    matches: Vec<usize>,
    matched: Matched,
    /// The dependents that name it.
    named_by: Vec<usize>,
}

/// A unit some pattern matches, as it stands.
#[derive(Clone, Debug)]
struct Required {
    name: String,
    on: Option<String>,
    hash: Option<UnitHash>,
    standing: Standing,
    /// The patterns that match it.
    patterns: Vec<usize>,
}

/// What a dependent's dependencies make of it as things stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Why it may not start (its first item not met), whatever its grace.
    pub waiting: Option<String>,
    /// Why what it `Requires=` is not met, for one that runs (its grace counts from then).
    pub requires_unmet: Option<String>,
    /// The instances its items name that are up, at most [`MOST_PLACES`]
    /// ([`DependencyIndex::up_of`] says where).
    up: Vec<usize>,
}

/// Every unit with dependencies of one cluster revision, and what it names.
#[derive(Clone, Debug, Default)]
pub struct DependencyIndex {
    dependents: Vec<Dependent>,
    patterns: Vec<Pattern>,
    required: Vec<Required>,
    by_name: HashMap<String, usize>,
}

impl DependencyIndex {
    /// The index of `units` (their current contents' hashes in `hashes`): every unit that
    /// should run with dependencies, and every unit its items name. Every standing starts as
    /// not reported: [`DependencyIndex::stand`] sets them. A dependent counts as placed only on
    /// a machine `present` holds: one on a machine gone is moved by the plan, and starts
    /// afresh, so it waits as a new one does.
    pub fn build(units: &[UnitSpec], hashes: &HashMap<&str, UnitHash>, present: impl Fn(&str) -> bool) -> Self {
        let mut index = Self::default();
        let waiting: Vec<&UnitSpec> = units
            .iter()
            .filter(|unit| unit.desired != DesiredState::Inactive && !unit.requirements.dependencies.is_empty())
            .collect();
        if waiting.is_empty() {
            return index;
        }
        let mut by_position: Vec<(&str, usize)> =
            units.iter().enumerate().map(|(position, unit)| (unit.name.as_str(), position)).collect();
        by_position.sort_unstable();
        let positions: HashMap<&str, usize> = by_position.iter().copied().collect();
        let mut pattern_of: HashMap<&str, usize> = HashMap::new();
        for unit in waiting {
            let dependent = index.dependents.len();
            let mut items = Vec::new();
            for item in &unit.requirements.dependencies.items {
                let pattern = match pattern_of.get(item.pattern.as_str()) {
                    Some(&pattern) => pattern,
                    None => {
                        let found: Vec<usize> = match Glob::new(&item.pattern) {
                            None => Vec::new(),
                            Some(glob) => match glob.literal() {
                                Some(name) => positions.get(name.as_str()).copied().into_iter().collect(),
                                // In name order, so that the places a file names are the first.
                                None => by_position
                                    .iter()
                                    .filter(|(name, _)| glob.matches(name))
                                    .map(|(_, at)| *at)
                                    .collect(),
                            },
                        };
                        let pattern = index.patterns.len();
                        let matches = found.into_iter().map(|at| index.require(&units[at], hashes, pattern)).collect();
                        index.patterns.push(Pattern { matches, matched: Matched::default(), named_by: Vec::new() });
                        pattern_of.insert(item.pattern.as_str(), pattern);
                        pattern
                    }
                };
                if index.patterns[pattern].named_by.last() != Some(&dependent) {
                    index.patterns[pattern].named_by.push(dependent);
                }
                items.push(pattern);
            }
            index.dependents.push(Dependent {
                name: unit.name.clone(),
                dependencies: unit.requirements.dependencies.clone(),
                placed: unit.scheduled_on.as_deref().is_some_and(&present),
                items,
            });
        }
        for pattern in &mut index.patterns {
            pattern.matched = Matched::of(pattern.matches.iter().map(|&at| &index.required[at].standing));
        }
        index
    }

    /// The position of `unit` among the units named, matched by `pattern`.
    fn require(&mut self, unit: &UnitSpec, hashes: &HashMap<&str, UnitHash>, pattern: usize) -> usize {
        let next = self.required.len();
        let position = *self.by_name.entry(unit.name.clone()).or_insert(next);
        if position == next {
            self.required.push(Required {
                name: unit.name.clone(),
                on: unit.scheduled_on.clone(),
                hash: hashes.get(unit.name.as_str()).copied(),
                standing: Standing::Down("not placed".to_string()),
                patterns: Vec::new(),
            });
        }
        self.required[position].patterns.push(pattern);
        position
    }

    pub fn is_empty(&self) -> bool {
        self.dependents.is_empty()
    }

    /// The names of the units the items name: whose states to read.
    pub fn named(&self) -> BTreeSet<String> {
        self.required.iter().map(|required| required.name.clone()).collect()
    }

    /// Sets each named unit's standing from `states` (the machines' reports of them); the
    /// dependents that name a pattern whose units' standing moved, by position.
    pub fn stand(&mut self, states: &[Arc<UnitState>]) -> BTreeSet<usize> {
        let mut reports: HashMap<usize, Vec<Arc<UnitState>>> = HashMap::new();
        for state in states {
            if let Some(&position) = self.by_name.get(&state.name) {
                reports.entry(position).or_default().push(state.clone());
            }
        }
        let mut touched: BTreeSet<usize> = BTreeSet::new();
        for (position, required) in self.required.iter_mut().enumerate() {
            let mine = reports.get(&position).map_or(&[][..], Vec::as_slice);
            let standing = standing_of(required.on.as_deref(), required.hash, &required.name, mine);
            if standing != required.standing {
                required.standing = standing;
                touched.extend(required.patterns.iter().copied());
            }
        }
        // Which instances are up matters to the places even when their number does not: every
        // dependent of a pattern touched is looked at again.
        let mut moved = BTreeSet::new();
        for pattern in touched {
            let matched = Matched::of(self.patterns[pattern].matches.iter().map(|&at| &self.required[at].standing));
            self.patterns[pattern].matched = matched;
            moved.extend(self.patterns[pattern].named_by.iter().copied());
        }
        moved
    }

    /// Every dependent's name and position.
    pub fn dependents(&self) -> impl Iterator<Item = (usize, &str)> {
        self.dependents.iter().enumerate().map(|(position, dependent)| (position, dependent.name.as_str()))
    }

    /// Whether the dependent at `position` is placed, and its grace.
    pub fn placed_and_grace(&self, position: usize) -> (bool, Option<std::time::Duration>) {
        let dependent = &self.dependents[position];
        (dependent.placed, dependent.dependencies.grace)
    }

    /// What the dependent at `position` makes of how what it names stands.
    pub fn evaluate(&self, position: usize) -> Evaluation {
        let dependent = &self.dependents[position];
        let items = dependent.dependencies.items.iter().zip(&dependent.items);
        let waiting = items.clone().find_map(|(item, &pattern)| unmet(item, &self.patterns[pattern].matched));
        let requires_unmet = if dependent.placed && dependent.dependencies.grace.is_some() {
            items
                .clone()
                .filter(|(item, _)| item.kind == Kind::Requires)
                .find_map(|(item, &pattern)| unmet(item, &self.patterns[pattern].matched))
        } else {
            None
        };
        let mut up: Vec<usize> = Vec::new();
        for &pattern in &dependent.items {
            let instances = self.patterns[pattern].matches.iter().copied();
            let placed_up =
                instances.filter(|&at| self.required[at].standing == Standing::Up && self.required[at].on.is_some());
            up.extend(placed_up.take(MOST_PLACES));
        }
        up.sort_unstable_by(|a, b| self.required[*a].name.cmp(&self.required[*b].name));
        up.dedup();
        up.truncate(MOST_PLACES);
        Evaluation { waiting, requires_unmet, up }
    }

    /// Where the instances up of `evaluation` (one of this index's) run, each machine's IP
    /// from `ips`, sorted.
    pub fn up_of(&self, evaluation: &Evaluation, ips: &HashMap<&str, &str>) -> Vec<RequiredPlace> {
        let mut places: Vec<RequiredPlace> = evaluation
            .up
            .iter()
            .filter_map(|&p| {
                let required = &self.required[p];
                let machine = required.on.as_deref()?;
                Some(RequiredPlace {
                    unit: required.name.clone(),
                    machine_id: machine.to_string(),
                    public_ip: ips.get(machine).copied().unwrap_or_default().to_string(),
                })
            })
            .collect();
        places.sort();
        places
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Requirements, SystemdState, UnitFile};

    fn spec(name: &str, x_fleet: &str, on: Option<&str>) -> (UnitSpec, UnitHash) {
        let file = UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{x_fleet}\n")).expect("a unit");
        let spec = UnitSpec {
            name: name.into(),
            desired: DesiredState::Launched,
            requirements: Arc::new(Requirements::from_unit(name, &file)),
            scheduled_on: on.map(str::to_string),
        };
        (spec, file.hash())
    }

    #[test]
    fn a_report_moves_only_the_units_that_name_its_unit() {
        let units = [
            spec("db.service", "", Some("m1")),
            spec("app.service", "Requires=db.service", None),
            spec("web.service", "After=cache.service", None),
            spec("cache.service", "", Some("m2")),
            spec("other.service", "", Some("m2")),
            spec("db@1.service", "", Some("m1")),
            spec("db@2.service", "", Some("m2")),
            spec("api.service", "Requires=db@*.service:2", Some("m3")),
        ];
        let hashes: HashMap<&str, UnitHash> = units.iter().map(|(spec, hash)| (spec.name.as_str(), *hash)).collect();
        let specs: Vec<UnitSpec> = units.iter().map(|(spec, _)| spec.clone()).collect();
        let mut index = DependencyIndex::build(&specs, &hashes, |_| true);
        let named: Vec<String> = index.named().into_iter().collect();
        assert_eq!(named, ["cache.service", "db.service", "db@1.service", "db@2.service"]);
        let state = |name: &str, on: &str, active: &str| {
            Arc::new(UnitState {
                name: name.into(),
                machine_id: on.into(),
                hash: hashes[name],
                systemd: SystemdState::new("loaded", active, "running"),
                launched: true,
                drift: None,
                health: None,
                secrets: Default::default(),
                run: None,
            })
        };
        let position =
            |unit: &str| index.dependents().find(|(_, name)| *name == unit).map(|(at, _)| at).expect("waits");
        let (app, api) = (position("app.service"), position("api.service"));
        let all = |db: &str, db2: &str| {
            [
                state("db.service", "m1", db),
                state("cache.service", "m2", "inactive"),
                state("db@1.service", "m1", "active"),
                state("db@2.service", "m2", db2),
            ]
        };
        assert_eq!(index.stand(&all("active", "active")).len(), 3, "the first reports move every one");
        assert_eq!(index.evaluate(app).waiting, None);
        assert_eq!(index.evaluate(api).waiting, None);
        let places = index.up_of(&index.evaluate(api), &HashMap::from([("m1", "10.0.0.1"), ("m2", "10.0.0.2")]));
        let names: Vec<&str> = places.iter().map(|place| place.unit.as_str()).collect();
        assert_eq!(names, ["db@1.service", "db@2.service"]);
        assert!(index.stand(&all("active", "active")).is_empty(), "nothing moved");
        assert_eq!(index.stand(&all("failed", "active")), BTreeSet::from([app]));
        assert_eq!(index.evaluate(app).waiting.as_deref(), Some("waiting for db.service: failed on m1"));
        assert_eq!(index.stand(&all("failed", "failed")), BTreeSet::from([api]));
        assert_eq!(index.evaluate(api).waiting.as_deref(), Some("waiting for 2 of db@*.service up: 1"));
    }

    /// Seeds 796593880 and 796593883 of `fleet-sim --dependent 6`: a dependent on a machine gone
    /// was counted as running, so the plan that moved it started it at once, before what it
    /// requires ran again.
    #[test]
    fn a_dependent_on_a_machine_gone_counts_as_not_placed() {
        let units = [
            spec("db.service", "", Some("m1")),
            spec("app.service", "Requires=db.service", Some("m1")),
            spec("web.service", "Requires=db.service", Some("m2")),
        ];
        let hashes: HashMap<&str, UnitHash> = units.iter().map(|(spec, hash)| (spec.name.as_str(), *hash)).collect();
        let specs: Vec<UnitSpec> = units.iter().map(|(spec, _)| spec.clone()).collect();
        let index = DependencyIndex::build(&specs, &hashes, |machine| machine == "m2");
        let placed = |unit: &str| {
            let (at, _) = index.dependents().find(|(_, name)| *name == unit).expect("a dependent");
            index.placed_and_grace(at).0
        };
        assert!(!placed("app.service"), "m1 is gone: app moves, and waits for db as a new unit does");
        assert!(placed("web.service"));
    }
}
