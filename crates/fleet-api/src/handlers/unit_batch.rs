//! `POST /units` (our addition): many unit writes in one request, each the write a
//! `PUT /units/{name}` of that unit makes, answered one by one. The request is checked
//! whole first: one unit that is malformed, or that the caller may not write, refuses the
//! batch and nothing is stored.

use std::collections::HashSet;

use axum::http::StatusCode;
use axum::response::Response;
use fleet_core::DesiredState;
use fleet_core::access::{Access, Action, Role, decide};
use fleet_core::state::InvalidState;
use fleet_core::unit_name::validate_name;
use fleet_registry::{UnitChange, UnitChanged, Writer};

use super::units::{file_from_options, json_object, refuse_template_activation, validate_options};
use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{Unit, UnitBatch, UnitBatchResult, UnitBatchResults};

/// The units of a batch, which its path does not name: handed to the audit with the answer
/// (a response extension), so that the write's event names them.
#[derive(Clone, Debug, Default)]
pub(crate) struct WrittenUnits(pub Vec<String>);

/// The most units one request may carry (fleetctl sends at most this many at once).
pub const MOST_UNITS_PER_BATCH: usize = 1000;

pub async fn post(state: &ApiState, role: &Role, body: &[u8], writer: &Writer) -> Result<Response, ApiError> {
    let batch: UnitBatch = json_object(body)?;
    if batch.units.is_empty() {
        return Err(ApiError::bad_request("no units given"));
    }
    let changes = admitted(batch.units, role, Permission::Write, MOST_UNITS_PER_BATCH, state.agent_ttl)?;
    let files = changes.iter().filter_map(|change| Some((change.name.as_str(), change.file.as_ref()?)));
    super::secrets::check_named(state, role, files.clone()).await?;
    super::dependency_cycles::refuse_cycles(state, files).await?;
    let answers = state.registry.change_units_as(&changes, writer).await?;
    let units = changes
        .iter()
        .zip(answers)
        .map(|(change, answer)| {
            let (code, message) = match answer {
                Ok(UnitChanged::Written) if change.file.is_some() => (StatusCode::CREATED, None),
                Ok(UnitChanged::Written) => (StatusCode::NO_CONTENT, None),
                Ok(UnitChanged::NoSuchUnit) => (StatusCode::NOT_FOUND, Some("unit does not exist".to_string())),
                Err(error) => {
                    let error = ApiError::from(error);
                    (error.status, Some(error.message))
                }
            };
            UnitBatchResult { name: change.name.clone(), code: code.as_u16(), message }
        })
        .collect();
    let mut response = json_response(StatusCode::OK, &UnitBatchResults { units });
    let written = changes.into_iter().map(|change| change.name).collect();
    response.extensions_mut().insert(WrittenUnits(written));
    Ok(response)
}

/// What a request asks of each of its units: to write it, or to plan a write of it (which
/// needs only that the caller may see it: a viewer plans anything it reads, an operator
/// within its pattern).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Permission {
    Write,
    Plan,
}

/// The request's changes (at most `most`), each checked as its own `PUT` would be and by the
/// one authorization check; the first unit refused refuses the whole request.
pub(super) fn admitted(
    units: Vec<Unit>,
    role: &Role,
    asked: Permission,
    most: usize,
    agent_ttl: std::time::Duration,
) -> Result<Vec<UnitChange>, ApiError> {
    if units.len() > most {
        return Err(ApiError::bad_request(format!("{} units given; at most {most} per request", units.len())));
    }
    let mut names = HashSet::new();
    let mut changes = Vec::with_capacity(units.len());
    for (index, unit) in units.into_iter().enumerate() {
        let change = admit_one(index, unit, role, asked, agent_ttl)?;
        if !names.insert(change.name.clone()) {
            return Err(ApiError::bad_request(format!("unit {} is given twice", change.name)));
        }
        changes.push(change);
    }
    Ok(changes)
}

/// One unit of a request (the `index`th), checked as its own `PUT` would be.
pub(super) fn admit_one(
    index: usize,
    unit: Unit,
    role: &Role,
    asked: Permission,
    agent_ttl: std::time::Duration,
) -> Result<UnitChange, ApiError> {
    let name = unit.name;
    if name.is_empty() {
        return Err(ApiError::bad_request(format!("unit {index} of the batch has no name")));
    }
    let about = |error: ApiError| ApiError::new(error.status, format!("unit {name}: {}", error.message));
    validate_name(&name).map_err(|error| about(ApiError::bad_request(error.to_string())))?;
    may(role, &name, asked)?;
    let desired: DesiredState = match unit.desired_state.as_deref().filter(|state| !state.is_empty()) {
        Some(text) => text.parse().map_err(|error: InvalidState| about(ApiError::bad_request(error.to_string())))?,
        None => return Err(about(ApiError::bad_request("desiredState missing"))),
    };
    refuse_template_activation(&name, desired).map_err(about)?;
    let file = match unit.options.is_empty() {
        true => None,
        false => {
            let file = file_from_options(unit.options);
            validate_options(&name, &file, agent_ttl).map_err(about)?;
            Some(file)
        }
    };
    Ok(UnitChange { name, file, desired })
}

/// Whether `role` may do what `asked` says to unit `name`.
pub(super) fn may(role: &Role, name: &str, asked: Permission) -> Result<(), ApiError> {
    let (action, verb) = match asked {
        Permission::Write => (Action::WriteUnit(name), "write"),
        Permission::Plan => (Action::ReadUnit(name), "plan"),
    };
    match decide(role, action) {
        Access::Allowed => Ok(()),
        _ => Err(ApiError::new(StatusCode::FORBIDDEN, format!("{role} may not {verb} unit {name}"))),
    }
}
