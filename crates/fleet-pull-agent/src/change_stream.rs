//! Following a manager's change stream ([`CHANGE_STREAM_PROTOCOL`]): one HTTP/1.1 request
//! that the manager switches to the stream, on which it writes the machine's changes as they
//! come. The agent beats on it; a manager that does not answer a beat in time is gone. While
//! the stream is open no HTTP/2 connection needs to stay open, so an idle agent costs its
//! manager a quiet TLS connection and nothing else.

use std::time::Duration;

use std::collections::HashMap;

use fleet_api_schema::{
    AgentChanges, AgentStreamAnswer, CHANGE_STREAM_HEARTBEAT_HEADER, CHANGE_STREAM_PROTOCOL, CHANGE_STREAM_PROTOCOL_V2,
    ErrorBody, LONGEST_STREAM_HEARTBEAT_SECONDS, MAX_CHANGE_STREAM_LINE,
};
use reqwest::StatusCode;
use reqwest::header::{CONNECTION, UPGRADE};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::leaving::Fault;
use crate::manager::without_url;

/// The least the manager is given to switch the stream's request (connecting included).
const LONGEST_OPENING: Duration = Duration::from_secs(30);

/// What the agent hears on its stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// The stream opened: the manager heard the agent when its request was sent. On a
    /// second-version stream (`carries_states`) the agent's states may go on it.
    Opened {
        sent: Instant,
        carries_states: bool,
    },
    Changes(Box<AgentChanges>),
    /// The manager answered the heartbeat sent then.
    BeatAnswered {
        sent: Instant,
    },
}

/// A states report to send on the stream, and where its answer goes (dropped unanswered when
/// the stream ends first).
pub(crate) struct StatesToSend {
    /// `AgentStates` as JSON, encoded once for the stream or a request alike.
    pub states: String,
    pub answer: oneshot::Sender<AgentStreamAnswer>,
}

/// How often the agent beats: every `idle` while nothing it runs needs its presence proven,
/// every `proving` while something does (`proven` says since when, and may change while the
/// stream lasts); and how long an answer may take before the manager counts as gone
/// (`answer_within`, the agent's patience: a beat's, a states line's, the opening's).
#[derive(Clone, Debug)]
pub(crate) struct Beats {
    pub idle: Duration,
    pub proving: Duration,
    pub proven: watch::Receiver<Option<Instant>>,
    pub answer_within: Duration,
}

impl Beats {
    /// The period the agent beats at now.
    fn period(&self) -> Duration {
        if self.proven.borrow().is_some() { self.proving } else { self.longest() }
    }

    /// The longest the agent goes between beats (an idle period shorter than the proving
    /// one is not beaten faster).
    fn longest(&self) -> Duration {
        self.idle.max(self.proving)
    }

    /// The longest the agent goes between beats, as the stream's request declares it (whole
    /// seconds, rounded up, within what a manager takes).
    fn declared_seconds(&self) -> u64 {
        let longest = self.longest();
        let seconds = longest.as_secs() + u64::from(longest.subsec_nanos() > 0);
        seconds.clamp(1, LONGEST_STREAM_HEARTBEAT_SECONDS)
    }
}

/// How a stream ended.
#[derive(Debug)]
pub(crate) enum StreamEnd {
    /// The manager serves no change stream (a manager from before it): follow its long poll.
    Unsupported,
    /// The manager closed the stream (it stops, or let the agent go).
    Closed,
    /// The manager answered with a refusal, or broke the protocol.
    Refused(String),
    /// The manager could not be reached, or went silent: why, and what that says of it.
    Unreachable { why: String, fault: Fault },
    /// The agent's requests moved to another manager meanwhile: it follows that one's stream.
    Moved,
}

/// Follows the stream at `url` until it ends, beating as `beats` says; on a second-version
/// stream, sends the states `states` brings.
pub(crate) async fn follow(
    client: &reqwest::Client,
    url: &str,
    beats: Beats,
    states: mpsc::Receiver<StatesToSend>,
    mut heard: impl FnMut(Heard),
) -> StreamEnd {
    let sent = Instant::now();
    // Both versions offered: a manager from before the second chooses the first.
    let request = client
        .get(url)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, CHANGE_STREAM_PROTOCOL_V2)
        .header(UPGRADE, CHANGE_STREAM_PROTOCOL)
        .header(CHANGE_STREAM_HEARTBEAT_HEADER, beats.declared_seconds());
    // The stream's client has no request timeout (the stream lasts): its opening gets one.
    let opening = beats.answer_within.max(LONGEST_OPENING);
    let response = match tokio::time::timeout(opening, request.send()).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return StreamEnd::Unreachable { why: without_url(&error), fault: Fault::of(&error) },
        Err(_) => return went_silent(format!("no answer to the stream's request within {opening:?}")),
    };
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = response.bytes().await.unwrap_or_default();
        let message = serde_json::from_slice::<ErrorBody>(&body).map(|body| body.error.message).unwrap_or_default();
        return match status {
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::BAD_REQUEST => StreamEnd::Unsupported,
            // It says it cannot serve the agent (it is full, say): another may.
            status if status.is_server_error() => {
                StreamEnd::Unreachable { why: format!("{status}: {message}"), fault: Fault::Gone }
            }
            status => StreamEnd::Refused(format!("{status}: {message}")),
        };
    }
    let carries_states =
        response.headers().get(UPGRADE).is_some_and(|chosen| chosen.as_bytes() == CHANGE_STREAM_PROTOCOL_V2.as_bytes());
    let upgraded = match response.upgrade().await {
        Ok(upgraded) => upgraded,
        Err(error) => return went_silent(without_url(&error)),
    };
    heard(Heard::Opened { sent, carries_states });
    let states = carries_states.then_some(states);
    follow_lines(BufReader::with_capacity(1024, upgraded), beats, states, heard).await
}

/// Reads the stream's lines from `io`, beating as `beats` says and sending what `states`
/// brings, until it ends.
async fn follow_lines<Io: AsyncBufRead + AsyncWrite + Unpin>(
    mut io: Io,
    mut beats: Beats,
    mut states: Option<mpsc::Receiver<StatesToSend>>,
    mut heard: impl FnMut(Heard),
) -> StreamEnd {
    let mut last_beat = Instant::now();
    let mut beat_now = false;
    // Once the presence must be proven, at once: what was heard last may be minutes old.
    let mut proving = beats.proven.borrow_and_update().is_some();
    let mut proven_open = true;
    // The beats sent and not answered yet, oldest first.
    let mut unanswered = std::collections::VecDeque::new();
    // The states lines sent and not answered yet, by id.
    let mut awaited: HashMap<u64, oneshot::Sender<AgentStreamAnswer>> = HashMap::new();
    let mut last_id = 0;
    let mut line = Vec::new();
    loop {
        let answer_due = unanswered.front().map(|sent: &Instant| *sent + beats.answer_within);
        let beat_due = if beat_now { Instant::now() } else { last_beat + beats.period() };
        tokio::select! {
            read = next_line(&mut io, &mut line) => match read {
                Ok(true) => {
                    if line == b"?\n" {
                        // The manager heard nothing for a while: beat now.
                        beat_now = true;
                    } else if line == b"\n" {
                        // One answer may stand for beats that reached the manager together:
                        // it heard the oldest of them by then, and is there.
                        match unanswered.front() {
                            Some(sent) => heard(Heard::BeatAnswered { sent: *sent }),
                            None => return StreamEnd::Refused("an answer to no heartbeat".into()),
                        }
                        unanswered.clear();
                    } else {
                        match serde_json::from_slice::<AgentChanges>(&line) {
                            Ok(AgentChanges { answer: Some(answer), .. }) => match awaited.remove(&answer.id) {
                                // Its waiter may have given up: nothing to tell then.
                                Some(waiter) => drop(waiter.send(answer)),
                                None => return StreamEnd::Refused("an answer to no states line".into()),
                            },
                            Ok(changes) => heard(Heard::Changes(Box::new(changes))),
                            Err(error) => return StreamEnd::Refused(format!("an unreadable line of changes: {error}")),
                        }
                    }
                    line.clear();
                }
                Ok(false) => return StreamEnd::Closed,
                Err(error) if error.kind() == std::io::ErrorKind::InvalidData => return StreamEnd::Refused(error.to_string()),
                Err(error) => return went_silent(error.to_string()),
            },
            () = tokio::time::sleep_until(beat_due) => {
                // Taken before the write: the manager hears the beat no earlier than this, so
                // the presence the agent counts from it never outlasts the manager's count.
                let sending = Instant::now();
                let beat = async {
                    io.write_all(b"\n").await?;
                    io.flush().await
                };
                match tokio::time::timeout(beats.answer_within, beat).await {
                    Ok(Ok(())) => unanswered.push_back(sending),
                    _ => return went_silent("a heartbeat could not be sent".into()),
                }
                last_beat = Instant::now();
                beat_now = false;
            }
            changed = beats.proven.changed(), if proven_open => {
                if changed.is_err() {
                    // The registry went: the stream beats as it last did, to its end.
                    proven_open = false;
                } else {
                    let now_proving = beats.proven.borrow_and_update().is_some();
                    beat_now |= now_proving && !proving && unanswered.is_empty();
                    proving = now_proving;
                }
            }
            () = sleep_until(answer_due) => {
                return went_silent(format!("no answer to a heartbeat within {:?}", beats.answer_within));
            }
            to_send = next_states(&mut states) => match to_send {
                Some(StatesToSend { states, answer }) => {
                    last_id += 1;
                    // An `AgentStreamStates` line, around the states as they were encoded.
                    let sent = format!("{{\"id\":{last_id},\"states\":{states}}}\n");
                    let write = async {
                        io.write_all(sent.as_bytes()).await?;
                        io.flush().await
                    };
                    match tokio::time::timeout(beats.answer_within, write).await {
                        Ok(Ok(())) => drop(awaited.insert(last_id, answer)),
                        _ => return went_silent("a states line could not be sent".into()),
                    }
                }
                // Nothing can send any more: the registry went.
                None => states = None,
            },
        }
    }
}

/// The manager went silent, or its connection was cut: `why`.
fn went_silent(why: String) -> StreamEnd {
    StreamEnd::Unreachable { why, fault: Fault::Unanswered }
}

/// The next states to send, or never when the stream carries none.
async fn next_states(states: &mut Option<mpsc::Receiver<StatesToSend>>) -> Option<StatesToSend> {
    match states {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Appends the next line of `reader` (with its `\n`) to `line`: true once it is whole, false
/// at the end of the stream. A line longer than [`MAX_CHANGE_STREAM_LINE`] is an error. Safe
/// to cancel: what was read stays in `line`, and the next call goes on from there.
async fn next_line<R: AsyncBufRead + Unpin>(reader: &mut R, line: &mut Vec<u8>) -> std::io::Result<bool> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(false);
        }
        let (taken, whole) = match available.iter().position(|byte| *byte == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        if line.len() + taken > MAX_CHANGE_STREAM_LINE {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a line of changes too long"));
        }
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        if whole {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests;
