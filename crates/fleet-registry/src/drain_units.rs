//! The units a drain concerns, as [`fleet_core::drain`] sees them, from what a store shows:
//! the units scheduled on the drained machine and the ones its drain let go.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};

use fleet_core::drain::{Drain, DrainUnit};
use fleet_core::{Requirements, UnitState};

use crate::UnitView;

/// The names of the units the drain of `machine` concerns, among `units`.
pub fn drain_unit_names(units: &[UnitView], machine: &str, drain: &Drain) -> BTreeSet<String> {
    units
        .iter()
        .filter(|unit| !unit.global && (unit.machine_id.as_deref() == Some(machine) || drain.lets_go(&unit.name)))
        .map(|unit| unit.name.clone())
        .collect()
}

/// Each unit the drain of `machine` concerns, with what the machines report of it (`states`
/// may hold any units' states).
pub fn drain_units<S: Borrow<UnitState>>(
    units: &[UnitView],
    states: &[S],
    machine: &str,
    drain: &Drain,
) -> Vec<DrainUnit> {
    let names = drain_unit_names(units, machine, drain);
    let mut reports: HashMap<&str, Vec<&UnitState>> = HashMap::new();
    for state in states.iter().map(Borrow::borrow).filter(|state| names.contains(&state.name)) {
        reports.entry(state.name.as_str()).or_default().push(state);
    }
    units
        .iter()
        .filter(|unit| names.contains(&unit.name))
        .map(|unit| {
            let requirements = Requirements::from_unit(&unit.name, &unit.file);
            let reported = reports.get(unit.name.as_str()).map_or(&[][..], Vec::as_slice);
            DrainUnit::of(&unit.name, unit.desired, unit.hash, unit.machine_id.as_deref(), &requirements, reported)
        })
        .collect()
}

/// The units of `budgeted` (those with a disruption budget) that `Requires=` others, each with
/// the patterns it requires ([`crate::BudgetedUnit::requires`]): a drain that lets one of those
/// others go takes from their budgets too.
pub fn budgeted_requirers(budgeted: &[crate::BudgetedUnit]) -> Vec<(String, Vec<fleet_core::glob::Glob>)> {
    budgeted
        .iter()
        .filter(|unit| !unit.requires.is_empty())
        .map(|unit| {
            let required = unit.requires.iter().filter_map(|pattern| fleet_core::glob::Glob::new(pattern)).collect();
            (unit.name.clone(), required)
        })
        .collect()
}

/// Notes on each of `drained` the units of `requirers` that require it.
pub fn note_required_by(drained: &mut [DrainUnit], requirers: &[(String, Vec<fleet_core::glob::Glob>)]) {
    for unit in drained {
        unit.required_by = requirers
            .iter()
            .filter(|(name, required)| *name != unit.name && required.iter().any(|glob| glob.matches(&unit.name)))
            .map(|(name, _)| name.clone())
            .collect();
    }
}
