//! fleetd's life, the same in every mode (etcd, embedded store, pull agent): its components
//! run under one [`Lifecycle`] until a signal. SIGHUP reloads: the components stop with the
//! units left running and start again; SIGTERM or SIGINT shuts down: they stop the units and
//! leave the cluster; SIGUSR2 upgrades in place: the components stop as for a reload, and
//! fleetd replaces itself with the binary it was started from (see `in_place.rs`), its units
//! running on and its presence kept; if it cannot, it goes on as after a reload.

use std::sync::Arc;

use anyhow::Context;
use fleet_runtime::Lifecycle;
use fleet_unit_manager::UnitManager;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use crate::supervise::ComponentTasks;

/// What a mode of fleetd runs under the daemon.
pub trait Components {
    /// Spawns the components onto `tasks`, each running until `lifecycle` ends it.
    fn start(&mut self, tasks: &mut ComponentTasks, lifecycle: watch::Receiver<Lifecycle>);

    /// Takes in what a reload changes, before the components start again.
    fn reload(&mut self);
}

pub struct Daemon {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
    upgrade: Signal,
    in_place: crate::in_place::InPlace,
}

/// What a signal asks of the running components.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    Reload,
    ShutDown,
    UpgradeInPlace,
}

impl Daemon {
    /// Installs the signal handlers (before anything starts: a signal that comes early must
    /// not end fleetd without its shutdown).
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            hangup: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
            upgrade: signal(SignalKind::user_defined2()).context("installing the SIGUSR2 handler")?,
            in_place: crate::in_place::InPlace::of_this_process()?,
        })
    }

    /// Runs `work` (what fleetd does before its components can start: a pull agent's join,
    /// retried while its manager cannot be reached) unless SIGTERM or SIGINT comes first:
    /// `None` then, and fleetd ends as asked rather than only once the work is done.
    pub async fn unless_stopped<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            outcome = work => Some(outcome),
            _ = self.terminate.recv() => None,
            _ = self.interrupt.recv() => None,
        }
    }

    /// Runs `components` until SIGTERM or SIGINT, starting them again on each SIGHUP; returns
    /// once they stopped. `serving` says how fleetd serves, for systemd's status line
    /// (`API on …`, `pulling from …`); `units` hands the units over on SIGUSR2.
    pub async fn run(&mut self, serving: &str, components: &mut impl Components, units: Arc<dyn UnitManager>) {
        crate::service_manager::ready(serving);
        tokio::spawn(crate::service_manager::keep_alive(serving.to_string()));
        loop {
            let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
            let mut tasks = ComponentTasks::default();
            components.start(&mut tasks, lifecycle_watch);
            let asked = loop {
                let asked = tokio::select! {
                    _ = self.terminate.recv() => Asked::ShutDown,
                    _ = self.interrupt.recv() => Asked::ShutDown,
                    _ = self.hangup.recv() => Asked::Reload,
                    _ = self.upgrade.recv() => Asked::UpgradeInPlace,
                };
                if asked != Asked::UpgradeInPlace {
                    break asked;
                }
                // Nothing stops before the new binary is known to run here.
                match self.in_place.check_new_binary().await {
                    Ok(version) => {
                        tracing::info!(new = version, "upgrading in place: units left running, the presence kept");
                        break asked;
                    }
                    Err(error) => tracing::error!("not upgrading: {error:#}"),
                }
            };
            match asked {
                Asked::Reload => {
                    tracing::info!("Reloading configuration");
                    crate::service_manager::reloading();
                    components.reload();
                    let _ = lifecycle.send(Lifecycle::Reloading);
                }
                Asked::UpgradeInPlace => {
                    crate::service_manager::reloading();
                    let _ = lifecycle.send(Lifecycle::Reloading);
                }
                Asked::ShutDown => {
                    tracing::info!("Shutting down");
                    crate::service_manager::stopping();
                    let _ = lifecycle.send(Lifecycle::ShuttingDown);
                }
            }
            tasks.all_ended().await;
            if asked == Asked::UpgradeInPlace {
                let error = self.in_place.replace(units.as_ref()).await;
                tracing::error!("{error:#}; this fleetd goes on");
            } else if asked != Asked::Reload {
                return;
            }
            crate::service_manager::ready(serving);
        }
    }
}
