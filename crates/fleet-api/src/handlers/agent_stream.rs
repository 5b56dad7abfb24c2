//! `GET /agents/{machine}/stream`: a pull agent's change stream
//! ([`crate::schema::CHANGE_STREAM_PROTOCOL`]). The agent upgrades an HTTP/1.1 connection; the
//! manager then writes the machine's changes on it as they come and answers its heartbeats.
//! The machine is present while the stream is open, and an idle agent costs its manager a
//! quiet TLS connection and a small task: no HTTP/2 connection (buffers, streams, a request
//! in flight) stays open for it, as a long poll needs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use fleet_core::access::Role;
use fleet_registry::AgentRegistry;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::agent_facet::agents;
use crate::agent_presence::AgentPresence;
use crate::api_state::ApiState;
use crate::auth::{Auth, Identity};
use crate::error::ApiError;
use crate::journal_relay::JournalRelay;
use crate::revocation_bell::RevocationBell;
use crate::schema::{AgentChanges, CHANGE_STREAM_PROTOCOL};
use crate::upgrade::{ConnectionHold, Upgrade};

/// How long one line may take to leave: an agent that reads nothing loses its stream.
const WRITE_LIMIT: Duration = Duration::from_secs(10);

/// Opens the stream of `identity`'s machine: `101 Switching Protocols`, then the stream is
/// served on the connection by a task of its own.
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
    if !asks_for_stream(headers) {
        return Err(ApiError::bad_request(format!(
            "a change stream needs the headers Connection: upgrade and Upgrade: {CHANGE_STREAM_PROTOCOL}"
        )));
    }
    let Some((connection, hold)) = upgrade.take() else {
        return Err(ApiError::bad_request("a change stream needs an HTTP/1.1 connection"));
    };
    let stream = ChangeStream {
        machine: machine.clone(),
        key: identity.key_sha256.clone().unwrap_or_default(),
        agents,
        presence: state.agent_presence.clone(),
        journal: state.journal_relay.clone(),
        revocations: state.revocation_bell.clone(),
        auth: state.auth.clone(),
    };
    tokio::spawn(stream.serve_upgraded(connection, hold));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(CHANGE_STREAM_PROTOCOL));
    Ok(response)
}

/// Whether the request asks to switch to the change stream protocol.
fn asks_for_stream(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers.get_all(header::CONNECTION).iter().any(|value| {
        value.to_str().is_ok_and(|text| text.split(',').any(|token| token.trim().eq_ignore_ascii_case("upgrade")))
    });
    let protocol =
        headers.get_all(header::UPGRADE).iter().any(|value| value.as_bytes() == CHANGE_STREAM_PROTOCOL.as_bytes());
    connection_upgrade && protocol
}

/// What one machine's stream follows.
struct ChangeStream {
    machine: String,
    /// The key of the certificate it came with: a revocation of it ends the stream.
    key: String,
    agents: Arc<dyn AgentRegistry>,
    presence: Arc<AgentPresence>,
    journal: Arc<JournalRelay>,
    revocations: Arc<RevocationBell>,
    auth: Auth,
}

/// A line the manager owes its agent.
enum Line {
    /// The machine's work's revision and the journals asked of it.
    Changes,
    /// The answer to a heartbeat.
    BeatAnswer,
    /// A request for a heartbeat: the agent has been silent for half of `agent_ttl`.
    BeatRequest,
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
        let mut due = Some(Line::Changes);
        let mut beats = [0u8; 64];
        let ended = loop {
            let line = match due.take() {
                None => None,
                Some(Line::Changes) => Some(self.changes_line(*changes.borrow_and_update())),
                Some(Line::BeatAnswer) => Some(b"\n".to_vec()),
                Some(Line::BeatRequest) => Some(b"?\n".to_vec()),
            };
            if let Some(line) = line
                && !write_line(&mut io, &line).await
            {
                break Ended::Gone;
            }
            tokio::select! {
                read = io.read(&mut beats) => match read {
                    Ok(read) if read > 0 && beats[..read].iter().all(|byte| *byte == b'\n') => {
                        heard = Instant::now();
                        beat_asked = false;
                        due = Some(Line::BeatAnswer);
                    }
                    _ => break Ended::Gone,
                },
                changed = changes.changed() => match changed {
                    Ok(()) => due = Some(Line::Changes),
                    Err(_) => break Ended::Gone,
                },
                asked_now = asked.changed() => match asked_now {
                    Ok(()) => due = Some(Line::Changes),
                    Err(_) => break Ended::Gone,
                },
                rang = rung.changed() => {
                    if rang.is_err() || self.auth.certificate_revoked(&self.machine, &self.key).await.unwrap_or(false) {
                        break Ended::Gone;
                    }
                }
                () = tokio::time::sleep_until(heard + ask_after), if !beat_asked => {
                    beat_asked = true;
                    due = Some(Line::BeatRequest);
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

    /// The line that tells the agent its work's `revision` and the journals asked of it.
    fn changes_line(&self, revision: u64) -> Vec<u8> {
        let changes = AgentChanges { revision, journal: self.journal.take(&self.machine) };
        let mut line = serde_json::to_vec(&changes).unwrap_or_default();
        line.push(b'\n');
        line
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

#[cfg(test)]
mod tests;
