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
