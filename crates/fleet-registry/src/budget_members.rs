//! The units that have a disruption budget, as [`fleet_core::disruption_budget`] counts them,
//! from what a store shows: each one's group, the value of its budget's key on its machine,
//! and whether it is down now.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};

use fleet_core::disruption_budget::{DisruptionBudget, Member, budget_of};
use fleet_core::drain::Drain;
use fleet_core::health::HealthStatus;
use fleet_core::rollout::{RolloutState, Step};
use fleet_core::unit_file::last_value;
use fleet_core::{DesiredState, MachineState, Requirements, UnitState};

use crate::{RolloutRecord, UnitView};

/// The units among `units` whose file states a disruption budget, with it (read once here:
/// the callers ask the machines' reports of these alone).
pub fn budgeted_units(units: &[UnitView]) -> Vec<(&UnitView, DisruptionBudget)> {
    units
        .iter()
        .filter(|unit| {
            !unit.global
                && last_value(unit.file.options(), fleet_core::unit_file::X_FLEET, "DisruptionBudget").is_some()
        })
        .filter_map(|unit| Some((unit, budget_of(&unit.name, unit.file.options()).ok().flatten()?)))
        .collect()
}

/// Every budgeted unit that should run (`budgeted`, from [`budgeted_units`]) as the ledger
/// counts it. It is down when the machine it is scheduled on does not report it on its
/// current content as it should be (active and not unhealthy, when it should run), when a
/// drain let it go, when a running rollout is replacing it, or when `pending` says a
/// disruption decided a moment ago has not reached what the store shows yet.
pub fn budget_members<U: Borrow<UnitView>, S: Borrow<UnitState>>(
    budgeted: &[(U, DisruptionBudget)],
    states: &[S],
    drains: &[(String, Drain)],
    rollouts: &[impl Borrow<RolloutRecord>],
    machines: &[MachineState],
    pending: impl Fn(&UnitView) -> bool,
) -> Vec<Member> {
    let names: BTreeSet<&str> = budgeted.iter().map(|(unit, _)| unit.borrow().name.as_str()).collect();
    let mut reports: HashMap<&str, Vec<&UnitState>> = HashMap::new();
    for state in states.iter().map(Borrow::borrow).filter(|state| names.contains(state.name.as_str())) {
        reports.entry(state.name.as_str()).or_default().push(state);
    }
    let released: HashSet<&str> =
        drains.iter().flat_map(|(_, drain)| drain.released.keys()).map(String::as_str).collect();
    let replacing: HashSet<&str> = rollouts
        .iter()
        .map(Borrow::borrow)
        .filter(|record| record.rollout.state == RolloutState::Running)
        .flat_map(|record| &record.rollout.units)
        .filter(|unit| matches!(unit.step, Step::Replacing { .. }))
        .map(|unit| unit.name.as_str())
        .collect();
    let metadata: HashMap<&str, &std::collections::BTreeMap<String, String>> =
        machines.iter().map(|machine| (machine.id.as_str(), &machine.metadata)).collect();
    budgeted
        .iter()
        .map(|(unit, budget)| (unit.borrow(), budget))
        .filter(|(unit, _)| unit.desired != DesiredState::Inactive)
        .map(|(unit, budget)| {
            let on = unit.machine_id.as_deref();
            let runs_well = reports.get(unit.name.as_str()).into_iter().flatten().any(|state| {
                Some(state.machine_id.as_str()) == on
                    && state.hash == unit.hash
                    && (unit.desired != DesiredState::Launched
                        || (state.systemd.active == "active"
                            && state.health.as_ref().is_none_or(|report| report.status != HealthStatus::Unhealthy)))
            });
            let name = unit.name.as_str();
            let down = !runs_well || released.contains(name) || replacing.contains(name) || pending(unit);
            let value = budget.by.as_ref().and_then(|key| metadata.get(on?)?.get(key).cloned());
            let group = Requirements::from_unit(&unit.name, &unit.file).spread_group_of(&unit.name);
            Member { name: unit.name.clone(), group, budget: budget.clone(), value, down }
        })
        .collect()
}
