use std::sync::{Arc, Mutex};

use fleet_api_schema::{AgentStates, AgentStreamStates};
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};

use super::*;

/// How long the agents here wait for an answer.
const PATIENCE: Duration = Duration::from_secs(10);

/// Beats every `heartbeat`, idle or not.
fn steady(heartbeat: Duration) -> Beats {
    Beats { idle: heartbeat, proving: heartbeat, proven: watch::channel(None).1, answer_within: PATIENCE }
}

/// Follows a stream whose manager's end is returned, recording what is heard.
fn following(heartbeat: Duration) -> (DuplexStream, tokio::task::JoinHandle<StreamEnd>, Arc<Mutex<Vec<Heard>>>) {
    following_beats(steady(heartbeat))
}

fn following_beats(beats: Beats) -> (DuplexStream, tokio::task::JoinHandle<StreamEnd>, Arc<Mutex<Vec<Heard>>>) {
    let (agent, manager) = tokio::io::duplex(4096);
    let heard = Arc::new(Mutex::new(Vec::new()));
    let recorded = heard.clone();
    let task = tokio::spawn(follow_lines(BufReader::new(agent), beats, None, move |event| {
        recorded.lock().unwrap().push(event);
    }));
    (manager, task, heard)
}

/// Reads one beat from the manager's end, and says when it came.
async fn next_beat(manager: &mut DuplexStream) -> Instant {
    let mut beat = [0u8; 1];
    manager.read_exact(&mut beat).await.unwrap();
    assert_eq!(&beat, b"\n");
    Instant::now()
}

#[tokio::test(start_paused = true)]
async fn an_idle_agent_beats_rarely_and_at_once_when_its_presence_must_be_proven() {
    let (proven, watched) = watch::channel(None);
    let idle = Duration::from_secs(300);
    let proving = Duration::from_secs(10);
    let opened = Instant::now();
    let (mut manager, task, heard) = following_beats(Beats { idle, proving, proven: watched, answer_within: PATIENCE });
    assert_eq!(next_beat(&mut manager).await - opened, idle, "idle: one beat in its idle period");
    manager.write_all(b"\n").await.unwrap();
    tokio::time::sleep(Duration::from_secs(7)).await;
    // A unit that needs the presence proven arrives: a beat at once, then every `proving`.
    proven.send_replace(Some(Instant::now()));
    let asked = Instant::now();
    assert_eq!(next_beat(&mut manager).await, asked, "beaten at once");
    manager.write_all(b"\n").await.unwrap();
    assert_eq!(next_beat(&mut manager).await - asked, proving);
    manager.write_all(b"\n").await.unwrap();
    let last = Instant::now();
    // Nothing needs it any more: back to the idle period, counted from the last beat.
    proven.send_replace(None);
    assert_eq!(next_beat(&mut manager).await - last, idle);
    drop(manager);
    assert!(matches!(task.await.unwrap(), StreamEnd::Closed));
    let answered = heard.lock().unwrap().iter().filter(|heard| matches!(heard, Heard::BeatAnswered { .. })).count();
    assert_eq!(answered, 3);
}

#[test]
fn the_request_declares_the_longest_it_goes_between_beats_in_whole_seconds() {
    let beats = |idle, proving| Beats { idle, proving, proven: watch::channel(None).1, answer_within: PATIENCE };
    assert_eq!(beats(Duration::from_secs(300), Duration::from_secs(10)).declared_seconds(), 300);
    assert_eq!(beats(Duration::from_millis(100), Duration::from_millis(1500)).declared_seconds(), 2);
    assert_eq!(beats(Duration::from_secs(7200), Duration::from_secs(10)).declared_seconds(), 3600);
}

#[tokio::test(start_paused = true)]
async fn changes_and_answered_beats_are_heard_until_the_manager_closes() {
    let (mut manager, task, heard) = following(Duration::from_secs(20));
    manager.write_all(b"{\"revision\":7}\n").await.unwrap();
    tokio::time::sleep(Duration::from_secs(21)).await;
    let mut beat = [0u8; 1];
    manager.read_exact(&mut beat).await.unwrap();
    assert_eq!(&beat, b"\n", "the agent beats after its heartbeat period");
    manager
        .write_all(b"\n{\"revision\":8,\"journal\":[{\"id\":1,\"unit\":\"a.service\",\"lines\":10}]}\n")
        .await
        .unwrap();
    drop(manager);
    assert!(matches!(task.await.unwrap(), StreamEnd::Closed));
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), 3, "{heard:?}");
    assert_eq!(heard[0], Heard::Changes(Box::new(AgentChanges { revision: 7, ..AgentChanges::default() })));
    assert!(matches!(heard[1], Heard::BeatAnswered { .. }));
    let Heard::Changes(changes) = &heard[2] else { panic!("{heard:?}") };
    assert_eq!((changes.revision, changes.journal.len()), (8, 1));
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_does_not_answer_a_beat_within_the_agents_patience_is_gone() {
    // A slow manager is waited on as long as the agent's patience says, however long.
    for patience in [PATIENCE, Duration::from_secs(100)] {
        let heartbeat = Duration::from_secs(20);
        let beats = Beats { answer_within: patience, ..steady(heartbeat) };
        let (mut manager, task, _heard) = following_beats(beats);
        let mut beat = [0u8; 1];
        manager.read_exact(&mut beat).await.unwrap();
        let beaten = Instant::now();
        let end = task.await.unwrap();
        // Silent, not gone: the agent leaves only if nothing else was heard for a period.
        assert!(matches!(end, StreamEnd::Unreachable { fault: Fault::Unanswered, .. }), "{end:?}");
        assert_eq!(Instant::now() - beaten, patience);
    }
}

#[tokio::test(start_paused = true)]
async fn what_the_protocol_has_no_place_for_ends_the_stream() {
    let (mut manager, task, _heard) = following(Duration::from_secs(20));
    manager.write_all(b"not json\n").await.unwrap();
    assert!(matches!(task.await.unwrap(), StreamEnd::Refused(_)));

    let (mut manager, task, _heard) = following(Duration::from_secs(20));
    manager.write_all(b"\n").await.unwrap();
    assert!(matches!(task.await.unwrap(), StreamEnd::Refused(_)), "an answer to no beat");

    let (mut manager, task, _heard) = following(Duration::from_secs(20));
    let endless = vec![b'x'; 64 * 1024];
    let writer = tokio::spawn(async move { while manager.write_all(&endless).await.is_ok() {} });
    assert!(matches!(task.await.unwrap(), StreamEnd::Refused(_)), "a line without end is bounded");
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_asks_for_a_beat_gets_one_at_once() {
    let (mut manager, task, heard) = following(Duration::from_secs(100));
    manager.write_all(b"?\n").await.unwrap();
    let mut beat = [0u8; 1];
    let asked = Instant::now();
    manager.read_exact(&mut beat).await.unwrap();
    assert_eq!((&beat, Instant::now()), (b"\n", asked), "beaten at once, not after the heartbeat period");
    manager.write_all(b"\n").await.unwrap();
    drop(manager);
    assert!(matches!(task.await.unwrap(), StreamEnd::Closed));
    assert!(matches!(heard.lock().unwrap()[..], [Heard::BeatAnswered { .. }]));
}

/// A manager that answers one request with `answer` over plain HTTP/1.1, then closes once the
/// agent wrote anything more (or closed): the request's head, and what the agent wrote after it.
async fn answering_once(answer: &'static [u8]) -> (String, tokio::task::JoinHandle<(String, Vec<u8>)>) {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/fleet/v1/agents/m1/stream", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut connection, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        let mut buffer = [0u8; 1024];
        while !received.windows(4).any(|window| window == b"\r\n\r\n") {
            let read = connection.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the request ended early");
            received.extend_from_slice(&buffer[..read]);
        }
        let end = received.windows(4).position(|window| window == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&received[..end]).into_owned();
        let mut after = received[end..].to_vec();
        connection.write_all(answer).await.unwrap();
        if after.is_empty()
            && let Ok(read) = connection.read(&mut buffer).await
        {
            after.extend_from_slice(&buffer[..read]);
        }
        (head, after)
    });
    (url, task)
}

fn http1_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().http1_only().build().unwrap()
}

#[tokio::test]
async fn a_switched_request_carries_the_stream() {
    let answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: fleet-changes/1\r\n\r\n{\"revision\":3}\n";
    let (url, manager) = answering_once(answer).await;
    let mut heard = Vec::new();
    let end = tokio::time::timeout(
        Duration::from_secs(10),
        follow(&http1_client(), &url, steady(Duration::from_millis(100)), mpsc::channel(1).1, |event| {
            heard.push(event)
        }),
    )
    .await
    .expect("the stream follows the manager's answers");
    // The manager closes the stream after the first beat.
    assert!(matches!(end, StreamEnd::Closed), "{end:?}");
    assert!(matches!(heard[0], Heard::Opened { carries_states: false, .. }), "the manager chose the first: {heard:?}");
    assert_eq!(heard[1], Heard::Changes(Box::new(AgentChanges { revision: 3, ..AgentChanges::default() })));
    let (head, after) = manager.await.unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("get /fleet/v1/agents/m1/stream http/1.1\r\n"), "{head}");
    assert!(head.contains("connection: upgrade\r\n"), "{head}");
    assert!(head.contains("upgrade: fleet-changes/2\r\n") && head.contains("upgrade: fleet-changes/1\r\n"), "{head}");
    assert!(head.contains("fleet-heartbeat: 1\r\n"), "the longest between beats, in whole seconds: {head}");
    assert_eq!(after, b"\n", "one beat");
}

#[tokio::test]
async fn a_manager_without_streams_is_told_apart_from_one_that_refuses() {
    let cases: [(&'static [u8], &str); 4] = [
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "unsupported"),
        (b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "unsupported"),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "unreachable"),
        (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "refused"),
    ];
    for (answer, expected) in cases {
        let (url, manager) = answering_once(answer).await;
        let end = follow(&http1_client(), &url, steady(Duration::from_secs(20)), mpsc::channel(1).1, |_| {}).await;
        let kind = match end {
            StreamEnd::Unsupported => "unsupported",
            StreamEnd::Unreachable { .. } => "unreachable",
            StreamEnd::Refused(_) => "refused",
            StreamEnd::Closed => "closed",
            StreamEnd::Moved => "moved",
        };
        assert_eq!(kind, expected, "{}", String::from_utf8_lossy(answer));
        manager.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn one_answer_stands_for_beats_that_reached_the_manager_together() {
    let (mut manager, task, heard) = following(Duration::from_secs(100));
    let mut beat = [0u8; 1];
    manager.read_exact(&mut beat).await.unwrap();
    // Asked for a beat right after the scheduled one: two beats are out, read as one.
    manager.write_all(b"?\n").await.unwrap();
    manager.read_exact(&mut beat).await.unwrap();
    manager.write_all(b"\n").await.unwrap();
    let answered = Instant::now();
    // Nothing more until the next beat: the stream stays, however long after the answer.
    tokio::time::sleep(PATIENCE * 2).await;
    assert!(!task.is_finished(), "the answer covered both beats");
    assert!(Instant::now() > answered + PATIENCE);
    drop(manager);
    assert!(matches!(task.await.unwrap(), StreamEnd::Closed));
    assert!(matches!(heard.lock().unwrap()[..], [Heard::BeatAnswered { .. }]));
}

#[tokio::test]
async fn states_go_on_a_second_version_stream_and_each_answer_finds_its_waiter() {
    let (agent, mut manager) = tokio::io::duplex(4096);
    let (sender, states) = mpsc::channel(4);
    let task =
        tokio::spawn(follow_lines(BufReader::new(agent), steady(Duration::from_secs(100)), Some(states), |_| {}));
    let mut waiting = Vec::new();
    for removed in ["a.service", "b.service"] {
        let (answer, answered) = oneshot::channel();
        let states = AgentStates { set: Vec::new(), removed: vec![removed.to_string()] };
        sender.send(StatesToSend { states: serde_json::to_string(&states).unwrap(), answer }).await.unwrap();
        waiting.push(answered);
    }
    let mut reader = BufReader::new(&mut manager);
    let mut sent = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        sent.push(serde_json::from_str::<AgentStreamStates>(&line).unwrap());
    }
    assert_eq!((sent[0].id, sent[0].states.removed.as_slice()), (1, ["a.service".to_string()].as_slice()));
    assert_eq!((sent[1].id, sent[1].states.removed.as_slice()), (2, ["b.service".to_string()].as_slice()));
    // Answered out of order: each reaches the report it answers.
    manager
        .write_all(b"{\"revision\":4,\"answer\":{\"id\":2,\"status\":403,\"message\":\"no\"}}\n{\"revision\":4,\"answer\":{\"id\":1,\"status\":204}}\n")
        .await
        .unwrap();
    let second = waiting.pop().unwrap().await.unwrap();
    let first = waiting.pop().unwrap().await.unwrap();
    assert_eq!((first.id, first.status), (1, 204));
    assert_eq!((second.id, second.status, second.message.as_str()), (2, 403, "no"));

    manager.write_all(b"{\"revision\":4,\"answer\":{\"id\":9,\"status\":204}}\n").await.unwrap();
    assert!(matches!(task.await.unwrap(), StreamEnd::Refused(_)), "an answer to no states line");
}

#[tokio::test]
async fn states_waiting_when_the_stream_ends_are_dropped_unanswered() {
    let (agent, manager) = tokio::io::duplex(4096);
    let (sender, states) = mpsc::channel(4);
    let task =
        tokio::spawn(follow_lines(BufReader::new(agent), steady(Duration::from_secs(100)), Some(states), |_| {}));
    let (answer, answered) = oneshot::channel();
    sender.send(StatesToSend { states: "{}".into(), answer }).await.unwrap();
    drop(manager);
    assert!(matches!(task.await.unwrap(), StreamEnd::Closed | StreamEnd::Unreachable { .. }));
    assert!(answered.await.is_err(), "the waiter learns the stream ended: it sends by request");
}
