//! Which unit-state reports to send: only what changed since the last report.

use std::collections::BTreeMap;

use fleet_core::UnitState;
use fleet_registry::StateReport;

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
    use fleet_core::{SystemdState, UnitHash};

    use super::*;

    fn state(name: &str, active: &str) -> (String, UnitState) {
        let state = UnitState {
            name: name.into(),
            machine_id: "m".into(),
            hash: UnitHash([0; 20]),
            systemd: SystemdState::new("loaded", active, "x"),
            launched: true,
        };
        (name.to_string(), state)
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
