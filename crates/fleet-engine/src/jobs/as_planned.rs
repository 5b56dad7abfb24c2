//! What the planner sees of the units whose runs or stays the engine keeps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fleet_core::job::moves;
use fleet_core::job::runs::{self, JobRecord, RunPlace};
use fleet_core::schedule::ClusterSnapshot;
use fleet_core::{DesiredState, Requirements};

/// `cluster` as the planner is to see its scheduled units: wanted only while a run of theirs
/// is active and not ended, pinned to the machine it was given once it has one; a unit whose
/// record could not be written this pass is left out (left where it is).
pub(super) fn as_planned(
    mut cluster: ClusterSnapshot,
    scheduled: &BTreeMap<String, (Arc<Requirements>, DesiredState)>,
    records: &BTreeMap<String, JobRecord>,
    places: &BTreeMap<String, moves::Place>,
    contested: &BTreeSet<String>,
) -> ClusterSnapshot {
    cluster.units.retain(|unit| !contested.contains(&unit.name));
    for unit in &mut cluster.units {
        // A global unit on a calendar is on every machine it may run on, as any global unit:
        // the machines start it for each ticket.
        if !scheduled.contains_key(&unit.name) || unit.requirements.global {
            continue;
        }
        // A service that moves on failure is planned as any other, but while it waits after a
        // failure (off every machine) or tries again away from where it failed.
        if let Some(place) = places.get(&unit.name) {
            match place {
                moves::Place::AsWanted => {}
                moves::Place::Avoiding(avoid) => {
                    unit.requirements = Arc::new(Requirements { avoid: avoid.clone(), ..(*unit.requirements).clone() });
                }
                moves::Place::Off(_) => unit.desired = DesiredState::Inactive,
            }
            continue;
        }
        let record = records.get(&unit.name);
        match record.and_then(runs::runs_now) {
            None => unit.desired = DesiredState::Inactive,
            Some(RunPlace::Anywhere) => {
                unit.desired = DesiredState::Launched;
                let avoid = record.and_then(JobRecord::active_run).map(|run| run.avoid.clone()).unwrap_or_default();
                if !avoid.is_empty() {
                    unit.requirements = Arc::new(Requirements { avoid, ..(*unit.requirements).clone() });
                }
            }
            Some(RunPlace::On(machine)) => {
                unit.desired = DesiredState::Launched;
                let pinned = Requirements { machine_id: Some(machine.to_string()), ..(*unit.requirements).clone() };
                unit.requirements = Arc::new(pinned);
            }
        }
    }
    cluster
}
