//! The UnitManager seam: what runs units on one machine.
//!
//! Implementations: [`systemd::SystemdManager`], which hands units to systemd over D-Bus, and
//! [`native::NativeManager`], a built-in supervisor for hosts without systemd as PID 1
//! (containers, development). The agent drives a manager only through
//! this trait.

pub mod account;
pub mod cgroup_procs;
pub mod check_command;
pub mod credentials;
pub mod fence;
#[cfg(feature = "native")]
pub mod native;
pub mod reexec;
#[cfg(feature = "systemd")]
pub mod systemd;

use std::collections::BTreeMap;

use async_trait::async_trait;
use fleet_core::drift::FileOnMachine;
use fleet_core::{SystemdState, UnitFile, UnitHash};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum UnitManagerError {
    #[error("unit {0} is not loaded")]
    NotLoaded(String),
    #[error("unit {unit}: {reason}")]
    Refused { unit: String, reason: String },
    /// A unit that runs at most once, asked to start with no fence holding it.
    #[error("unit {unit} runs at most once, and no fence holds it: its machine's presence may have lapsed")]
    Fenced { unit: String },
    /// The manager cannot run units as it must here (the native supervisor without a cgroup
    /// v2 hierarchy to hold units' processes).
    #[error("{0}")]
    Unsupported(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, UnitManagerError>;

/// A unit the manager holds, as the agent needs to know it after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldUnit {
    pub hash: UnitHash,
    pub state: SystemdState,
}

#[async_trait]
pub trait UnitManager: Send + Sync {
    /// Which implementation this is, for logs ("native", "systemd").
    fn kind(&self) -> &'static str;
    /// Makes `file` known under `name` without starting it.
    async fn load(&self, name: &str, file: &UnitFile) -> Result<()>;
    /// Stops the unit if it runs and forgets it.
    async fn unload(&self, name: &str) -> Result<()>;
    /// Picks up loads and unloads (systemd's daemon-reload); once per batch.
    async fn reload_unit_files(&self) -> Result<()>;
    async fn start(&self, name: &str) -> Result<()>;
    async fn stop(&self, name: &str) -> Result<()>;
    /// Runs a running unit's `ExecReload=` (`RequiresChange=reload`), leaving it running.
    async fn reload(&self, name: &str) -> Result<()> {
        Err(UnitManagerError::Refused {
            unit: name.to_string(),
            reason: format!("the {} unit manager cannot reload a unit", self.kind()),
        })
    }
    /// Every unit held, with its state.
    async fn units(&self) -> Result<BTreeMap<String, HeldUnit>>;
    /// Moves whenever a unit's state changes.
    fn state_changes(&self) -> watch::Receiver<u64>;
    /// The last `lines` lines of a unit's log.
    async fn journal(&self, name: &str, lines: usize) -> Result<String>;
    /// The last `lines` lines of a unit's log written since `since` (microseconds since the
    /// epoch: when its run started), as far as the manager can tell them from earlier ones.
    async fn run_log(&self, name: &str, _since: i64, lines: usize) -> Result<String> {
        self.journal(name, lines).await
    }
    /// The manager's own status report of a unit (`systemctl status`), when it has one.
    async fn status(&self, _name: &str) -> Result<Option<String>> {
        Ok(None)
    }
    /// How the unit file `name` runs from on this machine compares with the one fleet gave
    /// it (`hash`): someone on the machine may have edited or removed it. A manager whose
    /// files nobody else reaches says `Same`.
    async fn file_on_machine(&self, _name: &str, _hash: UnitHash) -> FileOnMachine {
        FileOnMachine::Same
    }
    /// Whether an inactive unit got there by itself (its process exited, a oneshot finished)
    /// rather than by a stop. A manager only fleet can stop says yes.
    async fn ended_by_itself(&self, _name: &str) -> Result<bool> {
        Ok(true)
    }
    /// How the run of unit `name` this manager last started ended, for a unit that runs to
    /// completion: `None` while it has not ended since that start (a start still queued has
    /// not), or when this manager has not started it. The end is the run's own (its main
    /// process exited after the start), never a unit merely seen inactive.
    async fn run_end(&self, name: &str) -> Result<Option<fleet_core::job::runs::Outcome>>;
    /// The cgroups a health check's command of unit `name` joins: the unit's own, so that
    /// what the check starts counts against the unit's limits and goes with the unit. `None`
    /// where the manager has none for it (the check then runs in a process group of its own).
    async fn check_cgroup(&self, _name: &str) -> Option<cgroup_procs::CgroupProcs> {
        None
    }
    /// What systemd's watchdog says of a `Type=notify` service with `WatchdogSec=`: `None`
    /// while it pings in time, else what is wrong (it fired, or the service is late with its
    /// pings). A manager without a watchdog has nothing to say.
    async fn watchdog_trouble(&self, _name: &str) -> Result<Option<String>> {
        Ok(None)
    }
    /// Stops every unit, for a clean shutdown.
    async fn stop_all(&self) -> Result<()>;
    /// Arms the backstop of `AtMostOnce=` units: something outside fleetd kills `units` at
    /// `deadline` unless it is armed again before, so they stop on time even if fleetd is
    /// frozen or dies. Each call replaces the last; no units lifts it. `Ok(false)`: this
    /// manager has no such backstop.
    async fn fence(&self, _deadline: tokio::time::Instant, _units: &[String]) -> Result<bool> {
        Ok(false)
    }
    /// Whether it delivers credentials ([`UnitManager::provide_credentials`]): one that does
    /// not runs a unit that waits for units without the file of where they run.
    fn delivers_credentials(&self) -> bool {
        false
    }
    /// The credential `credential` of `name` as it was last delivered, if this manager
    /// delivers credentials and `name` has that one.
    fn delivered_credential(&self, _name: &str, _credential: &str) -> Option<credentials::Credential> {
        None
    }
    /// Puts `credentials` where the processes of `name` (loaded next, from `file`) find them
    /// (`$CREDENTIALS_DIRECTORY`), replacing what it had; none removes them. They go when
    /// the unit is unloaded. A manager that cannot deliver credentials refuses a unit that
    /// has some.
    async fn provide_credentials(
        &self,
        name: &str,
        _file: &UnitFile,
        credentials: &[credentials::Credential],
    ) -> Result<()> {
        if credentials.is_empty() {
            return Ok(());
        }
        Err(UnitManagerError::Refused {
            unit: name.to_string(),
            reason: format!("the {} unit manager cannot deliver credentials", self.kind()),
        })
    }
    /// Replaces fleetd in place with `reexec` for an upgrade, the units left running for the
    /// next image to take over as they run. Returns only if that failed, with why; the units
    /// are then supervised as before.
    async fn reexec(&self, reexec: &reexec::Reexec) -> std::io::Error {
        match reexec.image() {
            Ok(image) => image.exec(),
            Err(error) => error,
        }
    }
}
