//! `/agents/join` and `/agents/renew`: pull agents get certificates of their own (our
//! addition). A join presents a registration token (the router lets nothing else through),
//! a renewal the machine's current certificate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use fleet_core::machine::valid_machine_id;
use fleet_registry::{JoinRefused, MachineIdentity, RevokedMachine};

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::auth::identity::bearer_token;
use crate::auth::tokens::{REGISTRATION_PREFIX, digest, now_unix, well_formed};
use crate::error::{ApiError, json_response};
use crate::schema::{AgentCertificate, AgentJoinRequest, AgentRenewRequest};
use fleet_tls::agent_ca::{AgentCa, AgentCaError};
use fleet_tls::certificate::key_sha256_of_pem;

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

/// The key (its SHA-256) of a certificate just signed.
fn signed_key(certificate: &str) -> Result<String, ApiError> {
    key_sha256_of_pem(certificate)
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "cannot read a certificate just signed"))
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
    // Signing is pure: the certificate is handed out only if the join below takes.
    let (certificate, expires) = sign(ca, &request.machine_id, &request.csr)?;
    let key = signed_key(&certificate)?;
    // Who holds the ID, its revocation and whether a machine of it is alive are read and
    // checked in the join's own write.
    let joined = state.registry.join_machine(&digest(&token), now_unix(), &request.machine_id, &key).await?;
    let (record, identity) = joined.map_err(|refused| {
        let status = match refused {
            JoinRefused::Token(_) => StatusCode::UNAUTHORIZED,
            JoinRefused::Taken(_) | JoinRefused::Alive(_) | JoinRefused::Member(_) => StatusCode::CONFLICT,
            JoinRefused::NotNamed { .. } | JoinRefused::Revoked(_) | JoinRefused::RevokedKey(_) => {
                StatusCode::FORBIDDEN
            }
        };
        ApiError::new(status, refused.to_string())
    })?;
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
        metadata: identity.metadata,
    };
    fleet_metrics::metrics().pull.joins.inc();
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// The identity of `machine_id` that the certificate `identity` presents still holds (`None`
/// for a machine that joined before identities were kept); 403 when its key no longer holds
/// the ID (another key took it after the machine was revoked and forgotten).
pub(crate) async fn held_identity(
    state: &ApiState,
    machine_id: &str,
    identity: &Identity,
) -> Result<Option<MachineIdentity>, ApiError> {
    let bound = state.registry.machine_identity(machine_id).await?;
    if bound.as_ref().is_some_and(|bound| Some(&bound.key_sha256) != identity.key_sha256.as_ref()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("this certificate's key no longer holds machine {machine_id:?}"),
        ));
    }
    Ok(bound)
}

/// A machine renews its certificate, by the one it holds, perhaps over a new key: the ID
/// moves to the new key only when the one presented still holds it.
pub async fn renew(state: &ApiState, identity: &Identity, body: &[u8]) -> Result<Response, ApiError> {
    let Role::Machine { id: machine_id } = &identity.role else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine renews its certificate"));
    };
    let ca = agent_ca(state)?;
    let request: AgentRenewRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid renew request: {error}")))?;
    let bound = held_identity(state, machine_id, identity).await?;
    let (certificate, expires) = sign(ca, machine_id, &request.csr)?;
    if let Some(bound) = bound {
        let key_sha256 = signed_key(&certificate)?;
        if key_sha256 != bound.key_sha256 {
            state.registry.put_machine_identity(&MachineIdentity { key_sha256, ..bound }).await?;
        }
    }
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
/// unit states leave the cluster (the engine moves its units), and it cannot join again; the
/// key it held stays refused even once it is forgotten.
pub async fn revoke(state: &ApiState, machine_id: &str) -> Result<Response, ApiError> {
    if !valid_machine_id(machine_id) {
        return Err(ApiError::bad_request("invalid machine ID"));
    }
    let bound = state.registry.machine_identity(machine_id).await?;
    let present =
        || async { state.registry.machines().await.map(|machines| machines.iter().any(|m| m.id == machine_id)) };
    if bound.is_none() && !present().await? {
        return Err(ApiError::not_found(format!("machine {machine_id:?} is not known to the cluster")));
    }
    let key_sha256 = bound.map(|identity| identity.key_sha256).filter(|key| !key.is_empty());
    let revoked = RevokedMachine { id: machine_id.to_string(), at: now_unix(), key_sha256, forgotten: false };
    state.registry.revoke_machine(&revoked).await?;
    state.auth.forget_revoked().await;
    state.revocation_bell.ring();
    tracing::info!(machine = machine_id, "machine revoked");
    let kind = fleet_core::events::EventKind::MachineRevoked;
    let revoked = fleet_core::events::NewEvent::new(
        fleet_registry::micros_now(),
        kind,
        "revoked: its certificates and its presence stop working",
    );
    state.events.note(revoked.on_machine(machine_id));
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Frees a revoked machine's ID for another key (`fleetctl machine forget`).
pub async fn forget(state: &ApiState, machine_id: &str) -> Result<Response, ApiError> {
    if !valid_machine_id(machine_id) {
        return Err(ApiError::bad_request("invalid machine ID"));
    }
    if !state.registry.forget_machine(machine_id).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("machine {machine_id:?} is not revoked: revoke it first, so that its certificates stop working"),
        ));
    }
    state.auth.forget_revoked().await;
    tracing::info!(machine = machine_id, "machine forgotten: its ID may join again with another key");
    Ok(StatusCode::NO_CONTENT.into_response())
}
