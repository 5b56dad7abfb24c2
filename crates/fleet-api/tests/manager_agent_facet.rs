//! The manager's side of pull agents, in process on paused time over the embedded store:
//! the agent facet (`/fleet/v1/agents/{machine}/…`) admits a machine to its own facet only and
//! holds each request to its own work; its long poll answers when that machine's work
//! changes, not another's, and at the end of its wait otherwise; every request keeps the
//! machine present, and the sweep gives up the presence of one silent for `agent_ttl`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use fleet_api::agent_presence::AgentPresence;
use fleet_api::auth::{Auth, Peer};
use fleet_api::silent_agents::SilentAgentSweep;
use fleet_api::{ApiState, router};
use fleet_core::access::Role;
use fleet_core::schedule::Decision;
use fleet_core::{DesiredState, UnitFile};
use fleet_registry::{ApiRegistry, EngineRegistry};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_tls::certificate::CertificateIdentity;
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt;

const AGENT_TTL: Duration = Duration::from_secs(30);

struct Manager {
    router: axum::Router,
    store: Arc<EmbeddedRegistry>,
    presence: Arc<AgentPresence>,
    _dir: tempfile::TempDir,
}

fn manager() -> Manager {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let presence = Arc::new(AgentPresence::new(AGENT_TTL));
    let state = ApiState {
        agents: Some(store.clone()),
        agent_presence: presence.clone(),
        ..ApiState::new(store.clone(), Auth::new(store.clone(), None))
    };
    Manager { router: router(state), store, presence, _dir: dir }
}

/// The peer a machine's own certificate makes (verified by the TLS handshake in fleetd).
fn machine_peer(id: &str) -> Peer {
    let certificate = CertificateIdentity {
        name: id.into(),
        role: Ok(Role::Machine { id: id.into() }),
        key_sha256: format!("key-of-{id}"),
    };
    Peer::Tcp { tls: true, certificate: Some(Arc::new(certificate)) }
}

impl Manager {
    /// `method path` as machine `as_machine`; the status and the JSON answer.
    async fn call(&self, as_machine: &str, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(format!("/fleet/v1/agents/{path}"));
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let mut request =
            request.body(body.map_or(Body::empty(), |body| Body::from(body.to_string()))).expect("request");
        request.extensions_mut().insert(machine_peer(as_machine));
        let response = self.router.clone().oneshot(request).await.expect("answer");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("JSON") })
    }

    async fn announce(&self, id: &str) {
        let (status, _) = self.call(id, "PUT", &format!("{id}/machine"), Some(json!({"publicIP": "10.0.0.1"}))).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{id} announces itself");
    }

    /// Places `unit` (with `exec`) on `machine`, as the engine would.
    async fn place(&self, unit: &str, exec: &str, machine: &str) -> UnitFile {
        let file = UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("unit");
        self.store.put_unit(unit, &file, DesiredState::Launched).await.expect("put");
        let lease = self.store.acquire_leadership("engine").await.expect("lease").expect("leads");
        let decision = Decision::Schedule { unit: unit.into(), machine: machine.into() };
        self.store.apply(&lease, &[decision], &[]).await.expect("apply");
        file
    }

    async fn revision(&self, id: &str) -> u64 {
        let (status, answer) = self.call(id, "GET", &format!("{id}/changes"), None).await;
        assert_eq!(status, StatusCode::OK);
        answer["revision"].as_u64().expect("a revision")
    }
}

fn state_of(unit: &str, file: &UnitFile) -> Value {
    json!({"set": [{
        "name": unit,
        "hash": file.hash().to_string(),
        "systemdLoadState": "loaded",
        "systemdActiveState": "active",
        "systemdSubState": "running",
        "launched": true,
    }]})
}

#[tokio::test(start_paused = true)]
async fn a_machine_reaches_its_own_facet_and_its_own_work_only() {
    let manager = manager();
    manager.announce("m1").await;
    manager.announce("m2").await;
    let own = manager.place("own.service", "/bin/sleep 1000", "m1").await;
    let other = manager.place("other.service", "/bin/sleep 2000", "m2").await;
    let (status, work) = manager.call("m1", "GET", "m1/work", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(work["scheduled"][0]["name"], "own.service");
    assert_eq!(work["scheduled"].as_array().map(Vec::len), Some(1), "{work}");
    let (status, _) = manager.call("m1", "GET", "m2/work", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another machine's facet");
    let (status, _) = manager.call("m1", "GET", &format!("m1/bodies/{}", own.hash()), None).await;
    assert_eq!(status, StatusCode::OK, "the body of a unit it was given");
    let (status, _) = manager.call("m1", "GET", &format!("m1/bodies/{}", other.hash()), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the body of another machine's unit");
    let (status, _) = manager.call("m1", "POST", "m1/states", Some(state_of("own.service", &own))).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "the state of a unit it holds");
    let (status, _) = manager.call("m1", "POST", "m1/states", Some(state_of("other.service", &other))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the state of a unit it does not hold");
    let states = manager.store.unit_states().await.expect("states");
    assert_eq!(states.len(), 1);
    assert_eq!((states[0].name.as_str(), states[0].machine_id.as_str()), ("own.service", "m1"));
}

#[tokio::test(start_paused = true)]
async fn the_long_poll_answers_on_its_machines_change_and_otherwise_at_the_end_of_its_wait() {
    let manager = Arc::new(manager());
    manager.announce("m1").await;
    manager.announce("m2").await;
    let current = manager.revision("m1").await;
    let started = tokio::time::Instant::now();
    let (status, answer) = manager.call("m1", "GET", &format!("m1/changes?after={current}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["revision"].as_u64(), Some(current), "nothing changed: the same revision");
    assert_eq!(started.elapsed(), manager.presence.poll_wait(), "it waited the whole poll");
    let polling = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let (_, answer) = manager.call("m1", "GET", &format!("m1/changes?after={current}"), None).await;
            (answer["revision"].as_u64(), started.elapsed())
        })
    };
    // On paused time the clock moves only once every task waits: after this, the poll waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    manager.place("elsewhere.service", "/bin/true", "m2").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!polling.is_finished(), "another machine's change does not answer m1's poll");
    manager.place("here.service", "/bin/true", "m1").await;
    let (revision, waited) = polling.await.expect("the poll ends");
    assert!(revision.is_some_and(|revision| revision > current), "a new revision: {revision:?}");
    assert!(waited < manager.presence.poll_wait(), "answered on the change, after {waited:?}");
    let (_, work) = manager.call("m1", "GET", "m1/work", None).await;
    assert_eq!(work["scheduled"][0]["name"], "here.service");
}

#[tokio::test(start_paused = true)]
async fn requests_keep_a_machine_present_and_the_sweep_gives_up_a_silent_one() {
    let manager = manager();
    manager.announce("m1").await;
    manager.announce("m2").await;
    let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    let sweep = SilentAgentSweep::new(manager.presence.clone(), manager.store.clone());
    let sweeping = tokio::spawn(fleet_runtime::run(sweep, lifecycle_watch));
    let machines = async || {
        let mut ids: Vec<String> =
            manager.store.machines().await.expect("machines").into_iter().map(|machine| machine.id).collect();
        ids.sort();
        ids
    };
    // m1 keeps asking, m2 falls silent.
    let until = tokio::time::Instant::now() + AGENT_TTL * 2;
    while tokio::time::Instant::now() < until {
        manager.call("m1", "GET", "m1/work", None).await;
        tokio::time::sleep(AGENT_TTL / 4).await;
    }
    assert_eq!(machines().await, ["m1"], "the silent machine is given up, the one heard from stays");
    assert!(manager.presence.knows("m1") && !manager.presence.knows("m2"));
    manager.announce("m2").await;
    assert_eq!(machines().await, ["m1", "m2"], "it comes back by announcing itself");
    lifecycle.send_replace(Lifecycle::ShuttingDown);
    sweeping.await.expect("the sweep stops");
}

/// A pull agent's health report reaches the unit's state: its failure cut to one short line,
/// its restart count bounded by the budget; an unknown status word is a 400 and stores nothing.
#[tokio::test(start_paused = true)]
async fn a_pull_agents_health_report_is_bounded_and_a_bad_one_refused() {
    let manager = manager();
    manager.announce("m1").await;
    let file = manager.place("web.service", "/bin/sleep 1000", "m1").await;
    let with_health = |health: Value| {
        let mut report = state_of("web.service", &file);
        report["set"][0]["health"] = health;
        report
    };
    let flood = format!("HTTP 500\n{}", "x".repeat(10_000));
    let report = with_health(json!({"status": "unhealthy", "failure": flood, "restarts": 99, "givenUp": true}));
    let (status, _) = manager.call("m1", "POST", "m1/states", Some(report)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let states = manager.store.unit_states().await.expect("states");
    let health = states[0].health.clone().expect("a health report");
    assert_eq!(health.status, fleet_core::health::HealthStatus::Unhealthy);
    assert!(health.failure.starts_with("HTTP 500 x") && health.failure.chars().count() <= 200, "{health:?}");
    assert_eq!((health.restarts, health.given_up), (fleet_core::drift::LIMIT, true));

    let (status, answer) = manager.call("m1", "POST", "m1/states", Some(with_health(json!({"status": "fine"})))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains("invalid health")), "{answer}");
    let unchanged = manager.store.unit_states().await.expect("states");
    assert_eq!(unchanged, states, "a refused report changes nothing");
}
