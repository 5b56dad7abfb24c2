//! `/journal/{name}`: the last lines of a unit's log on the answering machine, and with
//! `?status=true` its unit manager's status report (our addition; fleetctl journal and status
//! use it where the original used SSH to run journalctl and systemctl status).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::query::first_value;
use crate::schema::Journal;
use fleet_registry::JournalQuestion;

const DEFAULT_LINES: usize = 10;
const MAX_LINES: usize = 100_000;

/// How long a manager waits for a pull agent to answer for its unit's journal.
const RELAY_WAIT: Duration = Duration::from_secs(10);

pub async fn get(state: &ApiState, name: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
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
    // A unit on a pull agent this manager serves: its journal comes by the agent's long poll.
    let local_id = state.local.as_ref().map(|local| local.machine_id.as_str());
    if let Some(machine) = unit.machine_id.as_deref().filter(|machine| Some(*machine) != local_id)
        && state.agents.is_some()
        && state.agent_presence.knows(machine)
    {
        return match state.journal_relay.ask(machine, name, lines, with_status, RELAY_WAIT).await {
            Some(journal) => Ok(json_response(StatusCode::OK, &journal)),
            None => {
                Err(ApiError::new(StatusCode::GATEWAY_TIMEOUT, format!("machine {machine} did not answer in time")))
            }
        };
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
        let question = JournalQuestion { unit: name.to_string(), lines, status: with_status };
        let answer = questions.ask_journal(machine, &question, RELAY_WAIT).await?;
        let journal = answer.and_then(|bytes| serde_json::from_slice::<Journal>(&bytes).ok());
        return match journal {
            Some(journal) if journal.machine_id == machine && journal.name == name => {
                Ok(json_response(StatusCode::OK, &journal))
            }
            _ => Err(ApiError::new(StatusCode::GATEWAY_TIMEOUT, format!("machine {machine} did not answer in time"))),
        };
    }
    let journal = local
        .journal(name, lines, with_status)
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error))?;
    Ok(json_response(StatusCode::OK, &journal))
}
