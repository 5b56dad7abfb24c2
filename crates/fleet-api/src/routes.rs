//! The one route table: every (path, method) the API serves, the action it needs, the body it
//! takes and its handler, one line each. A request that matches no line is answered 404 or
//! 405 before anything else happens (no credential is read, nothing is counted per path),
//! so an endpoint exists only once it is written here.

use axum::http::Method;
use axum::response::Response;
use fleet_core::access::Action;
use futures_util::future::BoxFuture;

use crate::api_state::ApiState;
use crate::call::Call;
use crate::error::ApiError;
use crate::handlers::{
    agent_facet, agent_stream, agents, backup, discovery, drains, events, imports, journal, machines, metrics, plans,
    registration_tokens, rollouts, runs, secrets, sources, state, tokens, unit_batch, unit_history, units, web,
};

/// A handler, as the table holds it.
pub(crate) type Handler = for<'a> fn(&'a ApiState, Call<'a>) -> BoxFuture<'a, Result<Response, ApiError>>;

/// What a route needs the caller to be allowed, before its handler runs. The unit, machine
/// or source it names is the route's first path parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    List,
    ReadUnit,
    WriteUnit,
    WriteUnits,
    WriteMachines,
    ManageCredentials,
    /// Established by a registration token, verified before the handler runs.
    Join,
    RenewMachine,
    MachineFacet,
    ReadMetrics,
    ReadSources,
    ManageSources,
    ManageRollouts,
    BackUp,
    Import,
    ListSecrets,
    WriteSecret,
    /// Established by the body's signature with the source's secret, verified before the
    /// handler runs.
    SourceWebhook,
}

impl Need {
    /// The action the request takes, naming what its first parameter names.
    pub(crate) fn action<'a>(self, params: &'a [String]) -> Action<'a> {
        let named = params.first().map_or("", String::as_str);
        match self {
            Need::List => Action::List,
            Need::ReadUnit => Action::ReadUnit(named),
            Need::WriteUnit => Action::WriteUnit(named),
            Need::WriteUnits => Action::WriteUnits,
            Need::WriteMachines => Action::WriteMachines,
            Need::ManageCredentials => Action::ManageCredentials,
            Need::Join => Action::Join,
            Need::RenewMachine => Action::RenewMachine,
            Need::MachineFacet => Action::MachineFacet(named),
            Need::ReadMetrics => Action::ReadMetrics,
            Need::ReadSources => Action::ReadSources,
            Need::ManageSources => Action::ManageSources,
            Need::ManageRollouts => Action::ManageRollouts,
            Need::BackUp => Action::BackUp,
            Need::Import => Action::Import,
            Need::ListSecrets => Action::ListSecrets,
            Need::WriteSecret => Action::WriteSecret(named),
            Need::SourceWebhook => Action::SourceWebhook(named),
        }
    }
}

/// The body a route takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// None: a read, or a write that says everything in its path. A write must still come
    /// with no Content-Type or a JSON one.
    Empty,
    /// A JSON document, with exactly one `Content-Type: application/json`.
    Json,
    /// A JSON document as [`Body::Json`], of up to [`crate::router::BULK_BODY_LIMIT`]: an
    /// administrator's import of a whole registry.
    Bulk,
    /// Whatever a git forge sends; the request is authenticated by the body's signature.
    Signed,
}

pub(crate) struct Route {
    pub method: Method,
    /// `{name}` stands for one non-empty path segment, handed to the handler.
    pub pattern: &'static str,
    pub need: Need,
    pub body: Body,
    pub handler: Handler,
    /// The handler's call as written in the table (for the test that every handler is here).
    #[cfg_attr(not(test), allow(dead_code))]
    pub calls: &'static str,
}

macro_rules! route {
    ($method:ident $pattern:literal, $need:ident, $body:ident, |$state:ident, $call:ident| $handler:expr) => {
        Route {
            method: Method::$method,
            pattern: $pattern,
            need: Need::$need,
            body: Body::$body,
            handler: {
                #[allow(unused_variables)]
                fn handle<'a>($state: &'a ApiState, $call: Call<'a>) -> BoxFuture<'a, Result<Response, ApiError>> {
                    Box::pin(async move { $handler })
                }
                handle
            },
            calls: stringify!($handler),
        }
    };
}

/// Every route of the API.
pub(crate) static ROUTES: &[Route] = &[
    // The original's API (compat.md §2).
    route!(GET "/fleet/v1/discovery", List, Empty, |s, c| discovery::get()),
    route!(GET "/fleet/v1/units", List, Empty, |s, c| units::list(s, c.query, c.role()).await),
    route!(POST "/fleet/v1/units", WriteUnits, Json, |s, c| unit_batch::post(s, c.role(), c.body, &plans::guarded_writer(s, c.identity, c.query).await?).await),
    route!(GET "/fleet/v1/units/{unit}", ReadUnit, Empty, |s, c| units::get(s, c.role(), c.param()).await),
    route!(PUT "/fleet/v1/units/{unit}", WriteUnit, Json, |s, c| units::put(s, c.role(), c.param(), c.body, &plans::guarded_writer(s, c.identity, c.query).await?).await),
    route!(DELETE "/fleet/v1/units/{unit}", WriteUnit, Empty, |s, c| units::delete(s, c.param(), &plans::guarded_writer(s, c.identity, c.query).await?).await),
    route!(GET "/fleet/v1/units/{unit}/history", ReadUnit, Empty, |s, c| unit_history::list(s, c.param()).await),
    route!(GET "/fleet/v1/units/{unit}/history/{version}", ReadUnit, Empty, |s, c| unit_history::get(s, c.param(), c.second_param()).await),
    route!(GET "/fleet/v1/units/{unit}/runs", ReadUnit, Empty, |s, c| runs::get(s, c.param()).await),
    route!(POST "/fleet/v1/units/{unit}/runs", WriteUnit, Empty, |s, c| runs::post(s, c.param()).await),
    route!(GET "/fleet/v1/state", List, Empty, |s, c| state::list(s, c.query, c.role()).await),
    route!(GET "/fleet/v1/state/{unit}", ReadUnit, Empty, |s, c| state::get(s, c.param()).await),
    route!(GET "/fleet/v1/machines", List, Empty, |s, c| machines::list(s, c.query, c.role()).await),
    route!(PATCH "/fleet/v1/machines", WriteMachines, Json, |s, c| machines::patch(s, c.body).await),
    // Ours: drains, journals, credentials, sources, rollouts, pull agents, metrics, the web view.
    route!(GET "/fleet/v1/machines/{machine}/drain", List, Empty, |s, c| drains::get(s, c.param(), c.role()).await),
    route!(PUT "/fleet/v1/machines/{machine}/drain", WriteMachines, Json, |s, c| drains::put(s, c.param(), c.body).await),
    route!(DELETE "/fleet/v1/machines/{machine}/drain", WriteMachines, Empty, |s, c| drains::delete(s, c.param()).await),
    route!(GET "/fleet/v1/events", List, Empty, |s, c| events::get(s, c.identity, c.headers, c.query).await),
    route!(POST "/fleet/v1/plans", List, Json, |s, c| plans::post(s, c.role(), c.body).await),
    route!(POST "/fleet/v1/imports", Import, Bulk, |s, c| imports::post(s, c.identity, c.body).await),
    route!(GET "/fleet/v1/journal/{unit}", ReadUnit, Empty, |s, c| journal::get(s, c.identity, c.param(), c.query).await),
    route!(GET "/fleet/v1/tokens", ManageCredentials, Empty, |s, c| tokens::list(s).await),
    route!(POST "/fleet/v1/tokens", ManageCredentials, Json, |s, c| tokens::create(s, c.body).await),
    route!(DELETE "/fleet/v1/tokens/{name}", ManageCredentials, Empty, |s, c| tokens::revoke(s, c.param()).await),
    route!(GET "/fleet/v1/registration-tokens", ManageCredentials, Empty, |s, c| registration_tokens::list(s).await),
    route!(POST "/fleet/v1/registration-tokens", ManageCredentials, Json, |s, c| registration_tokens::create(s, c.body).await),
    route!(DELETE "/fleet/v1/registration-tokens/{name}", ManageCredentials, Empty, |s, c| registration_tokens::revoke(s, c.param()).await),
    route!(GET "/fleet/v1/sources", ReadSources, Empty, |s, c| sources::list(s).await),
    route!(GET "/fleet/v1/sources/{name}", ReadSources, Empty, |s, c| sources::get(s, c.param()).await),
    route!(PUT "/fleet/v1/sources/{name}", ManageSources, Json, |s, c| sources::put(s, c.param(), c.body).await),
    route!(DELETE "/fleet/v1/sources/{name}", ManageSources, Empty, |s, c| sources::delete(s, c.identity, c.param(), c.query).await),
    route!(POST "/fleet/v1/sources/{name}/sync", ManageSources, Empty, |s, c| sources::sync(s, c.param(), c.query).await),
    route!(POST "/fleet/v1/sources/{name}/webhook", SourceWebhook, Signed, |s, c| sources::webhook(s, c.param()).await),
    route!(GET "/fleet/v1/rollouts", ReadSources, Empty, |s, c| rollouts::list(s, c.query).await),
    route!(GET "/fleet/v1/rollouts/{name}", ReadSources, Empty, |s, c| rollouts::get(s, c.param(), c.query).await),
    route!(PUT "/fleet/v1/rollouts/{name}", ManageRollouts, Json, |s, c| rollouts::put(s, c.identity, c.param(), c.body).await),
    route!(DELETE "/fleet/v1/rollouts/{name}", ManageRollouts, Empty, |s, c| rollouts::delete(s, c.param()).await),
    route!(POST "/fleet/v1/rollouts/{name}/pause", ManageRollouts, Empty, |s, c| rollouts::act(s, c.param(), "pause").await),
    route!(POST "/fleet/v1/rollouts/{name}/resume", ManageRollouts, Empty, |s, c| rollouts::act(s, c.param(), "resume").await),
    route!(POST "/fleet/v1/rollouts/{name}/undo", ManageRollouts, Empty, |s, c| rollouts::act(s, c.param(), "undo").await),
    route!(POST "/fleet/v1/rollouts/{name}/promote", ManageRollouts, Empty, |s, c| rollouts::act(s, c.param(), "promote").await),
    route!(POST "/fleet/v1/agents/join", Join, Json, |s, c| agents::join(s, c.headers, c.body).await),
    route!(POST "/fleet/v1/agents/renew", RenewMachine, Json, |s, c| agents::renew(s, c.identity, c.body).await),
    route!(POST "/fleet/v1/agents/{machine}/revoke", ManageCredentials, Empty, |s, c| agents::revoke(s, c.param()).await),
    route!(POST "/fleet/v1/agents/{machine}/forget", ManageCredentials, Empty, |s, c| agents::forget(s, c.param()).await),
    route!(PUT "/fleet/v1/agents/{machine}/machine", MachineFacet, Json, |s, c| agent_facet::register(s, c.identity, c.body).await),
    route!(DELETE "/fleet/v1/agents/{machine}/machine", MachineFacet, Empty, |s, c| agent_facet::unregister(s, c.param()).await),
    route!(GET "/fleet/v1/agents/{machine}/work", MachineFacet, Empty, |s, c| agent_facet::work(s, c.param()).await),
    route!(GET "/fleet/v1/agents/{machine}/changes", MachineFacet, Empty, |s, c| agent_facet::changes(s, c.identity, c.query).await),
    route!(GET "/fleet/v1/agents/{machine}/stream", MachineFacet, Empty, |s, c| agent_stream::open(s, c.identity, c.headers, c.upgrade).await),
    route!(GET "/fleet/v1/agents/{machine}/bodies", MachineFacet, Empty, |s, c| agent_facet::bodies(s, c.param(), c.query).await),
    route!(GET "/fleet/v1/agents/{machine}/bodies/{hash}", MachineFacet, Empty, |s, c| agent_facet::body(s, c.param(), c.second_param()).await),
    route!(POST "/fleet/v1/agents/{machine}/states", MachineFacet, Json, |s, c| agent_facet::report(s, c.param(), c.body).await),
    route!(GET "/fleet/v1/agents/{machine}/secrets/{unit}", MachineFacet, Empty, |s, c| agent_facet::secrets(s, c.param(), c.second_param()).await),
    route!(POST "/fleet/v1/agents/{machine}/journal/{id}", MachineFacet, Json, |s, c| agent_facet::journal_answer(s, c.param(), c.second_param(), c.body)),
    route!(GET "/fleet/v1/backup", BackUp, Empty, |s, c| backup::get(s).await),
    route!(GET "/fleet/v1/secrets", ListSecrets, Empty, |s, c| secrets::list(s).await),
    route!(PUT "/fleet/v1/secrets/{name}", WriteSecret, Json, |s, c| secrets::put(s, c.identity, c.param(), c.body).await),
    route!(DELETE "/fleet/v1/secrets/{name}", WriteSecret, Empty, |s, c| secrets::delete(s, c.param()).await),
    route!(POST "/fleet/v1/secrets-reseal", ManageCredentials, Empty, |s, c| secrets::reseal(s).await),
    route!(GET "/metrics", ReadMetrics, Empty, |s, c| metrics::get(s, c.headers).await),
    route!(GET "/", List, Empty, |s, c| Ok(web::redirect_to_page())),
    route!(GET "/ui", List, Empty, |s, c| Ok(web::redirect_to_page())),
    route!(GET "/ui/", List, Empty, |s, c| web::asset("")),
    route!(GET "/ui/app.js", List, Empty, |s, c| web::asset("app.js")),
    route!(GET "/ui/app.css", List, Empty, |s, c| web::asset("app.css")),
    route!(GET "/ui/events", List, Empty, |s, c| web::events(s, c.identity).await),
];

/// Paths that exist but take no method at all (the original answers them 405 with no text).
const WITHOUT_METHODS: [&str; 1] = ["/fleet/v1"];

/// The original's own words for the methods its resources refuse, where they differ from
/// what the table lists (we serve more on them than it did).
const ORIGINAL_REFUSALS: [(&str, &str); 3] = [
    // The original took no method on `/`; a browser's GET leads to the web view here.
    ("/", ""),
    ("/fleet/v1/discovery", "only HTTP GET supported against this resource"),
    ("/fleet/v1/units", "only GET supported against this resource"),
];

/// What the table says of a request.
pub(crate) enum Found {
    Route(&'static Route, Vec<String>),
    /// The path exists, the method is not served on it: the 405's message.
    WrongMethod(String),
    Nothing,
}

/// The route of `method` on `path`.
pub(crate) fn find(path: &str, method: &Method) -> Found {
    let path = canonical(path);
    if WITHOUT_METHODS.contains(&path.as_ref()) {
        return Found::WrongMethod(String::new());
    }
    let segments: Vec<&str> = path.split('/').collect();
    let mut served = Vec::new();
    let mut pattern = None;
    for route in ROUTES {
        let Some(params) = matches(route.pattern, &segments) else { continue };
        if route.method == *method {
            return Found::Route(route, params);
        }
        served.push(route.method.as_str());
        pattern = Some(route.pattern);
    }
    let Some(pattern) = pattern else { return Found::Nothing };
    let original = ORIGINAL_REFUSALS.iter().find(|(known, _)| *known == pattern);
    Found::WrongMethod(original.map_or_else(|| refusal(&served), |(_, message)| message.to_string()))
}

/// `/v1-alpha/…`, the original's old prefix, as `/fleet/v1/…`.
fn canonical(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/v1-alpha") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/fleet/v1{rest}").into(),
        _ => path.into(),
    }
}

/// The parameters the path split at its `/` (`segments`) gives `pattern`'s `{…}` segments,
/// or `None` when it does not match. Every request is tried against the patterns in turn
/// (an agent's paths are near the table's end), so the path is split once, a pattern is left
/// at its first literal segment that differs, and only a whole match has its parameters
/// decoded: splitting the path again for every pattern was a twentieth of a manager's CPU
/// while 10,000 agents announced themselves.
fn matches(pattern: &str, segments: &[&str]) -> Option<Vec<String>> {
    let mut count = 0;
    for segment in pattern.split('/') {
        let text = segments.get(count)?;
        if !segment.starts_with('{') && segment != *text {
            return None;
        }
        count += 1;
    }
    if count != segments.len() {
        return None;
    }
    pattern
        .split('/')
        .zip(segments)
        .filter(|(segment, _)| segment.starts_with('{'))
        .map(|(_, text)| crate::query::percent_decode(text).filter(|name| !name.is_empty()))
        .collect()
}

/// "only GET, PUT and DELETE supported against this resource".
fn refusal(methods: &[&str]) -> String {
    let listed = match methods {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    };
    format!("only {listed} supported against this resource")
}

#[cfg(test)]
mod tests;
