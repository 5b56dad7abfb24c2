//! The agent's watch on drift: each pass, the units it holds in sync are compared with what
//! the unit manager shows (`fleet_core::drift::detect`); a drifted unit is put back within
//! its correction budget, or reported only, and what happened goes into its state report.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use fleet_core::agent_plan::{DesiredUnit, LoadedUnit, Task};
use fleet_core::drift::{Corrections, Drift, DriftReport, FileOnMachine, Observed, Verdict, detect};
use fleet_core::{DesiredState, UnitHash};
use fleet_unit_manager::{HeldUnit, UnitManager};

/// One unit's drift history, for the content and desired state it was seen with.
#[derive(Default)]
struct UnitDrift {
    wanted: Option<(UnitHash, DesiredState)>,
    corrections: Corrections,
    report: Option<DriftReport>,
}

/// Looks at most this often: a burst of changes (thousands of units arriving) costs one look
/// a second, not one per pass. A pass that comes too soon leaves the look to a later pass (the
/// next state change, or the fallback reconcile), so drift is seen within that interval.
const LOOK_EVERY: Duration = Duration::from_secs(1);

pub struct DriftWatch {
    started: Instant,
    units: BTreeMap<String, UnitDrift>,
    last_look: Option<Instant>,
}

impl Default for DriftWatch {
    fn default() -> Self {
        Self { started: Instant::now(), units: BTreeMap::new(), last_look: None }
    }
}

impl DriftWatch {
    /// Whether a look may happen now.
    pub fn due(&self) -> bool {
        self.last_look.is_none_or(|at| at.elapsed() >= LOOK_EVERY)
    }

    /// The drifted units to put back now, each with whether it was started: units with no
    /// task in `planned` whose content matches what is `desired`, as `held` shows them.
    pub async fn corrections(
        &mut self,
        manager: &dyn UnitManager,
        desired: &BTreeMap<String, DesiredUnit>,
        loaded: &BTreeMap<String, LoadedUnit>,
        held: &BTreeMap<String, HeldUnit>,
        planned: &[Task],
    ) -> Vec<(String, Drift, bool)> {
        self.last_look = Some(Instant::now());
        self.units.retain(|name, _| desired.contains_key(name));
        let touched: HashSet<&str> = planned
            .iter()
            .filter_map(|task| match task {
                Task::Unload(name) | Task::Load(name) | Task::Stop(name) | Task::Start(name) => Some(name.as_str()),
                // Its credentials only: its unit file and its running are as they were.
                Task::Refresh(_) | Task::Reload(_) | Task::ReloadUnitFiles => None,
            })
            .collect();
        let now = self.started.elapsed();
        let mut correct = Vec::new();
        for (name, wanted) in desired {
            let (Some(loaded), Some(held)) = (loaded.get(name), held.get(name)) else { continue };
            let unit = self.units.entry(name.clone()).or_default();
            let acted_on = touched.contains(name.as_str()) || loaded.hash != wanted.hash;
            // What fleet wants of it changed, or fleet is acting on it: a fresh budget.
            if acted_on || unit.wanted != Some((wanted.hash, wanted.state)) {
                *unit = UnitDrift { wanted: Some((wanted.hash, wanted.state)), ..UnitDrift::default() };
            }
            if acted_on {
                continue;
            }
            let file = if held.state.load == "not-found" {
                FileOnMachine::Missing
            } else {
                manager.file_on_machine(name, wanted.hash).await
            };
            let stopped = wanted.state == DesiredState::Launched && loaded.launched && held.state.active == "inactive";
            let ended_by_itself = stopped && manager.ended_by_itself(name).await.unwrap_or(true);
            let observed = Observed { state: &held.state, file, ended_by_itself };
            let Some(drift) = detect(wanted.state, loaded.launched, &observed) else {
                // Back in sync: a correction stays in the report for its window; a unit given
                // up on and put right by someone else gets its budget back.
                if unit.corrections.given_up() {
                    unit.corrections.reset();
                }
                if unit.corrections.recent(now) == 0 {
                    unit.report = None;
                }
                continue;
            };
            let verdict = unit.corrections.decide(wanted.drift, now);
            let report = DriftReport {
                drift,
                corrections: unit.corrections.recent(now),
                correcting: matches!(verdict, Verdict::Correct { .. }),
                given_up: verdict == Verdict::GiveUp,
            };
            if unit.report.as_ref() != Some(&report) || report.correcting {
                fleet_metrics::metrics().agent.drifts.inc();
                tracing::warn!(unit = name, drift = %report, "unit drifted from what fleet made it");
            }
            if report.correcting {
                fleet_metrics::metrics().agent.drift_corrections.inc();
                correct.push((name.clone(), drift, loaded.launched));
            }
            unit.report = Some(report);
        }
        correct
    }

    /// What to report about `name`'s drift.
    pub fn report(&self, name: &str) -> Option<&DriftReport> {
        self.units.get(name).and_then(|unit| unit.report.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use fleet_core::drift::DriftPolicy;
    use fleet_core::{SystemdState, UnitFile};
    use fleet_testkit::FakeUnitManager;

    use super::*;

    fn held(active: &str, hash: UnitHash) -> BTreeMap<String, HeldUnit> {
        let state = SystemdState::new("loaded", active, if active == "active" { "running" } else { "dead" });
        BTreeMap::from([("a.service".to_string(), HeldUnit { hash, state })])
    }

    #[tokio::test]
    async fn a_unit_stopped_outside_fleet_is_started_three_times_then_left_marked() {
        // The states come from `held`; the manager answers whether a stop was the unit's own.
        let manager = FakeUnitManager::new();
        let file = UnitFile::parse("[Service]\nExecStart=/bin/sleep 9\n").expect("a unit file");
        let hash = file.hash();
        manager.load("a.service", &file).await.expect("load");
        manager.start("a.service").await.expect("start");
        manager.stop_outside_fleet("a.service").expect("stop");
        let wanted = DesiredUnit {
            hash,
            state: DesiredState::Launched,
            drift: DriftPolicy::Correct,
            secrets: Default::default(),
            places: Default::default(),
        };
        let desired = BTreeMap::from([("a.service".to_string(), wanted.clone())]);
        let loaded = BTreeMap::from([(
            "a.service".to_string(),
            LoadedUnit { hash, launched: true, secrets: None, places: None },
        )]);
        let mut watch = DriftWatch::default();
        for _ in 0..3 {
            let fixes = watch.corrections(&manager, &desired, &loaded, &held("inactive", hash), &[]).await;
            assert_eq!(fixes, vec![("a.service".to_string(), Drift::Stopped, true)]);
        }
        let fixes = watch.corrections(&manager, &desired, &loaded, &held("inactive", hash), &[]).await;
        assert!(fixes.is_empty(), "given up");
        let report = watch.report("a.service").expect("a report");
        assert!(report.given_up && !report.correcting, "{report:?}");
        // In sync again (someone started it): the budget comes back, the mark goes.
        let fixes = watch.corrections(&manager, &desired, &loaded, &held("active", hash), &[]).await;
        assert!(fixes.is_empty());
        assert!(watch.report("a.service").is_none());
        // Report only: nothing is put back.
        let report_only =
            BTreeMap::from([("a.service".to_string(), DesiredUnit { drift: DriftPolicy::Report, ..wanted })]);
        let fixes = watch.corrections(&manager, &report_only, &loaded, &held("inactive", hash), &[]).await;
        assert!(fixes.is_empty());
        assert!(!watch.report("a.service").expect("a report").correcting);
        // A unit with a task this pass is the plan's, not drift, and starts a fresh budget.
        let planned = [Task::Start("a.service".into())];
        assert!(watch.corrections(&manager, &desired, &loaded, &held("inactive", hash), &planned).await.is_empty());
        assert!(watch.report("a.service").is_none());
        // A unit that ended by itself is done, not drifted.
        manager.start("a.service").await.expect("start");
        assert!(watch.corrections(&manager, &desired, &loaded, &held("inactive", hash), &[]).await.is_empty());
    }
}
