//! fleetd's life, the same in every mode (etcd, embedded store, pull agent): its components
//! run under one [`Lifecycle`] until a signal. SIGHUP reloads: the components stop with the
//! units left running and start again; SIGTERM or SIGINT shuts down: they stop the units and
//! leave the cluster; SIGUSR2 exits for an upgrade: the components stop as for a reload, the
//! units are left running and the machine's presence is kept, for the next fleetd (the new
//! binary, which systemd starts again) to take both over.

use anyhow::Context;
use fleet_runtime::Lifecycle;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What a mode of fleetd runs under the daemon.
pub trait Components {
    /// Spawns the components onto `tasks`, each running until `lifecycle` ends it.
    fn start(&mut self, tasks: &mut JoinSet<()>, lifecycle: watch::Receiver<Lifecycle>);

    /// Takes in what a reload changes, before the components start again.
    fn reload(&mut self);
}

pub struct Daemon {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
    upgrade: Signal,
}

/// What a signal asks of the running components.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    Reload,
    ShutDown,
    ExitForUpgrade,
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
        })
    }

    /// Runs `components` until SIGTERM or SIGINT, starting them again on each SIGHUP; returns
    /// once they stopped. `serving` says how fleetd serves, for systemd's status line
    /// (`API on …`, `pulling from …`).
    pub async fn run(&mut self, serving: &str, components: &mut impl Components) {
        crate::service_manager::ready(serving);
        tokio::spawn(crate::service_manager::keep_alive(serving.to_string()));
        loop {
            let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
            let mut tasks = JoinSet::new();
            components.start(&mut tasks, lifecycle_watch);
            let asked = tokio::select! {
                _ = self.terminate.recv() => Asked::ShutDown,
                _ = self.interrupt.recv() => Asked::ShutDown,
                _ = self.hangup.recv() => Asked::Reload,
                _ = self.upgrade.recv() => Asked::ExitForUpgrade,
            };
            match asked {
                Asked::Reload => {
                    tracing::info!("Reloading configuration");
                    crate::service_manager::reloading();
                    components.reload();
                    let _ = lifecycle.send(Lifecycle::Reloading);
                }
                Asked::ExitForUpgrade => {
                    tracing::info!("Exiting for an upgrade: units left running, the presence kept for the next fleetd");
                    crate::service_manager::stopping();
                    let _ = lifecycle.send(Lifecycle::Reloading);
                }
                Asked::ShutDown => {
                    tracing::info!("Shutting down");
                    crate::service_manager::stopping();
                    let _ = lifecycle.send(Lifecycle::ShuttingDown);
                }
            }
            while tasks.join_next().await.is_some() {}
            if asked != Asked::Reload {
                return;
            }
            crate::service_manager::ready(serving);
        }
    }
}
