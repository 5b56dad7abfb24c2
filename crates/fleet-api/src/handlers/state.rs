//! `/state` and `/state/{name}`: what machines report about their units.

use axum::http::StatusCode;
use axum::response::Response;
use fleet_core::access::Role;

use crate::pagination::serialized_size;
use crate::router::{ApiError, ApiState, first_value, json_response, page_token};
use crate::schema::{UnitState, UnitStatePage};

fn to_schema(state: fleet_core::UnitState) -> UnitState {
    UnitState {
        hash: state.hash.to_string(),
        machine_id: state.machine_id,
        name: state.name,
        systemd_active_state: state.systemd.active,
        systemd_load_state: state.systemd.load,
        systemd_sub_state: state.systemd.sub,
        drift: state.drift.map(|drift| drift.to_string()).unwrap_or_default(),
    }
}

/// The unit states `role` sees, a page at a time.
pub async fn list(state: &ApiState, query: &[(String, String)], role: &Role) -> Result<Response, ApiError> {
    let token = page_token(query, state.token_limit.get())?;
    let machine = first_value(query, "machineID");
    let unit = first_value(query, "unitName");
    let mut states: Vec<UnitState> = state
        .registry
        .unit_states()
        .await?
        .into_iter()
        .filter(|s| machine.is_none_or(|m| s.machine_id == m) && unit.is_none_or(|u| s.name == u))
        .filter(|s| role.sees_unit(&s.name))
        .map(to_schema)
        .collect();
    states.sort_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
    let (states, next) = token.page(states, serialized_size);
    Ok(json_response(StatusCode::OK, &UnitStatePage { next_page_token: next.map(|t| t.encode()), states }))
}

pub async fn get(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let found = state.registry.unit_states().await?.into_iter().find(|s| s.name == name);
    match found {
        Some(unit_state) => Ok(json_response(StatusCode::OK, &to_schema(unit_state))),
        None => Err(ApiError::not_found("unit state does not exist")),
    }
}
