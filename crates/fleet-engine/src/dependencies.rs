//! Units that wait for units on other machines (`[X-Fleet] Requires=`, `After=`): before each
//! plan, a unit whose dependencies are not met is kept off every machine for that plan (its
//! desired state taken as inactive), saying what it waits for. A unit that runs is left where
//! it is while what it requires is down, unless `RequiresGrace=` has passed: then it is taken
//! off too, and waits again. What counts as met is `fleet_core::dependency::waiting_for`; how
//! each unit stands comes from where it is scheduled and what that machine reports of its
//! current content.
//!
//! The same look gives, for each unit with dependencies, where the instances it names that
//! are up run ([`UpPlaces`]): once the plan says where each such unit goes, the engine records
//! them for its machine ([`places_to_record`]), which writes them into the unit's file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use fleet_core::dependency::{Dependencies, Dependency, Kind, Standing, standing_of, waiting_for};
use fleet_core::glob::Glob;
use fleet_core::required_places::{RequiredPlace, RequiredPlaces, next_places};
use fleet_core::schedule::{ClusterSnapshot, SnapshotUnit};
use fleet_core::schedule::{Decision, Plan};
use fleet_core::{DesiredState, UnitHash};
use fleet_registry::{EngineRegistry, RegistryError};

/// What the engine keeps between passes of the units that wait for units.
#[derive(Debug, Default)]
pub(crate) struct DependencyGate {
    /// Since when each running unit's `Requires=` has not been met (this leadership's sight).
    unmet_since: HashMap<String, Instant>,
    /// When the first `RequiresGrace=` of a running unit ends.
    pub grace_ends: Option<Instant>,
    /// Whether how other units stand may change a plan: a unit waits unplaced, or a running
    /// one may leave once its grace passes. The machines' reports wake the engine then.
    pub watching: bool,
}

/// The units a pass kept off, each with why.
pub(crate) type Waiting = Vec<(String, String)>;

/// For each unit with dependencies the pass did not keep off: where the instances it names
/// that are up run, sorted.
pub(crate) type UpPlaces = BTreeMap<String, Vec<RequiredPlace>>;

impl DependencyGate {
    /// `cluster` with each unit whose dependencies are not met kept off for this plan, the
    /// units kept off with why, and where what the others name runs. Reads the machines'
    /// reports of the units named, only when some unit has dependencies.
    pub async fn apply(
        &mut self,
        registry: &dyn EngineRegistry,
        mut cluster: ClusterSnapshot,
        listed: &[SnapshotUnit],
        now: Instant,
    ) -> Result<(ClusterSnapshot, Waiting, UpPlaces), RegistryError> {
        let dependents: Vec<usize> = (0..cluster.units.len())
            .filter(|&index| {
                let unit = &cluster.units[index];
                unit.desired != DesiredState::Inactive && !unit.requirements.dependencies.is_empty()
            })
            .collect();
        // How what they name stands may change a plan (a unit waits unplaced, or one that runs
        // may leave once its grace passes) or where they are told it runs.
        self.watching = !dependents.is_empty();
        if !self.watching {
            self.unmet_since.clear();
            self.grace_ends = None;
            return Ok((cluster, Vec::new(), UpPlaces::new()));
        }
        // Each item's pattern matched once over every unit's name.
        let mut matched: HashMap<&str, Vec<usize>> = HashMap::new();
        let by_name: HashMap<&str, usize> =
            cluster.units.iter().enumerate().map(|(index, unit)| (unit.name.as_str(), index)).collect();
        for &index in &dependents {
            for item in &cluster.units[index].requirements.dependencies.items {
                if matched.contains_key(item.pattern.as_str()) {
                    continue;
                }
                let Some(glob) = Glob::new(&item.pattern) else { continue };
                let found = match glob.literal() {
                    Some(name) => by_name.get(name.as_str()).copied().into_iter().collect(),
                    None => {
                        (0..cluster.units.len()).filter(|&other| glob.matches(&cluster.units[other].name)).collect()
                    }
                };
                matched.insert(item.pattern.as_str(), found);
            }
        }
        let named: BTreeSet<String> =
            matched.values().flatten().map(|&index| cluster.units[index].name.clone()).collect();
        let states = registry.reported_states(&named).await?;
        let hashes: HashMap<&str, UnitHash> = listed.iter().map(|unit| (unit.name.as_str(), unit.hash)).collect();
        let standing: HashMap<usize, Standing> = matched
            .values()
            .flatten()
            .map(|&index| {
                let unit = &cluster.units[index];
                let hash = hashes.get(unit.name.as_str()).copied();
                (index, standing_of(unit.scheduled_on.as_deref(), hash, &unit.name, &states))
            })
            .collect();
        let names_of = |item: &Dependency| -> Vec<(&str, &Standing)> {
            matched
                .get(item.pattern.as_str())
                .into_iter()
                .flatten()
                .filter_map(|index| Some((cluster.units[*index].name.as_str(), standing.get(index)?)))
                .collect()
        };
        let mut waiting = Vec::new();
        let mut keep_off = Vec::new();
        let mut still_unmet = HashMap::new();
        let mut grace_ends: Option<Instant> = None;
        for &index in &dependents {
            let unit = &cluster.units[index];
            let dependencies = &unit.requirements.dependencies;
            if unit.scheduled_on.is_none() {
                if let Some(why) = waiting_for(dependencies, names_of) {
                    waiting.push((unit.name.clone(), why));
                    keep_off.push(index);
                }
                continue;
            }
            // A unit that runs stops only for what it requires, and only past its grace.
            let Some(grace) = dependencies.grace else { continue };
            let required = Dependencies {
                items: dependencies.items.iter().filter(|item| item.kind == Kind::Requires).cloned().collect(),
                grace: Some(grace),
                on_change: dependencies.on_change,
            };
            let Some(why) = waiting_for(&required, names_of) else { continue };
            let since = *self.unmet_since.get(&unit.name).unwrap_or(&now);
            still_unmet.insert(unit.name.clone(), since);
            if now.duration_since(since) >= grace {
                let grace = fleet_core::duration::short_span(grace);
                waiting.push((unit.name.clone(), format!("{why} (RequiresGrace={grace} passed)")));
                keep_off.push(index);
            } else {
                let ends = since + grace;
                grace_ends = Some(grace_ends.map_or(ends, |first| first.min(ends)));
            }
        }
        self.grace_ends = grace_ends;
        self.unmet_since = still_unmet;
        let ips: HashMap<&str, &str> =
            cluster.machines.iter().map(|machine| (machine.id.as_str(), machine.public_ip.as_str())).collect();
        let mut places = UpPlaces::new();
        let kept: std::collections::HashSet<usize> = keep_off.iter().copied().collect();
        for &index in dependents.iter().filter(|index| !kept.contains(index)) {
            let unit = &cluster.units[index];
            let mut up: Vec<RequiredPlace> = unit
                .requirements
                .dependencies
                .items
                .iter()
                .flat_map(|item| matched.get(item.pattern.as_str()).into_iter().flatten())
                .filter(|other| standing.get(*other) == Some(&Standing::Up))
                .filter_map(|&other| {
                    let required = &cluster.units[other];
                    let machine = required.scheduled_on.as_deref()?;
                    Some(RequiredPlace {
                        unit: required.name.clone(),
                        machine_id: machine.to_string(),
                        public_ip: ips.get(machine).copied().unwrap_or_default().to_string(),
                    })
                })
                .collect();
            up.sort();
            up.dedup();
            places.insert(unit.name.clone(), up);
        }
        for index in keep_off {
            cluster.units[index].desired = DesiredState::Inactive;
        }
        waiting.sort();
        Ok((cluster, waiting, places))
    }
}

/// What to record of where requirements run once `plan` is written over `cluster`: for each
/// unit of `up` placed somewhere after the plan, the places up now, or those recorded for it
/// on that machine before (`before`) while none is up; nothing for a unit with no place yet.
pub(crate) fn places_to_record(
    up: &UpPlaces,
    cluster: &ClusterSnapshot,
    plan: &Plan,
    before: &[RequiredPlaces],
) -> Vec<RequiredPlaces> {
    let mut machine_of: HashMap<&str, Option<&str>> = cluster
        .units
        .iter()
        .filter(|unit| up.contains_key(&unit.name))
        .map(|unit| (unit.name.as_str(), unit.scheduled_on.as_deref()))
        .collect();
    for decision in &plan.decisions {
        match decision {
            Decision::Schedule { unit, machine } if up.contains_key(unit) => {
                machine_of.insert(unit.as_str(), Some(machine.as_str()));
            }
            Decision::Unschedule { unit, .. } if up.contains_key(unit) => {
                machine_of.insert(unit.as_str(), None);
            }
            _ => {}
        }
    }
    let before: HashMap<(&str, &str), &[RequiredPlace]> = before
        .iter()
        .map(|record| ((record.unit.as_str(), record.machine.as_str()), record.places.as_slice()))
        .collect();
    let mut records: Vec<RequiredPlaces> = up
        .iter()
        .filter_map(|(unit, places)| {
            let machine = (*machine_of.get(unit.as_str())?)?;
            let places = next_places(places.clone(), before.get(&(unit.as_str(), machine)).copied());
            (!places.is_empty()).then(|| RequiredPlaces { unit: unit.clone(), machine: machine.to_string(), places })
        })
        .collect();
    records.sort_by(|a, b| a.unit.cmp(&b.unit));
    records
}
