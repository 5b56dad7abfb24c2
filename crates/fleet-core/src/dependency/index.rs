//! What the engine keeps of units that wait for units between two looks at the cluster: each
//! unit with dependencies, the units its items name, how each of those stands, and what that
//! makes of the unit. Built once per cluster revision (a walk over every unit, and over the
//! names once per pattern); then a change of state costs the units named (to read and compare
//! their states) and the dependents of those whose standing moved, not the cluster.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::{Dependencies, Kind, Standing, standing_of, waiting_for};
use crate::glob::Glob;
use crate::required_places::RequiredPlace;
use crate::schedule::UnitSpec;
use crate::{DesiredState, UnitHash, UnitState};

/// A unit with dependencies, as the index holds it.
#[derive(Clone, Debug)]
struct Dependent {
    name: String,
    dependencies: Dependencies,
    placed: bool,
    /// The positions in [`DependencyIndex::required`] of what each item names, per item.
    items: Vec<Vec<usize>>,
}

/// A unit some item names, as it stands.
#[derive(Clone, Debug)]
struct Required {
    name: String,
    on: Option<String>,
    hash: Option<UnitHash>,
    standing: Standing,
}

/// What a dependent's dependencies make of it as things stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Why it may not start (its first item not met), whatever its grace.
    pub waiting: Option<String>,
    /// Why what it `Requires=` is not met, for one that runs (its grace counts from then).
    pub requires_unmet: Option<String>,
    /// The instances its items name that are up ([`DependencyIndex::up_of`] says where).
    up: Vec<usize>,
}

/// Every unit with dependencies of one cluster revision, and what it names.
#[derive(Clone, Debug, Default)]
pub struct DependencyIndex {
    dependents: Vec<Dependent>,
    required: Vec<Required>,
    by_name: HashMap<String, usize>,
    /// For each of [`DependencyIndex::required`], the dependents that name it.
    named_by: Vec<Vec<usize>>,
}

impl DependencyIndex {
    /// The index of `units` (their current contents' hashes in `hashes`): every unit that
    /// should run with dependencies, and every unit its items name. Every standing starts as
    /// not reported: [`DependencyIndex::stand`] sets them.
    pub fn build(units: &[UnitSpec], hashes: &HashMap<&str, UnitHash>) -> Self {
        let mut index = Self::default();
        let waiting: Vec<&UnitSpec> = units
            .iter()
            .filter(|unit| unit.desired != DesiredState::Inactive && !unit.requirements.dependencies.is_empty())
            .collect();
        if waiting.is_empty() {
            return index;
        }
        let positions: HashMap<&str, usize> =
            units.iter().enumerate().map(|(position, unit)| (unit.name.as_str(), position)).collect();
        let mut matched: HashMap<&str, Vec<usize>> = HashMap::new();
        for unit in waiting {
            let mut items = Vec::new();
            for item in &unit.requirements.dependencies.items {
                let found = matched.entry(item.pattern.as_str()).or_insert_with(|| match Glob::new(&item.pattern) {
                    None => Vec::new(),
                    Some(glob) => match glob.literal() {
                        Some(name) => positions.get(name.as_str()).copied().into_iter().collect(),
                        None => (0..units.len()).filter(|&at| glob.matches(&units[at].name)).collect(),
                    },
                });
                let mut named = Vec::with_capacity(found.len());
                for &at in found.iter() {
                    let other = &units[at];
                    let next = index.required.len();
                    let position = *index.by_name.entry(other.name.clone()).or_insert(next);
                    if position == next {
                        let hash = hashes.get(other.name.as_str()).copied();
                        let standing = Standing::Down("not placed".to_string());
                        index.required.push(Required {
                            name: other.name.clone(),
                            on: other.scheduled_on.clone(),
                            hash,
                            standing,
                        });
                        index.named_by.push(Vec::new());
                    }
                    named.push(position);
                }
                items.push(named);
            }
            let dependent = index.dependents.len();
            for position in items.iter().flatten() {
                if index.named_by[*position].last() != Some(&dependent) {
                    index.named_by[*position].push(dependent);
                }
            }
            index.dependents.push(Dependent {
                name: unit.name.clone(),
                dependencies: unit.requirements.dependencies.clone(),
                placed: unit.scheduled_on.is_some(),
                items,
            });
        }
        index
    }

    pub fn is_empty(&self) -> bool {
        self.dependents.is_empty()
    }

    /// The names of the units the items name: whose states to read.
    pub fn named(&self) -> BTreeSet<String> {
        self.required.iter().map(|required| required.name.clone()).collect()
    }

    /// Sets each named unit's standing from `states` (the machines' reports of them); the
    /// dependents whose named units' standing moved, by position.
    pub fn stand(&mut self, states: &[Arc<UnitState>]) -> BTreeSet<usize> {
        let mut reports: HashMap<usize, Vec<Arc<UnitState>>> = HashMap::new();
        for state in states {
            if let Some(&position) = self.by_name.get(&state.name) {
                reports.entry(position).or_default().push(state.clone());
            }
        }
        let mut moved = BTreeSet::new();
        for (position, required) in self.required.iter_mut().enumerate() {
            let mine = reports.get(&position).map_or(&[][..], Vec::as_slice);
            let standing = standing_of(required.on.as_deref(), required.hash, &required.name, mine);
            if standing != required.standing {
                required.standing = standing;
                moved.extend(self.named_by[position].iter().copied());
            }
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
        let items = &dependent.dependencies.items;
        let named_by_item = |item: &super::Dependency| -> Vec<(&str, &Standing)> {
            let at = items.iter().position(|candidate| candidate == item).unwrap_or(0);
            dependent.items.get(at).map_or(&[][..], Vec::as_slice).iter().map(|&p| self.standing_at(p)).collect()
        };
        let waiting = waiting_for(&dependent.dependencies, named_by_item);
        let requires_unmet = if dependent.placed && dependent.dependencies.grace.is_some() {
            let required = Dependencies {
                items: items.iter().filter(|item| item.kind == Kind::Requires).cloned().collect(),
                ..dependent.dependencies.clone()
            };
            waiting_for(&required, named_by_item)
        } else {
            None
        };
        let mut up: Vec<usize> = dependent
            .items
            .iter()
            .flatten()
            .copied()
            .filter(|&p| self.required[p].standing == Standing::Up && self.required[p].on.is_some())
            .collect();
        up.sort_unstable();
        up.dedup();
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

    fn standing_at(&self, position: usize) -> (&str, &Standing) {
        let required = &self.required[position];
        (required.name.as_str(), &required.standing)
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
        ];
        let hashes: HashMap<&str, UnitHash> = units.iter().map(|(spec, hash)| (spec.name.as_str(), *hash)).collect();
        let specs: Vec<UnitSpec> = units.iter().map(|(spec, _)| spec.clone()).collect();
        let mut index = DependencyIndex::build(&specs, &hashes);
        assert_eq!(index.named(), BTreeSet::from(["cache.service".to_string(), "db.service".to_string()]));
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
        let app = index.dependents().find(|(_, name)| *name == "app.service").map(|(position, _)| position);
        let app = app.expect("app waits");
        let both = [state("db.service", "m1", "active"), state("cache.service", "m2", "inactive")];
        assert_eq!(index.stand(&both).len(), 2, "the first reports move both from not reported");
        assert_eq!(index.evaluate(app).waiting, None);
        let places = index.up_of(&index.evaluate(app), &HashMap::from([("m1", "10.0.0.1")]));
        assert_eq!(places.iter().map(|place| place.public_ip.as_str()).collect::<Vec<_>>(), ["10.0.0.1"]);
        assert!(index.stand(&both).is_empty(), "nothing moved");
        let failed = [state("db.service", "m1", "failed"), state("cache.service", "m2", "inactive")];
        assert_eq!(index.stand(&failed), BTreeSet::from([app]));
        assert_eq!(index.evaluate(app).waiting.as_deref(), Some("waiting for db.service: failed on m1"));
    }
}
