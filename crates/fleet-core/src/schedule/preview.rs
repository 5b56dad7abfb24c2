//! What a change to the units would do to the schedule, before it is made: the engine's own
//! planner run twice, on the cluster as it stands and on the cluster with the change, writing
//! nothing. `fleetctl plan` shows it. The second run is the [`IncrementalPlanner`]'s, which
//! remembers where the first left the cluster: a change of free units (new instances, say) is
//! planned in proportion to itself, and the plan is [`super::plan`]'s all the same.
//!
//! The cluster as it stands is first settled (the decisions the engine is about to write are
//! taken as written), so a preview shows what the change itself does, not what the engine
//! owes the cluster anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::{ClusterSnapshot, Decision, IncrementalPlanner, Plan, UnitSpec};
use crate::drain::Drain;
use crate::requirements::Requirements;
use crate::rollout::MaxUnavailable;
use crate::state::DesiredState;

/// One change to preview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreviewChange {
    /// The unit (new, or existing with this content or desired state) as the change leaves it:
    /// `requirements` of its new content, or `None` to keep what it has.
    Set { name: String, desired: DesiredState, requirements: Option<Arc<Requirements>> },
    /// The unit destroyed.
    Destroy { name: String },
    /// The machine drained, every unit on it let go at once. A drain lets them go in waves:
    /// where a later wave lands may differ when the machines' loads changed meanwhile.
    Drain { machine: String },
}

/// Where a unit is, before and after the change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviewedUnit {
    pub name: String,
    /// Its machine as things stand (`None`: unplaced, or not a unit yet).
    pub before: Option<String>,
    /// Its machine once the change is made (`None`: unplaced or destroyed).
    pub after: Option<String>,
    /// Why the engine would leave it unplaced (or on a draining machine) after the change.
    pub waiting: Option<String>,
    /// Whether the change names it (the others are units it moves).
    pub changed: bool,
}

/// What a change does to the schedule: every unit it names, then every other unit it moves,
/// each in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preview {
    pub units: Vec<PreviewedUnit>,
}

/// Previews `changes` on `cluster` (a change of a unit the cluster does not hold creates it).
pub fn preview(cluster: &ClusterSnapshot, changes: &[PreviewChange]) -> Preview {
    let mut planner = IncrementalPlanner::default();
    let (first, _) = planner.plan(cluster);
    let standing = settled(cluster.clone(), &first);
    let before: BTreeMap<String, Option<String>> =
        standing.units.iter().map(|unit| (unit.name.clone(), unit.scheduled_on.clone())).collect();
    let mut named: BTreeSet<String> = BTreeSet::new();
    for change in changes {
        match change {
            PreviewChange::Set { name, .. } | PreviewChange::Destroy { name } => {
                named.insert(name.clone());
            }
            PreviewChange::Drain { machine } => named.extend(
                standing
                    .units
                    .iter()
                    .filter(|unit| unit.scheduled_on.as_deref() == Some(machine))
                    .map(|unit| unit.name.clone()),
            ),
        }
    }
    let changed = with_changes(standing, changes);
    let (after_plan, _) = planner.plan(&changed);
    let waiting: BTreeMap<String, String> = after_plan.reason_texts().into_iter().collect();
    let after_cluster = settled(changed, &after_plan);
    let after: BTreeMap<&str, Option<&str>> =
        after_cluster.units.iter().map(|unit| (unit.name.as_str(), unit.scheduled_on.as_deref())).collect();
    let previewed = |name: &str, changed: bool| PreviewedUnit {
        name: name.to_string(),
        before: before.get(name).cloned().flatten(),
        after: after.get(name).copied().flatten().map(str::to_string),
        waiting: waiting.get(name).cloned(),
        changed,
    };
    let mut units: Vec<PreviewedUnit> = named.iter().map(|name| previewed(name, true)).collect();
    let moved = after.iter().filter(|(name, machine)| {
        !named.contains(**name) && before.get(**name).map(Option::as_deref) != Some(**machine)
    });
    units.extend(moved.map(|(name, _)| previewed(name, false)));
    Preview { units }
}

/// `cluster` with `plan`'s decisions taken as written.
fn settled(mut cluster: ClusterSnapshot, plan: &Plan) -> ClusterSnapshot {
    let mut placed: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for decision in &plan.decisions {
        match decision {
            Decision::Schedule { unit, machine } => {
                placed.insert(unit, Some(machine));
            }
            Decision::Unschedule { unit, .. } => {
                placed.entry(unit).or_insert(None);
            }
        }
    }
    for unit in &mut cluster.units {
        if let Some(machine) = placed.get(unit.name.as_str()) {
            unit.scheduled_on = machine.map(str::to_string);
        }
    }
    cluster
}

/// `cluster` with `changes` made, as the store would hold them: a unit given new content
/// keeps its machine (the engine then judges whether it may stay), a destroyed one goes.
fn with_changes(mut cluster: ClusterSnapshot, changes: &[PreviewChange]) -> ClusterSnapshot {
    let mut position: HashMap<String, usize> =
        cluster.units.iter().enumerate().map(|(index, unit)| (unit.name.clone(), index)).collect();
    let mut destroyed = HashSet::new();
    for change in changes {
        match change {
            PreviewChange::Destroy { name } => {
                destroyed.insert(name.as_str());
            }
            PreviewChange::Drain { machine } => {
                let on_it = cluster.units.iter().filter(|unit| unit.scheduled_on.as_deref() == Some(machine));
                let released = on_it.map(|unit| (unit.name.clone(), 0)).collect();
                if let Some(drained) = cluster.machines.iter_mut().find(|candidate| candidate.id == *machine) {
                    let standing = drained.drain.take();
                    let max_unavailable = standing.map_or(MaxUnavailable::Count(1), |drain| drain.max_unavailable);
                    drained.drain = Some(Drain { released, ..Drain::new(max_unavailable, 0) });
                }
            }
            PreviewChange::Set { name, desired, requirements } => match position.get(name) {
                Some(index) => {
                    let unit = &mut cluster.units[*index];
                    unit.desired = *desired;
                    if let Some(requirements) = requirements {
                        unit.requirements = requirements.clone();
                    }
                }
                // A new unit comes with its content (the real command refuses one without,
                // before anything is planned).
                None => {
                    let Some(requirements) = requirements else { continue };
                    position.insert(name.clone(), cluster.units.len());
                    cluster.units.push(UnitSpec {
                        name: name.clone(),
                        desired: *desired,
                        requirements: requirements.clone(),
                        scheduled_on: None,
                    });
                }
            },
        }
    }
    cluster.units.retain(|unit| !destroyed.contains(unit.name.as_str()));
    cluster
}

#[cfg(test)]
mod tests;
