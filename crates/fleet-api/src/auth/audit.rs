//! The audit trail: one structured line (target `fleet::audit`) for every write and every
//! refused request, naming who asked, with which role, what, and how it ended. It never
//! holds a credential: identities are names (`token:ci`), never tokens.

use axum::http::{Method, StatusCode};

/// One audited request.
pub struct AuditEntry<'a> {
    /// The identity's name, or `-` when none could be established.
    pub identity: &'a str,
    /// The role, or `-`.
    pub role: &'a str,
    pub method: &'a Method,
    pub path: &'a str,
    pub unit: Option<&'a str>,
    pub status: StatusCode,
}

/// Whether a request is audited: every write, and every refusal.
pub fn audited(method: &Method, status: StatusCode) -> bool {
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    writes || status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

pub fn record(entry: &AuditEntry<'_>) {
    let outcome = match entry.status.as_u16() {
        401 => "unauthenticated",
        403 => "forbidden",
        code if code < 400 => "allowed",
        _ => "failed",
    };
    tracing::info!(
        target: "fleet::audit",
        identity = entry.identity,
        role = entry.role,
        method = %entry.method,
        path = entry.path,
        unit = entry.unit.unwrap_or("-"),
        status = entry.status.as_u16(),
        outcome,
        "audit"
    );
}
