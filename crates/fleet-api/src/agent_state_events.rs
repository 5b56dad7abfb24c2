//! The state and health events of pull agents' units, made by their manager as it takes their
//! reports: what each machine last reported of each unit (its states, without what events do
//! not say) against what it reports now. A machine's first report to this manager (it
//! started, or the agent came over from another) only teaches it what runs: the stream says
//! what changed, not that a manager started.

use std::collections::HashMap;
use std::sync::Mutex;

use fleet_core::UnitState;
use fleet_core::events::{NewEvent, state_changes};
use fleet_core::state_report::StateReport;
use fleet_core::unpoisoned::Locked;

#[derive(Default)]
pub struct AgentStateEvents {
    /// Per machine, per unit: what it last reported, as the events compare it.
    seen: Mutex<HashMap<String, HashMap<String, UnitState>>>,
}

/// `state` with only what the events compare: a unit's secrets, drift and runs make none.
fn as_compared(state: &UnitState) -> UnitState {
    UnitState { drift: None, secrets: Default::default(), run: None, ..state.clone() }
}

impl AgentStateEvents {
    /// The events `reports` of `machine` make, at `at`; learns them.
    pub fn events_of(&self, machine: &str, reports: &[StateReport], at: i64) -> Vec<NewEvent> {
        let mut seen = self.seen.locked();
        let known = seen.contains_key(machine);
        let units = seen.entry(machine.to_string()).or_default();
        let mut events = Vec::new();
        for report in reports {
            match report {
                StateReport::Set(state) => {
                    if known {
                        events.extend(state_changes(units.get(&state.name), report, at));
                    }
                    units.insert(state.name.clone(), as_compared(state));
                }
                StateReport::Remove(name) => {
                    if known {
                        events.extend(state_changes(units.get(name), report, at));
                    }
                    units.remove(name);
                }
            }
        }
        events
    }

    /// Forgets a machine that left (its units' next reports are its first again).
    pub fn forget(&self, machine: &str) {
        self.seen.locked().remove(machine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{SystemdState, UnitHash};

    fn state(active: &str, sub: &str) -> StateReport {
        StateReport::Set(UnitState {
            name: "web.service".into(),
            machine_id: "m1".into(),
            hash: UnitHash([0; 20]),
            systemd: SystemdState::new("loaded", active, sub),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
            run: None,
        })
    }

    #[test]
    fn a_machines_first_report_teaches_and_its_next_ones_are_events() {
        let events = AgentStateEvents::default();
        assert!(events.events_of("m1", &[state("active", "running")], 1).is_empty(), "the first report");
        assert!(events.events_of("m1", &[state("active", "running")], 2).is_empty(), "nothing moved");
        let failed = events.events_of("m1", &[state("failed", "failed")], 3);
        let shown: Vec<_> =
            failed.iter().map(|e| (e.unit.as_deref(), e.machine.as_deref(), e.message.as_str())).collect();
        assert_eq!(shown, [(Some("web.service"), Some("m1"), "failed/failed (was active/running)")]);
        let gone = events.events_of("m1", &[StateReport::Remove("web.service".into())], 4);
        assert_eq!(gone[0].message, "gone (was failed/failed)");
        events.forget("m1");
        assert!(events.events_of("m1", &[state("active", "running")], 5).is_empty(), "first again once forgotten");
    }
}
