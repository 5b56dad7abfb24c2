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
use crate::schema::{UnitBatch, UnitBatchResult, UnitBatchResults};

/// The most units one request may carry (fleetctl sends at most this many at once).
pub const MOST_UNITS_PER_BATCH: usize = 1000;

pub async fn post(state: &ApiState, role: &Role, body: &[u8], writer: &Writer) -> Result<Response, ApiError> {
    let batch: UnitBatch = json_object(body)?;
    let changes = admitted(batch, role)?;
    let files = changes.iter().filter_map(|change| Some((change.name.as_str(), change.file.as_ref()?)));
    super::secrets::check_named(state, role, files).await?;
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
    Ok(json_response(StatusCode::OK, &UnitBatchResults { units }))
}

/// The batch's changes, each checked as its own `PUT` would be and by the one authorization
/// check; the first unit refused refuses the whole batch.
fn admitted(batch: UnitBatch, role: &Role) -> Result<Vec<UnitChange>, ApiError> {
    if batch.units.is_empty() {
        return Err(ApiError::bad_request("no units given"));
    }
    if batch.units.len() > MOST_UNITS_PER_BATCH {
        return Err(ApiError::bad_request(format!(
            "{} units given; at most {MOST_UNITS_PER_BATCH} per request",
            batch.units.len()
        )));
    }
    let mut names = HashSet::new();
    let mut changes = Vec::with_capacity(batch.units.len());
    for (index, unit) in batch.units.into_iter().enumerate() {
        let name = unit.name;
        if name.is_empty() {
            return Err(ApiError::bad_request(format!("unit {index} of the batch has no name")));
        }
        let about = |error: ApiError| ApiError::new(error.status, format!("unit {name}: {}", error.message));
        validate_name(&name).map_err(|error| about(ApiError::bad_request(error.to_string())))?;
        if decide(role, Action::WriteUnit(&name)) != Access::Allowed {
            return Err(ApiError::new(StatusCode::FORBIDDEN, format!("{role} may not write unit {name}")));
        }
        let desired: DesiredState = match unit.desired_state.as_deref().filter(|state| !state.is_empty()) {
            Some(text) => {
                text.parse().map_err(|error: InvalidState| about(ApiError::bad_request(error.to_string())))?
            }
            None => return Err(about(ApiError::bad_request("desiredState missing"))),
        };
        refuse_template_activation(&name, desired).map_err(about)?;
        let file = match unit.options.is_empty() {
            true => None,
            false => {
                let file = file_from_options(unit.options);
                validate_options(&name, &file).map_err(about)?;
                Some(file)
            }
        };
        if !names.insert(name.clone()) {
            return Err(ApiError::bad_request(format!("unit {name} is given twice")));
        }
        changes.push(UnitChange { name, file, desired });
    }
    Ok(changes)
}
