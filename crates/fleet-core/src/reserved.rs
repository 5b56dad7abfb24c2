//! What units reserve on each machine, from where they are: a unit counts on the machine it
//! is scheduled to, a global unit on every machine that reports a state of it. The one tally
//! behind `fleetctl list-machines --fields reserved` and the web view's fill.

use std::collections::{BTreeMap, HashMap};

use crate::resources::Resources;

/// One unit as the tally needs it.
#[derive(Clone, Copy, Debug)]
pub struct UnitReservation<'a> {
    pub name: &'a str,
    pub reservation: Resources,
    pub global: bool,
    /// The machine it is scheduled to (none for a global unit).
    pub machine: Option<&'a str>,
}

/// The reservations on each machine, by machine ID; `reported` gives (unit, machine) for every
/// unit state a machine reported.
pub fn reserved_by_machine<'a>(
    units: impl IntoIterator<Item = UnitReservation<'a>>,
    reported: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, Resources> {
    let mut reserved: BTreeMap<String, Resources> = BTreeMap::new();
    let mut add = |machine: &str, reservation: Resources| {
        let total = reserved.entry(machine.to_string()).or_default();
        *total = total.saturating_add(reservation);
    };
    let mut globals: HashMap<&str, Resources> = HashMap::new();
    for unit in units.into_iter().filter(|unit| !unit.reservation.is_zero()) {
        match (unit.global, unit.machine.filter(|machine| !machine.is_empty())) {
            (true, _) => {
                globals.insert(unit.name, unit.reservation);
            }
            (false, Some(machine)) => add(machine, unit.reservation),
            (false, None) => {}
        }
    }
    for (unit, machine) in reported {
        if let Some(reservation) = globals.get(unit) {
            add(machine, *reservation);
        }
    }
    reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_count_where_they_are_scheduled_and_globals_where_they_run() {
        let gib = |n: u64| Resources { memory: n << 30, cpu_millis: 0 };
        let half_core = Resources { memory: 0, cpu_millis: 500 };
        let unit = |name, reservation, global, machine| UnitReservation { name, reservation, global, machine };
        let units = [
            unit("a.service", gib(1), false, Some("m1")),
            unit("b.service", half_core, false, Some("m1")),
            unit("c.service", gib(8), false, None),
            unit("g.service", gib(2), true, None),
            unit("free.service", Resources::ZERO, false, Some("m2")),
        ];
        let reported = [("a.service", "m1"), ("g.service", "m1"), ("g.service", "m2")];
        let reserved = reserved_by_machine(units, reported);
        assert_eq!(reserved["m1"], Resources { memory: 3 << 30, cpu_millis: 500 });
        assert_eq!(reserved["m2"], gib(2));
        assert_eq!(reserved.len(), 2, "an unplaced unit reserves nothing anywhere");
    }
}
