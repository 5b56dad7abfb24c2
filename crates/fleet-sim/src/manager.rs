//! A machine's unit manager in the simulation: the fake manager, reached only while the
//! fleetd is not frozen, with the keeper of `AtMostOnce=` units ([`Keeper`]: the native
//! supervisor's process or systemd's timer), which no freeze reaches and which kills the
//! fenced units at their deadline.

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use fleet_core::UnitFile;
use fleet_testkit::FakeUnitManager;
use fleet_unit_manager::fence::Fence;
use fleet_unit_manager::{HeldUnit, Result, UnitManager};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gate::Gate;

/// The native supervisor's keeper, with the fence it holds, enforced on the simulation's
/// clock (no freeze of fleetd reaches it).
#[derive(Debug, Default)]
pub struct Keeper {
    fence: Mutex<Fence>,
}

impl Keeper {
    fn fence(&self) -> std::sync::MutexGuard<'_, Fence> {
        self.fence.locked()
    }

    /// Kills the fenced units of `units` once their deadline has come.
    pub fn enforce(&self, units: &FakeUnitManager) {
        for name in self.fence().take_due(Instant::now()) {
            let _ = units.stop_outside_fleet(&name);
        }
    }
}

pub struct SimManager {
    pub units: Arc<FakeUnitManager>,
    frozen: Arc<Gate>,
    keeper: Arc<Keeper>,
}

impl SimManager {
    pub fn new(units: Arc<FakeUnitManager>, frozen: Arc<Gate>, keeper: Arc<Keeper>) -> Self {
        Self { units, frozen, keeper }
    }

    async fn thawed(&self) {
        self.frozen.passed().await;
    }
}

#[async_trait]
impl UnitManager for SimManager {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    async fn load(&self, name: &str, file: &UnitFile) -> Result<()> {
        self.thawed().await;
        self.keeper.fence().loaded(name, file);
        self.units.load(name, file).await
    }

    async fn unload(&self, name: &str) -> Result<()> {
        self.thawed().await;
        self.keeper.fence().unloaded(name);
        self.units.unload(name).await
    }

    async fn reload_unit_files(&self) -> Result<()> {
        self.thawed().await;
        Ok(())
    }

    async fn start(&self, name: &str) -> Result<()> {
        self.thawed().await;
        self.keeper.fence().check_start(name, Instant::now())?;
        self.units.start(name).await
    }

    async fn stop(&self, name: &str) -> Result<()> {
        self.thawed().await;
        self.units.stop(name).await
    }

    async fn units(&self) -> Result<BTreeMap<String, HeldUnit>> {
        self.thawed().await;
        self.units.units().await
    }

    fn state_changes(&self) -> watch::Receiver<u64> {
        self.units.state_changes()
    }

    async fn ended_by_itself(&self, name: &str) -> Result<bool> {
        self.units.ended_by_itself(name).await
    }

    async fn run_end(&self, name: &str) -> Result<Option<fleet_core::job::runs::Outcome>> {
        self.units.run_end(name).await
    }

    async fn journal(&self, _name: &str, _lines: usize) -> Result<String> {
        Ok(String::new())
    }

    async fn stop_all(&self) -> Result<()> {
        self.thawed().await;
        self.units.stop_all().await
    }

    async fn fence(&self, deadline: Instant, units: &[String]) -> Result<bool> {
        self.thawed().await;
        self.keeper.fence().arm(deadline, units);
        Ok(true)
    }
}
