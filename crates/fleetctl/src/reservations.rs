//! What units reserve on each machine, from the units the API lists (their `[X-Fleet]` and
//! systemd limits) and the states machines report, and how fleetctl shows it.

use std::collections::BTreeMap;

use fleet_api_schema::{Capacity, Unit, UnitState};
use fleet_core::Resources;
use fleet_core::requirements::reservation_of;
use fleet_core::reserved::UnitReservation;
use fleet_core::resources::{Bytes, Cores};

use crate::commands::create::{is_global, unit_file};

/// The reservations on each machine, by machine ID.
pub fn reserved_by_machine(units: &[Unit], states: &[UnitState]) -> BTreeMap<String, Resources> {
    let units = units.iter().map(|unit| UnitReservation {
        name: &unit.name,
        reservation: reservation_of(unit_file(unit).options()).unwrap_or_default(),
        global: is_global(unit),
        machine: unit.machine_id.as_deref(),
    });
    fleet_core::reserved::reserved_by_machine(
        units,
        states.iter().map(|state| (state.name.as_str(), state.machine_id.as_str())),
    )
}

/// `8 GiB, 4 CPU`, or `-` for a machine that does not say.
pub fn capacity_cell(capacity: Option<Capacity>) -> String {
    capacity.map_or_else(|| "-".to_string(), |capacity| cell(capacity.into()))
}

/// `2 GiB, 1.5 CPU`, marked when it is more than the machine's capacity (a machine whose
/// capacity shrank keeps what it has).
pub fn reserved_cell(reserved: Resources, capacity: Option<Capacity>) -> String {
    let over = capacity.is_some_and(|capacity| reserved.exceeds(capacity.into()));
    format!("{}{}", cell(reserved), if over { " (over capacity)" } else { "" })
}

fn cell(amounts: Resources) -> String {
    format!("{}, {} CPU", Bytes(amounts.memory), Cores(amounts.cpu_millis))
}

#[cfg(test)]
mod tests {
    use fleet_api_schema::UnitOption;

    use super::*;

    fn unit(name: &str, machine: &str, x_fleet: &[(&str, &str)]) -> Unit {
        let options = x_fleet
            .iter()
            .map(|(name, value)| UnitOption { section: "X-Fleet".into(), name: (*name).into(), value: (*value).into() })
            .collect();
        let machine_id = Some(machine.to_string()).filter(|machine| !machine.is_empty());
        Unit { name: name.into(), machine_id, options, ..Unit::default() }
    }

    fn state(name: &str, machine: &str) -> UnitState {
        UnitState { name: name.into(), machine_id: machine.into(), ..UnitState::default() }
    }

    #[test]
    fn units_count_where_they_are_scheduled_and_globals_where_they_run() {
        let units = [
            unit("a.service", "m1", &[("Memory", "1G")]),
            unit("b.service", "m1", &[("CPU", "0.5")]),
            unit("c.service", "", &[("Memory", "8G")]),
            unit("g.service", "", &[("Global", "true"), ("Memory", "512M")]),
            unit("free.service", "m2", &[]),
        ];
        let states = [state("a.service", "m1"), state("g.service", "m1"), state("g.service", "m2")];
        let reserved = reserved_by_machine(&units, &states);
        assert_eq!(reserved["m1"], Resources { memory: (1 << 30) + (512 << 20), cpu_millis: 500 });
        assert_eq!(reserved["m2"], Resources { memory: 512 << 20, cpu_millis: 0 });
        assert_eq!(reserved.len(), 2, "an unplaced unit reserves nothing anywhere");
    }

    #[test]
    fn cells_say_what_is_there_and_mark_an_over_commitment() {
        let capacity = Capacity { memory_bytes: 4 << 30, cpu_millicores: 2000 };
        assert_eq!(capacity_cell(Some(capacity)), "4 GiB, 2 CPU");
        assert_eq!(capacity_cell(None), "-");
        let within = Resources { memory: 1 << 30, cpu_millis: 1500 };
        assert_eq!(reserved_cell(within, Some(capacity)), "1 GiB, 1.5 CPU");
        let over = Resources { memory: 6 << 30, cpu_millis: 0 };
        assert_eq!(reserved_cell(over, Some(capacity)), "6 GiB, 0 CPU (over capacity)");
        assert_eq!(reserved_cell(over, None), "6 GiB, 0 CPU");
    }
}
