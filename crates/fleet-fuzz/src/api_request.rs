//! The API as a client reaches it: arbitrary method, path, query, headers and body, through
//! the real router on an embedded store. No request may panic a handler or get a 5xx.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use fleet_api::{ApiState, PageSize, router};
use fleet_store_embedded::EmbeddedRegistry;
use tower::ServiceExt;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    state: ApiState,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let registry = EmbeddedRegistry::open(&dir.path().join("fuzz.redb")).expect("embedded store");
        let state = ApiState {
            page_size: PageSize::new(2),
            ..ApiState::new(Arc::new(registry.clone()), fleet_api::auth::Auth::new(Arc::new(registry), None))
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Fixture { runtime, state, _dir: dir }
    })
}

const METHODS: &[&str] = &["GET", "PUT", "DELETE", "PATCH", "POST", "HEAD", "OPTIONS"];
const PREFIXES: &[&str] =
    &["/fleet/v1/units/", "/fleet/v1/units", "/fleet/v1/machines", "/fleet/v1/state", "/fleet/v1/", "/fleet/v1/tokens"];

/// Input layout: a byte choosing the method and path prefix (and, with its high bit, a TCP
/// client whose `Authorization` header is the body's first line instead of the Unix socket's
/// administrator), then the rest of the path and query up to a newline, then the body.
pub fn api_request(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    let prefix = PREFIXES[usize::from(selector / 8) % PREFIXES.len()];
    let (tail, body) = match rest.iter().position(|byte| *byte == b'\n') {
        Some(end) => (&rest[..end], &rest[end + 1..]),
        None => (rest, &[][..]),
    };
    let uri = format!("{prefix}{}", String::from_utf8_lossy(tail));
    let Ok(mut request) = Request::builder()
        .method(method)
        .uri(uri.as_str())
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    let mut credential: &[u8] = &[];
    if selector & 0x80 == 0 {
        // As the Unix socket's administrator: every handler is reachable.
        request.extensions_mut().insert(fleet_api::auth::Peer::Unix { uid: Some(0) });
    } else {
        request.extensions_mut().insert(fleet_api::auth::Peer::Tcp { tls: false, certificate: None });
        credential = body.split(|byte| *byte == b'\n').next().unwrap_or_default();
        if let Ok(value) = axum::http::HeaderValue::from_bytes(credential) {
            request.headers_mut().insert(axum::http::header::AUTHORIZATION, value);
        }
    }
    let fixture = fixture();
    let router = router(fixture.state.clone());
    let response = fixture.runtime.block_on(router.oneshot(request)).expect("the router never fails");
    let status = response.status();
    assert!(!status.is_server_error(), "{method} {uri} answered {status}");
    // A HEAD answer has no body by definition.
    if status.is_client_error() && method != "HEAD" {
        let bytes = fixture.runtime.block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).expect("a body");
        let error: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|error| panic!("{method} {uri} answered {status} with no JSON error: {error}"));
        assert!(error["error"]["code"].is_u64(), "{method} {uri}: {error}");
        // A credential is never echoed (a long one, that a path or body cannot contain by chance).
        let secret = credential.rsplit(|byte| *byte == b' ').next().unwrap_or_default();
        assert!(
            status != axum::http::StatusCode::UNAUTHORIZED
                || secret.len() < 12
                || !bytes.windows(secret.len()).any(|window| window == secret),
            "{method} {uri}: the credential is in the answer"
        );
    }
}
