//! `/tokens` and `/tokens/{name}`: bearer tokens (our addition; administrators only, which
//! the router checks before any of these run).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use fleet_registry::TokenRecord;

use crate::api_state::ApiState;
use crate::auth::tokens::{TOKEN_PREFIX, digest, generate, now_unix};
use crate::error::{ApiError, json_response};
use crate::schema::{Token, TokenList, TokenRequest};

/// The longest lifetime a token may be given: ten years.
pub(crate) const MAX_TTL_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// Token names: what `fleetctl token revoke` and the audit trail show.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

fn to_schema(record: TokenRecord) -> Token {
    Token {
        name: record.name,
        role: record.role,
        units: record.units,
        secrets: record.secrets,
        created: record.created,
        expires: record.expires,
        token: None,
    }
}

pub async fn create(state: &ApiState, body: &[u8]) -> Result<Response, ApiError> {
    let request: TokenRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid token request: {error}")))?;
    if !valid_name(&request.name) {
        return Err(ApiError::bad_request(
            "invalid token name: 1 to 64 characters among letters, digits, '-', '_', '.' and '@'",
        ));
    }
    let role = Role::parse(&request.role, request.units.as_deref())
        .and_then(|role| role.with_secrets(request.secrets.as_deref()))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let created = now_unix();
    let expires = match request.ttl_seconds {
        None => None,
        Some(ttl) if (1..=MAX_TTL_SECONDS).contains(&ttl) => Some(created + ttl),
        Some(_) => return Err(ApiError::bad_request("invalid ttlSeconds: between 1 and ten years")),
    };
    let token =
        generate(TOKEN_PREFIX).ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no random source"))?;
    let record = TokenRecord {
        name: request.name,
        role: role.name().to_string(),
        units: role.scope().map(str::to_string),
        secrets: role.secret_scope().map(str::to_string),
        sha256: digest(&token),
        created,
        expires,
    };
    if !state.registry.create_token(&record).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("a token named {:?} exists", record.name)));
    }
    state.auth.tokens().forget().await;
    let shown = Token { token: Some(token), ..to_schema(record) };
    Ok(json_response(StatusCode::CREATED, &shown))
}

pub async fn list(state: &ApiState) -> Result<Response, ApiError> {
    let tokens = state.registry.tokens().await?.into_iter().map(to_schema).collect();
    Ok(json_response(StatusCode::OK, &TokenList { tokens }))
}

pub async fn revoke(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    if state.registry.revoke_token(name).await? {
        state.auth.tokens().forget().await;
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("token does not exist"))
    }
}
