//! `/journal/{name}`: the last lines of a unit's log on the answering machine, and with
//! `?status=true` its unit manager's status report (our addition; fleetctl journal and status
//! use it where the original used SSH to run journalctl and systemctl status).

use axum::http::StatusCode;
use axum::response::Response;

use crate::router::{ApiError, ApiState, first_value, json_response};
use crate::schema::Journal;

const DEFAULT_LINES: usize = 10;
const MAX_LINES: usize = 100_000;

pub async fn get(state: &ApiState, name: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
    let Some(local) = &state.local else {
        return Err(ApiError::not_found("this fleetd runs no units"));
    };
    let lines = match first_value(query, "lines") {
        None => DEFAULT_LINES,
        Some(text) => {
            text.parse::<usize>().map_err(|_| ApiError::bad_request(format!("invalid lines: {text:?}")))?.min(MAX_LINES)
        }
    };
    if state.registry.unit(name).await?.is_none() {
        return Err(ApiError::not_found("unit does not exist"));
    }
    let text = local
        .manager
        .journal(name, lines)
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?;
    let status = match first_value(query, "status") {
        Some("true") => local
            .manager
            .status(name)
            .await
            .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?,
        Some("false") | None => None,
        Some(other) => return Err(ApiError::bad_request(format!("invalid status: {other:?}"))),
    };
    let journal = Journal { machine_id: local.machine_id.clone(), name: name.to_string(), text, status };
    Ok(json_response(StatusCode::OK, &journal))
}
