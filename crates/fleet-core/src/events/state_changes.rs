//! The events a machine's report of one unit makes: its state when its active or sub state
//! moved, its health when its verdict did. Other fields (launched, drift, secrets, runs) make
//! none: the stream says what an operator watches, not every report.

use super::{EventKind, NewEvent};
use crate::UnitState;
use crate::health::HealthStatus;
use crate::state_report::StateReport;

/// The events `report` makes, given what the machine reported of the unit before.
pub fn state_changes(before: Option<&UnitState>, report: &StateReport, at: i64) -> Vec<NewEvent> {
    let mut events = Vec::new();
    match report {
        StateReport::Set(now) => {
            let moved = before.is_none_or(|before| {
                before.systemd.active != now.systemd.active || before.systemd.sub != now.systemd.sub
            });
            if moved {
                let was = before.map_or_else(
                    || "new".to_string(),
                    |before| format!("{}/{}", before.systemd.active, before.systemd.sub),
                );
                let message = format!("{}/{} (was {was})", now.systemd.active, now.systemd.sub);
                events
                    .push(NewEvent::new(at, EventKind::State, message).of_unit(&now.name).on_machine(&now.machine_id));
            }
            let verdict = |state: Option<&UnitState>| state.and_then(|state| state.health.as_ref()).map(|h| h.status);
            let (was, is) = (verdict(before), verdict(Some(now)));
            if is != was && is.is_some_and(|status| status != HealthStatus::Unknown) {
                let health = now.health.as_ref();
                let mut message = is.map_or("unknown", HealthStatus::word).to_string();
                if let Some(failure) = health.map(|h| h.failure.as_str()).filter(|failure| !failure.is_empty()) {
                    message = format!("{message}: {failure}");
                }
                if health.is_some_and(|h| h.given_up) {
                    message.push_str(" (restarted too often: given up)");
                }
                events
                    .push(NewEvent::new(at, EventKind::Health, message).of_unit(&now.name).on_machine(&now.machine_id));
            }
        }
        StateReport::Remove(name) => {
            if let Some(before) = before {
                let message = format!("gone (was {}/{})", before.systemd.active, before.systemd.sub);
                events.push(NewEvent::new(at, EventKind::State, message).of_unit(name).on_machine(&before.machine_id));
            }
        }
    }
    events
}
