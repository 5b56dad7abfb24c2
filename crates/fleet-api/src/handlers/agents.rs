//! `/agents/join` and `/agents/renew`: pull agents get certificates of their own (our
//! addition). A join presents a registration token (the router lets nothing else through),
//! a renewal the machine's current certificate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use fleet_core::machine::valid_machine_id;
use fleet_registry::RevokedMachine;

use crate::auth::agent_ca::{AgentCa, AgentCaError};
use crate::auth::identity::bearer_token;
use crate::auth::tokens::{REGISTRATION_PREFIX, digest, now_unix, well_formed};
use crate::router::{ApiError, ApiState, json_response};
use crate::schema::{AgentCertificate, AgentJoinRequest, AgentRenewRequest};

fn agent_ca(state: &ApiState) -> Result<&AgentCa, ApiError> {
    state.agent_ca.as_deref().ok_or_else(|| ApiError::not_found("this fleetd signs no machine certificates"))
}

fn sign(ca: &AgentCa, machine_id: &str, csr: &str) -> Result<(String, u64), ApiError> {
    let (certificate, expires) = ca.sign(machine_id, csr, SystemTime::now()).map_err(|error| match error {
        AgentCaError::BadRequest(_) => ApiError::bad_request(error.to_string()),
        other => {
            tracing::error!(error = %other, "signing a machine certificate");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "cannot sign machine certificates")
        }
    })?;
    let expires = expires.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    Ok((certificate, expires))
}

/// The registration token a join presents (the router verified it before the join runs).
fn registration_token(headers: &HeaderMap) -> Option<String> {
    let credential = bearer_token(headers.get(header::AUTHORIZATION)?.as_bytes()).ok()?;
    Some(credential.token.into_owned()).filter(|token| well_formed(token, REGISTRATION_PREFIX))
}

pub async fn join(state: &ApiState, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let ca = agent_ca(state)?;
    let request: AgentJoinRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid join request: {error}")))?;
    if !valid_machine_id(&request.machine_id) {
        return Err(ApiError::bad_request("invalid machineID: 1 to 64 letters, digits, '-', '_' and '.'"));
    }
    let unauthorized = |message: String| ApiError::new(StatusCode::UNAUTHORIZED, message);
    let token = registration_token(headers).ok_or_else(|| unauthorized("malformed registration token".into()))?;
    // Everything that can be refused without using the token is checked first.
    let revoked = state.auth.machine_revoked(&request.machine_id).await;
    if revoked.map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "credentials cannot be checked"))? {
        return Err(ApiError::new(StatusCode::FORBIDDEN, format!("machine {:?} is revoked", request.machine_id)));
    }
    if state.registry.machines().await?.iter().any(|machine| machine.id == request.machine_id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("machine {:?} is alive in the cluster", request.machine_id),
        ));
    }
    let (certificate, expires) = sign(ca, &request.machine_id, &request.csr)?;
    let record = state.registry.redeem_registration(&digest(&token), now_unix()).await?;
    let record = record.map_err(|refused| unauthorized(refused.to_string()))?;
    tracing::info!(
        machine = request.machine_id,
        registration = record.name,
        "machine joined with a registration token"
    );
    let answer = AgentCertificate {
        machine_id: request.machine_id,
        certificate,
        ca_certificate: ca.cert_pem().to_string(),
        expires,
        metadata: record.metadata,
    };
    fleet_metrics::metrics().pull.joins.inc();
    Ok(json_response(StatusCode::CREATED, &answer))
}

pub async fn renew(state: &ApiState, role: &Role, body: &[u8]) -> Result<Response, ApiError> {
    let Role::Machine { id: machine_id } = role else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine renews its certificate"));
    };
    let ca = agent_ca(state)?;
    let request: AgentRenewRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid renew request: {error}")))?;
    let (certificate, expires) = sign(ca, machine_id, &request.csr)?;
    let answer = AgentCertificate {
        machine_id: machine_id.to_string(),
        certificate,
        ca_certificate: ca.cert_pem().to_string(),
        expires,
        metadata: Default::default(),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// Revokes a machine: its certificate is refused by every fleetd within a second, it and its
/// unit states leave the cluster (the engine moves its units), and it cannot join again.
pub async fn revoke(state: &ApiState, machine_id: &str) -> Result<Response, ApiError> {
    if !valid_machine_id(machine_id) {
        return Err(ApiError::bad_request("invalid machine ID"));
    }
    state.registry.revoke_machine(&RevokedMachine { id: machine_id.to_string(), at: now_unix() }).await?;
    state.auth.forget_revoked().await;
    tracing::info!(machine = machine_id, "machine revoked");
    Ok(StatusCode::NO_CONTENT.into_response())
}
