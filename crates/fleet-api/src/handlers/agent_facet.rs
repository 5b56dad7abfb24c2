//! `/agents/{machine}/…`: the agent's side of the store, served to a pull agent through its
//! manager. The router admits only the machine itself (by its certificate); here each request
//! is also held to the machine's own work: the bodies of units it was given, the states of
//! units it holds.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use fleet_api_schema::{RelayedJournal, STREAM_NOW_HEADER};
use fleet_core::access::Role;
use fleet_core::drift::{Drift, DriftReport};
use fleet_core::health::{HealthReport, HealthStatus};
use fleet_core::{Connection, MachineState, Resources, StateReport, SystemdState, UnitHash, UnitState};
use fleet_registry::machine_identity::admit_announce;
use fleet_registry::{AgentRegistry, AssignedUnit, MachineIdentity, MachineWork, RegistryError, Renewal};

use super::registration_tokens::check_metadata;
use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::encoded_bodies::options_of;
use crate::error::{ApiError, json_response};
use crate::schema::{
    AgentChanges, AgentHashedBody, AgentMachine, AgentSecret, AgentStates, AgentUnit, AgentUnitBodies, AgentUnitBody,
    AgentUnitSecrets, AgentWork, MAX_BODIES_PER_REQUEST, Machine,
};

pub(super) fn agents(state: &ApiState) -> Result<&Arc<dyn AgentRegistry>, ApiError> {
    state.agents.as_ref().ok_or_else(|| ApiError::not_found("this fleetd serves no pull agents"))
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

fn to_schema(unit: AssignedUnit) -> AgentUnit {
    let drift_policy = if unit.drift.is_default() { String::new() } else { unit.drift.to_string() };
    AgentUnit {
        name: unit.name,
        hash: unit.hash.to_string(),
        desired_state: unit.desired.to_string(),
        drift_policy,
        secrets: unit.secrets.versions,
        secrets_in_place: unit.secrets.in_place,
        run: unit.run.map(|ticket| fleet_api_schema::AgentRunTicket { id: ticket.id, elapse: ticket.elapse }),
        required_at: unit.required_at.into_iter().map(super::units::place_to_schema).collect(),
    }
}

/// The names and body hashes of what `machine` holds: its schedule and the global units.
fn held(work: &MachineWork) -> (BTreeSet<&str>, BTreeSet<UnitHash>) {
    let units = work.scheduled.iter().chain(&work.globals);
    let names = units.clone().map(|unit| unit.name.as_str()).collect();
    let hashes = units.map(|unit| unit.hash).collect();
    (names, hashes)
}

/// The machine announces itself, within what it was granted
/// ([`fleet_registry::machine_identity::admit_announce`]): its registration token's metadata,
/// the public IP of its first announcement. A machine that joined before identities were kept
/// is given one now, from this announcement, over the key it presents.
pub async fn register(state: &ApiState, identity: &Identity, body: &[u8]) -> Result<Response, ApiError> {
    let Role::Machine { id: machine_id } = &identity.role else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine announces itself"));
    };
    let agents = agents(state)?;
    let request: AgentMachine =
        serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("invalid machine: {error}")))?;
    if !request.public_ip.is_empty() && request.public_ip.parse::<std::net::IpAddr>().is_err() {
        return Err(ApiError::bad_request("invalid publicIP"));
    }
    check_metadata(&request.metadata)?;
    if request.version.len() > 64 || request.version.chars().any(char::is_control) {
        return Err(ApiError::bad_request("invalid version"));
    }
    let taints = announced_taints(&request.taints)?;
    let capacity: Option<Resources> = request.capacity.map(Into::into);
    if capacity.is_some_and(|capacity| !capacity.is_bounded()) {
        return Err(ApiError::bad_request("invalid capacity: at most 1 PiB of memory and 1000000 cores"));
    }
    let bound = super::agents::held_identity(state, machine_id, identity).await?;
    let granted = match &bound {
        Some(bound) => admit_announce(bound, &request.metadata, &request.public_ip)
            .map_err(|refused| ApiError::new(StatusCode::FORBIDDEN, refused.to_string()))?,
        None => {
            tracing::info!(machine = machine_id, "a machine that joined before identities were kept: bound to its key");
            MachineIdentity {
                id: machine_id.clone(),
                key_sha256: identity.key_sha256.clone().unwrap_or_default(),
                registration: String::new(),
                joined: crate::auth::tokens::now_unix(),
                metadata: request.metadata.clone(),
                public_ip: Some(request.public_ip.clone()).filter(|ip| !ip.is_empty()),
                member: false,
            }
        }
    };
    if bound.as_ref() != Some(&granted) {
        state.registry.put_machine_identity(&granted).await?;
    }
    let machine = MachineState {
        id: machine_id.to_string(),
        public_ip: granted.public_ip.unwrap_or(request.public_ip),
        metadata: granted.metadata,
        version: request.version,
        // A pull agent never leads the engine: it has no store of its own.
        disable_engine: true,
        connection: Connection::Pull,
        capacity,
        drain: None,
        taints,
    };
    agents.announce_for_agent(&machine).await?;
    fleet_metrics::metrics().pull.announcements.inc();
    let stream_now = if state.announce_pace.welcomes_stream() { "true" } else { "false" };
    Ok((StatusCode::NO_CONTENT, [(STREAM_NOW_HEADER, stream_now)]).into_response())
}

/// The most taints a machine announces.
const MOST_TAINTS: usize = 64;

/// The taints a machine announces, each as written, at most [`MOST_TAINTS`].
fn announced_taints(written: &[String]) -> Result<fleet_core::taint::Taints, ApiError> {
    if written.len() > MOST_TAINTS {
        return Err(ApiError::bad_request(format!("invalid taints: at most {MOST_TAINTS}")));
    }
    written
        .iter()
        .map(|taint| fleet_core::taint::parse_taint(taint))
        .collect::<Result<_, _>>()
        .map_err(|error| ApiError::bad_request(format!("invalid taints: {error}")))
}

/// The machine leaves the cluster (a clean stop): it and its states go, its units move.
pub async fn unregister(state: &ApiState, machine_id: &str) -> Result<Response, ApiError> {
    state.agent_presence.forget(machine_id);
    state.agent_state_events.forget(machine_id);
    agents(state)?.unregister_machine(machine_id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Answers when the machine's work may have changed since `after` (the revision its last
/// answer gave), or with the same revision after `wait` seconds (as the agent asks, at most
/// [`crate::agent_presence::LONGEST_POLL`]; [`crate::agent_presence::AgentPresence::poll_wait`]
/// when it asks for none): a long poll, opened by the agent, so a manager never connects to
/// an agent. The machine is present for as long as its poll is open.
pub async fn changes(state: &ApiState, identity: &Identity, query: &[(String, String)]) -> Result<Response, ApiError> {
    let Role::Machine { id: machine_id } = &identity.role else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine follows its changes"));
    };
    let key = identity.key_sha256.as_deref().unwrap_or_default();
    let agents = agents(state)?;
    let after = match crate::query::first_value(query, "after") {
        None => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| ApiError::bad_request("invalid after"))?),
    };
    let longest = crate::agent_presence::LONGEST_POLL.as_secs();
    let wait = match crate::query::first_value(query, "wait") {
        None => state.agent_presence.poll_wait(),
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|seconds| (1..=longest).contains(seconds))
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| ApiError::bad_request(format!("invalid wait: seconds, 1 to {longest}")))?,
    };
    let mut signal = agents.machine_changes(machine_id);
    let mut asked = state.journal_relay.asked(machine_id);
    let current = *signal.borrow_and_update();
    let mut journal = state.journal_relay.take(machine_id);
    if journal.is_empty() && after.is_some_and(|after| after == current) {
        // Wait for a change, or the end of the poll; a revocation rings the bell, and a
        // revoked machine's open poll ends within a second.
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        let _waiting = fleet_metrics::OpenNow::long_poll();
        // The machine is present while it waits here, however long.
        let presence = state.agent_presence.poll_opened(machine_id);
        let (mut revocations, _listening) = state.revocation_bell.open_poll(&state.auth);
        loop {
            tokio::select! {
                _ = signal.changed() => {}
                _ = asked.changed() => {}
                () = &mut deadline => break,
                rung = revocations.changed() => {
                    if rung.is_err() {
                        break;
                    }
                    if state.auth.certificate_revoked(machine_id, key).await.unwrap_or(false) {
                        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "revoked machine certificate"));
                    }
                    continue;
                }
            }
            journal = state.journal_relay.take(machine_id);
            break;
        }
        presence.answered();
    }
    let revision = *signal.borrow();
    Ok(json_response(StatusCode::OK, &AgentChanges { revision, journal, ..AgentChanges::default() }))
}

pub async fn work(state: &ApiState, machine_id: &str) -> Result<Response, ApiError> {
    let work = served_work(agents(state)?, machine_id).await?;
    Ok(json_response(StatusCode::OK, &work_to_schema(work)))
}

/// A pull agent's work as its manager tells it: the machine shown absent while this manager
/// holds no presence for it (the manager restarted, or the agent came from another), so that
/// the agent announces itself here at once, as agents since 0.1 do for a machine the cluster
/// lost. Without it, an idle agent back on its restarted manager found its presence still
/// there, hanging on the lease of the manager's previous life that nobody renewed any more,
/// and announced only once that lease expired (`agent_ttl`), its units unscheduled meanwhile.
pub(super) async fn served_work(
    agents: &Arc<dyn AgentRegistry>,
    machine_id: &str,
) -> Result<MachineWork, RegistryError> {
    let mut work = agents.machine_work(machine_id).await?;
    if agents.presence_renewed(machine_id) == Renewal::NotHeld {
        work.machine = None;
    }
    Ok(work)
}

/// A machine's work as its agent is told it.
pub(super) fn work_to_schema(work: MachineWork) -> AgentWork {
    let machine = work.machine.map(|machine| Machine {
        taints: fleet_core::taint::written(&machine.taints),
        id: machine.id,
        metadata: machine.metadata,
        primary_ip: machine.public_ip,
        ..Machine::default()
    });
    AgentWork {
        machine,
        scheduled: work.scheduled.into_iter().map(to_schema).collect(),
        globals: work.globals.into_iter().map(to_schema).collect(),
    }
}

/// Refuses any of `hashes` that is not the body of a unit `machine_id` holds.
async fn check_held(agents: &Arc<dyn AgentRegistry>, machine_id: &str, hashes: &[UnitHash]) -> Result<(), ApiError> {
    let work = agents.machine_work(machine_id).await?;
    let (_, held) = held(&work);
    match hashes.iter().find(|hash| !held.contains(hash)) {
        Some(hash) => Err(forbidden(format!("machine {machine_id} holds no unit with body {hash}"))),
        None => Ok(()),
    }
}

pub async fn body(state: &ApiState, machine_id: &str, hash: &str) -> Result<Response, ApiError> {
    let agents = agents(state)?;
    let hash = UnitHash::parse_hex(hash).ok_or_else(|| ApiError::bad_request("invalid unit hash"))?;
    check_held(agents, machine_id, &[hash]).await?;
    let file = agents.unit_body(&hash).await?.ok_or_else(|| ApiError::not_found("unit body does not exist"))?;
    Ok(json_response(StatusCode::OK, &AgentUnitBody { options: options_of(file) }))
}

/// `GET /agents/{machine}/secrets/{unit}`: the values of the secrets `unit` names, opened here
/// for the machine, which must hold the unit: scheduled to it, or global and wanted by its
/// metadata. Nothing of another unit, and nothing for a machine revoked (its certificate
/// no longer reaches here).
pub async fn secrets(state: &ApiState, machine_id: &str, unit: &str) -> Result<Response, ApiError> {
    let agents = agents(state)?;
    let work = agents.machine_work(machine_id).await?;
    let scheduled = work.scheduled.iter().find(|held| held.name == unit);
    let global = work.globals.iter().find(|held| held.name == unit);
    let Some(held) = scheduled.or(global) else {
        return Err(forbidden(format!("machine {machine_id} holds no unit {unit}")));
    };
    let file = agents.unit_body(&held.hash).await?.ok_or_else(|| ApiError::not_found("unit body does not exist"))?;
    if scheduled.is_none() {
        let machine = work.machine.clone().unwrap_or_default();
        if !fleet_core::requirements::Requirements::from_unit(unit, &file).admitted_by(&machine) {
            return Err(forbidden(format!("machine {machine_id} does not run global unit {unit}")));
        }
    }
    let references = fleet_core::secrets::references(&file).map_err(ApiError::bad_request)?;
    let keys = state.secret_keys.get().map_err(|why| {
        tracing::warn!(machine = machine_id, unit, "cannot open secrets for a pull agent: {why}");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("this fleetd holds no secrets key: {why}"))
    })?;
    let names: Vec<String> = references.into_iter().map(|reference| reference.secret).collect();
    // At the versions the unit is pinned to in the machine's work.
    let delivered = crate::secret_keys::open_for_unit(state.registry.as_ref(), &keys, &held.secrets, &names)
        .await
        .map_err(|(name, why)| {
            use crate::secret_keys::OpenFailure;
            match why {
                OpenFailure::Store(error) => ApiError::from(error),
                OpenFailure::Missing => ApiError::not_found(format!("secret {name} does not exist")),
                OpenFailure::VersionGone(version) => {
                    ApiError::not_found(format!("secret {name} no longer keeps version {version}"))
                }
                OpenFailure::Sealed(error) => {
                    tracing::warn!(secret = name, %error, "cannot open a secret");
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("secret {name}: {error}"))
                }
            }
        })?;
    let secrets = delivered
        .iter()
        .map(|secret| AgentSecret {
            name: secret.name.clone(),
            version: secret.version,
            value: base64::engine::general_purpose::STANDARD.encode(&secret.value),
        })
        .collect();
    Ok(json_response(StatusCode::OK, &AgentUnitSecrets { secrets }))
}

/// `GET /agents/{machine}/bodies?hash=H&hash=H…`: the bodies that exist among those asked for,
/// read together; every one must be the body of a unit the machine holds.
pub async fn bodies(state: &ApiState, machine_id: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
    let agents = agents(state)?;
    let mut hashes = Vec::new();
    for (name, value) in query {
        if name != "hash" {
            return Err(ApiError::bad_request(format!("unknown parameter {name:?}")));
        }
        hashes.push(UnitHash::parse_hex(value).ok_or_else(|| ApiError::bad_request("invalid unit hash"))?);
    }
    if hashes.is_empty() || hashes.len() > MAX_BODIES_PER_REQUEST {
        return Err(ApiError::bad_request(format!("between 1 and {MAX_BODIES_PER_REQUEST} hash parameters expected")));
    }
    hashes.sort_unstable();
    hashes.dedup();
    check_held(agents, machine_id, &hashes).await?;
    let mut found = agents.unit_bodies(machine_id, &hashes).await?;
    let bodies = hashes
        .iter()
        .filter_map(|hash| {
            found.remove(hash).map(|file| AgentHashedBody { hash: hash.to_string(), options: options_of(file) })
        })
        .collect();
    Ok(json_response(StatusCode::OK, &AgentUnitBodies { bodies }))
}

pub async fn report(state: &ApiState, machine_id: &str, body: &[u8]) -> Result<Response, ApiError> {
    let agents = agents(state)?;
    let request: AgentStates =
        serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("invalid states: {error}")))?;
    take_states(agents, machine_id, request, (&state.agent_state_events, &state.events)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Stores the state changes `machine_id` reports of its own units (by request or on its
/// change stream): a state only of a unit it holds, every value checked. Once stored, what
/// they change of its units' states and health goes to the event sink (`noting`).
pub(super) async fn take_states(
    agents: &Arc<dyn AgentRegistry>,
    machine_id: &str,
    request: AgentStates,
    noting: (&crate::agent_state_events::AgentStateEvents, &fleet_registry::EventSink),
) -> Result<(), ApiError> {
    let work = agents.machine_work(machine_id).await?;
    let (names, _) = held(&work);
    if let Some(state) = request.set.iter().find(|state| !names.contains(state.name.as_str())) {
        return Err(forbidden(format!("machine {machine_id} does not hold {}", state.name)));
    }
    // A removal takes only this machine's own state of a unit, and most often of a unit it no
    // longer holds (destroyed, or moved away): any valid name is allowed.
    for name in &request.removed {
        fleet_core::unit_name::validate_name(name)
            .map_err(|error| ApiError::bad_request(format!("invalid unit name {name:?}: {error}")))?;
    }
    let mut reports = Vec::with_capacity(request.set.len() + request.removed.len());
    for reported in request.set {
        let hash = UnitHash::parse_hex(&reported.hash).ok_or_else(|| ApiError::bad_request("invalid unit hash"))?;
        let systemd = SystemdState::new(
            &reported.systemd_load_state,
            &reported.systemd_active_state,
            &reported.systemd_sub_state,
        );
        let drift = match reported.drift {
            Some(report) => Some(DriftReport {
                drift: Drift::from_word(&report.drift)
                    .ok_or_else(|| ApiError::bad_request(format!("invalid drift {:?}", report.drift)))?,
                corrections: report.corrections.min(fleet_core::drift::LIMIT),
                correcting: report.correcting,
                given_up: report.given_up,
            }),
            None => None,
        };
        let health = match reported.health {
            Some(report) => Some(HealthReport {
                status: HealthStatus::from_word(&report.status)
                    .ok_or_else(|| ApiError::bad_request(format!("invalid health {:?}", report.status)))?,
                failure: fleet_core::health::short_failure(&report.failure),
                restarts: report.restarts.min(fleet_core::drift::LIMIT),
                given_up: report.given_up,
            }),
            None => None,
        };
        let run = match reported.run {
            Some(run) => Some(Box::new(checked_run(run)?)),
            None => None,
        };
        reports.push(StateReport::Set(UnitState {
            run,
            name: reported.name,
            machine_id: machine_id.to_string(),
            hash,
            systemd,
            launched: reported.launched,
            drift,
            health,
            secrets: checked_deliveries(reported.secrets)?,
        }));
    }
    reports.extend(request.removed.into_iter().map(StateReport::Remove));
    agents.report_states(machine_id, &reports).await?;
    let (seen, sink) = noting;
    if sink.keeps() {
        sink.note_all(seen.events_of(machine_id, &reports, fleet_registry::micros_now()));
    }
    Ok(())
}

/// A run a machine reports, its outcome one the words name.
fn checked_run(run: fleet_api_schema::AgentRun) -> Result<fleet_core::job::runs::RunReport, ApiError> {
    let outcome = match run.outcome.as_deref() {
        None => None,
        Some(word) => Some(
            fleet_core::job::runs::Outcome::from_report(word, run.status, run.signal.as_deref())
                .ok_or_else(|| ApiError::bad_request(format!("invalid run outcome {word:?}")))?,
        ),
    };
    if run.log.as_ref().is_some_and(|log| log.len() > fleet_core::job::runs::LOG_BYTES) {
        return Err(ApiError::bad_request(format!(
            "a run's log is at most {} bytes",
            fleet_core::job::runs::LOG_BYTES
        )));
    }
    Ok(fleet_core::job::runs::RunReport { started: run.started, ended: run.ended, outcome, log: run.log, run: run.run })
}

/// The versions of secrets a machine says it gave a unit, as bounded as a unit's references.
fn checked_deliveries(
    delivered: std::collections::BTreeMap<String, u64>,
) -> Result<std::collections::BTreeMap<String, u64>, ApiError> {
    if delivered.len() > fleet_core::secrets::MAX_REFERENCES {
        return Err(ApiError::bad_request(format!(
            "a unit names at most {} secrets",
            fleet_core::secrets::MAX_REFERENCES
        )));
    }
    match delivered.keys().find_map(|name| fleet_core::secrets::name_problem(name)) {
        Some(problem) => Err(ApiError::bad_request(problem)),
        None => Ok(delivered),
    }
}

/// The machine answers a journal question its long poll carried.
pub fn journal_answer(state: &ApiState, machine_id: &str, id: &str, body: &[u8]) -> Result<Response, ApiError> {
    let id: u64 = id.parse().map_err(|_| ApiError::not_found("no such journal question for this machine"))?;
    let mut answer: RelayedJournal =
        serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("invalid journal: {error}")))?;
    if let RelayedJournal::Journal(journal) = &mut answer {
        journal.machine_id = machine_id.to_string();
        // What the agent sent is bounded as any relayed answer is.
        *journal = crate::api_state::within_relay_bound(std::mem::take(journal));
    }
    if state.journal_relay.answer(machine_id, id, answer) {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("no such journal question for this machine"))
    }
}

#[cfg(test)]
mod tests {
    use super::checked_run;
    use fleet_api_schema::AgentRun;
    use fleet_core::job::runs::Outcome;

    #[test]
    fn a_reported_run_keeps_its_number_and_bad_ones_are_refused() {
        let run = AgentRun {
            started: 1,
            ended: Some(2),
            outcome: Some("failed".into()),
            status: Some(4),
            run: Some(7),
            ..AgentRun::default()
        };
        let checked = checked_run(run.clone()).expect("a valid run");
        assert_eq!((checked.run, checked.outcome), (Some(7), Some(Outcome::Failed { status: Some(4), signal: None })));
        let odd = AgentRun { outcome: Some("exploded".into()), ..run.clone() };
        assert_eq!(checked_run(odd).err().map(|error| error.status.as_u16()), Some(400));
        let long = AgentRun { log: Some("x".repeat(4096)), ..run };
        assert_eq!(checked_run(long).err().map(|error| error.status.as_u16()), Some(400));
    }
}
