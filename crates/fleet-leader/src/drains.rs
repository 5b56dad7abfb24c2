//! The engine leader's drain driver: while its fleetd leads, the drain of every drained
//! machine is stepped (`fleet_core::drain::advance`) against what the machines report, and
//! stored when it moved on; the engine then moves the units it let go.
//!
//! It reads the drains, the units and the states of the units a drain concerns from the
//! store's watch-fed copy, and wakes when any of those change. With no machine drained it
//! reads the (empty) drains on each change and nothing more: never every machine, which at
//! 10,000 machines cost the leader a third of its CPU while their agents reported states.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::drain::advance;
use fleet_registry::{RegistryError, drain_unit_names, drain_units};
use fleet_runtime::{LeaderPass, Lifecycle, Next, Triggers, while_leading};
use tokio::sync::watch;

use crate::leader_store::LeaderStore;
use crate::now;

/// The longest a drain with units moving goes without a pass though nothing changed: a
/// safety net under the change signals.
const FALLBACK: Duration = Duration::from_secs(60);

pub struct DrainDriver {
    registry: Arc<dyn LeaderStore>,
}

impl DrainDriver {
    pub fn new(registry: Arc<dyn LeaderStore>) -> Self {
        Self { registry }
    }

    /// Steps the drains while `leads` says this fleetd leads, until `lifecycle` ends it.
    pub async fn run(self, leads: watch::Receiver<bool>, lifecycle: watch::Receiver<Lifecycle>) {
        let changes = Triggers::none().with(self.registry.unit_changes());
        while_leading(self, changes, leads, lifecycle).await;
    }

    /// Steps every drain; says whether one still has units to move.
    async fn step_drains(&self) -> Result<bool, RegistryError> {
        let drained = self.registry.drains().await?;
        if drained.is_empty() {
            return Ok(false);
        }
        let units = self.registry.units_copied().await?;
        let names = drained.iter().flat_map(|(machine, drain)| drain_unit_names(&units, machine, drain)).collect();
        let states = self.registry.states_of(&names).await?;
        let now = now();
        let mut unfinished = false;
        for (machine, mut drain) in drained {
            let before = drain.clone();
            let concerned = drain_units(&units, &states, &machine, &before);
            let progress = advance(&mut drain, &machine, &concerned, now);
            if drain != before {
                let let_go: Vec<&String> = drain.released.keys().filter(|unit| !before.lets_go(unit)).collect();
                if !let_go.is_empty() {
                    tracing::info!(machine, units = ?let_go, "drain lets units go");
                }
                if progress.word() == "drained" {
                    tracing::info!(machine, moved = drain.moved, stay = progress.stays.len(), "machine drained");
                }
                self.registry.step_drain(&machine, &drain).await?;
            }
            unfinished |= !progress.moving.is_empty() || !progress.left.is_empty();
        }
        Ok(unfinished)
    }
}

impl LeaderPass for DrainDriver {
    type Error = RegistryError;
    const NAME: &'static str = "drain pass";
    /// States change in bursts (a wave of units starting elsewhere): one pass for the burst.
    const SETTLE: Duration = Duration::from_millis(250);

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Ok(if self.step_drains().await? { Next::After(FALLBACK) } else { Next::OnChange })
    }
}
