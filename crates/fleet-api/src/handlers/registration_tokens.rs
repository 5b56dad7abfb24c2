//! `/registration-tokens` and `/registration-tokens/{name}`: the tokens pull agents join with
//! (our addition; administrators only, which the router checks before any of these run).

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_registry::RegistrationRecord;

use super::tokens::{MAX_TTL_SECONDS, valid_name};
use crate::api_state::ApiState;
use crate::auth::tokens::{REGISTRATION_PREFIX, digest, generate, now_unix};
use crate::error::{ApiError, json_response};
use crate::schema::{RegistrationToken, RegistrationTokenList, RegistrationTokenRequest};

/// The most metadata pairs a token may carry.
const MAX_METADATA: usize = 32;

fn to_schema(record: RegistrationRecord) -> RegistrationToken {
    RegistrationToken {
        name: record.name,
        created: record.created,
        expires: record.expires,
        max_uses: record.max_uses,
        uses: record.uses,
        metadata: record.metadata,
        machine_ids: record.machine_ids,
        token: None,
    }
}

/// Checks metadata as machines carry it: short keys of letters, digits, `-`, `_`, `.`, and
/// values without control characters.
pub(crate) fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA {
        return Err(ApiError::bad_request(format!("too much metadata: at most {MAX_METADATA} pairs")));
    }
    for (key, value) in metadata {
        let key_ok = (1..=64).contains(&key.len())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !key_ok {
            return Err(ApiError::bad_request(format!("invalid metadata key {key:?}")));
        }
        if value.len() > 255 || value.chars().any(|c| c.is_control() || c == ',' || c == '=') {
            return Err(ApiError::bad_request(format!("invalid metadata value for {key:?}")));
        }
    }
    Ok(())
}

pub async fn create(state: &ApiState, body: &[u8]) -> Result<Response, ApiError> {
    let request: RegistrationTokenRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid registration token request: {error}")))?;
    if !valid_name(&request.name) {
        return Err(ApiError::bad_request(
            "invalid token name: 1 to 64 characters among letters, digits, '-', '_', '.' and '@'",
        ));
    }
    check_metadata(&request.metadata)?;
    if let Some(pattern) = &request.machine_ids
        && (fleet_core::glob::Glob::new(pattern).is_none() || pattern.is_empty() || pattern.len() > 64)
    {
        return Err(ApiError::bad_request(format!(
            "invalid machineIDs {pattern:?}: a pattern of at most 64 characters"
        )));
    }
    if request.max_uses == Some(0) {
        return Err(ApiError::bad_request("invalid maxUses: at least 1"));
    }
    let created = now_unix();
    let expires = match request.ttl_seconds {
        None => None,
        Some(ttl) if (1..=MAX_TTL_SECONDS).contains(&ttl) => Some(created + ttl),
        Some(_) => return Err(ApiError::bad_request("invalid ttlSeconds: between 1 and ten years")),
    };
    let token = generate(REGISTRATION_PREFIX)
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no random source"))?;
    let record = RegistrationRecord {
        name: request.name,
        sha256: digest(&token),
        created,
        expires,
        max_uses: request.max_uses,
        uses: 0,
        metadata: request.metadata,
        machine_ids: request.machine_ids,
    };
    if !state.registry.create_registration(&record).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("a registration token named {:?} exists", record.name),
        ));
    }
    let shown = RegistrationToken { token: Some(token), ..to_schema(record) };
    Ok(json_response(StatusCode::CREATED, &shown))
}

pub async fn list(state: &ApiState) -> Result<Response, ApiError> {
    let registration_tokens = state.registry.registrations().await?.into_iter().map(to_schema).collect();
    Ok(json_response(StatusCode::OK, &RegistrationTokenList { registration_tokens }))
}

pub async fn revoke(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    if state.registry.revoke_registration(name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("registration token does not exist"))
    }
}
