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

/// A first-version stream of machine `m1` served on one end of an in-memory connection; the
/// agent's end.
async fn served() -> Served {
    served_speaking(Version::First, &[]).await
}

/// A stream of `version`, opened once `scheduled` are on m1.
async fn served_speaking(version: Version, scheduled: &[(&str, &UnitFile)]) -> Served {
    served_with(version, scheduled, None).await
}

/// As [`served_speaking`], its agent having declared how often it beats.
async fn served_with(version: Version, scheduled: &[(&str, &UnitFile)], heartbeat: Option<Duration>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&MachineState { id: "m1".into(), ..MachineState::default() }).await.unwrap();
    for (unit, file) in scheduled {
        schedule(&registry, unit, file).await;
    }
    let presence = Arc::new(AgentPresence::new(Duration::from_secs(40)));
    presence.heard("m1").unwrap();
    let stream = ChangeStream {
        machine: "m1".into(),
        key: "k".into(),
        version,
        heartbeat,
        agents: Arc::new(registry.clone()),
        bodies: Arc::new(EncodedBodies::default()),
        presence: presence.clone(),
        journal: Arc::new(JournalRelay::default()),
        revocations: Arc::new(RevocationBell::default()),
        auth: Auth::new(Arc::new(registry.clone()), None),
        state_events: Arc::default(),
        events: fleet_registry::EventSink::writing_to(Arc::new(registry.clone())),
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
async fn an_agent_that_beats_rarely_keeps_its_stream_and_is_present_until_agent_ttl_after_it_closed() {
    let mut served = served_with(Version::First, &[], Some(Duration::from_secs(300))).await;
    line(&mut served.agent).await;
    // Silent for far longer than agent_ttl (40 s): its connection is the kernel's to watch.
    tokio::time::advance(Duration::from_secs(370)).await;
    assert!(!served.task.is_finished(), "kept through its heartbeat period");
    served.agent.get_mut().write_all(b"\n").await.unwrap();
    assert_eq!(line(&mut served.agent).await, "\n");
    tokio::time::advance(Duration::from_secs(200)).await;
    // It closes its connection (say, to move to another manager): it was there until then,
    // and has agent_ttl to be heard again before it is lost.
    drop(served.agent);
    served.task.await.unwrap();
    tokio::time::advance(Duration::from_secs(39)).await;
    assert!(served.presence.take_lost().is_empty(), "closed 39 s ago, agent_ttl 40 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(served.presence.take_lost(), vec!["m1".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn an_agent_silent_past_the_period_it_declared_is_asked_then_lost_from_its_last_word() {
    let mut served = served_with(Version::First, &[], Some(Duration::from_secs(300))).await;
    line(&mut served.agent).await;
    // Asked once silent for a period and a quarter, dropped at half as long again.
    tokio::time::advance(Duration::from_secs(374)).await;
    assert!(!served.task.is_finished());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(line(&mut served.agent).await, "?\n");
    tokio::time::advance(Duration::from_millis(562_500 - 375_000)).await;
    served.task.await.unwrap();
    assert_eq!(served.presence.take_lost(), vec!["m1".to_string()], "heard last 562.5 s ago");
}

#[test]
fn a_declared_heartbeat_is_whole_seconds_within_an_hour() {
    let declared = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(CHANGE_STREAM_HEARTBEAT_HEADER, HeaderValue::from_str(value).unwrap());
        declared_heartbeat(&headers).map_err(|error| error.status)
    };
    assert_eq!(declared_heartbeat(&HeaderMap::new()).map_err(|error| error.status), Ok(None));
    assert_eq!(declared("300"), Ok(Some(Duration::from_secs(300))));
    assert_eq!(declared("3600"), Ok(Some(Duration::from_secs(3600))));
    for bad in ["0", "3601", "-5", "1.5", "soon", "99999999999999999999999"] {
        assert_eq!(declared(bad), Err(StatusCode::BAD_REQUEST), "{bad}");
    }
}

#[test]
fn a_connection_the_kernel_gave_up_on_is_told_apart_from_one_closed() {
    assert!(matches!(ended_by(&std::io::Error::from(std::io::ErrorKind::TimedOut)), Ended::Unheard));
    assert!(matches!(ended_by(&std::io::Error::from(std::io::ErrorKind::ConnectionReset)), Ended::Closed));
    assert!(matches!(ended_by(&std::io::Error::from(std::io::ErrorKind::BrokenPipe)), Ended::Closed));
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

/// Regression (issue 67): one agent certificate held 200 streams, each buffering a states
/// line of up to 1 MiB. A machine holds one stream on a manager: a newer one ends the older.
#[tokio::test]
async fn a_newer_stream_of_the_same_machine_ends_the_older_one() {
    let mut first = served().await;
    line(&mut first.agent).await;
    // The second stream, as a reconnecting agent opens it, on the same manager's presence.
    let (number, _newest) = first.presence.stream_opened("m1");
    assert_eq!(number, 2, "the first stream was number 1");
    first.task.await.unwrap();
    assert_eq!(line(&mut first.agent).await, "", "the older stream was closed");
    assert_eq!(first.slots.available_permits(), 1, "and its connection's slot given back");
}

#[test]
fn the_newest_protocol_asked_for_is_switched_to() {
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    };
    let first = Some(Version::First);
    let second = Some(Version::Second);
    assert_eq!(asked_version(&headers(&[("connection", "Upgrade"), ("upgrade", CHANGE_STREAM_PROTOCOL)])), first);
    assert_eq!(
        asked_version(&headers(&[("connection", "keep-alive, upgrade"), ("upgrade", CHANGE_STREAM_PROTOCOL)])),
        first
    );
    let both_lines =
        [("connection", "upgrade"), ("upgrade", CHANGE_STREAM_PROTOCOL_V2), ("upgrade", CHANGE_STREAM_PROTOCOL)];
    assert_eq!(asked_version(&headers(&both_lines)), second);
    let one_line = [("connection", "upgrade"), ("upgrade", "fleet-changes/1, fleet-changes/2")];
    assert_eq!(asked_version(&headers(&one_line)), second);
    assert_eq!(asked_version(&headers(&[("upgrade", CHANGE_STREAM_PROTOCOL)])), None);
    assert_eq!(asked_version(&headers(&[("connection", "upgrade"), ("upgrade", "websocket")])), None);
    assert_eq!(asked_version(&headers(&[("connection", "upgrade"), ("upgrade", "fleet-changes/3")])), None);
    assert_eq!(asked_version(&headers(&[])), None);
}

fn changes(line: &str) -> AgentChanges {
    assert!(line.ends_with('\n'), "a whole line: {line:?}");
    serde_json::from_str::<AgentChanges>(line).unwrap()
}

/// Schedules `unit` (with `file`) on m1.
async fn schedule(registry: &EmbeddedRegistry, unit: &str, file: &UnitFile) {
    registry.put_unit(unit, file, DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
    let schedule = [Decision::Schedule { unit: unit.into(), machine: "m1".into() }];
    registry.apply(&lease, &schedule, &[]).await.unwrap();
}

#[tokio::test]
async fn a_second_version_stream_carries_the_work_and_the_bodies_new_to_it() {
    let first_file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    let mut served = served_speaking(Version::Second, &[("a.service", &first_file)]).await;
    // The first line: the work as it stands, without bodies (the agent read them before).
    let first = changes(&line(&mut served.agent).await);
    assert!(first.bodies.is_empty(), "{first:?}");
    let work = first.work.unwrap();
    assert_eq!((work.machine.unwrap().id.as_str(), work.scheduled.len()), ("m1", 1));

    let second_file = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1\n").unwrap();
    schedule(&served.registry, "b.service", &second_file).await;
    let next = changes(&line(&mut served.agent).await);
    assert!(next.revision > first.revision);
    let work = next.work.expect("the work rides with the change");
    let names: Vec<&str> = work.scheduled.iter().map(|unit| unit.name.as_str()).collect();
    assert_eq!(names, ["a.service", "b.service"]);
    assert_eq!(next.bodies.len(), 1, "only the body new to the stream: {:?}", next.bodies);
    assert_eq!(next.bodies[0].hash, second_file.hash().to_string());
    assert_eq!(next.bodies[0].options[0].value, "/bin/sleep 1");
}

#[tokio::test]
async fn states_written_on_a_second_version_stream_are_stored_and_answered() {
    let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    let mut served = served_speaking(Version::Second, &[("a.service", &file)]).await;
    let last = changes(&line(&mut served.agent).await);
    let state = crate::schema::AgentUnitState {
        name: "a.service".into(),
        hash: file.hash().to_string(),
        systemd_load_state: "loaded".into(),
        systemd_active_state: "active".into(),
        systemd_sub_state: "running".into(),
        launched: true,
        ..Default::default()
    };
    let held =
        AgentStreamStates { id: 1, states: crate::schema::AgentStates { set: vec![state.clone()], removed: vec![] } };
    let not_held = AgentStreamStates {
        id: 2,
        states: crate::schema::AgentStates {
            set: vec![crate::schema::AgentUnitState { name: "z.service".into(), ..state }],
            removed: vec![],
        },
    };
    let mut sent = Vec::new();
    for states in [&held, &not_held] {
        sent.extend(serde_json::to_vec(states).unwrap());
        sent.push(b'\n');
    }
    served.agent.get_mut().write_all(&sent).await.unwrap();

    let answered = changes(&line(&mut served.agent).await);
    assert_eq!(answered.revision, last.revision, "an answer carries the revision last told");
    assert!(answered.work.is_none());
    assert_eq!(answered.answer, Some(AgentStreamAnswer { id: 1, status: 204, message: String::new() }));
    let states = ApiRegistry::unit_states(&served.registry).await.unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!((states[0].name.as_str(), states[0].systemd.active.as_str()), ("a.service", "active"));

    let refused = changes(&line(&mut served.agent).await).answer.unwrap();
    assert_eq!((refused.id, refused.status), (2, 403));
    assert_eq!(refused.message, "machine m1 does not hold z.service");
    assert!(!served.task.is_finished(), "a refused report keeps the stream");

    // The machine's first report taught the manager what runs; the next one's change is an
    // event, made by the manager.
    let failed = crate::schema::AgentUnitState {
        systemd_active_state: "failed".into(),
        systemd_sub_state: "failed".into(),
        ..held.states.set[0].clone()
    };
    let next = AgentStreamStates { id: 3, states: crate::schema::AgentStates { set: vec![failed], removed: vec![] } };
    let mut sent = serde_json::to_vec(&next).unwrap();
    sent.push(b'\n');
    served.agent.get_mut().write_all(&sent).await.unwrap();
    assert_eq!(changes(&line(&mut served.agent).await).answer.map(|answer| answer.status), Some(204));
    let registry = served.registry.clone();
    let messages = async || {
        let page = fleet_registry::EventLog::events_after(&registry, 0, 100).await.unwrap();
        page.events.into_iter().map(|e| (e.event.unit, e.event.machine, e.event.message)).collect::<Vec<_>>()
    };
    fleet_testkit::eventually("the change is an event", async || !messages().await.is_empty()).await;
    let expected =
        (Some("a.service".to_string()), Some("m1".to_string()), "failed/failed (was active/running)".to_string());
    assert_eq!(messages().await, [expected]);
}

#[tokio::test]
async fn a_first_version_stream_carries_no_work_and_takes_no_states() {
    let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    let mut served = served().await;
    line(&mut served.agent).await;
    schedule(&served.registry, "a.service", &file).await;
    let told = changes(&line(&mut served.agent).await);
    assert!(told.work.is_none() && told.bodies.is_empty(), "{told:?}");
    served.agent.get_mut().write_all(b"{\"id\":1,\"states\":{}}\n").await.unwrap();
    served.task.await.unwrap();
    assert_eq!(line(&mut served.agent).await, "", "the manager closed the stream");
}
