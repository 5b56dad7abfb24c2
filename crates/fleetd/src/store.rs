//! Which registry fleetd uses: the embedded store, or etcd when `etcd_servers` is set.

use fleet_core::Backoff;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_registry::{ApiRegistry, JournalQuestions, Registry, StoreChores};
use fleet_store_embedded::EmbeddedRegistry;
use fleet_store_etcd::{EtcdOptions, EtcdRegistry, Lifetimes};

use fleetd::config::Config;

const CONNECT_RETRY_MAX: Duration = Duration::from_secs(30);

fn etcd_options(config: &Config) -> EtcdOptions {
    EtcdOptions {
        endpoints: config.etcd_servers.clone(),
        key_prefix: config.etcd_key_prefix.clone(),
        request_timeout: config.etcd_request_timeout,
        username: config.etcd_username.clone(),
        password: config.etcd_password.clone(),
        ca_file: config.etcd_cafile.clone(),
        cert_file: config.etcd_certfile.clone(),
        key_file: config.etcd_keyfile.clone(),
        lease_file: Some(config.state_dir.join("etcd-machine-lease")),
        agent_lease_file: Some(config.state_dir.join("etcd-agent-lease")),
        // A manager (it signs machine certificates) serves many pull agents from one copy.
        serve_many_machines: !config.agent_ca_cert_file.is_empty(),
        kept_history: None,
        api_copy_idle: None,
    }
}

/// The lease lifetimes the options give: `agent_ttl`, and five engine reconcile intervals
/// for the engine leadership, as the original.
pub fn lifetimes(config: &Config) -> Lifetimes {
    Lifetimes { agent_ttl: config.agent_ttl, engine_lease_ttl: config.engine_reconcile_interval * 5 }
}

/// The store fleetd uses, and its chores if it has any.
pub struct Store {
    pub registry: Arc<dyn Registry>,
    pub chores: Option<Arc<dyn StoreChores>>,
    /// How journals are asked of the cluster's other machines, where the store carries them.
    pub journal_questions: Option<Arc<dyn JournalQuestions>>,
    /// The store's recorded format.
    pub format: Arc<dyn fleet_registry::FormatRecord>,
    /// How the API backs the store up (the embedded store; etcd's are etcd's).
    pub backup: Option<Arc<dyn fleet_registry::StoreBackup>>,
}

/// Opens the store the configuration names. Connecting to etcd is retried with backoff:
/// without credentials the connection is lazy and this returns at once; with them etcd must
/// hand out a token first.
pub async fn open(config: &Config) -> anyhow::Result<Store> {
    if config.etcd_servers.is_empty() {
        let path = config.state_dir.join("registry.redb");
        // A store an older fleetd created under a wider umask.
        fleet_fs::make_private(&path)?;
        tracing::info!(path = %path.display(), "using the embedded store");
        let registry = Arc::new(EmbeddedRegistry::open(&path)?);
        registry.keep_versions(config.unit_versions_kept);
        return Ok(Store {
            registry: registry.clone(),
            chores: None,
            journal_questions: None,
            format: registry.clone(),
            backup: Some(registry),
        });
    }
    if config.disable_watches {
        tracing::warn!("disable_watches is ignored: each agent watches only its own schedule, so watches wake no herd");
    }
    let options = etcd_options(config);
    let mut retry = Backoff::new(Duration::from_millis(500), CONNECT_RETRY_MAX);
    loop {
        match EtcdRegistry::connect(&options, lifetimes(config)).await {
            Ok(registry) => {
                tracing::info!(servers = ?config.etcd_servers, prefix = config.etcd_key_prefix, "using etcd");
                let registry = Arc::new(registry);
                registry.keep_versions(config.unit_versions_kept);
                return Ok(Store {
                    registry: registry.clone(),
                    chores: Some(registry.clone()),
                    journal_questions: Some(registry.clone()),
                    format: registry,
                    backup: None,
                });
            }
            Err(error) => {
                let wait = retry.next_delay();
                tracing::warn!(%error, retry_in = ?wait, "cannot connect to etcd");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Announces the machine before anything runs, so that a machine ID already alive in the
/// cluster stops fleetd at once. An unreachable store is not fatal: the agent registers
/// when it comes back.
pub async fn announce(registry: &dyn Registry, machine: &fleet_core::MachineState) -> anyhow::Result<()> {
    match registry.register_machine(machine).await {
        Ok(()) => Ok(()),
        Err(error @ fleet_registry::RegistryError::MachineInUse { .. }) => Err(error).context("refusing to start"),
        // A fresh presence: the agent registers it once it stopped what runs here from before.
        Err(fleet_registry::RegistryError::PresenceLapsed) => Ok(()),
        Err(error) => {
            tracing::warn!(%error, "cannot register this machine yet; retrying in the background");
            Ok(())
        }
    }
}
