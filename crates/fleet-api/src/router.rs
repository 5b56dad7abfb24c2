//! One dispatcher for the whole API: it maps each path and method to its handler, answers
//! everything else with the original's status codes, and turns every error into the JSON
//! error body. No input reaches a panic: handlers return [`ApiError`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_registry::{ApiRegistry, RegistryError};
use fleet_unit_manager::UnitManager;

use fleet_core::access::{Access, Action, decide};

use crate::auth::audit::{self, AuditEntry};
use crate::auth::{Auth, Identity, Peer, Refused};
use crate::handlers::{
    self, agent_facet, agents, journal, machines, metrics, registration_tokens, rollouts, sources, state, tokens,
    unit_batch, units, web,
};
use crate::host_check::HostCheck;
use crate::schema::{ErrorBody, ErrorDetail};

/// The largest request body accepted.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// How long a client may take to send a request's body.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The machine answering, for what only it can tell (its units' logs).
#[derive(Clone)]
pub struct LocalMachine {
    pub machine_id: String,
    pub manager: Arc<dyn UnitManager>,
}

#[derive(Clone)]
pub struct ApiState {
    pub registry: Arc<dyn ApiRegistry>,
    /// Page size (`token_limit`).
    pub token_limit: TokenLimit,
    pub local: Option<LocalMachine>,
    /// Who is asking: tokens, and the anonymous opt-in.
    pub auth: Auth,
    /// The agent CA, on a fleetd that signs machine certificates for joining pull agents.
    pub agent_ca: Option<Arc<crate::auth::agent_ca::AgentCa>>,
    /// The agent's side of the store, on a fleetd that serves pull agents (a manager).
    pub agents: Option<Arc<dyn fleet_registry::AgentRegistry>>,
    /// When each pull agent was last heard from.
    pub agent_presence: Arc<crate::agent_presence::AgentPresence>,
    /// Journals asked of pull agents through this manager.
    pub journal_relay: Arc<crate::journal_relay::JournalRelay>,
    /// The web view's live feed.
    pub live_view: Arc<crate::live_view::LiveView>,
    /// Where the lists being followed page by page stopped.
    pub page_cursors: Arc<crate::pagination::PageCursors>,
    /// Where git sources' secrets are read (their push webhooks' shared secrets); `None`:
    /// no webhook is accepted.
    pub source_secrets_dir: Option<std::path::PathBuf>,
}

/// The page size (`token_limit`), shared with fleetd so that a reload changes it while the
/// API keeps serving.
#[derive(Clone, Debug)]
pub struct TokenLimit(Arc<AtomicU16>);

impl TokenLimit {
    pub fn new(limit: u16) -> Self {
        Self(Arc::new(AtomicU16::new(limit)))
    }

    pub fn get(&self) -> u16 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, limit: u16) {
        self.0.store(limit, Ordering::Relaxed);
    }
}

/// An error answer: a status and the message of the JSON error body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    fn method_not_allowed(message: &str) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, message)
    }
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        tracing::warn!(%error, "registry error while serving the API");
        match error {
            RegistryError::Unavailable(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "fleet server unable to communicate with etcd")
            }
            RegistryError::Corrupt { .. } => Self::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
            RegistryError::LeadershipLost | RegistryError::MachineInUse { .. } => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "")
            }
            RegistryError::NotAnnounced { .. } | RegistryError::Owned { .. } | RegistryError::SourceRemoved { .. } => {
                Self::new(StatusCode::CONFLICT, error.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.status.as_u16(), message: self.message } };
        json_response(self.status, &body)
    }
}

pub fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The query string's parameters, percent-decoded, in order (a name may repeat).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |text: &str| percent_decode(&text.replace('+', " ")).unwrap_or_else(|| text.to_string());
            (decode(name), decode(value))
        })
        .collect()
}

pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Which part of a machine's own side of the store a pull agent asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AgentPart {
    Machine,
    Work,
    Changes,
    Body(String),
    /// `/bodies?hash=…`: several bodies in one request.
    Bodies,
    States,
    JournalAnswer(u64),
}

/// What a request asks for once the API prefix is off.
enum Resource {
    Root,
    ApiRoot,
    Discovery,
    Units,
    Unit(String),
    States,
    State(String),
    Machines,
    Journal(String),
    Tokens,
    Token(String),
    RegistrationTokens,
    RegistrationToken(String),
    Sources,
    Source(String),
    SourceSync(String),
    SourceWebhook(String),
    Rollouts,
    Rollout(String),
    /// `/rollouts/{name}/{pause|resume|undo}`.
    RolloutAction(String, String),
    AgentJoin,
    AgentRenew,
    AgentRevoke(String),
    /// `/agents/{machine}/machine`, `/work`, `/bodies/{hash}`, `/bodies`, `/states`.
    AgentFacet(String, AgentPart),
    /// `/metrics`, outside the API prefix as in the original.
    Metrics,
    /// `/ui`: the web view's address without its slash.
    WebRoot,
    /// A file of the web view (`/ui/`, `/ui/app.js`).
    WebAsset(&'static str),
    /// `/ui/events`: the web view's live feed.
    WebEvents,
    Unknown,
}

impl Resource {
    /// The route's pattern, the `endpoint` label of the API's metrics.
    fn endpoint(&self) -> &'static str {
        match self {
            Resource::Root => "/",
            Resource::ApiRoot => "/fleet/v1",
            Resource::Discovery => "/fleet/v1/discovery",
            Resource::Units => "/fleet/v1/units",
            Resource::Unit(_) => "/fleet/v1/units/{unit}",
            Resource::States => "/fleet/v1/state",
            Resource::State(_) => "/fleet/v1/state/{unit}",
            Resource::Machines => "/fleet/v1/machines",
            Resource::Journal(_) => "/fleet/v1/journal/{unit}",
            Resource::Tokens => "/fleet/v1/tokens",
            Resource::Token(_) => "/fleet/v1/tokens/{name}",
            Resource::RegistrationTokens => "/fleet/v1/registration-tokens",
            Resource::RegistrationToken(_) => "/fleet/v1/registration-tokens/{name}",
            Resource::Sources => "/fleet/v1/sources",
            Resource::Source(_) => "/fleet/v1/sources/{name}",
            Resource::SourceSync(_) => "/fleet/v1/sources/{name}/sync",
            Resource::SourceWebhook(_) => "/fleet/v1/sources/{name}/webhook",
            Resource::Rollouts => "/fleet/v1/rollouts",
            Resource::Rollout(_) => "/fleet/v1/rollouts/{name}",
            Resource::RolloutAction(..) => "/fleet/v1/rollouts/{name}/{action}",
            Resource::AgentJoin => "/fleet/v1/agents/join",
            Resource::AgentRenew => "/fleet/v1/agents/renew",
            Resource::AgentRevoke(_) => "/fleet/v1/agents/{machine}/revoke",
            Resource::AgentFacet(_, part) => match part {
                AgentPart::Machine => "/fleet/v1/agents/{machine}/machine",
                AgentPart::Work => "/fleet/v1/agents/{machine}/work",
                AgentPart::Changes => "/fleet/v1/agents/{machine}/changes",
                AgentPart::Body(_) => "/fleet/v1/agents/{machine}/bodies/{hash}",
                AgentPart::Bodies => "/fleet/v1/agents/{machine}/bodies",
                AgentPart::States => "/fleet/v1/agents/{machine}/states",
                AgentPart::JournalAnswer(_) => "/fleet/v1/agents/{machine}/journal/{id}",
            },
            Resource::Metrics => "/metrics",
            Resource::WebRoot => "/ui",
            Resource::WebAsset(_) => "/ui/{asset}",
            Resource::WebEvents => "/ui/events",
            Resource::Unknown => "unknown",
        }
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

fn resource(path: &str) -> Resource {
    if path == "/" {
        return Resource::Root;
    }
    if path == "/metrics" {
        return Resource::Metrics;
    }
    if let Some(rest) = path.strip_prefix("/ui") {
        return match rest {
            "" => Resource::WebRoot,
            "/events" => Resource::WebEvents,
            _ => rest
                .strip_prefix('/')
                .and_then(|name| handlers::web::ASSETS.iter().find(|(asset, _, _)| *asset == name))
                .map_or(Resource::Unknown, |(asset, _, _)| Resource::WebAsset(asset)),
        };
    }
    let Some(rest) = path.strip_prefix("/fleet/v1").or_else(|| path.strip_prefix("/v1-alpha")) else {
        return Resource::Unknown;
    };
    if rest.is_empty() {
        return Resource::ApiRoot;
    }
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let name = |segment: &str| match percent_decode(segment) {
        Some(name) if !name.is_empty() => Some(name),
        _ => None,
    };
    match segments.as_slice() {
        ["discovery"] => Resource::Discovery,
        ["units"] => Resource::Units,
        ["units", unit] => name(unit).map_or(Resource::Unknown, Resource::Unit),
        ["state"] => Resource::States,
        ["state", unit] => name(unit).map_or(Resource::Unknown, Resource::State),
        ["machines"] => Resource::Machines,
        ["journal", unit] => name(unit).map_or(Resource::Unknown, Resource::Journal),
        ["tokens"] => Resource::Tokens,
        ["tokens", token] => name(token).map_or(Resource::Unknown, Resource::Token),
        ["registration-tokens"] => Resource::RegistrationTokens,
        ["sources"] => Resource::Sources,
        ["sources", source] => name(source).map_or(Resource::Unknown, Resource::Source),
        ["sources", source, "sync"] => name(source).map_or(Resource::Unknown, Resource::SourceSync),
        ["sources", source, "webhook"] => name(source).map_or(Resource::Unknown, Resource::SourceWebhook),
        ["rollouts"] => Resource::Rollouts,
        ["rollouts", rollout] => name(rollout).map_or(Resource::Unknown, Resource::Rollout),
        ["rollouts", rollout, action @ ("pause" | "resume" | "undo")] => {
            name(rollout).map_or(Resource::Unknown, |rollout| Resource::RolloutAction(rollout, action.to_string()))
        }
        ["agents", "join"] => Resource::AgentJoin,
        ["agents", "renew"] => Resource::AgentRenew,
        ["agents", machine, "revoke"] => name(machine).map_or(Resource::Unknown, Resource::AgentRevoke),
        ["agents", machine, part] => {
            let part = match *part {
                "machine" => AgentPart::Machine,
                "work" => AgentPart::Work,
                "changes" => AgentPart::Changes,
                "bodies" => AgentPart::Bodies,
                "states" => AgentPart::States,
                _ => return Resource::Unknown,
            };
            name(machine).map_or(Resource::Unknown, |machine| Resource::AgentFacet(machine, part))
        }
        ["agents", machine, "journal", id] => match (name(machine), id.parse::<u64>()) {
            (Some(machine), Ok(id)) => Resource::AgentFacet(machine, AgentPart::JournalAnswer(id)),
            _ => Resource::Unknown,
        },
        ["agents", machine, "bodies", hash] => match (name(machine), name(hash)) {
            (Some(machine), Some(hash)) => Resource::AgentFacet(machine, AgentPart::Body(hash)),
            _ => Resource::Unknown,
        },
        ["registration-tokens", token] => name(token).map_or(Resource::Unknown, Resource::RegistrationToken),
        _ => Resource::Unknown,
    }
}

const DISCOVERY: &str = include_str!("discovery.json");

/// What `method` on `resource` does, for authorization; `None` for requests that do
/// nothing but get an error (unknown paths, methods a resource does not take).
fn action<'a>(resource: &'a Resource, method: &Method) -> Option<Action<'a>> {
    Some(match (resource, method) {
        (Resource::Discovery | Resource::Units | Resource::States | Resource::Machines, &Method::GET) => Action::List,
        (Resource::Unit(name) | Resource::State(name) | Resource::Journal(name), &Method::GET) => {
            Action::ReadUnit(name)
        }
        (Resource::Unit(name), &Method::PUT | &Method::DELETE) => Action::WriteUnit(name),
        (Resource::Units, &Method::POST) => Action::WriteUnits,
        (Resource::Machines, &Method::PATCH) => Action::WriteMachines,
        (Resource::Tokens | Resource::RegistrationTokens, &Method::GET | &Method::POST)
        | (Resource::Token(_) | Resource::RegistrationToken(_), &Method::DELETE) => Action::ManageCredentials,
        (Resource::AgentJoin, &Method::POST) => Action::Join,
        (Resource::AgentRenew, &Method::POST) => Action::RenewMachine,
        (Resource::AgentRevoke(_), &Method::POST) => Action::ManageCredentials,
        (Resource::Metrics, &Method::GET) => Action::ReadMetrics,
        (Resource::Sources | Resource::Source(_) | Resource::Rollouts | Resource::Rollout(_), &Method::GET) => {
            Action::ReadSources
        }
        (Resource::Rollout(_), &Method::PUT | &Method::DELETE) | (Resource::RolloutAction(..), &Method::POST) => {
            Action::ManageRollouts
        }
        (Resource::Source(_), &Method::PUT | &Method::DELETE) | (Resource::SourceSync(_), &Method::POST) => {
            Action::ManageSources
        }
        (Resource::SourceWebhook(_), &Method::POST) => Action::SourceWebhook,
        (Resource::WebRoot | Resource::WebAsset(_) | Resource::WebEvents, &Method::GET) => Action::List,
        (Resource::AgentFacet(machine, part), method) => match (part, method) {
            (AgentPart::Machine, &Method::PUT | &Method::DELETE)
            | (AgentPart::Work | AgentPart::Changes | AgentPart::Body(_) | AgentPart::Bodies, &Method::GET)
            | (AgentPart::States | AgentPart::JournalAnswer(_), &Method::POST) => Action::MachineFacet(machine),
            _ => return None,
        },
        _ => return None,
    })
}

/// The answer to a read of a unit the identity may not see: what it would get if the unit
/// did not exist.
fn hidden(resource: &Resource) -> ApiError {
    match resource {
        Resource::State(_) => ApiError::not_found("unit state does not exist"),
        _ => ApiError::not_found("unit does not exist"),
    }
}

async fn dispatch(State(state): State<ApiState>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let check = parts.extensions.get::<HostCheck>().copied().unwrap_or(HostCheck::Any);
    let host = parts.headers.get(header::HOST).map(|value| value.to_str().unwrap_or("\u{fffd}"));
    if !check.allows(host) {
        return ApiError::new(StatusCode::FORBIDDEN, "Host header names no loopback address; refusing the request")
            .into_response();
    }
    let resource = resource(&path);
    let action = action(&resource, &method);
    let identity = state.auth.authenticate(parts.extensions.get::<Peer>(), &parts.headers).await;
    let mut response = match &identity {
        Err(Refused::Unauthenticated(message)) => {
            let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message.as_str()).into_response();
            // A browser asks its user for the web view's credential (a token, as the password).
            let challenge = match resource {
                Resource::WebRoot | Resource::WebAsset(_) | Resource::WebEvents => {
                    HeaderValue::from_static("Basic realm=\"fleet\", charset=\"UTF-8\"")
                }
                _ => HeaderValue::from_static("Bearer"),
            };
            response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
            response
        }
        Err(Refused::Forbidden { message, .. }) => {
            ApiError::new(StatusCode::FORBIDDEN, message.as_str()).into_response()
        }
        Ok(identity) => match action.map_or(Access::Allowed, |action| decide(&identity.role, action)) {
            Access::Allowed => {
                let query = parts.uri.query();
                authorized(&state, identity, &resource, &method, query, &parts.headers, body).await
            }
            Access::Hidden => hidden(&resource).into_response(),
            Access::Denied => ApiError::new(
                StatusCode::FORBIDDEN,
                format!("{} may not {} {path}", identity.role, method.as_str().to_ascii_uppercase()),
            )
            .into_response(),
        },
    };
    let status = response.status();
    if audit::audited(&method, status) {
        let (name, role) = match &identity {
            Ok(identity) => (identity.name.clone(), identity.role.to_string()),
            Err(Refused::Forbidden { name, .. }) => (name.clone(), "-".to_string()),
            Err(Refused::Unauthenticated(_)) => ("-".to_string(), "-".to_string()),
        };
        let unit = action.and_then(|action| action.unit().map(str::to_string));
        audit::record(&AuditEntry {
            identity: &name,
            role: &role,
            method: &method,
            path: &path,
            unit: unit.as_deref(),
            status,
        });
    }
    let server = HeaderValue::from_static(concat!("fleetd/", env!("CARGO_PKG_VERSION")));
    response.headers_mut().insert(header::SERVER, server);
    let metrics = &fleet_metrics::metrics().api;
    let (endpoint, method) = (resource.endpoint(), method_label(&method));
    metrics
        .request_duration
        .get_or_create(&fleet_metrics::RouteLabels { endpoint, method: method.clone() })
        .observe(started.elapsed().as_secs_f64());
    metrics.requests.get_or_create(&fleet_metrics::ResponseLabels { endpoint, method, code: status.as_u16() }).inc();
    response
}

/// Serves a request its identity may make: reads the body, then routes.
async fn authorized(
    state: &ApiState,
    identity: &Identity,
    resource: &Resource,
    method: &Method,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds {BODY_LIMIT} bytes"))
                .into_response();
        }
        Err(_) => {
            return ApiError::new(StatusCode::REQUEST_TIMEOUT, "request body not received in time").into_response();
        }
    };
    let request = Routed { identity, resource, method, query: &query_pairs(query), headers, body };
    route(state, request).await.unwrap_or_else(IntoResponse::into_response)
}

/// A request ready for its handler.
struct Routed<'a> {
    identity: &'a Identity,
    resource: &'a Resource,
    method: &'a Method,
    query: &'a [(String, String)],
    headers: &'a HeaderMap,
    body: Bytes,
}

async fn route(state: &ApiState, request: Routed<'_>) -> Result<Response, ApiError> {
    let Routed { identity, resource, method, query, headers, body } = request;
    let role = &identity.role;
    match (resource, method) {
        (Resource::Root | Resource::ApiRoot, _) => Err(ApiError::method_not_allowed("")),
        (Resource::Discovery, &Method::GET) => {
            Ok(([(header::CONTENT_TYPE, "application/json")], Body::from(DISCOVERY)).into_response())
        }
        (Resource::Discovery, _) => Err(ApiError::method_not_allowed("only HTTP GET supported against this resource")),
        (Resource::Units, &Method::GET) => units::list(state, query, role).await,
        (Resource::Units, &Method::POST) => unit_batch::post(state, role, headers, &body, &units::writer(query)?).await,
        (Resource::Units, _) => Err(ApiError::method_not_allowed("only GET supported against this resource")),
        (Resource::Unit(name), &Method::GET) => units::get(state, name).await,
        (Resource::Unit(name), &Method::PUT) => units::put(state, name, headers, &body, &units::writer(query)?).await,
        (Resource::Unit(name), &Method::DELETE) => units::delete(state, name, &units::writer(query)?).await,
        (Resource::Unit(_), _) => {
            Err(ApiError::method_not_allowed("only GET, PUT and DELETE supported against this resource"))
        }
        (Resource::States, &Method::GET) => state::list(state, query, role).await,
        (Resource::State(name), &Method::GET) => state::get(state, name).await,
        (Resource::States | Resource::State(_), _) => {
            Err(ApiError::method_not_allowed("only GET supported against this resource"))
        }
        (Resource::Machines, &Method::GET) => machines::list(state, query).await,
        (Resource::Machines, &Method::PATCH) => machines::patch(state, &body).await,
        (Resource::Machines, _) => {
            Err(ApiError::method_not_allowed("only GET and PATCH supported against this resource"))
        }
        (Resource::Journal(name), &Method::GET) => journal::get(state, name, query).await,
        (Resource::Journal(_), _) => Err(ApiError::method_not_allowed("only GET supported against this resource")),
        (Resource::Tokens, &Method::GET) => tokens::list(state).await,
        (Resource::Tokens, &Method::POST) => tokens::create(state, &body).await,
        (Resource::Tokens, _) => Err(ApiError::method_not_allowed("only GET supported against this resource")),
        (Resource::Token(name), &Method::DELETE) => tokens::revoke(state, name).await,
        (Resource::RegistrationTokens, &Method::GET) => registration_tokens::list(state).await,
        (Resource::RegistrationTokens, &Method::POST) => registration_tokens::create(state, &body).await,
        (Resource::RegistrationToken(name), &Method::DELETE) => registration_tokens::revoke(state, name).await,
        (Resource::RegistrationTokens, _) => {
            Err(ApiError::method_not_allowed("only GET supported against this resource"))
        }
        (Resource::Sources, &Method::GET) => sources::list(state).await,
        (Resource::Sources, _) => Err(ApiError::method_not_allowed("only GET supported against this resource")),
        (Resource::Source(name), &Method::GET) => sources::get(state, name).await,
        (Resource::Source(name), &Method::PUT) => sources::put(state, name, &body).await,
        (Resource::Source(name), &Method::DELETE) => sources::delete(state, name, query).await,
        (Resource::Source(_), _) => {
            Err(ApiError::method_not_allowed("only GET, PUT and DELETE supported against this resource"))
        }
        (Resource::SourceSync(name), &Method::POST) => sources::sync(state, name).await,
        (Resource::SourceWebhook(name), &Method::POST) => sources::webhook(state, name, headers, &body).await,
        (Resource::SourceSync(_) | Resource::SourceWebhook(_), _) => {
            Err(ApiError::method_not_allowed("only POST supported against this resource"))
        }
        (Resource::Rollouts, &Method::GET) => rollouts::list(state).await,
        (Resource::Rollouts, _) => Err(ApiError::method_not_allowed("only GET supported against this resource")),
        (Resource::Rollout(name), &Method::GET) => rollouts::get(state, name).await,
        (Resource::Rollout(name), &Method::PUT) => rollouts::put(state, name, &body).await,
        (Resource::Rollout(name), &Method::DELETE) => rollouts::delete(state, name).await,
        (Resource::Rollout(_), _) => {
            Err(ApiError::method_not_allowed("only GET, PUT and DELETE supported against this resource"))
        }
        (Resource::RolloutAction(name, action), &Method::POST) => rollouts::act(state, name, action).await,
        (Resource::RolloutAction(..), _) => {
            Err(ApiError::method_not_allowed("only POST supported against this resource"))
        }
        (Resource::AgentJoin, &Method::POST) => agents::join(state, headers, &body).await,
        (Resource::AgentRenew, &Method::POST) => match role {
            fleet_core::access::Role::Machine { id } => agents::renew(state, id, &body).await,
            _ => Err(ApiError::new(StatusCode::FORBIDDEN, "only a machine renews its certificate")),
        },
        (Resource::AgentRevoke(machine), &Method::POST) => agents::revoke(state, machine).await,
        (Resource::AgentFacet(machine, part), method) => {
            // Any request of a machine's own keeps it present, but its leaving.
            if !matches!((part, method), (AgentPart::Machine, &Method::DELETE)) {
                state.agent_presence.heard(machine);
            }
            agent_request(state, machine, part, method, query, &body).await
        }
        (Resource::AgentJoin | Resource::AgentRenew | Resource::AgentRevoke(_), _) => {
            Err(ApiError::method_not_allowed("only POST supported against this resource"))
        }
        (Resource::Token(_) | Resource::RegistrationToken(_), _) => {
            Err(ApiError::method_not_allowed("only DELETE supported against this resource"))
        }
        (Resource::Metrics, &Method::GET) => metrics::get(state, headers).await,
        (Resource::WebRoot, &Method::GET) => Ok(web::redirect_to_page()),
        (Resource::WebAsset(name), &Method::GET) => web::asset(name),
        (Resource::WebEvents, &Method::GET) => web::events(state, role).await,
        (Resource::Metrics | Resource::WebRoot | Resource::WebAsset(_) | Resource::WebEvents, _) => {
            Err(ApiError::method_not_allowed("only GET supported against this resource"))
        }
        (Resource::Unknown, _) => Err(ApiError::not_found("")),
    }
}

/// A pull agent's request of its own side of the store.
async fn agent_request(
    state: &ApiState,
    machine: &str,
    part: &AgentPart,
    method: &Method,
    query: &[(String, String)],
    body: &Bytes,
) -> Result<Response, ApiError> {
    match (part, method) {
        (AgentPart::Machine, &Method::PUT) => agent_facet::register(state, machine, body).await,
        (AgentPart::Machine, &Method::DELETE) => {
            state.agent_presence.forget(machine);
            agent_facet::unregister(state, machine).await
        }
        (AgentPart::Work, &Method::GET) => agent_facet::work(state, machine).await,
        (AgentPart::Changes, &Method::GET) => agent_facet::changes(state, machine, query).await,
        (AgentPart::Body(hash), &Method::GET) => agent_facet::body(state, machine, hash).await,
        (AgentPart::Bodies, &Method::GET) => agent_facet::bodies(state, machine, query).await,
        (AgentPart::States, &Method::POST) => agent_facet::report(state, machine, body).await,
        (AgentPart::JournalAnswer(id), &Method::POST) => agent_facet::journal_answer(state, machine, *id, body),
        (AgentPart::Machine, _) => {
            Err(ApiError::method_not_allowed("only PUT and DELETE supported against this resource"))
        }
        (AgentPart::Work | AgentPart::Changes | AgentPart::Body(_) | AgentPart::Bodies, _) => {
            Err(ApiError::method_not_allowed("only GET supported against this resource"))
        }
        (AgentPart::States | AgentPart::JournalAnswer(_), _) => {
            Err(ApiError::method_not_allowed("only POST supported against this resource"))
        }
    }
}

/// The API as one axum service.
pub fn router(state: ApiState) -> Router {
    Router::new().fallback(dispatch).with_state(state)
}

/// Reads the one page token a request may carry.
pub fn page_token(query: &[(String, String)], limit: u16) -> Result<crate::pagination::PageToken, ApiError> {
    let tokens: Vec<&String> =
        query.iter().filter(|(name, _)| name == "nextPageToken").map(|(_, value)| value).collect();
    match tokens.as_slice() {
        [] => Ok(crate::pagination::PageToken::first(limit)),
        [token] => crate::pagination::PageToken::decode(token, limit).map_err(ApiError::bad_request),
        _ => Err(ApiError::bad_request("too many values for page token")),
    }
}

/// The first value of a query parameter.
pub fn first_value<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests;
