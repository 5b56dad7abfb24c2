//! The registry contract, run against the remote store: every check of the agent's facet that
//! the store crates run against the embedded and etcd stores, with the agent's side played by
//! `fleet_pull_agent::RemoteRegistry` (one per machine, each with its own certificate) through an
//! in-process manager (the real API server, TLS and agent CA) on an embedded store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_api::auth::tokens::{REGISTRATION_PREFIX, digest, generate, now_unix};
use fleet_api::listen::bind_tcp;
use fleet_api::serve::{ServeLimits, serve};
use fleet_api::{ApiState, router};
use fleet_e2e::pki::ManagerPki;
use fleet_registry::contract::{self, AgentFor};
use fleet_registry::{AgentRegistry, CredentialRegistry, RegistrationRecord, Registry};
use fleet_store_embedded::EmbeddedRegistry;
use fleet_tls::agent_ca::AgentCa;
use fleet_tls::server_tls::{ServerTls, TlsFiles};
use tokio::sync::watch;

/// A manager on an embedded store, and a remote store for each of machines m1 and m2.
struct RemoteStores {
    store: Arc<EmbeddedRegistry>,
    agents: HashMap<String, Arc<dyn AgentRegistry>>,
    _stop: watch::Sender<bool>,
    _pki: ManagerPki,
    _dir: tempfile::TempDir,
}

async fn remote_stores() -> RemoteStores {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let pki = ManagerPki::local();
    let agent_ca = AgentCa::load(&pki.agent_ca_file, &pki.agent_ca_key, Duration::from_secs(3600)).expect("agent CA");
    let tls = ServerTls::load(TlsFiles {
        certificate: pki.server.cert.clone(),
        key: pki.server.key.clone(),
        client_ca: None,
        agent_ca: Some(pki.agent_ca_file.clone()),
    })
    .expect("TLS");
    let state = ApiState {
        agent_ca: Some(Arc::new(agent_ca)),
        agents: Some(store.clone()),
        ..ApiState::new(store.clone(), fleet_api::auth::Auth::new(store.clone(), None))
    };
    let listener = bind_tcp("127.0.0.1:0").expect("bind").with_tls();
    let port = listener.tcp_address().expect("address").port();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        serve(&[listener], router(state), stopped, ServeLimits::default(), Some(Arc::new(tls))).await
    });

    let token = generate(REGISTRATION_PREFIX).expect("token");
    let record = RegistrationRecord {
        name: "contract".into(),
        sha256: digest(&token),
        created: now_unix(),
        expires: None,
        max_uses: None,
        uses: 0,
        // What the contract's machines announce of themselves: a pull agent announces no more
        // than its registration grants.
        metadata: [("hostname".to_string(), "smoke".to_string())].into(),
        machine_ids: None,
    };
    assert!(store.create_registration(&record).await.expect("registration"));
    let manager = fleet_pull_agent::Manager::new(
        &format!("https://localhost:{port}"),
        Some(pki.api_ca_pem()),
        Duration::from_secs(10),
    )
    .expect("manager");
    let mut agents: HashMap<String, Arc<dyn AgentRegistry>> = HashMap::new();
    for id in ["m1", "m2"] {
        let (credentials, _) = manager.join(&token, id).await.expect("join");
        let remote = fleet_pull_agent::RemoteRegistry::new(&manager, &credentials, None).expect("remote store");
        fleet_pull_agent::start(&remote);
        agents.insert(id.to_string(), remote);
    }
    RemoteStores { store, agents, _stop: stop, _pki: pki, _dir: dir }
}

macro_rules! remote_contract {
    ($($name:ident),+ $(,)?) => {
        $(#[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let stores = remote_stores().await;
            let agents = stores.agents.clone();
            let agent_for: AgentFor<'_> = &move |id: &str| agents.get(id).expect("a machine of the test").clone();
            let store: &dyn Registry = stores.store.as_ref();
            contract::$name(store, agent_for).await;
        })+
    };
}

remote_contract!(
    a_schedule_change_wakes_only_its_machine,
    desired_state_changes_reach_the_agent,
    runtime_metadata_overlays_the_machine,
    taints_overlay_the_machine_as_metadata_does,
    states_go_with_their_machine,
    a_revoked_machine_goes_with_its_states,
    a_run_ticket_reaches_every_machine_with_its_global_unit,
    where_requirements_run_reaches_the_machine_of_their_unit,
);
