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
use crate::api_state::ApiState;
use crate::auth::{Auth, Identity};
use crate::encoded_bodies::EncodedBodies;
use crate::error::ApiError;
use crate::journal_relay::JournalRelay;
use crate::revocation_bell::RevocationBell;
use crate::schema::{
    AgentChanges, AgentStreamAnswer, AgentStreamStates, CHANGE_STREAM_PROTOCOL, CHANGE_STREAM_PROTOCOL_V2,
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
    let Some((connection, hold)) = upgrade.take() else {
        return Err(ApiError::bad_request("a change stream needs an HTTP/1.1 connection"));
    };
    let stream = ChangeStream {
        machine: machine.clone(),
        key: identity.key_sha256.clone().unwrap_or_default(),
        version,
        agents,
        bodies: state.encoded_bodies.clone(),
        presence: state.agent_presence.clone(),
        journal: state.journal_relay.clone(),
        revocations: state.revocation_bell.clone(),
        auth: state.auth.clone(),
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

/// What one machine's stream follows.
struct ChangeStream {
    machine: String,
    /// The key of the certificate it came with: a revocation of it ends the stream.
    key: String,
    version: Version,
    agents: Arc<dyn AgentRegistry>,
    bodies: Arc<EncodedBodies>,
    presence: Arc<AgentPresence>,
    journal: Arc<JournalRelay>,
    revocations: Arc<RevocationBell>,
    auth: Auth,
}

/// A line the manager owes its agent.
enum Line {
    /// The machine's work's revision and the journals asked of it (and on a second-version
    /// stream, the work).
    Changes,
    /// The answer to a heartbeat.
    BeatAnswer,
    /// A request for a heartbeat: the agent has been silent for half of `agent_ttl`.
    BeatRequest,
    /// The answer to a states line, once they are stored.
    StatesAnswer(AgentStreamStates),
}

/// How a stream ended.
enum Ended {
    /// The manager stops: its agents were heard to the end.
    Stopped,
    /// The agent went (it closed the stream, its connection broke, it fell silent, it sent
    /// what the protocol has no place for, or its certificate was revoked): heard last at its
    /// last heartbeat.
    Gone,
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
        let _streaming = fleet_metrics::OpenNow::change_stream();
        // An agent silent for half of `agent_ttl` is asked for a beat, and has a quarter more to
        // give it (whatever its own heartbeat): its loss is noticed within `agent_ttl`.
        let (ask_after, silence) = (self.presence.keepalive(), self.presence.cut_off_slack());
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
                if !write_line(&mut io, &line).await {
                    break 'serving Ended::Gone;
                }
            }
            tokio::select! {
                read = incoming.read(&mut io) => {
                    if !matches!(read, Ok(true)) {
                        break Ended::Gone;
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
                                break 'serving Ended::Gone;
                            }
                        }
                    }
                }
                changed = changes.changed() => match changed {
                    Ok(()) => push_once(&mut due, Line::Changes),
                    Err(_) => break Ended::Gone,
                },
                asked_now = asked.changed() => match asked_now {
                    Ok(()) => push_once(&mut due, Line::Changes),
                    Err(_) => break Ended::Gone,
                },
                rang = rung.changed() => {
                    if rang.is_err() || self.auth.certificate_revoked(&self.machine, &self.key).await.unwrap_or(false) {
                        break Ended::Gone;
                    }
                }
                () = tokio::time::sleep_until(heard + ask_after), if !beat_asked => {
                    beat_asked = true;
                    push_once(&mut due, Line::BeatRequest);
                }
                () = tokio::time::sleep_until(heard + silence) => break Ended::Gone,
                () = crate::serve::stopped(&mut stop) => break Ended::Stopped,
            }
        };
        match ended {
            Ended::Stopped => open.answered(),
            Ended::Gone => open.last_heard(heard),
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
        let answer = match take_states(&self.agents, &self.machine, states.states).await {
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

/// Writes `line` whole within [`WRITE_LIMIT`]; false if it could not.
async fn write_line<Io: AsyncWrite + Unpin>(io: &mut Io, line: &[u8]) -> bool {
    let written = async {
        io.write_all(line).await?;
        io.flush().await
    };
    matches!(tokio::time::timeout(WRITE_LIMIT, written).await, Ok(Ok(())))
}

mod changes_line;
mod incoming;
#[cfg(test)]
mod tests;
