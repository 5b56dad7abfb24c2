//! `/journal/{name}`: the last lines of a unit's log on the answering machine, and with
//! `?status=true` its unit manager's status report (our addition; fleetctl journal and status
//! use it where the original used SSH to run journalctl and systemctl status).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use fleet_api_schema::RelayedJournal;

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::{ApiError, json_response};
use crate::query::first_value;
use fleet_registry::JournalQuestion;

const DEFAULT_LINES: usize = 10;
const MAX_LINES: usize = 100_000;

/// How long a relay waits for the machine asked to answer (a pull agent through this manager,
/// or another member through the store).
pub const RELAY_WAIT: Duration = Duration::from_secs(10);

pub async fn get(
    state: &ApiState,
    identity: &Identity,
    name: &str,
    query: &[(String, String)],
) -> Result<Response, ApiError> {
    let lines = match first_value(query, "lines") {
        None => DEFAULT_LINES,
        Some(text) => {
            text.parse::<usize>().map_err(|_| ApiError::bad_request(format!("invalid lines: {text:?}")))?.min(MAX_LINES)
        }
    };
    let with_status = match first_value(query, "status") {
        Some("true") => true,
        Some("false") | None => false,
        Some(other) => return Err(ApiError::bad_request(format!("invalid status: {other:?}"))),
    };
    let Some(unit) = state.registry.unit(name).await? else {
        return Err(ApiError::not_found("unit does not exist"));
    };
    // A unit on a pull agent this manager serves: its journal comes by the agent's stream.
    let local_id = state.local.as_ref().map(|local| local.machine_id.as_str());
    if let Some(machine) = unit.machine_id.as_deref().filter(|machine| Some(*machine) != local_id)
        && state.agents.is_some()
        && state.agent_presence.knows(machine)
    {
        let _relaying = state.journal_limits.admit(identity)?;
        let answer = state
            .journal_relay
            .ask(machine, name, lines, with_status, RELAY_WAIT)
            .await
            .map_err(|busy| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, busy.to_string()))?;
        return relayed(machine, name, answer);
    }
    let Some(local) = &state.local else {
        return Err(ApiError::not_found("this fleetd runs no units"));
    };
    // A unit another machine runs: its log is there, not here (answering with this machine's
    // log of it, empty or left from when it ran here, would be a wrong answer). The store
    // carries the question to that machine where it can.
    if let Some(machine) = unit.machine_id.as_deref().filter(|machine| *machine != local.machine_id) {
        let Some(questions) = &state.journal_questions else {
            return Err(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                format!("unit {name} runs on machine {machine}: ask that machine's fleetd for its journal"),
            ));
        };
        let _relaying = state.journal_limits.admit(identity)?;
        let question = JournalQuestion { unit: name.to_string(), lines, status: with_status };
        let answer = questions.ask_journal(machine, &question, RELAY_WAIT).await?;
        let answer = match answer {
            None => None,
            Some(bytes) => Some(serde_json::from_slice::<RelayedJournal>(&bytes).map_err(|_| {
                ApiError::new(StatusCode::BAD_GATEWAY, format!("machine {machine} answered with an unreadable journal"))
            })?),
        };
        return relayed(machine, name, answer);
    }
    let journal = local
        .journal(name, lines, with_status)
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error))?;
    Ok(json_response(StatusCode::OK, &journal))
}

/// The answer to a relayed journal of `unit` from `machine`: the journal it sent, its own
/// error as a 502, or a 504 when it sent nothing in time.
fn relayed(machine: &str, unit: &str, answer: Option<RelayedJournal>) -> Result<Response, ApiError> {
    match answer {
        Some(RelayedJournal::Journal(journal)) if journal.machine_id == machine && journal.name == unit => {
            Ok(json_response(StatusCode::OK, &journal))
        }
        Some(RelayedJournal::Journal(_)) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("machine {machine} answered with the journal of another unit"),
        )),
        Some(RelayedJournal::Failed { error }) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("machine {machine} could not read the journal of {unit}: {error}"),
        )),
        None => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("machine {machine} did not answer within {}s", RELAY_WAIT.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use fleet_api_schema::Journal;

    use super::*;

    #[test]
    fn a_relayed_answer_is_the_journal_asked_or_an_error_that_says_what_went_wrong() {
        let journal = |unit: &str| {
            RelayedJournal::Journal(Journal { machine_id: "m2".into(), name: unit.into(), ..Journal::default() })
        };
        assert_eq!(
            relayed("m2", "a.service", Some(journal("a.service"))).map(|r| r.status()).ok(),
            Some(StatusCode::OK)
        );
        let status = |answer| relayed("m2", "a.service", answer).err().map(|error| (error.status, error.message));
        let (code, message) = status(Some(journal("b.service"))).expect("refused");
        assert_eq!(code, StatusCode::BAD_GATEWAY, "{message}");
        let failed = RelayedJournal::Failed { error: "no such unit".into() };
        let (code, message) = status(Some(failed)).expect("refused");
        assert_eq!((code, message.contains("no such unit")), (StatusCode::BAD_GATEWAY, true), "{message}");
        let (code, message) = status(None).expect("refused");
        assert_eq!(code, StatusCode::GATEWAY_TIMEOUT, "{message}");
    }
}
