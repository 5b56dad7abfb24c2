//! A machine's unit manager in the simulation: the fake manager, reached only while the
//! fleetd is not frozen, with the keeper of `AtMostOnce=` units ([`Keeper`]: the native
//! supervisor's process or systemd's timer), which no freeze reaches and which kills the
//! fenced units at their deadline. A unit on a calendar runs for as long as its
//! `ExecStart=/bin/sleep SECONDS` says, then ends by itself, and each start of one is counted
//! in the [`RunLog`] every machine shares (the judge compares them with the runs claimed).

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// The starts of units on a calendar on every machine, across fleetd restarts: (machine,
/// unit) → how many.
pub type RunLog = Arc<Mutex<BTreeMap<(String, String), u64>>>;

/// How long a run of `name` lasts: the seconds of its `ExecStart=/bin/sleep`, for a unit on a
/// calendar; `None` for any other.
fn run_length(name: &str, file: &UnitFile) -> Option<Duration> {
    fleet_core::Requirements::from_unit(name, file).job.filter(|job| job.keeps_runs())?;
    let command =
        file.options().iter().rev().find(|option| option.section == "Service" && option.name == "ExecStart")?;
    let seconds: f64 = command.value.split_whitespace().last()?.parse().ok()?;
    Some(Duration::from_secs_f64(seconds))
}

/// Whether a run of `file` fails soon after it starts on `machine`: its `ExecStart=` is
/// `/bin/fails-on MACHINE …` and names it.
fn fails_on(file: &UnitFile, machine: &str) -> bool {
    let command = file.options().iter().rev().find(|option| option.section == "Service" && option.name == "ExecStart");
    command.is_some_and(|command| {
        let mut words = command.value.split_whitespace();
        words.next() == Some("/bin/fails-on") && words.next() == Some(machine)
    })
}

/// How long a start of a service that fails here lasts before it fails.
const FAILS_AFTER: Duration = Duration::from_millis(200);

pub struct SimManager {
    pub units: Arc<FakeUnitManager>,
    frozen: Arc<Gate>,
    keeper: Arc<Keeper>,
    machine: String,
    runs: RunLog,
    /// Units on a calendar loaded here, with how long a run of each lasts.
    run_lengths: Mutex<BTreeMap<String, Duration>>,
    /// Services loaded here that fail soon after each start here.
    failing: Mutex<std::collections::BTreeSet<String>>,
}

impl SimManager {
    pub fn new(
        units: Arc<FakeUnitManager>,
        frozen: Arc<Gate>,
        keeper: Arc<Keeper>,
        machine: &str,
        runs: RunLog,
    ) -> Self {
        Self {
            units,
            frozen,
            keeper,
            machine: machine.to_string(),
            runs,
            run_lengths: Mutex::default(),
            failing: Mutex::default(),
        }
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
        {
            let mut lengths = self.run_lengths.locked();
            match run_length(name, file) {
                Some(length) => lengths.insert(name.to_string(), length),
                None => lengths.remove(name),
            };
            let mut failing = self.failing.locked();
            match fails_on(file, &self.machine) {
                true => failing.insert(name.to_string()),
                false => failing.remove(name),
            };
        }
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
        self.units.start(name).await?;
        if self.failing.locked().contains(name) {
            let (units, name) = (self.units.clone(), name.to_string());
            tokio::spawn(async move {
                tokio::time::sleep(FAILS_AFTER).await;
                if units.state(&name).is_some_and(|state| state.active == "active") {
                    let _ = units.fail_by_itself(&name);
                }
            });
            return Ok(());
        }
        let Some(length) = self.run_lengths.locked().get(name).copied() else { return Ok(()) };
        let key = (self.machine.clone(), name.to_string());
        let start = {
            let mut runs = self.runs.locked();
            let count = runs.entry(key.clone()).or_default();
            *count += 1;
            *count
        };
        // The run ends by itself, unless it was started again (or stopped) meanwhile.
        let (units, runs, name) = (self.units.clone(), self.runs.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(length).await;
            let current = runs.locked().get(&key).copied();
            if current == Some(start) && units.state(&name).is_some_and(|state| state.active == "active") {
                let _ = units.end_run(&name, fleet_core::job::runs::Outcome::Succeeded);
            }
        });
        Ok(())
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
