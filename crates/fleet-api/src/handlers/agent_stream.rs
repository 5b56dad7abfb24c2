//! `GET /agents/{machine}/stream`: a pull agent's change stream
//! ([`crate::schema::CHANGE_STREAM_PROTOCOL`]). The agent upgrades an HTTP/1.1 connection; the
//! manager then writes the machine's changes on it as they come and answers its heartbeats.
//! The machine is present while the stream is open, and an idle agent costs its manager a
//! quiet TLS connection and a small task: no HTTP/2 connection (buffers, streams, a request
//! in flight) stays open for it, as a long poll needs. On a second-version stream a change
//! travels whole (the work and its new bodies out, the agent's states back), so a change that
//! reaches every agent opens no connection.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use fleet_core::access::Role;
use fleet_registry::AgentRegistry;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use self::changes_line::Carried;
use self::incoming::{Incoming, Said};
use super::agent_facet::{agents, take_states};
use crate::agent_presence::AgentPresence;
use crate::agent_state_events::AgentStateEvents;
use crate::api_state::ApiState;
use crate::auth::{Auth, Identity};
use crate::encoded_bodies::EncodedBodies;
use crate::error::ApiError;
use crate::journal_relay::JournalRelay;
use crate::revocation_bell::RevocationBell;
use crate::schema::{
    AgentChanges, AgentStreamAnswer, AgentStreamStates, CHANGE_STREAM_HEARTBEAT_HEADER, CHANGE_STREAM_PROTOCOL,
    CHANGE_STREAM_PROTOCOL_V2, LONGEST_STREAM_HEARTBEAT_SECONDS,
};
use crate::upgrade::{ConnectionHold, Upgrade};

/// How long one line may take to leave: an agent that reads nothing loses its stream.
const WRITE_LIMIT: Duration = Duration::from_secs(10);

/// Which protocol a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// [`CHANGE_STREAM_PROTOCOL`]: revisions and heartbeats.
    First,
    /// [`CHANGE_STREAM_PROTOCOL_V2`]: a change whole, and the agent's states.
    Second,
}

impl Version {
    fn protocol(self) -> &'static str {
        match self {
            Version::First => CHANGE_STREAM_PROTOCOL,
            Version::Second => CHANGE_STREAM_PROTOCOL_V2,
        }
    }
}

/// Opens the stream of `identity`'s machine: `101 Switching Protocols`, then the stream is
/// served on the connection by a task of its own. Its opening is admitted as the machine's
/// facet ([`crate::routes`]), the one action of every request it carries (its states).
pub async fn open(
    state: &ApiState,
    identity: &Identity,
    headers: &HeaderMap,
    upgrade: &Upgrade,
) -> Result<Response, ApiError> {
    let Role::Machine { id: machine } = &identity.role else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine follows its changes"));
    };
    let agents = agents(state)?.clone();
    let Some(version) = asked_version(headers) else {
        return Err(ApiError::bad_request(format!(
            "a change stream needs the headers Connection: upgrade and Upgrade: {CHANGE_STREAM_PROTOCOL}"
        )));
    };
    let heartbeat = declared_heartbeat(headers)?;
    let Some((connection, hold)) = upgrade.take() else {
        return Err(ApiError::bad_request("a change stream needs an HTTP/1.1 connection"));
    };
    let stream = ChangeStream {
        machine: machine.clone(),
        key: identity.key_sha256.clone().unwrap_or_default(),
        version,
        heartbeat,
        agents,
        bodies: state.encoded_bodies.clone(),
        presence: state.agent_presence.clone(),
        journal: state.journal_relay.clone(),
        revocations: state.revocation_bell.clone(),
        auth: state.auth.clone(),
        state_events: state.agent_state_events.clone(),
        events: state.events.clone(),
    };
    tokio::spawn(stream.serve_upgraded(connection, hold));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(version.protocol()));
    Ok(response)
}

/// The newest stream protocol the request asks to switch to, if it asks for one.
fn asked_version(headers: &HeaderMap) -> Option<Version> {
    let tokens = |name| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|text| text.split(','))
            .map(str::trim)
            .collect::<Vec<_>>()
    };
    if !tokens(header::CONNECTION).iter().any(|token| token.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    let offered = tokens(header::UPGRADE);
    [Version::Second, Version::First].into_iter().find(|version| offered.contains(&version.protocol()))
}

/// The heartbeat period the stream's request declares ([`CHANGE_STREAM_HEARTBEAT_HEADER`]),
/// if it declares one: whole seconds, from one to [`LONGEST_STREAM_HEARTBEAT_SECONDS`].
fn declared_heartbeat(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(CHANGE_STREAM_HEARTBEAT_HEADER) else { return Ok(None) };
    let seconds = value.to_str().ok().and_then(|text| text.trim().parse::<u64>().ok());
    match seconds {
        Some(seconds) if (1..=LONGEST_STREAM_HEARTBEAT_SECONDS).contains(&seconds) => {
            Ok(Some(Duration::from_secs(seconds)))
        }
        _ => Err(ApiError::bad_request(format!(
            "{CHANGE_STREAM_HEARTBEAT_HEADER} must be whole seconds from 1 to {LONGEST_STREAM_HEARTBEAT_SECONDS}"
        ))),
    }
}

/// What one machine's stream follows.
struct ChangeStream {
    machine: String,
    /// The key of the certificate it came with: a revocation of it ends the stream.
    key: String,
    version: Version,
    /// The longest its agent goes between heartbeats, if it said; its connection's end then
    /// tells when it was last there.
    heartbeat: Option<Duration>,
    agents: Arc<dyn AgentRegistry>,
    bodies: Arc<EncodedBodies>,
    presence: Arc<AgentPresence>,
    journal: Arc<JournalRelay>,
    revocations: Arc<RevocationBell>,
    auth: Auth,
    /// What its reports make of events, and where they go.
    state_events: Arc<AgentStateEvents>,
    events: fleet_registry::EventSink,
}

/// A line the manager owes its agent.
enum Line {
    /// The machine's work's revision and the journals asked of it (and on a second-version
    /// stream, the work).
    Changes,
    /// The answer to a heartbeat.
    BeatAnswer,
    /// A request for a heartbeat: the agent has been silent for longer than it beats at (half
    /// of `agent_ttl` if it did not say).
    BeatRequest,
    /// The answer to a states line, once they are stored.
    StatesAnswer(AgentStreamStates),
}

/// How a stream ended.
enum Ended {
    /// The manager stops: its agents were heard to the end.
    Stopped,
    /// The agent fell silent for longer than its heartbeats allow, or the manager ended the
    /// stream for it (its certificate revoked, the store's signals gone): heard last at its
    /// last word.
    Silent,
    /// The connection ended (the agent closed it, its connection was reset, it sent what the
    /// protocol has no place for, or its certificate was revoked): its kernel was there until
    /// then.
    Closed,
    /// The kernel found the peer gone (no answer to its keepalive probes, or to what was
    /// sent), or it read nothing for [`WRITE_LIMIT`]: heard last at its last word or
    /// [`AgentPresence::cut_off_slack`] before, whichever is later.
    Unheard,
}

/// How a failed read or write of the stream ended it.
fn ended_by(error: &std::io::Error) -> Ended {
    match error.kind() {
        std::io::ErrorKind::TimedOut => Ended::Unheard,
        _ => Ended::Closed,
    }
}

impl ChangeStream {
    async fn serve_upgraded(self, connection: OnUpgrade, hold: ConnectionHold) {
        match connection.await {
            Ok(upgraded) => self.serve(TokioIo::new(upgraded), hold).await,
            Err(error) => tracing::debug!(%error, machine = self.machine, "a change stream's upgrade failed"),
        }
    }

    /// Serves the stream on `io` until the agent goes or the server stops.
    async fn serve<Io: AsyncRead + AsyncWrite + Unpin>(self, mut io: Io, hold: ConnectionHold) {
        let ConnectionHold { slot: _slot, mut stop } = hold;
        let mut changes = self.agents.machine_changes(&self.machine);
        let mut asked = self.journal.asked(&self.machine);
        let (mut rung, _listening) = self.revocations.open_poll(&self.auth);
        let open = self.presence.poll_opened(&self.machine);
        let (number, mut newer) = self.presence.stream_opened(&self.machine);
        let _streaming = fleet_metrics::OpenNow::change_stream();
        // An agent silent for longer than it beats at (half of `agent_ttl` if it did not say)
        // is asked for a beat, and has half as long again to give it. One that said how often
        // it beats may be silent for minutes: its connection is watched by the kernel
        // ([`crate::tcp_liveness`]), so that its loss is noticed within `agent_ttl` all the same.
        let ask_after = match self.heartbeat {
            Some(period) => (period * 5 / 4).max(self.presence.keepalive()),
            None => self.presence.keepalive(),
        };
        let silence = ask_after * 3 / 2;
        let mut heard = Instant::now();
        let mut beat_asked = false;
        let mut due = VecDeque::from([Line::Changes]);
        let mut incoming = Incoming::new(self.version == Version::Second);
        let mut carried = Carried::default();
        let ended = 'serving: loop {
            while let Some(line) = due.pop_front() {
                let line = match line {
                    Line::Changes => {
                        let revision = *changes.borrow_and_update();
                        self.changes_line(revision, &mut carried).await
                    }
                    Line::BeatAnswer => b"\n".to_vec(),
                    Line::BeatRequest => b"?\n".to_vec(),
                    Line::StatesAnswer(states) => self.states_answer(states, carried.revision).await,
                };
                if let Err(error) = write_line(&mut io, &line).await {
                    break 'serving ended_by(&error);
                }
            }
            tokio::select! {
                read = incoming.read(&mut io) => {
                    match read {
                        Ok(true) => {}
                        Ok(false) => break Ended::Closed,
                        Err(error) => break ended_by(&error),
                    }
                    loop {
                        match incoming.next() {
                            Ok(None) => break,
                            Ok(Some(said)) => {
                                heard = Instant::now();
                                beat_asked = false;
                                match said {
                                    Said::Beat => {
                                        fleet_metrics::metrics().pull.stream_heartbeats.inc();
                                        push_once(&mut due, Line::BeatAnswer);
                                    }
                                    Said::States(states) => due.push_back(Line::StatesAnswer(states)),
                                }
                            }
                            Err(broken) => {
                                tracing::debug!(machine = self.machine, broken, "a change stream broken by its agent");
                                break 'serving Ended::Closed;
                            }
                        }
                    }
                }
                changed = changes.changed() => match changed {
                    Ok(()) => push_once(&mut due, Line::Changes),
                    Err(_) => break Ended::Silent,
                },
                asked_now = asked.changed() => match asked_now {
                    Ok(()) => push_once(&mut due, Line::Changes),
                    Err(_) => break Ended::Silent,
                },
                rang = rung.changed() => {
                    if rang.is_err() || self.auth.certificate_revoked(&self.machine, &self.key).await.unwrap_or(false) {
                        break Ended::Silent;
                    }
                }
                () = tokio::time::sleep_until(heard + ask_after), if !beat_asked => {
                    beat_asked = true;
                    push_once(&mut due, Line::BeatRequest);
                }
                () = tokio::time::sleep_until(heard + silence) => break Ended::Silent,
                // A newer stream of this machine opened here: it takes over.
                opened = newer.changed() => {
                    if opened.is_err() || *newer.borrow_and_update() != number {
                        break Ended::Stopped;
                    }
                }
                () = crate::serve::stopped(&mut stop) => break Ended::Stopped,
            }
        };
        match ended {
            Ended::Stopped => open.answered(),
            // Heard at its last word, or, for an agent that beats rarely and whose
            // connection ended, when it ended (it was there until then).
            Ended::Closed if self.heartbeat.is_some() => open.answered(),
            Ended::Silent | Ended::Closed => open.last_heard(heard),
            Ended::Unheard => {
                let cut_off = Instant::now().checked_sub(self.presence.cut_off_slack());
                open.last_heard(cut_off.map_or(heard, |cut_off| cut_off.max(heard)));
            }
        }
        let _ = io.shutdown().await;
    }

    /// The line that tells the agent its work's `revision` and the journals asked of it; on a
    /// second-version stream, its work too.
    async fn changes_line(&self, revision: u64, carried: &mut Carried) -> Vec<u8> {
        let journal = self.journal.take(&self.machine);
        match self.version {
            Version::First => changes_line::bare(revision, journal),
            Version::Second => {
                changes_line::with_work(&self.agents, &self.bodies, &self.machine, revision, journal, carried).await
            }
        }
    }

    /// Stores the states the agent wrote and tells it how that went, as `POST …/states` would.
    async fn states_answer(&self, states: AgentStreamStates, revision: u64) -> Vec<u8> {
        let noting = (self.state_events.as_ref(), &self.events);
        let answer = match take_states(&self.agents, &self.machine, states.states, noting).await {
            Ok(()) => {
                AgentStreamAnswer { id: states.id, status: StatusCode::NO_CONTENT.as_u16(), message: String::new() }
            }
            Err(error) => AgentStreamAnswer { id: states.id, status: error.status.as_u16(), message: error.message },
        };
        fleet_metrics::metrics().pull.stream_states.inc();
        changes_line::encode_line(&AgentChanges { revision, answer: Some(answer), ..AgentChanges::default() })
    }
}

/// Adds `line` to what is due unless one of its kind is due already.
fn push_once(due: &mut VecDeque<Line>, line: Line) {
    if !due.iter().any(|waiting| std::mem::discriminant(waiting) == std::mem::discriminant(&line)) {
        due.push_back(line);
    }
}

/// Writes `line` whole within [`WRITE_LIMIT`] (an agent that reads nothing for that long
/// counts as gone unheard).
async fn write_line<Io: AsyncWrite + Unpin>(io: &mut Io, line: &[u8]) -> std::io::Result<()> {
    let written = async {
        io.write_all(line).await?;
        io.flush().await
    };
    match tokio::time::timeout(WRITE_LIMIT, written).await {
        Ok(written) => written,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    }
}

mod changes_line;
mod incoming;
#[cfg(test)]
mod tests;
