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
    /// Where the instances its items name that are up run (machine ID; IPs are the caller's).
    pub up: Vec<(String, String)>,
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
        let mut up: Vec<(String, String)> = dependent
            .items
            .iter()
            .flatten()
            .map(|&p| &self.required[p])
            .filter(|required| required.standing == Standing::Up)
            .filter_map(|required| Some((required.name.clone(), required.on.clone()?)))
            .collect();
        up.sort();
        up.dedup();
        Evaluation { waiting, requires_unmet, up }
    }

    fn standing_at(&self, position: usize) -> (&str, &Standing) {
        let required = &self.required[position];
        (required.name.as_str(), &required.standing)
    }
}

/// `up` as places, each machine's IP from `ips`.
pub fn places_of(up: &[(String, String)], ips: &HashMap<&str, &str>) -> Vec<RequiredPlace> {
    up.iter()
        .map(|(unit, machine)| RequiredPlace {
            unit: unit.clone(),
            machine_id: machine.clone(),
            public_ip: ips.get(machine.as_str()).copied().unwrap_or_default().to_string(),
        })
        .collect()
}
