//! Wiring: the registry, the unit manager, the API, and the components a fleetd on a store
//! runs under the daemon (the agent, the engine and what runs on the engine leader).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_agent::{Agent, AgentConfig};
use fleet_api::listen::ApiListener;
use fleet_core::{Connection, MachineState};
use fleet_engine::{Engine, EngineConfig};
use fleet_leader::{DisruptionLedger, DrainDriver, RolloutDriver, SourceSyncer, SyncerConfig};
use fleet_runtime::Lifecycle;
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::native::{LogLimits, NativeManager, NativeOptions};
use fleet_unit_manager::systemd::{SystemdManager, SystemdOptions};
use tokio::sync::watch;

use crate::agent_journal_answers::AgentJournalAnswers;
use crate::api_service::ApiService;
use crate::daemon::{Components, Daemon};
use crate::event_trim::EventTrimPass;
use crate::journal_answers::JournalAnswers;
use crate::memory_trim::MemoryTrim;
use crate::reconcile_timing::{AGENT_RECONCILE_INTERVAL, DEBOUNCE};
use crate::store_chores::StoreChoresPass;
use crate::supervise::ComponentTasks;
use crate::{host, store};
use fleet_api::silent_agents::SilentAgentSweep;
use fleetd::config::{Config, UnitManagerChoice};

/// The shortest wait between two passes of the source syncer (it wakes on a change to the
/// sources, or when one is due, and reads nothing meanwhile).
const SOURCE_TICK: Duration = Duration::from_millis(250);

fn machine_state(config: &Config, machine_id: &str) -> MachineState {
    let public_ip = if config.public_ip.is_empty() {
        host::default_public_ip().map(|ip| ip.to_string()).unwrap_or_default()
    } else {
        config.public_ip.clone()
    };
    MachineState {
        id: machine_id.to_string(),
        public_ip,
        metadata: config.metadata.clone(),
        version: fleetd::VERSION.to_string(),
        disable_engine: config.disable_engine,
        connection: if !config.manager_url.is_empty() {
            Connection::Pull
        } else if config.etcd_servers.is_empty() {
            Connection::Embedded
        } else {
            Connection::Etcd
        },
        capacity: crate::capacity::of_this_machine(config),
        drain: None,
        taints: config.taints.clone(),
    }
}

/// The unit manager `unit_manager` asks for: `auto` takes systemd when the machine runs it
/// (`/run/systemd/system` exists) and it answers on the bus, the native supervisor otherwise.
async fn unit_manager(
    config: &Config,
    machine_id: &str,
    handover_nonce: Option<String>,
) -> anyhow::Result<Arc<dyn UnitManager>> {
    let user = config.systemd_user;
    let instance = if user { "the user's systemd instance" } else { "systemd" };
    let use_systemd = match config.unit_manager {
        UnitManagerChoice::Systemd => true,
        UnitManagerChoice::Native => false,
        UnitManagerChoice::Auto if !Path::new("/run/systemd/system").exists() => false,
        UnitManagerChoice::Auto => {
            let answers = SystemdManager::answers(user).await;
            if !answers {
                tracing::warn!("the machine runs systemd, but {instance} does not answer on D-Bus");
            }
            answers
        }
    };
    if use_systemd {
        tracing::info!(units_directory = %config.units_directory.display(), "using {instance} as the unit manager");
        let options = SystemdOptions {
            user,
            units_directory: config.units_directory.clone(),
            credentials_dir: config.credentials_dir.join(machine_id),
        };
        let manager = SystemdManager::new(options)?;
        return Ok(manager);
    }
    tracing::info!("using the native unit manager");
    let keeper_program = std::env::current_exe().context("locating the fleetd binary for the unit keeper")?;
    let options = NativeOptions {
        state_dir: config.state_dir.clone(),
        machine_id: machine_id.to_string(),
        hostname: host::hostname(),
        keeper_program: Some(keeper_program),
        log_limits: LogLimits { max_bytes: config.unit_log_max_bytes, files: config.unit_log_files },
        stop_all_timeout: config.shutdown_timeout,
        allow_without_cgroups: config.native_without_cgroups,
        handover_nonce,
        credentials_dir: config.credentials_dir.join(machine_id),
    };
    Ok(Arc::new(NativeManager::new(options)?))
}

/// Warns about options a reload cannot change.
fn warn_fixed_options(old: &Config, new: &Config) {
    let fixed = [
        ("state_dir", old.state_dir != new.state_dir),
        ("machine_id", old.machine_id != new.machine_id),
        ("api_listen", old.api_listen != new.api_listen),
        ("api_anonymous_role", old.api_anonymous_role != new.api_anonymous_role),
        ("api_max_connections", old.api_max_connections != new.api_max_connections),
        ("unit_manager", old.unit_manager != new.unit_manager),
        ("etcd_servers", old.etcd_servers != new.etcd_servers),
    ];
    for (name, changed) in fixed {
        if changed {
            tracing::warn!(option = name, "this option changes only when fleetd restarts");
        }
    }
}

/// Says which deprecated options are set (and ignored).
fn warn_deprecated_options(config: &Config) {
    if config.verify_units {
        tracing::error!("verify_units is deprecated and ignored");
    }
    if !config.authorized_keys_file.is_empty() {
        tracing::error!("authorized_keys_file is deprecated and ignored");
    }
}

/// Runs fleetd until SIGTERM or SIGINT. `activated` holds the sockets systemd passed, taken
/// in `main` before the runtime's threads started.
/// `handover_nonce`: set when an earlier image of this fleetd replaced itself with this one
/// (SIGUSR2), whose units are taken over as they run.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    activated: Vec<ApiListener>,
    handover_nonce: Option<String>,
) -> anyhow::Result<()> {
    warn_deprecated_options(&config);
    let machine_id = config.resolve_machine_id()?;
    fleet_fs::create_private_dir(&config.state_dir)
        .with_context(|| format!("creating state_dir {}", config.state_dir.display()))?;
    // Before anything else touches the state: unit processes, the store, the lease file.
    let _state_lock = fleet_fs::StateLock::acquire(&config.state_dir)?;
    let mut daemon = Daemon::new()?;
    let manager = unit_manager(&config, &machine_id, handover_nonce).await?;
    if !config.manager_url.is_empty() {
        let machine = machine_state(&config, &machine_id);
        return crate::pull::run(config, machine, manager, daemon).await;
    }
    // Both retry while the store cannot be reached: a signal meanwhile ends fleetd.
    let reached = daemon.unless_stopped(async {
        let store = store::open(&config).await?;
        crate::store_format::settle(store.format.as_ref()).await?;
        anyhow::Ok(store)
    });
    let Some(reached) = reached.await else {
        tracing::info!("fleetd stopped before it reached its store");
        return Ok(());
    };
    let store::Store { registry, chores, journal_questions, format: _, backup } = reached?;
    let store_format = fleet_core::store_format::CURRENT.to_string();
    fleet_metrics::set_build_info(&[
        ("version", fleet_build_info::VERSION),
        ("commit", fleet_build_info::COMMIT),
        ("store_format", &store_format),
    ]);
    // Followed for fleetd's whole life: a fresh presence is claimed only once the agent
    // stopped what runs here from before (announcing cannot claim one ahead of it).
    let _lapses = registry.presence_lapses(&machine_id);
    let announced = machine_state(&config, &machine_id);
    store::announce(registry.as_ref(), &announced).await?;
    let capacity = announced.capacity.map(|capacity| capacity.to_string());
    tracing::info!(
        machine_id,
        capacity = capacity.as_deref().unwrap_or("unknown"),
        "fleetd {} starting",
        fleetd::VERSION
    );
    let api = ApiService::start(
        &config,
        &machine_id,
        registry.clone(),
        journal_questions.clone(),
        backup,
        manager.clone(),
        activated,
    )
    .await?;
    let serving = api.serving.clone();
    let (secret_keys, events) = (api.secret_keys.clone(), api.events.clone());
    let mut member = ClusterMember {
        config,
        config_path,
        machine_id,
        registry,
        chores,
        journal_questions,
        manager,
        api,
        secret_keys,
        events,
    };
    let units = member.manager.clone();
    daemon.run(&serving, &mut member, units).await;
    member.api.stop().await;
    tracing::info!("fleetd stopped");
    Ok(())
}

/// A fleetd on a store (etcd or embedded): its agent, and unless `disable_engine` the
/// engine and what runs on the engine leader.
struct ClusterMember {
    config: Config,
    config_path: Option<PathBuf>,
    machine_id: String,
    registry: Arc<dyn fleet_registry::Registry>,
    chores: Option<Arc<dyn fleet_registry::StoreChores>>,
    journal_questions: Option<Arc<dyn fleet_registry::JournalQuestions>>,
    manager: Arc<dyn UnitManager>,
    api: ApiService,
    /// The cluster's secrets key, which opens what units name for the agent.
    secret_keys: Arc<fleet_api::secret_keys::SecretKeys>,
    /// Where the agent, the engine and the leader's drivers hand their events.
    events: fleet_registry::EventSink,
}

impl Components for ClusterMember {
    fn start(&mut self, tasks: &mut ComponentTasks, lifecycle: watch::Receiver<Lifecycle>) {
        let config = &self.config;
        let agent_config = AgentConfig {
            machine: machine_state(config, &self.machine_id),
            reconcile_interval: AGENT_RECONCILE_INTERVAL,
            debounce: DEBOUNCE,
            presence_ttl: Some(config.agent_ttl),
            stop_units_when_cut_off: config.stop_units_when_cut_off,
        };
        if let Some(questions) = self.journal_questions.clone() {
            let local = fleet_api::LocalMachine { machine_id: self.machine_id.clone(), manager: self.manager.clone() };
            let running = lifecycle.clone();
            tasks.supervise("journal answers", move || {
                fleet_runtime::run(JournalAnswers::new(questions.clone(), local.clone()), running.clone())
            });
        }
        let (registry, manager, running) = (self.registry.clone(), self.manager.clone(), lifecycle.clone());
        let secrets: Arc<dyn fleet_registry::UnitSecrets> =
            Arc::new(crate::store_secrets::StoreSecrets::new(self.registry.clone(), self.secret_keys.clone()));
        let events = self.events.clone();
        tasks.supervise("agent", move || {
            Agent::new(agent_config.clone(), registry.clone(), manager.clone())
                .with_secrets(secrets.clone())
                .with_events(events.clone())
                .run(running.clone())
        });
        if self.api.serves_agents {
            let (presence, registry, running) =
                (self.api.agent_presence.clone(), self.registry.clone(), lifecycle.clone());
            tasks.supervise("silent agent sweep", move || {
                fleet_runtime::run(SilentAgentSweep::new(presence.clone(), registry.clone()), running.clone())
            });
            // A manager answers the journal questions put through the store to its agents.
            if let Some(questions) = self.journal_questions.clone() {
                let (relay, presence, running) =
                    (self.api.journal_relay.clone(), self.api.agent_presence.clone(), lifecycle.clone());
                tasks.supervise("agents' journal answers", move || {
                    let answers = AgentJournalAnswers::new(questions.clone(), relay.clone(), presence.clone());
                    fleet_runtime::run(answers, running.clone())
                });
            }
            // A manager's memory comes and goes with its agents' connections.
            let running = lifecycle.clone();
            tasks.supervise("memory trim", move || fleet_runtime::run(MemoryTrim::new(), running.clone()));
        }
        if config.disable_engine {
            return;
        }
        let engine_config = EngineConfig {
            machine_id: self.machine_id.clone(),
            reconcile_interval: config.engine_reconcile_interval,
            debounce: DEBOUNCE,
            agent_ttl: config.agent_ttl,
            strategy: config.placement_strategy,
            preemption: config.preemption,
        };
        let (leads, leads_watch) = watch::channel(false);
        // The engine, the rollout driver and the drain driver take their disruptions from the
        // same budgets.
        let ledger = DisruptionLedger::default();
        let (registry, running, shared) = (self.registry.clone(), lifecycle.clone(), ledger.clone());
        let events = self.events.clone();
        tasks.supervise("engine", move || {
            Engine::new(engine_config.clone(), registry.clone())
                .with_leadership_signal(leads.clone())
                .with_disruption_ledger(shared.clone())
                .with_events(events.clone())
                .run(running.clone())
        });
        let syncer_config = SyncerConfig { tick: SOURCE_TICK };
        let (registry, running, leading) = (self.registry.clone(), lifecycle.clone(), leads_watch.clone());
        let (events, reader) = (self.events.clone(), self.api.source_reader.clone());
        tasks.supervise("source syncer", move || {
            SourceSyncer::new(syncer_config.clone(), Arc::new(registry.clone()), reader.clone())
                .with_events(events.clone())
                .run(leading.clone(), running.clone())
        });
        let (registry, running, leading) = (self.registry.clone(), lifecycle.clone(), leads_watch.clone());
        let shared = ledger.clone();
        let events = self.events.clone();
        tasks.supervise("rollout driver", move || {
            RolloutDriver::new(Arc::new(registry.clone()))
                .sharing(shared.clone())
                .with_events(events.clone())
                .run(leading.clone(), running.clone())
        });
        let (registry, running, leading) = (self.registry.clone(), lifecycle.clone(), leads_watch.clone());
        let events = self.events.clone();
        tasks.supervise("drain driver", move || {
            DrainDriver::new(Arc::new(registry.clone()))
                .sharing(ledger.clone())
                .with_events(events.clone())
                .run(leading.clone(), running.clone())
        });
        let (log, running, leading) = (self.registry.clone(), lifecycle.clone(), leads_watch.clone());
        let (kept, kept_for) = (config.events_kept, config.events_kept_for);
        tasks.supervise("event trim", move || {
            let pass = EventTrimPass::new(log.clone(), kept, kept_for);
            fleet_runtime::while_leading(pass, fleet_runtime::Triggers::none(), leading.clone(), running.clone())
        });
        if let Some(chores) = self.chores.clone() {
            tasks.supervise("store chores", move || {
                let changes = fleet_runtime::Triggers::none().with(chores.chore_changes());
                fleet_runtime::while_leading(
                    StoreChoresPass::new(chores.clone()),
                    changes,
                    leads_watch.clone(),
                    lifecycle.clone(),
                )
            });
        }
    }

    fn reload(&mut self) {
        let environment: BTreeMap<String, String> = std::env::vars().collect();
        match Config::load(self.config_path.as_deref(), &environment) {
            Ok(new) => {
                warn_deprecated_options(&new);
                warn_fixed_options(&self.config, &new);
                let old = &self.config;
                self.config = Config {
                    state_dir: old.state_dir.clone(),
                    api_listen: old.api_listen.clone(),
                    machine_id: old.machine_id.clone(),
                    unit_manager: old.unit_manager,
                    ..new
                };
                self.api.reload(&self.config);
            }
            Err(error) => tracing::error!("keeping the running configuration: {error:#}"),
        }
    }
}
