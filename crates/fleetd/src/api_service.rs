//! The HTTP API of an etcd or embedded-store fleetd: its listeners, its TLS, its state, and
//! the server, which serves for fleetd's whole life (a reload changes what it can in place,
//! so no client's connection is cut by one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_api::LocalMachine;
use fleet_api::agent_presence::AgentPresence;
use fleet_api::auth::Auth;
use fleet_api::listen::{ApiListener, ListenAddress};
use fleet_api::serve::{ServeLimits, serve};
use fleet_api::{ApiState, PageSize, router};
use fleet_tls::agent_ca::AgentCa;
use fleet_tls::server_tls::ServerTls;
use fleet_unit_manager::UnitManager;
use tokio::sync::watch;

use fleetd::api_security::{self, Transport};
use fleetd::config::Config;

/// How long the API may take to answer its first request once it serves.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// The API server, serving.
pub struct ApiService {
    /// What a reload changes in place: the page size and the certificates.
    pub page_size: PageSize,
    tls: Option<Arc<ServerTls>>,
    /// Which pull agents were heard from lately.
    pub agent_presence: Arc<AgentPresence>,
    /// Journal questions carried to pull agents on their streams.
    pub journal_relay: Arc<fleet_api::journal_relay::JournalRelay>,
    /// Whether this fleetd is a manager: it signs machine certificates and serves pull agents.
    pub serves_agents: bool,
    /// How it serves (`API on …`), for systemd's status line.
    pub serving: String,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    /// The Unix socket files fleetd created itself, removed when it stops.
    owned_sockets: Vec<PathBuf>,
    /// The cluster's secrets key, shared with the agent; a reload reads its file again.
    pub secret_keys: Arc<fleet_api::secret_keys::SecretKeys>,
    /// Where the API's writes go as events, and the agent's, the engine's and the leader's.
    pub events: fleet_registry::EventSink,
    /// Reads git sources, for the engine leader's syncs and the API's plans of a sync.
    pub source_reader: Arc<fleet_leader::SourceReader>,
}

impl ApiService {
    /// Starts serving and returns once the API answers a request. `activated` holds the
    /// sockets systemd passed.
    pub async fn start(
        config: &Config,
        machine_id: &str,
        registry: Arc<dyn fleet_registry::Registry>,
        journal_questions: Option<Arc<dyn fleet_registry::JournalQuestions>>,
        backup: Option<Arc<dyn fleet_registry::StoreBackup>>,
        manager: Arc<dyn UnitManager>,
        activated: Vec<ApiListener>,
    ) -> anyhow::Result<Self> {
        let tls_files = api_security::tls_files(config).map_err(anyhow::Error::msg)?;
        let tls = match &tls_files {
            Some(files) => Some(Arc::new(ServerTls::load(files.clone()).context("setting up the API's TLS")?)),
            None => None,
        };
        let agent_ca = match api_security::agent_ca_files(config).map_err(anyhow::Error::msg)? {
            Some((cert, key)) => {
                Some(Arc::new(AgentCa::load(&cert, &key, config.agent_cert_lifetime).context("loading the agent CA")?))
            }
            None => None,
        };
        let (listeners, owned_sockets) = listeners(config, activated, tls.is_some())?;
        for listener in &listeners {
            tracing::info!(address = listener.describe(), "API listening");
        }
        if let Some(role) = &config.api_anonymous_role {
            tracing::warn!(
                role = %role,
                "anonymous API access is on: clients without a credential on TCP listeners act as {role}"
            );
        }
        let page_size = PageSize::new(config.token_limit);
        let secret_keys = Arc::new(crate::secrets_key::of(config));
        // A fleetd that signs machine certificates is a manager: it serves pull agents.
        let serves_agents = agent_ca.is_some();
        let agent_presence = Arc::new(AgentPresence::new(config.agent_ttl));
        let journal_relay = Arc::new(fleet_api::journal_relay::JournalRelay::default());
        // Every part of this fleetd hands its events to this one writer.
        let events = fleet_registry::EventSink::writing_to(registry.clone());
        // The engine leader's syncer reads sources through the same reader.
        let source_reader = Arc::new(fleet_leader::SourceReader::new(fleet_leader::ReaderConfig {
            cache_dir: config.state_dir.join("sources"),
            credentials_dir: config.source_credentials_dir.clone(),
            max_units: config.source_max_units,
        }));
        let state = ApiState {
            registry: registry.clone(),
            page_size: page_size.clone(),
            local: Some(LocalMachine { machine_id: machine_id.to_string(), manager }),
            auth: Auth::new(registry.clone(), config.api_anonymous_role.clone()),
            agents: agent_ca.as_ref().map(|_| registry.clone() as Arc<dyn fleet_registry::AgentRegistry>),
            agent_ca,
            agent_presence: agent_presence.clone(),
            announce_pace: Default::default(),
            journal_relay: journal_relay.clone(),
            journal_limits: Default::default(),
            revocation_bell: Default::default(),
            encoded_bodies: Default::default(),
            journal_questions,
            live_view: Default::default(),
            feed_slots: Arc::new(fleet_api::feed_slots::FeedSlots::for_connections(config.api_max_connections)),
            page_cursors: Default::default(),
            source_secrets_dir: Some(config.source_credentials_dir.clone()),
            secret_keys: secret_keys.clone(),
            placement_strategy: config.placement_strategy,
            preemption: config.preemption,
            agent_ttl: config.agent_ttl,
            plans_under_way: Default::default(),
            plan_requirements: Default::default(),
            events: events.clone(),
            encoded_events: Default::default(),
            agent_state_events: Default::default(),
            source_reader: Some(source_reader.clone()),
            backup: backup.map(|store| fleet_api::Backup {
                store,
                scratch: config.state_dir.clone(),
                under_way: Default::default(),
            }),
        };
        let defaults = ServeLimits::default();
        let limits = ServeLimits {
            connections_per_listener: config.api_max_connections,
            keep_alive: if serves_agents { agent_presence.keepalive() } else { defaults.keep_alive },
            // A pull agent waits a third of agent_ttl for its manager (at least 10 s): its
            // handshake is given more.
            handshake_timeout: if serves_agents {
                agent_presence.keepalive().max(defaults.handshake_timeout)
            } else {
                defaults.handshake_timeout
            },
            ..defaults
        };
        let (stop, stopped) = watch::channel(false);
        let serving = format!("API on {}", listeners.iter().map(ApiListener::describe).collect::<Vec<_>>().join(", "));
        let unix_socket = listeners.iter().find_map(|listener| match listener {
            ApiListener::Unix(unix) => unix.local_addr().ok()?.as_pathname().map(Path::to_path_buf),
            _ => None,
        });
        let app = router(state);
        let probe = app.clone();
        let server_tls = tls.clone();
        let server = tokio::spawn(async move {
            if let Err(error) = serve(&listeners, app, stopped, limits, server_tls).await {
                tracing::error!(%error, "API server failed");
            }
        });
        // systemd hears "ready" only once the API answers a request.
        if !crate::ready_probe::wait_until_api_answers(unix_socket, probe, READY_LIMIT).await {
            anyhow::bail!("the API did not answer within {READY_LIMIT:?} of starting");
        }
        Ok(Self {
            page_size,
            tls,
            agent_presence,
            journal_relay,
            serves_agents,
            serving,
            stop,
            server,
            owned_sockets,
            secret_keys,
            events,
            source_reader,
        })
    }

    /// Takes in a reloaded configuration: the page size and the certificates (a failure
    /// keeps the running ones).
    pub fn reload(&self, config: &Config) {
        self.page_size.set(config.token_limit);
        self.secret_keys.forget();
        match (self.tls.as_deref(), api_security::tls_files(config)) {
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

    /// Stops serving and removes the socket files fleetd made.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        for path in &self.owned_sockets {
            let _ = std::fs::remove_file(path);
        }
    }
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
