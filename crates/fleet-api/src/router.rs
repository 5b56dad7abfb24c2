//! One dispatcher for the whole API. Every request goes the same way, and nothing happens
//! before the step that allows it:
//!
//! 1. the Host check of loopback listeners;
//! 2. the route table ([`crate::routes`]): a path or method it does not list is 404 or 405;
//! 3. the write guard ([`crate::write_guard`]): a write a browser could send for another site
//!    is refused;
//! 4. the identity, verified as the route needs it (a registration token for a join, the
//!    body's signature for a webhook, else the connection and `Authorization`);
//! 5. [`fleet_core::access::decide`]: the action the route needs, for that identity's role;
//! 6. only then the body is read (but a webhook's, which its signature covers), a pull
//!    agent is noted present, and the handler runs.
//!
//! Every error is the original's JSON error body. No input reaches a panic: handlers return
//! [`ApiError`].

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_core::access::{Access, Action, Role, decide};

use crate::api_state::ApiState;
use crate::auth::audit::{self, AuditEntry};
use crate::auth::{Identity, Peer, Refused};
use crate::call::Call;
use crate::error::ApiError;
use crate::host_check::HostCheck;
use crate::query::query_pairs;
use crate::routes::{Found, Need, Route};
use crate::upgrade::Upgrade;

/// The largest request body accepted.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// The largest body of a route that takes a [`crate::routes::Body::Bulk`] (read only once the
/// caller is authorized for it).
pub const BULK_BODY_LIMIT: usize = 32 * 1024 * 1024;
/// How long a client may take to send a request's body.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer to a read of a unit the identity may not see: what it would get if the unit
/// did not exist.
fn hidden(route: &Route) -> ApiError {
    if route.pattern.starts_with("/fleet/v1/state/") {
        ApiError::not_found("unit state does not exist")
    } else {
        ApiError::not_found("unit does not exist")
    }
}

/// A method as a metrics label: the standard ones by name, any other as `OTHER`, so that
/// clients cannot make new series.
fn method_label(method: &Method) -> String {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    if KNOWN.contains(method) { method.as_str().to_string() } else { "OTHER".to_string() }
}

/// What became of a request, for the audit line and the metrics.
struct Outcome<'a> {
    response: Response,
    route: Option<&'static Route>,
    identity: Option<Result<Identity, Refused>>,
    action: Option<Action<'a>>,
}

async fn dispatch(State(state): State<ApiState>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let (mut parts, body) = request.into_parts();
    let upgrade = Upgrade::take_from(&mut parts.extensions);
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let check = parts.extensions.get::<HostCheck>().copied().unwrap_or(HostCheck::Any);
    let host = parts.headers.get(header::HOST).map(|value| value.to_str().unwrap_or("\u{fffd}"));
    if !check.allows(host) {
        return ApiError::new(StatusCode::FORBIDDEN, "Host header names no loopback address; refusing the request")
            .into_response();
    }
    let (route, params) = match crate::routes::find(&path, &method) {
        Found::Route(route, params) => (route, params),
        Found::WrongMethod(message) => {
            let response = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message).into_response();
            let unrouted = Outcome { response, route: None, identity: None, action: None };
            return finish(unrouted, &method, &path, started, &state.events);
        }
        Found::Nothing => {
            let response = ApiError::not_found("").into_response();
            let unrouted = Outcome { response, route: None, identity: None, action: None };
            return finish(unrouted, &method, &path, started, &state.events);
        }
    };
    let query = query_pairs(parts.uri.query());
    let peer = parts.extensions.get::<Peer>();
    let asked = Asked { route, params: &params, method: &method, query: &query, headers: &parts.headers, peer };
    let outcome = serve(&state, asked, body, &upgrade).await;
    finish(outcome, &method, &path, started, &state.events)
}

/// A request the route table knows, with what came with it.
pub(crate) struct Asked<'a> {
    pub route: &'static Route,
    pub params: &'a [String],
    pub method: &'a Method,
    pub query: &'a [(String, String)],
    pub headers: &'a HeaderMap,
    pub peer: Option<&'a Peer>,
}

/// A request let through to its handler.
pub(crate) struct Admitted {
    pub identity: Identity,
    pub body: Bytes,
}

/// Why a request was not let through: its answer, and the identity if one was established.
pub(crate) struct Turned {
    pub response: Response,
    pub identity: Option<Result<Identity, Refused>>,
}

/// Serves a request the route table knows: [`admit`], then its handler.
async fn serve<'a>(state: &ApiState, asked: Asked<'a>, body: Body, upgrade: &Upgrade) -> Outcome<'a> {
    let action = asked.route.need.action(asked.params);
    let (route, params, query, headers) = (asked.route, asked.params, asked.query, asked.headers);
    match admit(state, asked, body).await {
        Err(Turned { response, identity }) => Outcome { response, route: Some(route), identity, action: Some(action) },
        Ok(Admitted { identity, body }) => {
            let call = Call { identity: &identity, params, query, headers, body: &body, upgrade };
            let response = (route.handler)(state, call).await.unwrap_or_else(IntoResponse::into_response);
            Outcome { response, route: Some(route), identity: Some(Ok(identity)), action: Some(action) }
        }
    }
}

/// Steps 3 to 6 short of the handler: the write guard, the identity, the decision, the
/// presence of a pull agent and the body.
pub(crate) async fn admit(state: &ApiState, asked: Asked<'_>, body: Body) -> Result<Admitted, Turned> {
    let Asked { route, params, method, headers, peer, .. } = asked;
    let turned = |response: Response, identity: Option<Result<Identity, Refused>>| Turned { response, identity };
    if let Err(error) = crate::write_guard::check(method, route.body, headers) {
        return Err(turned(error.into_response(), None));
    }
    // A webhook's signature covers its body, so that body is read first (bounded as every body).
    let (mut body, mut read) = (Some(body), None);
    let identity = match route.need {
        Need::SourceWebhook => {
            let bytes =
                read_body(body.take(), route.body).await.map_err(|error| turned(error.into_response(), None))?;
            let source = params.first().map_or("", String::as_str);
            let secrets = state.source_secrets_dir.as_deref();
            let registry = state.registry.as_ref();
            let sources = &state.auth.webhook_sources;
            let verified = crate::auth::webhook::verify(registry, sources, secrets, source, headers, &bytes).await;
            read = Some(bytes);
            verified
        }
        Need::Join => state.auth.joining(headers).await,
        _ => state.auth.authenticate(peer, headers, method).await,
    };
    let identity = match identity {
        Ok(identity) => identity,
        Err(refusal) => return Err(turned(refusal_response(&refusal, route), Some(Err(refusal)))),
    };
    match decide(&identity.role, route.need.action(params)) {
        Access::Allowed => {}
        Access::Hidden => return Err(turned(hidden(route).into_response(), Some(Ok(identity)))),
        Access::Denied => {
            let message = format!("{} may not {} {}", identity.role, method.as_str(), route.pattern);
            return Err(turned(ApiError::new(StatusCode::FORBIDDEN, message).into_response(), Some(Ok(identity))));
        }
    }
    // Any request of a machine's own keeps it present, but its leaving.
    if let Role::Machine { id } = &identity.role
        && route.need == Need::MachineFacet
        && *method != Method::DELETE
        && let Err(full) = state.agent_presence.heard(id)
    {
        let response = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, full.to_string()).into_response();
        return Err(turned(response, Some(Ok(identity))));
    }
    let body = match read {
        Some(bytes) => bytes,
        None => match read_body(body.take(), route.body).await {
            Ok(bytes) => bytes,
            Err(error) => return Err(turned(error.into_response(), Some(Ok(identity)))),
        },
    };
    Ok(Admitted { identity, body })
}

fn refusal_response(refusal: &Refused, route: &Route) -> Response {
    match refusal {
        Refused::Unauthenticated(message) => {
            let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message.as_str()).into_response();
            // A browser asks its user for the web view's credential (a token, as the password).
            let challenge = if route.pattern.starts_with("/ui") || route.pattern == "/" {
                HeaderValue::from_static("Basic realm=\"fleet\", charset=\"UTF-8\"")
            } else {
                HeaderValue::from_static("Bearer")
            };
            response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
            response
        }
        Refused::Forbidden { message, .. } => ApiError::new(StatusCode::FORBIDDEN, message.as_str()).into_response(),
    }
}

/// A request's body, bounded in size and in the time it may take to arrive.
async fn read_body(body: Option<Body>, kind: crate::routes::Body) -> Result<Bytes, ApiError> {
    let body = body.unwrap_or_else(Body::empty);
    let limit = match kind {
        crate::routes::Body::Bulk => BULK_BODY_LIMIT,
        _ => BODY_LIMIT,
    };
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error))
            if std::error::Error::source(&error)
                .is_some_and(|cause| cause.is::<http_body_util::LengthLimitError>()) =>
        {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds {limit} bytes")))
        }
        // The client went away (or its stream was reset) before its body was whole.
        Ok(Err(_)) => Err(ApiError::bad_request("request body could not be read")),
        Err(_) => Err(ApiError::new(StatusCode::REQUEST_TIMEOUT, "request body not received in time")),
    }
}

/// The audit line (and, for a write, its event), the `Server` header and the metrics of every
/// answer. A request whose identity was not established is audited by its route's pattern,
/// never by the path it chose (which could name anything).
fn finish(
    outcome: Outcome<'_>,
    method: &Method,
    path: &str,
    started: std::time::Instant,
    events: &fleet_registry::EventSink,
) -> Response {
    let Outcome { mut response, route, identity, action } = outcome;
    let status = response.status();
    if let Some(route) = route
        && audit::audited(method, status)
    {
        let (name, role, path) = match &identity {
            Some(Ok(identity)) => (identity.name.clone(), identity.role.to_string(), path),
            Some(Err(Refused::Forbidden { name, .. })) => (name.clone(), "-".to_string(), route.pattern),
            Some(Err(Refused::Unauthenticated(_))) | None => ("-".to_string(), "-".to_string(), route.pattern),
        };
        let established = matches!(identity, Some(Ok(_)));
        let unit = action.filter(|_| established).and_then(|action| action.unit().map(str::to_string));
        let units = response
            .extensions_mut()
            .remove::<crate::handlers::unit_batch::WrittenUnits>()
            .filter(|_| established)
            .unwrap_or_default();
        let entry =
            AuditEntry { identity: &name, role: &role, method, path, unit: unit.as_deref(), units: &units.0, status };
        audit::record(&entry);
        if let Some(event) = audit::event_of(&entry, route.need) {
            events.note(event);
        }
    }
    let server = HeaderValue::from_static(concat!("fleetd/", env!("CARGO_PKG_VERSION")));
    response.headers_mut().insert(header::SERVER, server);
    let metrics = &fleet_metrics::metrics().api;
    let (endpoint, method) = (route.map_or("unknown", |route| route.pattern), method_label(method));
    metrics
        .request_duration
        .get_or_create(&fleet_metrics::RouteLabels { endpoint, method: method.clone() })
        .observe(started.elapsed().as_secs_f64());
    metrics.requests.get_or_create(&fleet_metrics::ResponseLabels { endpoint, method, code: status.as_u16() }).inc();
    response
}

/// The API as one axum service.
pub fn router(state: ApiState) -> Router {
    Router::new().fallback(dispatch).with_state(state)
}

#[cfg(test)]
mod tests;
