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

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use fleet_core::dependency::index::{DependencyIndex, Evaluation};
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
    /// Whether how other units stand may change a plan or what units are told: some unit
    /// has dependencies. The machines' reports wake the engine then.
    pub watching: bool,
    /// The index of the cluster revision looked at last, with what each of its dependents
    /// made of it then.
    looked: Option<Looked>,
}

#[derive(Debug)]
struct Looked {
    revision: u64,
    index: DependencyIndex,
    evaluations: Vec<Evaluation>,
}

/// The units a pass kept off, each with why.
pub(crate) type Waiting = Vec<(String, String)>;

/// For each unit with dependencies the pass did not keep off: where the instances it names
/// that are up run, sorted.
pub(crate) type UpPlaces = BTreeMap<String, Vec<RequiredPlace>>;

impl DependencyGate {
    /// Whether the machines' reports may change a plan of cluster `revision`, as far as
    /// dependencies go: reads only the states of the units named and re-evaluates only the
    /// units that name one whose standing moved. `true` when the revision is not the one
    /// looked at last, or a grace ended (a full pass is due then).
    pub async fn reports_matter(
        &mut self,
        registry: &dyn EngineRegistry,
        revision: Option<u64>,
        now: Instant,
    ) -> Result<bool, RegistryError> {
        let Some(looked) = self.looked.as_mut().filter(|looked| Some(looked.revision) == revision) else {
            return Ok(true);
        };
        if self.grace_ends.is_some_and(|ends| ends <= now) {
            return Ok(true);
        }
        let states = registry.reported_states(&looked.index.named()).await?;
        let mut matters = false;
        for position in looked.index.stand(&states) {
            let evaluation = looked.index.evaluate(position);
            matters |= evaluation != looked.evaluations[position];
            looked.evaluations[position] = evaluation;
        }
        Ok(matters)
    }

    /// `cluster` (of `revision`) with each unit whose dependencies are not met kept off for
    /// this plan, the units kept off with why, and where what the others name runs. Reads
    /// the machines' reports of the units named, only when some unit has dependencies.
    pub async fn apply(
        &mut self,
        registry: &dyn EngineRegistry,
        (mut cluster, revision): (ClusterSnapshot, u64),
        listed: &[SnapshotUnit],
        now: Instant,
    ) -> Result<(ClusterSnapshot, Waiting, UpPlaces), RegistryError> {
        let mut looked = match self.looked.take().filter(|looked| looked.revision == revision) {
            Some(looked) => looked,
            None => {
                let hashes: HashMap<&str, UnitHash> =
                    listed.iter().map(|unit| (unit.name.as_str(), unit.hash)).collect();
                let present: std::collections::HashSet<&str> =
                    cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
                let index = DependencyIndex::build(&cluster.units, &hashes, |machine| present.contains(machine));
                Looked { revision, index, evaluations: Vec::new() }
            }
        };
        self.watching = !looked.index.is_empty();
        if !self.watching {
            self.unmet_since.clear();
            self.grace_ends = None;
            self.looked = Some(looked);
            return Ok((cluster, Vec::new(), UpPlaces::new()));
        }
        let states = registry.reported_states(&looked.index.named()).await?;
        looked.index.stand(&states);
        looked.evaluations = looked.index.dependents().map(|(position, _)| looked.index.evaluate(position)).collect();
        let mut waiting = Vec::new();
        let mut keep_off = Vec::new();
        let mut still_unmet = HashMap::new();
        let mut grace_ends: Option<Instant> = None;
        for (position, name) in looked.index.dependents() {
            let evaluation = &looked.evaluations[position];
            let (placed, grace) = looked.index.placed_and_grace(position);
            if !placed {
                if let Some(why) = &evaluation.waiting {
                    waiting.push((name.to_string(), why.clone()));
                    keep_off.push(name);
                }
                continue;
            }
            // A unit that runs stops only for what it requires, and only past its grace.
            let (Some(grace), Some(why)) = (grace, &evaluation.requires_unmet) else { continue };
            let since = *self.unmet_since.get(name).unwrap_or(&now);
            still_unmet.insert(name.to_string(), since);
            if now.duration_since(since) >= grace {
                let grace = fleet_core::duration::short_span(grace);
                waiting.push((name.to_string(), format!("{why} (RequiresGrace={grace} passed)")));
                keep_off.push(name);
            } else {
                let ends = since + grace;
                grace_ends = Some(grace_ends.map_or(ends, |first| first.min(ends)));
            }
        }
        self.grace_ends = grace_ends;
        self.unmet_since = still_unmet;
        let ips: HashMap<&str, &str> =
            cluster.machines.iter().map(|machine| (machine.id.as_str(), machine.public_ip.as_str())).collect();
        let kept: std::collections::HashSet<&str> = keep_off.iter().copied().collect();
        let places: UpPlaces = looked
            .index
            .dependents()
            .filter(|(_, name)| !kept.contains(name))
            .map(|(position, name)| (name.to_string(), looked.index.up_of(&looked.evaluations[position], &ips)))
            .collect();
        for unit in cluster.units.iter_mut().filter(|unit| kept.contains(unit.name.as_str())) {
            unit.desired = DesiredState::Inactive;
        }
        waiting.sort();
        self.looked = Some(looked);
        Ok((cluster, waiting, places))
    }
}

/// What to record of where requirements run once `plan` is written over `cluster`: for each
/// unit of `up` placed somewhere after the plan, the places up now, or those recorded for it
/// on that machine before (`before`) while none is up; nothing for a unit with no place yet.
/// A unit kept off (not in `up`) keeps its record while the cluster still has it on that
/// machine: the record is written before the plan, and its machine must not see the file
/// change (and restart the unit with what it names gone) before it sees the unit leave.
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
    let leaving = cluster.units.iter().filter(|unit| !up.contains_key(&unit.name)).filter_map(|unit| {
        let machine = unit.scheduled_on.as_deref()?;
        let places = before.get(&(unit.name.as_str(), machine))?;
        Some(RequiredPlaces { unit: unit.name.clone(), machine: machine.to_string(), places: places.to_vec() })
    });
    records.extend(leaving);
    records.sort_by(|a, b| a.unit.cmp(&b.unit));
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(unit: &str, machine: &str) -> RequiredPlace {
        RequiredPlace { unit: unit.into(), machine_id: machine.into(), public_ip: format!("10.0.0.{}", machine.len()) }
    }

    fn cluster_with_app_on(machine: Option<&str>) -> ClusterSnapshot {
        let file = fleet_core::UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nRequires=db.service\n")
            .expect("a unit");
        let app = fleet_core::schedule::UnitSpec {
            name: "app.service".into(),
            desired: DesiredState::Launched,
            requirements: std::sync::Arc::new(fleet_core::Requirements::from_unit("app.service", &file)),
            scheduled_on: machine.map(str::to_string),
        };
        ClusterSnapshot { units: vec![app], ..ClusterSnapshot::default() }
    }

    /// Regression (loaded suite, dependencies_on_etcd): an app taken off past its grace lost
    /// its record in the same pass, written before its unschedule; its machine saw the file go
    /// first and restarted the app with nothing in it, then stopped it.
    #[test]
    fn a_unit_kept_off_keeps_its_record_until_it_has_left_its_machine() {
        let before = vec![RequiredPlaces {
            unit: "app.service".into(),
            machine: "m2".into(),
            places: vec![place("db.service", "m0")],
        }];
        let cluster = cluster_with_app_on(Some("m2"));
        let leaving = Plan {
            decisions: vec![Decision::Unschedule {
                unit: "app.service".into(),
                machine: "m2".into(),
                reason: fleet_core::schedule::UnscheduleReason::TargetStateInactive,
            }],
            ..Plan::default()
        };
        assert_eq!(places_to_record(&UpPlaces::new(), &cluster, &leaving, &before), before, "still on m2");
        let gone = cluster_with_app_on(None);
        assert_eq!(places_to_record(&UpPlaces::new(), &gone, &Plan::default(), &before), Vec::new(), "it left");
        let back = UpPlaces::from([("app.service".to_string(), vec![place("db.service", "m1")])]);
        let placed = Plan {
            decisions: vec![Decision::Schedule { unit: "app.service".into(), machine: "m2".into() }],
            ..Plan::default()
        };
        assert_eq!(
            places_to_record(&back, &gone, &placed, &before),
            vec![RequiredPlaces {
                unit: "app.service".into(),
                machine: "m2".into(),
                places: vec![place("db.service", "m1")],
            }]
        );
    }
}
