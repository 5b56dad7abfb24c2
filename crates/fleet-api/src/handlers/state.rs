//! `/state` and `/state/{name}`: what machines report about their units.

use axum::http::StatusCode;
use axum::response::Response;
use std::sync::Arc;

use fleet_core::access::Role;
use fleet_registry::PageRequest;

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::query::{first_value, flag, page_token};
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
        health: state.health.as_ref().map(|health| health.status.word().to_string()).unwrap_or_default(),
        health_failure: state.health.as_ref().map(|health| health.failure.clone()).unwrap_or_default(),
        health_restarts: state.health.as_ref().map_or(0, |health| health.restarts),
        health_given_up: state.health.as_ref().is_some_and(|health| health.given_up),
        out_of_touch_since: String::new(),
    }
}

/// The unit states `role` sees, a page at a time; with `?outOfTouch=true`, the units that
/// wait for a machine out of touch after them, on the last page, as `unknown`.
pub async fn list(state: &ApiState, query: &[(String, String)], role: &Role) -> Result<Response, ApiError> {
    let token = page_token(query, state.page_size.get())?;
    let machine = first_value(query, "machineID");
    let unit = first_value(query, "unitName").map(str::to_string);
    let (start, limit) = token.window();
    let listing = format!("state {role:?} {machine:?} {unit:?}");
    let after = state.page_cursors.after(&listing, start);
    let role = role.clone();
    let admits = move |name: &str| unit.as_deref().is_none_or(|unit| name == unit) && role.sees_unit(name);
    let admits: Arc<dyn Fn(&str) -> bool + Send + Sync> = Arc::new(admits);
    let out_of_touch = flag(query, "outOfTouch", false)?;
    let request = PageRequest { start, limit, admits: admits.clone(), after };
    let _turn = crate::unread_answers::page_build_turn().await;
    let page = state.registry.unit_states_page(request, machine).await?;
    let mut states: Vec<UnitState> = page.items.into_iter().map(to_schema).collect();
    if !page.more && out_of_touch {
        let machines = crate::out_of_touch::machines(&*state.registry).await?;
        states.extend(crate::out_of_touch::unit_states(&machines, |unit, on| {
            admits(unit) && machine.is_none_or(|machine| machine == on)
        }));
    }
    let (states, encoded, next) = token.page_encoded(states, page.more);
    if let (Some(_), Some(last)) = (&next, states.last()) {
        state.page_cursors.remember(&listing, start + states.len(), format!("{}\0{}", last.name, last.machine_id));
    }
    Ok(json_response(StatusCode::OK, &UnitStatePage { next_page_token: next.map(|t| t.encode()), states: encoded }))
}

pub async fn get(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let wanted = name.to_string();
    let request = PageRequest { start: 0, limit: 1, admits: Arc::new(move |unit: &str| unit == wanted), after: None };
    let found = state.registry.unit_states_page(request, None).await?.items.into_iter().next();
    match found {
        Some(unit_state) => Ok(json_response(StatusCode::OK, &to_schema(unit_state))),
        None => Err(ApiError::not_found("unit state does not exist")),
    }
}
