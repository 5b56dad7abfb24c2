//! What an agent tells the registry about its units: only what changed since its last
//! report, and which units it counts as launched. Pure.

use std::collections::BTreeMap;

use crate::{SystemdState, UnitState};

/// A change in what a machine reports about one of its units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateReport {
    Set(UnitState),
    Remove(String),
}

/// Whether a unit the unit manager already runs when the agent starts (a fleetd restarted
/// under systemd) counts as launched: active, or on its way there.
pub fn adopted_as_launched(state: &SystemdState) -> bool {
    state.active == "active" || state.active == "activating"
}

/// The reports that take `reported` to `current`.
pub fn state_reports(
    reported: &BTreeMap<String, UnitState>,
    current: &BTreeMap<String, UnitState>,
) -> Vec<StateReport> {
    let mut reports: Vec<StateReport> = current
        .iter()
        .filter(|(name, state)| reported.get(*name) != Some(state))
        .map(|(_, state)| StateReport::Set(state.clone()))
        .collect();
    reports.extend(
        reported.keys().filter(|name| !current.contains_key(*name)).map(|name| StateReport::Remove(name.clone())),
    );
    reports
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UnitHash;

    fn state(name: &str, active: &str) -> (String, UnitState) {
        let state = UnitState {
            name: name.into(),
            machine_id: "m".into(),
            hash: UnitHash([0; 20]),
            systemd: SystemdState::new("loaded", active, "x"),
            launched: true,
            drift: None,
        };
        (name.to_string(), state)
    }

    #[test]
    fn adopted_units_count_as_launched_while_active_or_starting() {
        assert!(adopted_as_launched(&SystemdState::new("loaded", "active", "running")));
        assert!(adopted_as_launched(&SystemdState::new("loaded", "activating", "start")));
        assert!(!adopted_as_launched(&SystemdState::new("loaded", "failed", "failed")));
        assert!(!adopted_as_launched(&SystemdState::new("loaded", "inactive", "dead")));
    }

    #[test]
    fn only_changes_are_reported() {
        let reported = BTreeMap::from([state("same", "active"), state("changed", "active"), state("gone", "active")]);
        let current = BTreeMap::from([state("same", "active"), state("changed", "failed"), state("new", "active")]);
        let reports = state_reports(&reported, &current);
        assert_eq!(
            reports,
            vec![
                StateReport::Set(state("changed", "failed").1),
                StateReport::Set(state("new", "active").1),
                StateReport::Remove("gone".into()),
            ]
        );
        assert!(state_reports(&current, &current).is_empty());
    }
}
