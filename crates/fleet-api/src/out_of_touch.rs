//! Machines out of touch that units wait for (`LostAfter=`, `AtMostOnce=`), as lists show them
//! when asked (`?outOfTouch=true`, our addition: the original's clients, which do not ask, see
//! the present machines and the reported states alone, as before): each machine with its last
//! address and metadata, and each unit that waits for it as `unknown`.

use std::collections::HashSet;

use fleet_core::OutOfTouch;
use fleet_core::civil_time::rfc3339_of_micros;

use fleet_registry::ApiRegistry;

use crate::error::ApiError;
use crate::schema::{Machine, UnitState};

/// The word a unit waiting for its machine shows for its systemd states.
pub const UNKNOWN: &str = "unknown";

/// The machines out of touch the engine recorded that are not present again (a machine back
/// is left out until the engine's next pass forgets it).
pub async fn machines(registry: &dyn ApiRegistry) -> Result<Vec<OutOfTouch>, ApiError> {
    let recorded = registry.machines_out_of_touch().await?;
    if recorded.is_empty() {
        return Ok(recorded);
    }
    let present: HashSet<String> = registry.machines().await?.into_iter().map(|machine| machine.id).collect();
    Ok(recorded.into_iter().filter(|machine| !present.contains(&machine.id)).collect())
}

/// A machine out of touch as `/machines` lists it.
pub fn listed_machine(machine: OutOfTouch) -> Machine {
    let last = machine.last.unwrap_or_default();
    Machine {
        out_of_touch_since: rfc3339_of_micros(machine.since),
        connection: last.connection.word().to_string(),
        taints: fleet_core::taint::written(&last.taints),
        id: machine.id,
        metadata: last.metadata,
        primary_ip: last.public_ip,
        version: last.version,
        ..Machine::default()
    }
}

/// The units that wait for `machines` and that `admits`, as `/state` lists them, in name order.
pub fn unit_states(machines: &[OutOfTouch], admits: impl Fn(&str, &str) -> bool) -> Vec<UnitState> {
    let mut states: Vec<UnitState> = machines
        .iter()
        .flat_map(|machine| machine.units.iter().map(move |unit| (machine, unit)))
        .filter(|(machine, unit)| admits(unit, &machine.id))
        .map(|(machine, unit)| UnitState {
            machine_id: machine.id.clone(),
            name: unit.clone(),
            systemd_active_state: UNKNOWN.to_string(),
            systemd_load_state: UNKNOWN.to_string(),
            systemd_sub_state: UNKNOWN.to_string(),
            out_of_touch_since: rfc3339_of_micros(machine.since),
            ..UnitState::default()
        })
        .collect();
    states.sort_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
    states
}
