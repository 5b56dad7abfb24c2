use std::sync::Arc;
use std::time::Duration;

use fleet_core::schedule::Decision;
use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry};
use fleet_store_embedded::EmbeddedRegistry;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::*;

struct Served {
    registry: EmbeddedRegistry,
    presence: Arc<AgentPresence>,
    slots: Arc<Semaphore>,
    stop: watch::Sender<bool>,
    agent: BufReader<DuplexStream>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// A stream of machine `m1` served on one end of an in-memory connection; the agent's end.
async fn served() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&MachineState { id: "m1".into(), ..MachineState::default() }).await.unwrap();
    let presence = Arc::new(AgentPresence::new(Duration::from_secs(40)));
    presence.heard("m1").unwrap();
    let stream = ChangeStream {
        machine: "m1".into(),
        key: "k".into(),
        agents: Arc::new(registry.clone()),
        presence: presence.clone(),
        journal: Arc::new(JournalRelay::default()),
        revocations: Arc::new(RevocationBell::default()),
        auth: Auth::new(Arc::new(registry.clone()), None),
    };
    let slots = Arc::new(Semaphore::new(1));
    let (stop, stopped) = watch::channel(false);
    let hold = ConnectionHold { slot: Arc::new(slots.clone().try_acquire_owned().unwrap()), stop: stopped };
    let (agent, manager) = tokio::io::duplex(4096);
    let task = tokio::spawn(stream.serve(manager, hold));
    Served { registry, presence, slots, stop, agent: BufReader::new(agent), task, _dir: dir }
}

async fn line(agent: &mut BufReader<DuplexStream>) -> String {
    let mut line = String::new();
    agent.read_line(&mut line).await.unwrap();
    line
}

fn revision(line: &str) -> u64 {
    assert!(line.ends_with('\n'), "a whole line: {line:?}");
    serde_json::from_str::<AgentChanges>(line).unwrap().revision
}

#[tokio::test]
async fn a_stream_tells_its_agent_each_change_and_answers_each_heartbeat() {
    let mut served = served().await;
    let first = revision(&line(&mut served.agent).await);
    served.agent.get_mut().write_all(b"\n").await.unwrap();
    assert_eq!(line(&mut served.agent).await, "\n", "a heartbeat is answered with an empty line");

    let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    served.registry.put_unit("a.service", &file, DesiredState::Launched).await.unwrap();
    let lease = served.registry.acquire_leadership("m1").await.unwrap().unwrap();
    let schedule = [Decision::Schedule { unit: "a.service".into(), machine: "m1".into() }];
    served.registry.apply(&lease, &schedule, &[]).await.unwrap();
    let after = revision(&line(&mut served.agent).await);
    assert!(after > first, "the machine's work changed: {first} then {after}");

    assert_eq!(served.slots.available_permits(), 0, "the stream holds its connection's slot");
    drop(served.agent);
    served.task.await.unwrap();
    assert_eq!(served.slots.available_permits(), 1, "an ended stream gives its slot back");
    assert!(served.presence.knows("m1"));
}

#[tokio::test(start_paused = true)]
async fn a_silent_agent_loses_its_stream_and_is_present_from_its_last_heartbeat() {
    let mut served = served().await;
    line(&mut served.agent).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    served.agent.get_mut().write_all(b"\n").await.unwrap();
    assert_eq!(line(&mut served.agent).await, "\n");
    // The last heartbeat, then silence: the agent is asked for a beat half of `agent_ttl`
    // later, and the stream ends three quarters of it later.
    let silence = served.presence.cut_off_slack();
    assert_eq!(silence, Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(line(&mut served.agent).await, "?\n", "silent for half of agent_ttl: asked for a beat");
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(!served.task.is_finished());
    tokio::time::advance(Duration::from_secs(2)).await;
    served.task.await.unwrap();
    assert!(served.presence.take_lost().is_empty(), "heard 31 s ago, agent_ttl 40 s");
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(served.presence.take_lost(), vec!["m1".to_string()], "lost 40 s after its last heartbeat");
}

#[tokio::test(start_paused = true)]
async fn an_agent_asked_for_a_beat_keeps_its_stream() {
    let mut served = served().await;
    line(&mut served.agent).await;
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(line(&mut served.agent).await, "?\n");
        served.agent.get_mut().write_all(b"\n").await.unwrap();
        assert_eq!(line(&mut served.agent).await, "\n");
    }
    assert!(!served.task.is_finished(), "an agent that answers is kept for as long as it does");
}

#[tokio::test]
async fn anything_but_a_heartbeat_ends_the_stream() {
    let mut served = served().await;
    line(&mut served.agent).await;
    served.agent.get_mut().write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    served.task.await.unwrap();
    assert_eq!(line(&mut served.agent).await, "", "the manager closed the stream");
}

#[tokio::test]
async fn a_stopping_manager_ends_its_streams() {
    let mut served = served().await;
    line(&mut served.agent).await;
    served.stop.send_replace(true);
    served.task.await.unwrap();
    assert_eq!(line(&mut served.agent).await, "");
    assert_eq!(served.slots.available_permits(), 1);
}

#[test]
fn only_a_request_for_the_change_stream_protocol_is_switched() {
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    };
    assert!(asks_for_stream(&headers(&[("connection", "Upgrade"), ("upgrade", CHANGE_STREAM_PROTOCOL)])));
    assert!(asks_for_stream(&headers(&[("connection", "keep-alive, upgrade"), ("upgrade", CHANGE_STREAM_PROTOCOL)])));
    assert!(!asks_for_stream(&headers(&[("upgrade", CHANGE_STREAM_PROTOCOL)])));
    assert!(!asks_for_stream(&headers(&[("connection", "upgrade"), ("upgrade", "websocket")])));
    assert!(!asks_for_stream(&headers(&[])));
}
