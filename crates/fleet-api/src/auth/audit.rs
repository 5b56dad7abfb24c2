//! The audit trail: one structured line (target `fleet::audit`) for every write and every
//! refused request, naming who asked, with which role, what, and how it ended. It never
//! holds a credential: identities are names (`token:ci`), never tokens.

use axum::http::{Method, StatusCode};
use fleet_core::events::{EventKind, NewEvent};

use crate::routes::Need;

/// One audited request.
pub struct AuditEntry<'a> {
    /// The identity's name, or `-` when none could be established.
    pub identity: &'a str,
    /// The role, or `-`.
    pub role: &'a str,
    pub method: &'a Method,
    pub path: &'a str,
    pub unit: Option<&'a str>,
    /// The units a request about several wrote (`unit_batch::WrittenUnits`).
    pub units: &'a [String],
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

/// The event a write leaves in the cluster's stream: every write but a machine's own (its
/// presence, its reports, its renewals: a cluster's worth of them every few seconds, which
/// the stream says as state changes and machines joining and lost).
pub(crate) fn event_of(entry: &AuditEntry<'_>, need: Need) -> Option<NewEvent> {
    let machines_own = matches!(need, Need::MachineFacet | Need::RenewMachine);
    if matches!(*entry.method, Method::GET | Method::HEAD | Method::OPTIONS) || machines_own {
        return None;
    }
    let status = entry.status;
    let message =
        format!("{} {}: {} {}", entry.method, entry.path, status.as_u16(), status.canonical_reason().unwrap_or(""));
    let mut event =
        NewEvent::new(fleet_registry::micros_now(), EventKind::Write, message.trim_end()).by(entry.identity);
    if let Some(unit) = entry.unit {
        event = event.of_unit(unit);
    } else if !entry.units.is_empty() {
        event = event.of_units(entry.units.iter().map(String::as_str));
    }
    Some(event)
}
