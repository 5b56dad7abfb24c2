//! Wiring: the registry, the unit manager, the engine, the agent and the API, and the
//! signals that reload or stop them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_api::LocalMachine;
use fleet_api::agent_presence::AgentPresence;
use fleet_api::auth::Auth;
use fleet_api::auth::agent_ca::AgentCa;
use fleet_api::auth::tls::ServerTls;
use fleet_api::listen::{ApiListener, ListenAddress};
use fleet_api::serve::{ServeLimits, serve};
use fleet_api::{ApiState, TokenLimit, router};
use fleet_core::MachineState;
use fleet_engine::{Engine, EngineConfig};
use fleet_source::{RolloutDriver, SourceSyncer, SyncerConfig};
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::native::{LogLimits, NativeManager, NativeOptions};
use fleet_unit_manager::systemd::{SystemdManager, SystemdOptions};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::reconcile_timing::{AGENT_RECONCILE_INTERVAL, DEBOUNCE};
use crate::supervise::supervise;
use crate::{host, store};
use fleetd::api_security::{self, Transport};
use fleetd::config::{Config, UnitManagerChoice};

/// How long the API may take to answer its first request once it serves.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How often the engine leader looks for a git source that is due (a webhook or a change is
/// picked up within this; two small reads of the store each time, on the leader only).
const SOURCE_TICK: Duration = Duration::from_millis(250);
/// How often the engine leader steps the running rollouts (one read of the rollouts when
/// none runs; units and states besides while one does).
const ROLLOUT_TICK: Duration = Duration::from_millis(500);

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
        version: fleet_api::VERSION.to_string(),
        disable_engine: config.disable_engine,
    }
}

/// The unit manager `unit_manager` asks for: `auto` takes systemd when the machine runs it
/// (`/run/systemd/system` exists) and it answers on the bus, the native supervisor otherwise.
async fn unit_manager(config: &Config, machine_id: &str) -> anyhow::Result<Arc<dyn UnitManager>> {
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
        let options = SystemdOptions { user, units_directory: config.units_directory.clone() };
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
    };
    Ok(Arc::new(NativeManager::new(options)?))
}

/// The API's listeners: those systemd passed (TCP ones serving HTTPS when TLS is configured),
/// else those `api_listen` names; and the Unix socket files fleetd created itself (to remove
/// at shutdown). Refuses any that would expose the API unprotected.
fn listeners(
    config: &Config,
    activated: Vec<ApiListener>,
    tls_configured: bool,
) -> anyhow::Result<(Vec<ApiListener>, Vec<PathBuf>)> {
    let mut owned = Vec::new();
    let listeners = if activated.is_empty() {
        let mut listeners = Vec::new();
        for entry in &config.api_listen {
            let address = ListenAddress::parse(entry).with_context(|| format!("invalid api_listen entry {entry}"))?;
            if let ListenAddress::Unix(path) = &address {
                owned.push(path.clone());
            }
            listeners.push(address.bind().with_context(|| format!("listening on {entry}"))?);
        }
        listeners
    } else if tls_configured {
        activated.into_iter().map(ApiListener::with_tls).collect()
    } else {
        activated
    };
    let tcp: Vec<(std::net::SocketAddr, Transport)> = listeners
        .iter()
        .filter_map(|listener| {
            let transport = if matches!(listener, ApiListener::Tls(_)) { Transport::Https } else { Transport::Http };
            Some((listener.tcp_address()?, transport))
        })
        .collect();
    api_security::check_listeners(&tcp, tls_configured).map_err(anyhow::Error::msg)?;
    Ok((listeners, owned))
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

/// Gives up the presence of pull agents silent for `agent_ttl`: the cluster treats them as
/// lost machines (their units move), as it does an etcd machine whose lease ran out. An agent
/// that comes back announces itself again.
async fn sweep_silent_agents(presence: Arc<AgentPresence>, registry: Arc<dyn fleet_registry::Registry>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for machine in presence.take_lost() {
            tracing::warn!(machine, "pull agent silent for agent_ttl: treating it as a lost machine");
            if let Err(error) = registry.unregister_machine(&machine).await {
                tracing::warn!(machine, %error, "cannot give up the pull agent's presence; trying again");
                // Its slot was freed just above, so it fits again.
                let _ = presence.heard(&machine);
            }
        }
    }
}

/// Reads the API's certificates and keys again (rotation without a restart). A failure keeps
/// the running ones.
fn reload_tls(tls: Option<&ServerTls>, config: &Config) {
    match (tls, api_security::tls_files(config)) {
        (Some(tls), Ok(Some(files))) => match tls.reload(files) {
            Ok(()) => tracing::info!("API TLS certificates reloaded"),
            Err(error) => tracing::error!(%error, "keeping the running API TLS certificates"),
        },
        (None, Ok(None)) => {}
        (_, Err(error)) => tracing::error!(%error, "keeping the running API TLS certificates"),
        (None, Ok(Some(_))) | (Some(_), Ok(None)) => {
            tracing::warn!("turning the API's TLS on or off takes a restart of fleetd")
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
pub async fn run(mut config: Config, config_path: Option<PathBuf>, activated: Vec<ApiListener>) -> anyhow::Result<()> {
    warn_deprecated_options(&config);
    let machine_id = config.resolve_machine_id()?;
    fleet_fs::create_private_dir(&config.state_dir)
        .with_context(|| format!("creating state_dir {}", config.state_dir.display()))?;
    // Before anything else touches the state: unit processes, the store, the lease file.
    let _state_lock = fleet_fs::StateLock::acquire(&config.state_dir)?;
    let manager = unit_manager(&config, &machine_id).await?;
    if !config.manager_url.is_empty() {
        return crate::pull::run(config.clone(), machine_state(&config, &machine_id), manager).await;
    }
    let registry = store::open(&config).await?;
    store::announce(registry.as_ref(), &machine_state(&config, &machine_id)).await?;
    let tls_files = api_security::tls_files(&config).map_err(anyhow::Error::msg)?;
    let tls = match &tls_files {
        Some(files) => Some(Arc::new(ServerTls::load(files.clone()).context("setting up the API's TLS")?)),
        None => None,
    };
    let agent_ca = match api_security::agent_ca_files(&config).map_err(anyhow::Error::msg)? {
        Some((cert, key)) => {
            Some(Arc::new(AgentCa::load(&cert, &key, config.agent_cert_lifetime).context("loading the agent CA")?))
        }
        None => None,
    };
    let (listeners, owned_sockets) = listeners(&config, activated, tls.is_some())?;
    for listener in &listeners {
        tracing::info!(address = listener.describe(), "API listening");
    }
    if let Some(role) = &config.api_anonymous_role {
        tracing::warn!(
            role = %role,
            "anonymous API access is on: clients without a credential on TCP listeners act as {role}"
        );
    }
    let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tracing::info!(machine_id, "fleetd {} starting", fleet_api::VERSION);
    // The API serves for fleetd's whole life: a reload changes its page size in place, so no
    // client's connection is cut by a reload.
    let token_limit = TokenLimit::new(config.token_limit);
    let agent_presence = Arc::new(AgentPresence::new(config.agent_ttl));
    let api_state = ApiState {
        registry: registry.clone(),
        token_limit: token_limit.clone(),
        local: Some(LocalMachine { machine_id: machine_id.clone(), manager: manager.clone() }),
        auth: Auth::new(registry.clone(), config.api_anonymous_role.clone()),
        // A fleetd that signs machine certificates is a manager: it serves pull agents.
        agents: agent_ca.as_ref().map(|_| registry.clone() as Arc<dyn fleet_registry::AgentRegistry>),
        agent_ca,
        agent_presence: agent_presence.clone(),
        journal_relay: Default::default(),
        live_view: Default::default(),
        feed_slots: Default::default(),
        page_cursors: Default::default(),
        source_secrets_dir: Some(config.source_credentials_dir.clone()),
    };
    if api_state.agents.is_some() {
        tokio::spawn(sweep_silent_agents(agent_presence, registry.clone()));
    }
    let api_tls = tls.clone();
    let limits = ServeLimits { connections_per_listener: config.api_max_connections, ..ServeLimits::default() };
    let (api_stop, api_stopped) = watch::channel(false);
    let serving = format!("API on {}", listeners.iter().map(ApiListener::describe).collect::<Vec<_>>().join(", "));
    let unix_socket = listeners.iter().find_map(|listener| match listener {
        ApiListener::Unix(unix) => unix.local_addr().ok()?.as_pathname().map(Path::to_path_buf),
        _ => None,
    });
    let app = router(api_state);
    let probe = app.clone();
    let api = tokio::spawn(async move {
        if let Err(error) = serve(&listeners, app, api_stopped, limits, api_tls).await {
            tracing::error!(%error, "API server failed");
        }
    });
    // systemd hears "ready" only once the API answers a request.
    if crate::ready_probe::wait_until_api_answers(unix_socket, probe, READY_LIMIT).await {
        crate::service_manager::ready(&serving);
    } else {
        anyhow::bail!("the API did not answer within {READY_LIMIT:?} of starting");
    }
    tokio::spawn(crate::service_manager::keep_alive(serving.clone()));
    loop {
        let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
        let (stop, stop_watch) = watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        let agent_config = AgentConfig {
            machine: machine_state(&config, &machine_id),
            reconcile_interval: AGENT_RECONCILE_INTERVAL,
            debounce: DEBOUNCE,
            presence_ttl: Some(config.agent_ttl),
            stop_units_when_cut_off: config.stop_units_when_cut_off,
        };
        let (agent_registry, agent_manager) = (registry.clone(), manager.clone());
        tasks.spawn(supervise("agent", move || {
            Agent::new(agent_config.clone(), agent_registry.clone(), agent_manager.clone()).run(lifecycle_watch.clone())
        }));
        if !config.disable_engine {
            let engine_config = EngineConfig {
                machine_id: machine_id.clone(),
                reconcile_interval: config.engine_reconcile_interval,
                debounce: DEBOUNCE,
                at_most_once_hold: fleet_core::schedule::at_most_once::hold(config.agent_ttl),
            };
            let (leads, leads_watch) = watch::channel(false);
            let (engine_registry, engine_stop) = (registry.clone(), stop_watch.clone());
            tasks.spawn(supervise("engine", move || {
                Engine::new(engine_config.clone(), engine_registry.clone())
                    .with_leadership_signal(leads.clone())
                    .run(engine_stop.clone())
            }));
            let syncer_config = SyncerConfig {
                cache_dir: config.state_dir.join("sources"),
                credentials_dir: config.source_credentials_dir.clone(),
                tick: SOURCE_TICK,
                max_units: config.source_max_units,
            };
            let (syncer_registry, syncer_stop, syncer_leads) =
                (registry.clone(), stop_watch.clone(), leads_watch.clone());
            tasks.spawn(supervise("source syncer", move || {
                SourceSyncer::new(syncer_config.clone(), syncer_registry.clone())
                    .run(syncer_leads.clone(), syncer_stop.clone())
            }));
            let (rollout_registry, rollout_stop) = (registry.clone(), stop_watch.clone());
            tasks.spawn(supervise("rollout driver", move || {
                RolloutDriver::new(rollout_registry.clone(), ROLLOUT_TICK)
                    .run(leads_watch.clone(), rollout_stop.clone())
            }));
        }
        let reload = tokio::select! {
            _ = terminate.recv() => false,
            _ = interrupt.recv() => false,
            _ = hangup.recv() => true,
        };
        if reload {
            tracing::info!("Reloading configuration");
            crate::service_manager::reloading();
            let environment: BTreeMap<String, String> = std::env::vars().collect();
            match Config::load(config_path.as_deref(), &environment) {
                Ok(new) => {
                    warn_deprecated_options(&new);
                    warn_fixed_options(&config, &new);
                    let (state_dir, api_listen, machine, manager_choice) = (
                        config.state_dir.clone(),
                        config.api_listen.clone(),
                        config.machine_id.clone(),
                        config.unit_manager,
                    );
                    config = Config { state_dir, api_listen, machine_id: machine, unit_manager: manager_choice, ..new };
                    token_limit.set(config.token_limit);
                    reload_tls(tls.as_deref(), &config);
                }
                Err(error) => tracing::error!("keeping the running configuration: {error:#}"),
            }
            let _ = lifecycle.send(Lifecycle::Reloading);
        } else {
            tracing::info!("Shutting down");
            crate::service_manager::stopping();
            let _ = lifecycle.send(Lifecycle::ShuttingDown);
        }
        let _ = stop.send(true);
        while tasks.join_next().await.is_some() {}
        if reload {
            crate::service_manager::ready(&serving);
        }
        if !reload {
            let _ = api_stop.send(true);
            let _ = api.await;
            for path in &owned_sockets {
                let _ = std::fs::remove_file(path);
            }
            tracing::info!("fleetd stopped");
            return Ok(());
        }
    }
}
