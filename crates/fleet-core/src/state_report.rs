//! What an agent tells the registry about its units: only what changed since its last
//! report, and which units it counts as launched. Pure.

use std::collections::{BTreeMap, HashSet};

use crate::drift::DriftReport;
use crate::health::HealthReport;
use crate::{SystemdState, UnitHash, UnitState};

/// A change in what a machine reports about one of its units.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "reports are built, sent and dropped together, mostly sets: a box each would be an allocation per report"
)]
pub enum StateReport {
    Set(UnitState),
    Remove(String),
}

/// Whether a unit the unit manager already runs when the agent starts (a fleetd restarted
/// under systemd) counts as launched: active, or on its way there.
pub fn adopted_as_launched(state: &SystemdState) -> bool {
    state.active == "active" || state.active == "activating"
}

/// What a machine says of one unit it holds now, as [`already_reported`] compares it.
#[derive(Clone, Copy, Debug)]
pub struct HeldNow<'a> {
    pub hash: UnitHash,
    pub systemd: &'a SystemdState,
    pub launched: bool,
    pub drift: Option<&'a DriftReport>,
    pub health: Option<&'a HealthReport>,
    /// The version of each secret it was given.
    pub secrets: &'a BTreeMap<String, u64>,
    /// Its run, for a unit that runs to completion.
    pub run: Option<&'a crate::job::runs::RunReport>,
}

/// Whether `reported` already says what a unit held `now` would: most passes change nothing,
/// and this decides so without building states.
pub fn already_reported(reported: Option<&UnitState>, now: HeldNow<'_>) -> bool {
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
             health: reported_health,
             secrets: reported_secrets,
             run: reported_run,
         }| {
            *reported_hash == now.hash
                && *reported_launched == now.launched
                && reported_systemd == now.systemd
                && reported_drift.as_ref() == now.drift
                && reported_health.as_ref() == now.health
                && reported_secrets == now.secrets
                && reported_run.as_deref() == now.run
        },
    )
}

/// One unit the machine holds now, as its report would say it.
#[derive(Clone, Copy, Debug)]
pub struct HeldUnitNow<'a> {
    pub name: &'a str,
    pub now: HeldNow<'a>,
    /// It started with a health check whose first verdict is not in yet: what was reported
    /// of it stands until the verdict (or its wait) is.
    pub awaiting_first_verdict: bool,
}

impl HeldUnitNow<'_> {
    fn state(&self, machine_id: &str) -> UnitState {
        UnitState {
            name: self.name.to_string(),
            machine_id: machine_id.to_string(),
            hash: self.now.hash,
            systemd: self.now.systemd.clone(),
            launched: self.now.launched,
            drift: self.now.drift.cloned(),
            health: self.now.health.cloned(),
            secrets: self.now.secrets.clone(),
            run: self.now.run.cloned().map(Box::new),
        }
    }
}

/// The reports that take `reported` to what machine `machine_id` holds now (`held`, each
/// unit once): a state is built only for a unit whose report changes, and a unit reported
/// before and held no more is removed. Most passes change one unit or none, on machines that
/// hold many.
pub fn reports_of_changes(
    reported: &BTreeMap<String, UnitState>,
    machine_id: &str,
    held: &[HeldUnitNow<'_>],
) -> Vec<StateReport> {
    let mut reports = Vec::new();
    let mut still_reported = 0;
    for unit in held {
        let before = reported.get(unit.name);
        still_reported += usize::from(before.is_some());
        if !unit.awaiting_first_verdict && !already_reported(before, unit.now) {
            reports.push(StateReport::Set(unit.state(machine_id)));
        }
    }
    if still_reported < reported.len() {
        let held: HashSet<&str> = held.iter().map(|unit| unit.name).collect();
        reports.extend(
            reported.keys().filter(|name| !held.contains(name.as_str())).map(|name| StateReport::Remove(name.clone())),
        );
    }
    reports
}

/// `reported` once `reports` are written.
pub fn apply_reports(reported: &mut BTreeMap<String, UnitState>, reports: Vec<StateReport>) {
    for report in reports {
        match report {
            StateReport::Set(state) => {
                reported.insert(state.name.clone(), state);
            }
            StateReport::Remove(name) => {
                reported.remove(&name);
            }
        }
    }
}

/// `reported` once a write of `reports` failed without saying whether it landed (a lost
/// answer commits): a state it set may be in the store or not. Each is kept as reported in an
/// unknown state, which what the machine holds never equals: sent again while the unit is
/// held, removed once it is not. (Were it forgotten, a unit let go of meanwhile would keep its
/// last state in the store for as long as the machine's presence lives; a removal that failed
/// is still reported, so it is sent again as it is.)
pub fn apply_uncertain_reports(reported: &mut BTreeMap<String, UnitState>, reports: Vec<StateReport>) {
    for report in reports {
        if let StateReport::Set(state) = report {
            reported.insert(state.name.clone(), UnitState { systemd: unknown(), ..state });
        }
    }
}

/// `reported` once the machine's presence lapsed: the store drops the states written under a
/// lapsed presence (or may have), so none is known to be there. Each is kept in an unknown
/// state, as an uncertain write's: sent again while the unit is held (a unit started again
/// once the machine registered afresh is reported running, so no engine takes it for stopped
/// and starts it elsewhere), removed once it is not.
pub fn forget_after_lapse(reported: &mut BTreeMap<String, UnitState>) {
    for state in reported.values_mut() {
        state.systemd = unknown();
    }
}

/// The systemd state nothing a machine holds ever is.
fn unknown() -> SystemdState {
    SystemdState::new("unknown", "unknown", "unknown")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UnitHash;

    /// Seed 50503 of `fleet-sim --scheduled 4 --moving 3 --prioritized 12`: a machine whose
    /// presence lapsed stopped its units, registered afresh (the store dropping its states) and
    /// started one again as its work still said; the report of it equalled the one before the
    /// lapse and was not sent, so the engine took the unit for stopped there and started it
    /// elsewhere too.
    #[test]
    fn after_a_lapse_every_unit_held_is_reported_again_and_the_others_removed() {
        let mut reported = BTreeMap::from([state("kept", "active"), state("dropped", "active")]);
        forget_after_lapse(&mut reported);
        let now = BTreeMap::from([state("kept", "active")]);
        assert_eq!(
            reports_of_changes(&reported, "m", &held_as(&now)),
            vec![StateReport::Set(state("kept", "active").1), StateReport::Remove("dropped".into())]
        );
    }

    #[test]
    fn a_report_whose_write_may_have_landed_is_sent_again_or_removed() {
        let mut reported = BTreeMap::from([state("gone", "active")]);
        let current = BTreeMap::from([state("kept", "failed"), state("dropped", "failed")]);
        let reports = reports_of_changes(&reported, "m", &held_as(&current));
        apply_uncertain_reports(&mut reported, reports);
        // Next pass: "dropped" was let go of meanwhile, "kept" is still held.
        let now = BTreeMap::from([state("kept", "failed")]);
        let again = reports_of_changes(&reported, "m", &held_as(&now));
        assert_eq!(
            again,
            vec![
                StateReport::Set(state("kept", "failed").1),
                StateReport::Remove("dropped".into()),
                StateReport::Remove("gone".into()),
            ]
        );
        apply_reports(&mut reported, again);
        assert_eq!(reported, now);
    }

    fn state(name: &str, active: &str) -> (String, UnitState) {
        let state = UnitState {
            run: None,
            name: name.into(),
            machine_id: "m".into(),
            hash: UnitHash([0; 20]),
            systemd: SystemdState::new("loaded", active, "x"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
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

    /// What a machine holding `current` says of each unit, none awaiting a first verdict.
    fn held_as(current: &BTreeMap<String, UnitState>) -> Vec<HeldUnitNow<'_>> {
        current
            .values()
            .map(|state| HeldUnitNow {
                name: &state.name,
                now: HeldNow {
                    run: None,
                    hash: state.hash,
                    systemd: &state.systemd,
                    launched: state.launched,
                    drift: state.drift.as_ref(),
                    health: state.health.as_ref(),
                    secrets: &state.secrets,
                },
                awaiting_first_verdict: false,
            })
            .collect()
    }

    #[test]
    fn only_changes_are_reported() {
        let mut reported =
            BTreeMap::from([state("same", "active"), state("changed", "active"), state("gone", "active")]);
        let current = BTreeMap::from([state("same", "active"), state("changed", "failed"), state("new", "active")]);
        let reports = reports_of_changes(&reported, "m", &held_as(&current));
        assert_eq!(
            reports,
            vec![
                StateReport::Set(state("changed", "failed").1),
                StateReport::Set(state("new", "active").1),
                StateReport::Remove("gone".into()),
            ]
        );
        apply_reports(&mut reported, reports);
        assert_eq!(reported, current, "the reports take what was reported to what is held");
        assert!(reports_of_changes(&current, "m", &held_as(&current)).is_empty());
    }

    #[test]
    fn a_unit_awaiting_its_first_verdict_keeps_what_was_reported_of_it() {
        let reported = BTreeMap::from([state("restarted", "active")]);
        let current = BTreeMap::from([state("restarted", "activating"), state("started", "active")]);
        let mut held = held_as(&current);
        for unit in &mut held {
            unit.awaiting_first_verdict = true;
        }
        assert!(
            reports_of_changes(&reported, "m", &held).is_empty(),
            "neither the restarted unit (kept as reported) nor the new one (not reported yet) is reported, nor removed"
        );
        held[0].awaiting_first_verdict = false;
        assert_eq!(
            reports_of_changes(&reported, "m", &held),
            vec![StateReport::Set(state("restarted", "activating").1)]
        );
    }

    #[test]
    fn a_state_is_already_reported_only_when_every_field_matches() {
        let (_, reported) = state("a", "active");
        let active = SystemdState::new("loaded", "active", "x");
        let none = BTreeMap::new();
        let now = HeldNow {
            run: None,
            hash: reported.hash,
            systemd: &active,
            launched: true,
            drift: None,
            health: None,
            secrets: &none,
        };
        assert!(already_reported(Some(&reported), now));
        assert!(!already_reported(None, now), "never reported");
        assert!(!already_reported(Some(&reported), HeldNow { hash: UnitHash([1; 20]), ..now }), "new content");
        let failed = SystemdState::new("loaded", "failed", "x");
        assert!(!already_reported(Some(&reported), HeldNow { systemd: &failed, ..now }), "new systemd state");
        assert!(!already_reported(Some(&reported), HeldNow { launched: false, ..now }), "no longer launched");
        let drift =
            DriftReport { drift: crate::drift::Drift::Stopped, corrections: 1, correcting: true, given_up: false };
        assert!(!already_reported(Some(&reported), HeldNow { drift: Some(&drift), ..now }), "drift seen");
        let drifted = UnitState { drift: Some(drift.clone()), ..reported.clone() };
        assert!(already_reported(Some(&drifted), HeldNow { drift: Some(&drift), ..now }));
        assert!(!already_reported(Some(&drifted), now), "drift gone");
        let healthy = HealthReport { status: crate::health::HealthStatus::Healthy, ..HealthReport::default() };
        assert!(!already_reported(Some(&reported), HeldNow { health: Some(&healthy), ..now }), "health seen");
        let checked = UnitState { health: Some(healthy.clone()), ..reported };
        assert!(already_reported(Some(&checked), HeldNow { health: Some(&healthy), ..now }));
        let unhealthy = HealthReport { status: crate::health::HealthStatus::Unhealthy, ..HealthReport::default() };
        assert!(!already_reported(Some(&checked), HeldNow { health: Some(&unhealthy), ..now }), "health changed");
    }
}
