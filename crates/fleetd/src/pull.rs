//! fleetd as a pull agent: no store of its own and no listener, only connections it opens to
//! its manager. It joins once with the registration token (or uses the certificate it kept),
//! renews that certificate before it expires, and runs the agent on the remote store.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_agent::{Agent, AgentConfig};
use fleet_core::MachineState;
use fleet_pull_agent::{DiskCopy, MachineCredentials, Manager, RemoteRegistry};
use fleet_runtime::Lifecycle;
use fleet_unit_manager::UnitManager;
use tokio::sync::watch;

use crate::daemon::{Components, Daemon};
use crate::journal_answers::JournalAnswers;
use crate::reconcile_timing::{DEBOUNCE, PULL_RECONCILE_INTERVAL};
use crate::supervise::ComponentTasks;
use fleetd::config::Config;

/// How long a request to the manager may take.
const MANAGER_TIMEOUT: Duration = Duration::from_secs(10);

/// The machine's credentials: those kept in `state_dir`, else a join with the registration
/// token, retried while the manager cannot be reached and given up when it refuses.
async fn credentials(config: &Config, manager: &Arc<Manager>, machine_id: &str) -> anyhow::Result<MachineCredentials> {
    if let Some(kept) = MachineCredentials::load(&config.state_dir)? {
        if kept.machine_id != machine_id {
            anyhow::bail!(
                "{} holds credentials for machine {}, not {machine_id}",
                fleet_pull_agent::credentials_path(&config.state_dir).display(),
                kept.machine_id
            );
        }
        return Ok(kept);
    }
    if config.registration_token.is_empty() {
        anyhow::bail!("this machine has not joined yet: set registration_token");
    }
    let token = config.registration_token.expose();
    Ok(fleet_pull_agent::join(manager.clone(), token, machine_id, config.state_dir.clone()).await?)
}

/// Runs fleetd as a pull agent until SIGTERM or SIGINT.
pub async fn run(
    config: Config,
    machine: MachineState,
    units: Arc<dyn UnitManager>,
    mut daemon: Daemon,
) -> anyhow::Result<()> {
    if !config.etcd_servers.is_empty() {
        anyhow::bail!("manager_url and etcd_servers exclude each other: a pull agent has no store of its own");
    }
    let server_ca = if config.manager_ca_file.is_empty() {
        None
    } else {
        Some(std::fs::read(&config.manager_ca_file).with_context(|| format!("reading {}", config.manager_ca_file))?)
    };
    let manager = Arc::new(
        Manager::new(&config.manager_url, server_ca, MANAGER_TIMEOUT)?
            .with_heartbeat(config.agent_ttl / 3)
            .with_idle_heartbeat(config.agent_heartbeat),
    );
    let Some(credentials) = daemon.unless_stopped(credentials(&config, &manager, &machine.id)).await else {
        tracing::info!("fleetd stopped before it joined");
        return Ok(());
    };
    let credentials = credentials?;
    let copy = DiskCopy::open(&config.state_dir.join("desired")).context("keeping the desired state on disk")?;
    let registry = RemoteRegistry::new(&manager, &credentials, Some(copy))?;
    let mut machine = machine;
    for (key, value) in &credentials.metadata {
        machine.metadata.entry(key.clone()).or_insert_with(|| value.clone());
    }
    machine.disable_engine = true;
    tracing::info!(
        machine_id = machine.id,
        manager = config.manager_url,
        "fleetd {} starting as a pull agent",
        fleetd::VERSION
    );
    // A pull agent serves no API: it is ready once it joined and holds its credentials.
    let pulling = format!("pulling from {}", config.manager_url);
    let mut agent = PullAgent {
        machine,
        agent_ttl: config.agent_ttl,
        registry,
        units: units.clone(),
        manager,
        credentials: Arc::new(std::sync::Mutex::new(credentials)),
        state_dir: config.state_dir.clone(),
    };
    daemon.run(&pulling, &mut agent, units).await;
    tracing::info!("fleetd stopped");
    Ok(())
}

/// What a pull agent runs under the daemon, each a reconciler under its one lifecycle: the
/// agent on the remote store, the following of the manager's changes, the certificate's
/// renewal and the answers to journal questions.
struct PullAgent {
    machine: MachineState,
    agent_ttl: Duration,
    registry: Arc<RemoteRegistry>,
    units: Arc<dyn UnitManager>,
    manager: Arc<Manager>,
    /// Shared with every renewal started (one after each reload): the newest certificate.
    credentials: Arc<std::sync::Mutex<MachineCredentials>>,
    state_dir: std::path::PathBuf,
}

impl Components for PullAgent {
    fn start(&mut self, tasks: &mut ComponentTasks, lifecycle: watch::Receiver<Lifecycle>) {
        let agent_config = AgentConfig {
            machine: self.machine.clone(),
            reconcile_interval: PULL_RECONCILE_INTERVAL,
            debounce: DEBOUNCE,
            // A pull agent has no lease of its own: its manager holds it present for its own
            // `agent_ttl` after it last heard from it. The units that run at most once stop
            // on this clock, so this fleetd's agent_ttl must not be longer than its managers'.
            presence_ttl: Some(self.agent_ttl),
            stop_units_when_cut_off: false,
        };
        let (registry, units, running) = (self.registry.clone(), self.units.clone(), lifecycle.clone());
        let secrets: Arc<dyn fleet_registry::UnitSecrets> = self.registry.clone();
        tasks.supervise("agent", move || {
            Agent::new(agent_config.clone(), registry.clone(), units.clone())
                .with_secrets(secrets.clone())
                .run(running.clone())
        });
        let (registry, running) = (self.registry.clone(), lifecycle.clone());
        tasks.supervise("manager's changes", move || fleet_pull_agent::follow_changes(&registry, running.clone()));
        let (manager, registry, running) = (self.manager.clone(), self.registry.clone(), lifecycle.clone());
        let (credentials, state_dir) = (self.credentials.clone(), self.state_dir.clone());
        tasks.supervise("certificate renewal", move || {
            fleet_pull_agent::keep_renewing(
                manager.clone(),
                registry.clone(),
                credentials.clone(),
                state_dir.clone(),
                running.clone(),
            )
        });
        let inbox: Arc<dyn fleet_registry::JournalInbox> = self.registry.clone();
        let local = fleet_api::LocalMachine { machine_id: self.machine.id.clone(), manager: self.units.clone() };
        tasks.supervise("journal answers", move || {
            fleet_runtime::run(JournalAnswers::new(inbox.clone(), local.clone()), lifecycle.clone())
        });
    }

    fn reload(&mut self) {
        tracing::info!("restarting the agent (a pull agent rereads no configuration: restart fleetd for that)");
    }
}
