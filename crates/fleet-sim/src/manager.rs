//! A machine's unit manager in the simulation: the fake manager (what runs there outlives
//! its fleetd, as under systemd), reached only while the fleetd is not frozen.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use fleet_core::UnitFile;
use fleet_testkit::FakeUnitManager;
use fleet_unit_manager::{HeldUnit, Result, UnitManager};
use tokio::sync::watch;

use crate::gate::Gate;

pub struct SimManager {
    pub units: Arc<FakeUnitManager>,
    frozen: Arc<Gate>,
}

impl SimManager {
    pub fn new(units: Arc<FakeUnitManager>, frozen: Arc<Gate>) -> Self {
        Self { units, frozen }
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
        self.units.load(name, file).await
    }

    async fn unload(&self, name: &str) -> Result<()> {
        self.thawed().await;
        self.units.unload(name).await
    }

    async fn reload_unit_files(&self) -> Result<()> {
        self.thawed().await;
        Ok(())
    }

    async fn start(&self, name: &str) -> Result<()> {
        self.thawed().await;
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

    async fn journal(&self, _name: &str, _lines: usize) -> Result<String> {
        Ok(String::new())
    }

    async fn stop_all(&self) -> Result<()> {
        self.thawed().await;
        self.units.stop_all().await
    }
}
