//! `/units/{name}/history` (our addition): a unit's versions, oldest first, the current one
//! last; `/units/{name}/history/{version}` one of them with its unit file, which is what
//! `fleetctl revert` writes back.

use axum::http::StatusCode;
use axum::response::Response;

use fleet_core::civil_time::CivilTime;
use fleet_core::unit_history::{Shown, shown};
use fleet_registry::UnitView;

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{UnitHistory, UnitOption, UnitVersion};

pub async fn list(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let view = existing(state, name).await?;
    let versions = shown(view.hash, view.desired, &view.versions).into_iter().map(to_schema).collect();
    Ok(json_response(StatusCode::OK, &UnitHistory { name: name.to_string(), versions }))
}

pub async fn get(state: &ApiState, name: &str, version: &str) -> Result<Response, ApiError> {
    let asked = parse_version(version)?;
    let view = existing(state, name).await?;
    let versions = shown(view.hash, view.desired, &view.versions);
    let (oldest, newest) = (versions.first().map_or(1, |v| v.version), view.versions.number());
    let Some(found) = versions.into_iter().find(|shown| shown.version == asked) else {
        let message = format!("unit {name} keeps no version {asked}: it keeps versions {oldest} to {newest}");
        return Err(ApiError::not_found(message));
    };
    let file = if found.current {
        view.file
    } else {
        state.registry.kept_body(&found.hash).await?.ok_or_else(|| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the unit file of version {asked} is missing"))
        })?
    };
    let options = file
        .into_options()
        .into_iter()
        .map(|o| UnitOption { name: o.name, section: o.section, value: o.value })
        .collect();
    Ok(json_response(StatusCode::OK, &UnitVersion { options, ..to_schema(found) }))
}

async fn existing(state: &ApiState, name: &str) -> Result<UnitView, ApiError> {
    state.registry.unit(name).await?.ok_or_else(|| ApiError::not_found("unit does not exist"))
}

/// A version as the path names it: a whole number from 1.
fn parse_version(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .ok()
        .filter(|version| *version > 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid version {text:?}: expected a whole number from 1")))
}

fn to_schema(version: Shown) -> UnitVersion {
    UnitVersion {
        version: version.version,
        hash: version.hash.to_string(),
        desired_state: version.desired.to_string(),
        changed_at: version.at.map(|at| CivilTime::from_unix(u64::try_from(at).unwrap_or(0)).rfc3339()),
        changed_by: version.by,
        current: version.current,
        options: Vec::new(),
    }
}
