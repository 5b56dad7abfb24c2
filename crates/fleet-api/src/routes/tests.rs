//! The route table against what was meant, written down separately: which identity may do
//! what on every route, every method a route does not take, and every handler in the table.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use fleet_registry::{CredentialRegistry, RegistrationRecord, SourceRecord, SourceRegistry, TokenRecord};
use fleet_store_embedded::EmbeddedRegistry;

use super::*;
use crate::auth::tokens::{REGISTRATION_PREFIX, TOKEN_PREFIX, digest, generate};
use crate::auth::{Auth, Peer};
use crate::router::{Asked, admit};
use fleet_tls::certificate::CertificateIdentity;

/// The identities every route is tried with, in the order of the expected table's columns.
const IDENTITIES: [&str; 13] = [
    "nobody",
    "unix admin",
    "admin token",
    "operator token",
    "operator token for web-*",
    "viewer token",
    "certificate of m1",
    "certificate of m2",
    "registration token",
    "forged registration token",
    "webhook of docs, signed",
    "webhook of docs, forged",
    "admin token, from another site",
];

/// What each identity gets, per route (the route's `{…}` filled as [`example_path`] does):
/// `A` let through, `U` 401, `D` 403 by the decision, `H` 404 (the unit is hidden from it),
/// `X` 403 by the write guard (a cross-site write). Written by hand, from what each role is
/// for; not derived from the table or from `decide`.
const EXPECTED: &[(&str, &str, &str)] = &[
    // nobody, unix, admin, operator, scoped, viewer, m1, m2, join, forged, hook, forged, cross-site
    ("GET", "/fleet/v1/discovery", "UAAAAADDUUUUA"),
    ("GET", "/fleet/v1/units", "UAAAAADDUUUUA"),
    ("POST", "/fleet/v1/units", "UAAAADDDUUUUX"),
    ("GET", "/fleet/v1/units/{unit}", "UAAAHADDUUUUA"),
    ("PUT", "/fleet/v1/units/{unit}", "UAAADDDDUUUUX"),
    ("DELETE", "/fleet/v1/units/{unit}", "UAAADDDDUUUUX"),
    ("GET", "/fleet/v1/units/{unit}/history", "UAAAHADDUUUUA"),
    ("GET", "/fleet/v1/units/{unit}/history/{version}", "UAAAHADDUUUUA"),
    ("GET", "/fleet/v1/units/{unit}/runs", "UAAAHADDUUUUA"),
    ("POST", "/fleet/v1/units/{unit}/runs", "UAAADDDDUUUUX"),
    ("GET", "/fleet/v1/state", "UAAAAADDUUUUA"),
    ("GET", "/fleet/v1/state/{unit}", "UAAAHADDUUUUA"),
    ("GET", "/fleet/v1/machines", "UAAAAADDUUUUA"),
    ("PATCH", "/fleet/v1/machines", "UAAADDDDUUUUX"),
    ("GET", "/fleet/v1/machines/{machine}/drain", "UAAAAADDUUUUA"),
    ("PUT", "/fleet/v1/machines/{machine}/drain", "UAAADDDDUUUUX"),
    ("DELETE", "/fleet/v1/machines/{machine}/drain", "UAAADDDDUUUUX"),
    ("GET", "/fleet/v1/events", "UAAAAADDUUUUA"),
    ("POST", "/fleet/v1/plans", "UAAAAADDUUUUX"),
    ("POST", "/fleet/v1/imports", "UAADDDDDUUUUX"),
    ("GET", "/fleet/v1/journal/{unit}", "UAAAHADDUUUUA"),
    ("GET", "/fleet/v1/tokens", "UAADDDDDUUUUA"),
    ("POST", "/fleet/v1/tokens", "UAADDDDDUUUUX"),
    ("DELETE", "/fleet/v1/tokens/{name}", "UAADDDDDUUUUX"),
    ("GET", "/fleet/v1/registration-tokens", "UAADDDDDUUUUA"),
    ("POST", "/fleet/v1/registration-tokens", "UAADDDDDUUUUX"),
    ("DELETE", "/fleet/v1/registration-tokens/{name}", "UAADDDDDUUUUX"),
    ("GET", "/fleet/v1/sources", "UAAADADDUUUUA"),
    ("GET", "/fleet/v1/sources/{name}", "UAAADADDUUUUA"),
    ("PUT", "/fleet/v1/sources/{name}", "UAADDDDDUUUUX"),
    ("DELETE", "/fleet/v1/sources/{name}", "UAADDDDDUUUUX"),
    ("POST", "/fleet/v1/sources/{name}/sync", "UAADDDDDUUUUX"),
    ("POST", "/fleet/v1/sources/{name}/webhook", "UUUUUUUUUUAUX"),
    ("GET", "/fleet/v1/rollouts", "UAAADADDUUUUA"),
    ("GET", "/fleet/v1/rollouts/{name}", "UAAADADDUUUUA"),
    ("PUT", "/fleet/v1/rollouts/{name}", "UAAADDDDUUUUX"),
    ("DELETE", "/fleet/v1/rollouts/{name}", "UAAADDDDUUUUX"),
    ("POST", "/fleet/v1/rollouts/{name}/pause", "UAAADDDDUUUUX"),
    ("POST", "/fleet/v1/rollouts/{name}/resume", "UAAADDDDUUUUX"),
    ("POST", "/fleet/v1/rollouts/{name}/undo", "UAAADDDDUUUUX"),
    ("POST", "/fleet/v1/rollouts/{name}/promote", "UAAADDDDUUUUX"),
    ("POST", "/fleet/v1/agents/join", "UUUUUUUUAUUUX"),
    ("POST", "/fleet/v1/agents/renew", "UDDDDDAAUUUUX"),
    ("POST", "/fleet/v1/agents/{machine}/revoke", "UAADDDDDUUUUX"),
    ("POST", "/fleet/v1/agents/{machine}/forget", "UAADDDDDUUUUX"),
    ("PUT", "/fleet/v1/agents/{machine}/machine", "UDDDDDADUUUUX"),
    ("DELETE", "/fleet/v1/agents/{machine}/machine", "UDDDDDADUUUUX"),
    ("GET", "/fleet/v1/agents/{machine}/work", "UDDDDDADUUUUD"),
    ("GET", "/fleet/v1/agents/{machine}/changes", "UDDDDDADUUUUD"),
    ("GET", "/fleet/v1/agents/{machine}/stream", "UDDDDDADUUUUD"),
    ("GET", "/fleet/v1/agents/{machine}/bodies", "UDDDDDADUUUUD"),
    ("GET", "/fleet/v1/agents/{machine}/bodies/{hash}", "UDDDDDADUUUUD"),
    ("POST", "/fleet/v1/agents/{machine}/states", "UDDDDDADUUUUX"),
    ("GET", "/fleet/v1/agents/{machine}/secrets/{unit}", "UDDDDDADUUUUD"),
    ("POST", "/fleet/v1/agents/{machine}/journal/{id}", "UDDDDDADUUUUX"),
    ("GET", "/fleet/v1/backup", "UAADDDDDUUUUA"),
    ("GET", "/fleet/v1/secrets", "UAAAAADDUUUUA"),
    ("PUT", "/fleet/v1/secrets/{name}", "UAADDDDDUUUUX"),
    ("DELETE", "/fleet/v1/secrets/{name}", "UAADDDDDUUUUX"),
    ("POST", "/fleet/v1/secrets-reseal", "UAADDDDDUUUUX"),
    ("GET", "/metrics", "UAAADADDUUUUA"),
    ("GET", "/", "UAAAAADDUUUUA"),
    ("GET", "/ui", "UAAAAADDUUUUA"),
    ("GET", "/ui/", "UAAAAADDUUUUA"),
    ("GET", "/ui/app.js", "UAAAAADDUUUUA"),
    ("GET", "/ui/app.css", "UAAAAADDUUUUA"),
    ("GET", "/ui/events", "UAAAAADDUUUUA"),
];

const ALL_METHODS: [Method; 7] =
    [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS];

/// A path of `pattern`: unit `db.service` (outside the scoped operator's `web-*`), machine
/// `m1`, source `docs`.
fn example_path(pattern: &str) -> String {
    pattern
        .replace("{unit}", "db.service")
        .replace("{machine}", "m1")
        .replace("{name}", "docs")
        .replace("{hash}", &"ab".repeat(20))
        .replace("{id}", "1")
        .replace("{version}", "1")
}

struct Lab {
    state: ApiState,
    tokens: Vec<String>,
    registration: String,
    _dir: tempfile::TempDir,
}

const WEBHOOK_SECRET: &[u8] = b"s3cret";
const WEBHOOK_BODY: &[u8] = b"{\"ref\":\"refs/heads/main\"}";

async fn lab() -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let mut tokens = Vec::new();
    for (name, role, units) in
        [("a", "admin", None), ("o", "operator", None), ("s", "operator", Some("web-*")), ("v", "viewer", None)]
    {
        let token = generate(TOKEN_PREFIX).unwrap();
        let record = TokenRecord {
            name: name.into(),
            role: role.into(),
            units: units.map(str::to_string),
            secrets: None,
            sha256: digest(&token),
            created: 0,
            expires: None,
        };
        assert!(registry.create_token(&record).await.unwrap());
        tokens.push(token);
    }
    let registration = generate(REGISTRATION_PREFIX).unwrap();
    let record = RegistrationRecord {
        name: "rack".into(),
        sha256: digest(&registration),
        created: 0,
        expires: None,
        max_uses: Some(5),
        uses: 0,
        metadata: Default::default(),
        machine_ids: None,
    };
    assert!(registry.create_registration(&record).await.unwrap());
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("docs-hook"), WEBHOOK_SECRET).unwrap();
    let source = SourceRecord {
        webhook_secret: Some("docs-hook".into()),
        ..SourceRecord::new("docs", "https://example.com/docs.git")
    };
    registry.put_source(&source).await.unwrap();
    let state = ApiState {
        source_secrets_dir: Some(secrets),
        backup: None,
        ..ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None))
    };
    Lab { state, tokens, registration, _dir: dir }
}

fn signature(secret: &[u8], body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, body);
    format!("sha256={}", tag.as_ref().iter().map(|byte| format!("{byte:02x}")).collect::<String>())
}

fn machine(id: &str) -> Peer {
    let role = Ok(fleet_core::access::Role::Machine { id: id.into() });
    let certificate = CertificateIdentity { name: id.into(), role, key_sha256: format!("key-of-{id}") };
    Peer::Tcp { tls: true, certificate: Some(Arc::new(certificate)) }
}

/// The peer and headers of identity `index` of [`IDENTITIES`].
fn identity(lab: &Lab, index: usize) -> (Peer, HeaderMap) {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::HOST, HeaderValue::from_static("fleet.example:8443"));
    let bearer = |token: &str| HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
    let anyone = Peer::Tcp { tls: true, certificate: None };
    let peer = match index {
        0 => anyone,
        1 => Peer::Unix { uid: Some(0) },
        2..=5 => {
            headers.insert(header::AUTHORIZATION, bearer(&lab.tokens[index - 2]));
            anyone
        }
        6 => machine("m1"),
        7 => machine("m2"),
        8 | 9 => {
            let token = if index == 8 { lab.registration.clone() } else { generate(REGISTRATION_PREFIX).unwrap() };
            headers.insert(header::AUTHORIZATION, bearer(&token));
            anyone
        }
        10 | 11 => {
            let secret: &[u8] = if index == 10 { WEBHOOK_SECRET } else { b"guessed" };
            headers.insert("x-hub-signature-256", HeaderValue::from_str(&signature(secret, WEBHOOK_BODY)).unwrap());
            anyone
        }
        _ => {
            headers.insert(header::AUTHORIZATION, bearer(&lab.tokens[0]));
            headers.insert(header::ORIGIN, HeaderValue::from_static("https://evil.example"));
            headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
            anyone
        }
    };
    (peer, headers)
}

fn decision(status: u16, message: &str) -> char {
    match status {
        401 => 'U',
        403 if message.starts_with("cross-site request refused") => 'X',
        403 => 'D',
        404 => 'H',
        other => panic!("a refusal the table does not expect: {other} {message}"),
    }
}

#[tokio::test]
async fn every_identity_on_every_route_gets_what_was_meant() {
    let lab = lab().await;
    let mut listed = HashSet::new();
    for (method, pattern, expected) in EXPECTED {
        assert_eq!(expected.len(), IDENTITIES.len(), "{method} {pattern}");
        listed.insert((*method, *pattern));
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let path = example_path(pattern);
        let Found::Route(route, params) = find(&path, &method) else { panic!("{method} {path} is not routed") };
        assert_eq!(route.pattern, *pattern);
        for (index, want) in expected.chars().enumerate() {
            let (peer, headers) = identity(&lab, index);
            let asked =
                Asked { route, params: &params, method: &method, query: &[], headers: &headers, peer: Some(&peer) };
            let got = match admit(&lab.state, asked, Body::from(WEBHOOK_BODY)).await {
                Ok(_) => 'A',
                Err(turned) => {
                    let status = turned.response.status().as_u16();
                    let bytes = axum::body::to_bytes(turned.response.into_body(), usize::MAX).await.unwrap();
                    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    decision(status, body["error"]["message"].as_str().unwrap_or(""))
                }
            };
            assert_eq!(got, want, "{method} {path} as {}", IDENTITIES[index]);
        }
    }
    for route in ROUTES {
        assert!(
            listed.contains(&(route.method.as_str(), route.pattern)),
            "{} {} has no expected row",
            route.method,
            route.pattern
        );
    }
    assert_eq!(listed.len(), ROUTES.len(), "a row names a route twice");
    // Only the certificate of m1, on m1's own routes, made a machine present.
    assert!(lab.state.agent_presence.knows("m1"));
    assert_eq!(lab.state.agent_presence.count(), 1);
}

#[tokio::test]
async fn a_method_no_route_takes_is_refused_before_anything_else() {
    let lab = lab().await;
    let router = crate::router::router(lab.state.clone());
    let patterns: HashSet<&str> = ROUTES.iter().map(|route| route.pattern).collect();
    for pattern in patterns {
        let path = example_path(pattern);
        for method in ALL_METHODS {
            if ROUTES.iter().any(|route| route.pattern == pattern && route.method == method) {
                continue;
            }
            for (index, name) in IDENTITIES.iter().enumerate() {
                let (peer, headers) = identity(&lab, index);
                let mut request = axum::http::Request::builder().method(method.clone()).uri(&path);
                for (name, value) in &headers {
                    request = request.header(name, value);
                }
                let mut request = request.body(Body::from(WEBHOOK_BODY)).unwrap();
                request.extensions_mut().insert(peer);
                let response = tower::ServiceExt::oneshot(router.clone(), request).await.unwrap();
                assert_eq!(response.status().as_u16(), 405, "{method} {path} as {name}");
            }
        }
    }
    // The attack of the issue: a PATCH of a machine's work, with a signature header or a
    // registration token, made the machine present. Nothing did here.
    assert_eq!(lab.state.agent_presence.count(), 0);
    for path in ["/fleet/v1/agents/m1/nothing", "/fleet/v1/nothing", "/fleet/v1/units/", "/ui/missing.js"] {
        assert_eq!(find(path, &Method::GET).status(), 404, "{path}");
    }
}

impl Found {
    fn status(&self) -> u16 {
        match self {
            Found::Route(..) => 200,
            Found::WrongMethod(_) => 405,
            Found::Nothing => 404,
        }
    }
}

/// Every handler of `handlers/` (a public function answering `Result<Response, ApiError>`)
/// is called by a line of the table: a handler cannot exist beside the table.
#[test]
fn every_handler_is_in_the_table() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/handlers");
    let mut handlers = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            continue; // a handler's own tests
        }
        let module = path.file_stem().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("\npub ") {
            let rest = &text[at + 1..];
            let signature = &rest[..rest.find('{').unwrap_or(rest.len())];
            let Some(name) = signature.strip_prefix("pub async fn ").or_else(|| signature.strip_prefix("pub fn "))
            else {
                continue;
            };
            if signature.contains("-> Result<Response, ApiError>") {
                let name = &name[..name.find(['(', '<']).unwrap()];
                handlers.push(format!("{module}::{name}"));
            }
        }
    }
    assert!(handlers.len() >= 40, "handlers found: {handlers:?}");
    for handler in handlers {
        let called = format!("{handler}(");
        assert!(
            ROUTES.iter().any(|route| route.calls.replace(' ', "").contains(&called)),
            "{handler} is a handler no line of the route table calls"
        );
    }
}

#[test]
fn paths_match_whole_segments_and_methods_are_listed_as_the_original_words_them() {
    assert!(
        matches!(find("/v1-alpha/units/a.service", &Method::DELETE), Found::Route(route, _) if route.pattern == "/fleet/v1/units/{unit}")
    );
    assert!(
        matches!(find("/fleet/v1/units/a%2Fb.service", &Method::GET), Found::Route(_, params) if params == ["a/b.service"])
    );
    assert!(matches!(find("/fleet/v1/units/%ff", &Method::GET), Found::Nothing));
    // A path a segment longer or shorter than every pattern it begins like matches none.
    for path in ["/fleet/v1/units/a.service/extra", "/fleet/v1/agents/m1/bodies/h/extra", "/fleet/v1/agents/m1/journal"]
    {
        assert!(matches!(find(path, &Method::GET), Found::Nothing), "{path}");
        assert!(matches!(find(path, &Method::POST), Found::Nothing), "{path}");
    }
    let refusal = |path: &str, method: Method| match find(path, &method) {
        Found::WrongMethod(message) => message,
        _ => panic!("{method} {path} is not a wrong method"),
    };
    assert_eq!(refusal("/", Method::PUT), "");
    assert_eq!(refusal("/fleet/v1", Method::PUT), "");
    assert_eq!(refusal("/fleet/v1/units", Method::PUT), "only GET supported against this resource");
    assert_eq!(
        refusal("/fleet/v1/units/a.service", Method::POST),
        "only GET, PUT and DELETE supported against this resource"
    );
    assert_eq!(refusal("/fleet/v1/machines", Method::PUT), "only GET and PATCH supported against this resource");
    assert_eq!(refusal("/fleet/v1/tokens", Method::PUT), "only GET and POST supported against this resource");
}
