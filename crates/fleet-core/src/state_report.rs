//! What an agent tells the registry about its units: only what changed since its last
//! report, and which units it counts as launched. Pure.

use std::collections::BTreeMap;

use crate::drift::DriftReport;
use crate::{SystemdState, UnitHash, UnitState};

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

/// Whether `reported` already says what a unit held now with `hash`, `systemd`, `launched`
/// and `drift` would: most passes change nothing, and this decides so without building states.
pub fn already_reported(
    reported: Option<&UnitState>,
    hash: UnitHash,
    systemd: &SystemdState,
    launched: bool,
    drift: Option<&DriftReport>,
) -> bool {
    // Destructured in full: a field added to `UnitState` must be compared here too, or a
    // change to it would never be reported.
    reported.is_some_and(
        |UnitState {
             name: _,
             machine_id: _,
             hash: reported_hash,
             systemd: reported_systemd,
             launched: reported_launched,
             drift: reported_drift,
         }| {
            *reported_hash == hash
                && *reported_launched == launched
                && reported_systemd == systemd
                && reported_drift.as_ref() == drift
        },
    )
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

    #[test]
    fn a_state_is_already_reported_only_when_every_field_matches() {
        let (_, reported) = state("a", "active");
        let active = SystemdState::new("loaded", "active", "x");
        let hash = reported.hash;
        assert!(already_reported(Some(&reported), hash, &active, true, None));
        assert!(!already_reported(None, hash, &active, true, None), "never reported");
        assert!(!already_reported(Some(&reported), UnitHash([1; 20]), &active, true, None), "new content");
        let failed = SystemdState::new("loaded", "failed", "x");
        assert!(!already_reported(Some(&reported), hash, &failed, true, None), "new systemd state");
        assert!(!already_reported(Some(&reported), hash, &active, false, None), "no longer launched");
        let drift =
            DriftReport { drift: crate::drift::Drift::Stopped, corrections: 1, correcting: true, given_up: false };
        assert!(!already_reported(Some(&reported), hash, &active, true, Some(&drift)), "drift seen");
        let drifted = UnitState { drift: Some(drift.clone()), ..reported };
        assert!(already_reported(Some(&drifted), hash, &active, true, Some(&drift)));
        assert!(!already_reported(Some(&drifted), hash, &active, true, None), "drift gone");
    }
}
