//! The API as an outsider reaches it: any route, any method, any path parameters, query and
//! body, with every credential an outsider can bring but none that verifies (nothing, a
//! forged bearer or registration token, a webhook signature made with a guessed secret, Basic
//! credentials, a browser's cross-site headers). Whatever it sends, the store is not written
//! and no machine becomes present.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{HeaderValue, Request};
use fleet_api::{ApiState, PageSize, router};
use fleet_registry::{ApiRegistry, SourceRecord, SourceRegistry};
use fleet_store_embedded::EmbeddedRegistry;
use tower::ServiceExt;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    state: ApiState,
    registry: EmbeddedRegistry,
    _dir: tempfile::TempDir,
}

/// The secret the fixture's source `docs` verifies webhooks with; the fuzzer never has it.
const SECRET: &[u8] = b"the webhook secret nobody outside knows";

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let registry = EmbeddedRegistry::open(&dir.path().join("fuzz.redb")).expect("embedded store");
        let secrets = dir.path().join("secrets");
        std::fs::create_dir(&secrets).expect("secrets dir");
        std::fs::write(secrets.join("hook"), SECRET).expect("secret");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let source = SourceRecord {
            webhook_secret: Some("hook".into()),
            ..SourceRecord::new("docs", "https://example.com/docs.git")
        };
        runtime.block_on(registry.put_source(&source)).expect("a source");
        let state = ApiState {
            page_size: PageSize::new(2),
            agents: Some(Arc::new(registry.clone())),
            source_secrets_dir: Some(secrets),
            backup: None,
            ..ApiState::new(Arc::new(registry.clone()), fleet_api::auth::Auth::new(Arc::new(registry.clone()), None))
        };
        Fixture { runtime, state, registry, _dir: dir }
    })
}

const METHODS: &[&str] = &["GET", "PUT", "DELETE", "PATCH", "POST", "HEAD", "OPTIONS"];
/// Every path shape the API serves, with `{}` where the input's own text goes.
const PATHS: &[&str] = &[
    "/fleet/v1/units",
    "/fleet/v1/units/{}",
    "/fleet/v1/state/{}",
    "/fleet/v1/machines",
    "/fleet/v1/tokens",
    "/fleet/v1/tokens/{}",
    "/fleet/v1/registration-tokens",
    "/fleet/v1/sources/{}",
    "/fleet/v1/sources/{}/sync",
    "/fleet/v1/sources/docs/webhook",
    "/fleet/v1/sources/{}/webhook",
    "/fleet/v1/rollouts/{}",
    "/fleet/v1/rollouts/{}/pause",
    "/fleet/v1/agents/join",
    "/fleet/v1/agents/renew",
    "/fleet/v1/agents/{}/revoke",
    "/fleet/v1/agents/{}/forget",
    "/fleet/v1/agents/{}/machine",
    "/fleet/v1/agents/{}/work",
    "/fleet/v1/agents/{}/states",
    "/fleet/v1/agents/{}/journal/1",
    "/fleet/v1/agents/{}/{}",
    "/ui/events",
    "/{}",
];

/// The credential an outsider brings, by the input's choice; none of them verifies.
fn credential(choice: u8, line: &[u8], body: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let forged_signature = {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, line);
        let tag = ring::hmac::sign(&key, body);
        format!("sha256={}", tag.as_ref().iter().map(|byte| format!("{byte:02x}")).collect::<String>())
    };
    match choice % 7 {
        0 => Vec::new(),
        1 => vec![("authorization", [b"Bearer ".as_slice(), line].concat())],
        2 => vec![("authorization", format!("Bearer fleetreg_{}", String::from_utf8_lossy(line)).into_bytes())],
        3 => vec![("x-hub-signature-256", forged_signature.into_bytes())],
        4 => vec![("x-hub-signature-256", line.to_vec())],
        5 => vec![("authorization", [b"Basic ".as_slice(), line].concat())],
        _ => vec![
            ("origin", b"https://evil.example".to_vec()),
            ("sec-fetch-site", b"cross-site".to_vec()),
            ("content-type", line.to_vec()),
        ],
    }
}

/// Input layout: a byte choosing the method and the path, a byte choosing the credential,
/// then the path's text up to a newline, the credential's text up to a newline, then the
/// body.
pub fn api_unverified(data: &[u8]) {
    let [route, choice, rest @ ..] = data else { return };
    let method = METHODS[usize::from(*route) % METHODS.len()];
    let mut parts = rest.splitn(3, |byte| *byte == b'\n');
    let (text, line, body) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next());
    let body = body.unwrap_or_default();
    let text = String::from_utf8_lossy(text);
    let (first, second) = text.split_once('/').unwrap_or((&text, "work"));
    let path = PATHS[usize::from(*route / 8) % PATHS.len()].replacen("{}", first, 1).replacen("{}", second, 1);
    let Ok(mut request) = Request::builder().method(method).uri(path.as_str()).body(Body::from(body.to_vec())) else {
        return;
    };
    for (name, value) in credential(*choice, line, body) {
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            request.headers_mut().append(name, value);
        }
    }
    if !request.headers().contains_key("content-type") && choice & 0x80 != 0 {
        request.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    }
    request.extensions_mut().insert(fleet_api::auth::Peer::Tcp { tls: true, certificate: None });
    let fixture = fixture();
    let before = fixture.runtime.block_on(fixture.registry.revision()).expect("a revision");
    let response =
        fixture.runtime.block_on(router(fixture.state.clone()).oneshot(request)).expect("the router never fails");
    let status = response.status();
    let after = fixture.runtime.block_on(fixture.registry.revision()).expect("a revision");
    assert!(status.is_client_error(), "{method} {path} answered {status} to an unverified caller");
    assert_eq!(before, after, "{method} {path} ({status}) changed the store");
    assert_eq!(fixture.state.agent_presence.count(), 0, "{method} {path} ({status}) made a machine present");
}
