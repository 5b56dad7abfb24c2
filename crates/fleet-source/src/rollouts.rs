//! The engine leader's rollout driver: while its fleetd leads, every running rollout is
//! stepped (`fleet_core::rollout::advance`) against what the machines report, the units of
//! the next wave get their new content (written as their owner would), and the rollout is
//! stored again, so that a new leader carries on where this one stopped.
//!
//! It reads only the units of running rollouts and their states, from the store's watch-fed
//! copy, and wakes when a rollout, a unit or a state changes, or when a step is due by the
//! clock (a deadline passing, a unit ready for long enough). With no rollout running it reads
//! nothing until a rollout changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fleet_core::health::HealthStatus;
use fleet_core::rollout::{Health, Observed, RolloutState, advance, next_timed_step};
use fleet_core::{UnitFile, UnitState};
use fleet_registry::{RegistryError, RolloutRecord, UnitChange, UnitView, Writer};
use fleet_runtime::{Lifecycle, Next};
use tokio::sync::watch;

use crate::leader_store::LeaderStore;
use crate::now;
use fleet_runtime::{LeaderPass, Triggers, while_leading};

/// The longest a running rollout goes without a pass though nothing changed: a safety net
/// under the change signals.
const FALLBACK: Duration = Duration::from_secs(60);

pub struct RolloutDriver {
    registry: Arc<dyn LeaderStore>,
}

/// How a unit runs, as a rollout counts it: active counts only once its health check (where
/// it has one) says healthy.
pub fn health(state: &UnitState) -> Health {
    match state.systemd.active.as_str() {
        "active" => match state.health.as_ref().map(|report| report.status) {
            None | Some(HealthStatus::Healthy) => Health::Active,
            Some(HealthStatus::Unknown) => Health::Changing,
            Some(HealthStatus::Unhealthy) => Health::Unhealthy,
        },
        "failed" => Health::Down,
        // Loaded and not started yet (a replacement under way), or started and gone.
        "inactive" if !state.launched => Health::Changing,
        "inactive" => Health::Down,
        _ => Health::Changing,
    }
}

/// What the machines report of each unit: the report of its newest content when two machines
/// report it (a unit on its way from one to the other).
pub fn observed(states: &[UnitState], units: &BTreeMap<String, UnitView>) -> BTreeMap<String, Observed> {
    let mut seen: BTreeMap<String, Observed> = BTreeMap::new();
    for state in states {
        let current = units.get(&state.name).map(|unit| unit.hash);
        let failure = state.health.as_ref().map(|report| report.failure.clone()).unwrap_or_default();
        let report = Observed { hash: state.hash, health: health(state), failure };
        match seen.get(&state.name) {
            Some(kept) if Some(kept.hash) == current && Some(state.hash) != current => {}
            _ => {
                seen.insert(state.name.clone(), report);
            }
        }
    }
    seen
}

impl RolloutDriver {
    pub fn new(registry: Arc<dyn LeaderStore>) -> Self {
        Self { registry }
    }

    /// Steps the rollouts while `leads` says this fleetd leads, until `lifecycle` ends it.
    pub async fn run(self, leads: watch::Receiver<bool>, lifecycle: watch::Receiver<Lifecycle>) {
        let changes = Triggers::none().with(self.registry.source_changes()).with(self.registry.unit_changes());
        while_leading(self, changes, leads, lifecycle).await;
    }

    /// Steps every running rollout; says when the next pass is due if any still runs.
    async fn step_running(&self) -> Result<Option<Duration>, RegistryError> {
        let running: Vec<RolloutRecord> = self
            .registry
            .rollouts()
            .await?
            .into_iter()
            .filter(|record| record.rollout.state == RolloutState::Running)
            .collect();
        if running.is_empty() {
            return Ok(None);
        }
        let names: BTreeSet<String> =
            running.iter().flat_map(|record| record.rollout.units.iter().map(|unit| unit.name.clone())).collect();
        let units: BTreeMap<String, UnitView> =
            self.registry.units_named(&names).await?.into_iter().map(|unit| (unit.name.clone(), unit)).collect();
        let seen = observed(&self.registry.states_of(&names).await?, &units);
        let now = now();
        let mut next = FALLBACK;
        for mut record in running {
            let before = record.rollout.clone();
            let step = advance(&mut record.rollout, &seen, now);
            if !step.replace.is_empty() {
                tracing::info!(rollout = record.name, units = step.replace.len(), "rolling out new content");
            }
            self.replace_all(&record, &step.replace, &units).await?;
            if record.rollout != before {
                if let Some(why) = record.rollout.reverted.as_ref().filter(|_| before.reverted.is_none()) {
                    tracing::warn!(rollout = record.name, why, "rollout reverting by itself: a gate failed");
                }
                if let RolloutState::Paused { reason } = &record.rollout.state {
                    tracing::warn!(rollout = record.name, reason, "rollout paused");
                } else if record.rollout.state == RolloutState::Done {
                    tracing::info!(rollout = record.name, "rollout done");
                }
                self.registry.put_rollout(&record).await?;
            }
            if let Some(due) = next_timed_step(&record.rollout) {
                next = next.min(Duration::from_secs(due.saturating_sub(now)));
            }
        }
        Ok(Some(next))
    }

    /// Writes the new content of the units `names` (a wave), each as its owner, in as few
    /// requests as the store allows: a wave of a thousand units is not a thousand round trips.
    /// A write that failed fails the pass (retried; the writes that landed are the same again).
    async fn replace_all(
        &self,
        record: &RolloutRecord,
        names: &[String],
        units: &BTreeMap<String, UnitView>,
    ) -> Result<(), RegistryError> {
        let mut by_writer: Vec<(Writer, Vec<UnitChange>)> = Vec::new();
        for (change, writer) in names.iter().filter_map(|name| self.replacement(record, name, units)) {
            match by_writer.iter_mut().find(|(kept, _)| *kept == writer) {
                Some((_, changes)) => changes.push(change),
                None => by_writer.push((writer, vec![change])),
            }
        }
        for (writer, changes) in &by_writer {
            for answer in self.registry.change_units_as(changes, writer).await? {
                answer?;
            }
        }
        Ok(())
    }

    /// What writing a unit's new content takes: the write (content and desired state) and its
    /// owner (its source, or by hand) as the writer. `None` when the rollout holds no readable
    /// body for it or the unit is gone (both logged).
    fn replacement(
        &self,
        record: &RolloutRecord,
        name: &str,
        units: &BTreeMap<String, UnitView>,
    ) -> Option<(UnitChange, Writer)> {
        let unit = record.rollout.units.iter().find(|unit| unit.name == name)?;
        let Some(file) = record.bodies.get(&unit.to.to_string()).and_then(|text| UnitFile::parse(text).ok()) else {
            tracing::error!(
                rollout = record.name,
                unit = name,
                "the rollout holds no readable body for its new content"
            );
            return None;
        };
        let Some(current) = units.get(name) else {
            tracing::warn!(rollout = record.name, unit = name, "a unit of the rollout is gone");
            return None;
        };
        let writer = match &current.source {
            Some(source) => Writer::Source { name: source.clone(), take_over: false, drift: current.drift },
            None => Writer::BY_HAND,
        };
        Some((UnitChange { name: name.to_string(), file: Some(file), desired: current.desired }, writer))
    }
}

impl LeaderPass for RolloutDriver {
    type Error = RegistryError;
    const NAME: &'static str = "rollout pass";
    /// States change in bursts (a wave of units restarting): one pass for the burst.
    const SETTLE: Duration = Duration::from_millis(100);

    /// A running rollout is stepped on every change and when a step is due by the clock; with
    /// none running, the next pass waits for a rollout to change.
    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Ok(self.step_running().await?.map_or(Next::OnChange, Next::After))
    }
}
