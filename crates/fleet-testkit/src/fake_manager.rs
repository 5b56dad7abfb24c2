//! A unit manager that runs nothing: loading and starting succeed at once and the states
//! are what systemd would report. It stands in for a real manager where fleet's own work is
//! what is tested or measured (the real agent, registry and engine): the reconcilers' tests
//! and the simulated machines of `bench-cluster`. It counts the starts it was asked for, so
//! a test can tell an adopted unit from a restarted one. A unit can be stopped as if with
//! `systemctl stop` behind fleet's back ([`FakeUnitManager::stop_outside_fleet`]), or fail by
//! itself ([`FakeUnitManager::fail_by_itself`]).

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use fleet_core::job::runs::Outcome;
use fleet_core::{SystemdState, UnitFile};
use fleet_unit_manager::{HeldUnit, Result, UnitManager, UnitManagerError};
use tokio::sync::watch;

/// What a test runs once enough loads were asked for.
type AfterLoads = Box<dyn FnOnce() + Send>;

/// Each unit's credentials, by unit and credential name.
type Delivered = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

pub struct FakeUnitManager {
    units: Mutex<BTreeMap<String, HeldUnit>>,
    /// Units stopped behind fleet's back since fleet last started them.
    stopped_outside: Mutex<BTreeSet<String>>,
    starts: AtomicUsize,
    /// Calls of `stop_all`: fleetd's leaving, nothing else.
    stop_alls: AtomicUsize,
    loads: AtomicUsize,
    /// What to do once this many loads were asked for ([`FakeUnitManager::when_loaded`]).
    after_loads: Mutex<Option<(usize, AfterLoads)>>,
    /// How each unit's run since its last start ended by itself ([`FakeUnitManager::end_run`]).
    run_ends: Mutex<BTreeMap<String, Outcome>>,
    /// What each unit wrote to its log ([`FakeUnitManager::write_log`]).
    logs: Mutex<BTreeMap<String, String>>,
    /// Each unit's credentials by name, for a manager that delivers them
    /// ([`FakeUnitManager::delivering_credentials`]); `None`: it delivers none.
    credentials: Option<Mutex<Delivered>>,
    changes: watch::Sender<u64>,
}

impl Default for FakeUnitManager {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeUnitManager {
    pub fn new() -> Self {
        Self {
            units: Mutex::new(BTreeMap::new()),
            stopped_outside: Mutex::new(BTreeSet::new()),
            starts: AtomicUsize::new(0),
            stop_alls: AtomicUsize::new(0),
            loads: AtomicUsize::new(0),
            after_loads: Mutex::new(None),
            run_ends: Mutex::new(BTreeMap::new()),
            logs: Mutex::new(BTreeMap::new()),
            credentials: None,
            changes: watch::channel(0).0,
        }
    }

    /// The same manager, delivering credentials as the native and systemd managers do.
    pub fn delivering_credentials(self) -> Self {
        Self { credentials: Some(Mutex::new(BTreeMap::new())), ..self }
    }

    /// `name` holds `value` as its credential `credential`, as an earlier fleetd delivered it.
    pub fn delivered(&self, name: &str, credential: &str, value: &[u8]) {
        if let Some(credentials) = &self.credentials {
            credentials.locked().entry(name.to_string()).or_default().insert(credential.to_string(), value.to_vec());
        }
    }

    /// `name` writes `text` to its log (what `journal` then shows).
    pub fn write_log(&self, name: &str, text: &str) {
        self.logs.locked().entry(name.to_string()).or_default().push_str(text);
    }

    /// A manager that already holds `file` as `name`, running: what a restarted fleetd
    /// finds under systemd.
    pub fn running(name: &str, file: &UnitFile) -> Self {
        let manager = Self::new();
        let held = HeldUnit { hash: file.hash(), state: SystemdState::new("loaded", "active", "running") };
        manager.units.locked().insert(name.to_string(), held);
        manager
    }

    /// How many starts were asked for.
    pub fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }

    /// How many loads were asked for.
    pub fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }

    /// Runs `then` as the `count`th load is done (a test stopping fleetd mid-pass).
    pub fn when_loaded(&self, count: usize, then: impl FnOnce() + Send + 'static) {
        *self.after_loads.locked() = Some((count, Box::new(then)));
    }

    /// How many times `stop_all` was called.
    pub fn stop_alls(&self) -> usize {
        self.stop_alls.load(Ordering::SeqCst)
    }

    /// The state of `name`, if held.
    pub fn state(&self, name: &str) -> Option<SystemdState> {
        self.units.locked().get(name).map(|held| held.state.clone())
    }

    /// Stops `name` as `systemctl stop` would, behind fleet's back.
    pub fn stop_outside_fleet(&self, name: &str) -> Result<()> {
        self.stopped_outside.locked().insert(name.to_string());
        self.set(name, SystemdState::new("loaded", "inactive", "dead"))
    }

    /// Marks `name` failed as a service whose process exited with an error would be: it
    /// ended by itself, so this is no drift.
    pub fn fail_by_itself(&self, name: &str) -> Result<()> {
        self.set(name, SystemdState::new("loaded", "failed", "failed"))
    }

    /// Ends the run of `name` by itself, as a oneshot's process exiting would: `inactive`
    /// when it succeeded, else `failed`.
    pub fn end_run(&self, name: &str, outcome: Outcome) -> Result<()> {
        let state = match outcome {
            Outcome::Succeeded => SystemdState::new("loaded", "inactive", "dead"),
            _ => SystemdState::new("loaded", "failed", "failed"),
        };
        self.run_ends.locked().insert(name.to_string(), outcome);
        self.set(name, state)
    }

    fn set(&self, name: &str, state: SystemdState) -> Result<()> {
        let mut units = self.units.locked();
        let unit = units.get_mut(name).ok_or_else(|| UnitManagerError::NotLoaded(name.to_string()))?;
        unit.state = state;
        drop(units);
        self.changes.send_modify(|generation| *generation += 1);
        Ok(())
    }
}

#[async_trait]
impl UnitManager for FakeUnitManager {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn delivers_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    fn delivered_credential(
        &self,
        name: &str,
        credential: &str,
    ) -> Option<fleet_unit_manager::credentials::Credential> {
        let credentials = self.credentials.as_ref()?.locked();
        let value = credentials.get(name)?.get(credential)?.clone();
        Some(fleet_unit_manager::credentials::Credential::new(credential, value))
    }

    async fn provide_credentials(
        &self,
        name: &str,
        _file: &UnitFile,
        credentials: &[fleet_unit_manager::credentials::Credential],
    ) -> Result<()> {
        let Some(held) = &self.credentials else {
            if credentials.is_empty() {
                return Ok(());
            }
            return Err(UnitManagerError::Refused { unit: name.to_string(), reason: "the fake delivers none".into() });
        };
        let values = credentials.iter().map(|credential| (credential.name.clone(), credential.value().to_vec()));
        held.locked().insert(name.to_string(), values.collect());
        Ok(())
    }

    async fn load(&self, name: &str, file: &UnitFile) -> Result<()> {
        let held = HeldUnit { hash: file.hash(), state: SystemdState::new("loaded", "inactive", "dead") };
        self.units.locked().insert(name.to_string(), held);
        self.changes.send_modify(|generation| *generation += 1);
        let loads = self.loads.fetch_add(1, Ordering::SeqCst) + 1;
        let due = {
            let mut after = self.after_loads.locked();
            if after.as_ref().is_some_and(|(count, _)| *count == loads) { after.take() } else { None }
        };
        if let Some((_, then)) = due {
            then();
        }
        Ok(())
    }

    async fn unload(&self, name: &str) -> Result<()> {
        self.units.locked().remove(name);
        self.changes.send_modify(|generation| *generation += 1);
        Ok(())
    }

    async fn reload_unit_files(&self) -> Result<()> {
        Ok(())
    }

    async fn start(&self, name: &str) -> Result<()> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.stopped_outside.locked().remove(name);
        self.run_ends.locked().remove(name);
        self.set(name, SystemdState::new("loaded", "active", "running"))
    }

    async fn stop(&self, name: &str) -> Result<()> {
        self.set(name, SystemdState::new("loaded", "inactive", "dead"))
    }

    async fn units(&self) -> Result<BTreeMap<String, HeldUnit>> {
        Ok(self.units.locked().clone())
    }

    fn state_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn run_end(&self, name: &str) -> Result<Option<Outcome>> {
        Ok(self.run_ends.locked().get(name).cloned())
    }

    async fn ended_by_itself(&self, name: &str) -> Result<bool> {
        Ok(!self.stopped_outside.locked().contains(name))
    }

    async fn journal(&self, name: &str, lines: usize) -> Result<String> {
        let logs = self.logs.locked();
        let Some(log) = logs.get(name) else { return Ok(String::new()) };
        let all: Vec<&str> = log.lines().collect();
        Ok(all[all.len().saturating_sub(lines)..].iter().map(|line| format!("{line}\n")).collect())
    }

    async fn stop_all(&self) -> Result<()> {
        self.stop_alls.fetch_add(1, Ordering::SeqCst);
        let names: Vec<String> = self.units.locked().keys().cloned().collect();
        for name in names {
            self.stop(&name).await?;
        }
        Ok(())
    }
}
