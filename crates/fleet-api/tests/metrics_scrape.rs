//! What a scrape of `/metrics` costs and what a client can put in it. One test in its own
//! binary: the metrics are one static set per process, and nothing else may count into it
//! meanwhile.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, header};
use fleet_api::auth::{Auth, Peer};
use fleet_api::{ApiState, router};
use fleet_store_embedded::EmbeddedRegistry;
use tower::ServiceExt;

async fn call(router: &axum::Router, method: Method, path: &str, body: Option<&str>) -> (u16, String) {
    let mut request = Request::builder().method(method).uri(path);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let mut request = request.body(body.map_or(Body::empty(), |body| Body::from(body.to_string()))).expect("request");
    request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
    let response = router.clone().oneshot(request).await.expect("answer");
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The store request counts a scrape shows.
fn store_requests(scrape: &str) -> Vec<&str> {
    scrape.lines().filter(|line| line.starts_with("fleet_store_request_duration_seconds_count")).collect()
}

#[tokio::test]
async fn a_scrape_reads_no_store_and_makes_no_new_series() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let router = router(ApiState::new(store.clone(), Auth::new(store, None)));
    let unit =
        r#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/true"}]}"#;
    assert_eq!(call(&router, Method::PUT, "/fleet/v1/units/a.service", Some(unit)).await.0, 201);
    // What a client makes up: names, paths and methods of its own.
    call(&router, Method::GET, "/fleet/v1/units/madeup-4711.service", None).await;
    call(&router, Method::GET, "/madeup-path-4711", None).await;
    let brew = Method::from_bytes(b"BREW").expect("a method");
    call(&router, brew, "/fleet/v1/units", None).await;
    let (status, first) = call(&router, Method::GET, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(!store_requests(&first).is_empty(), "the store's requests are counted: {first}");
    let (_, second) = call(&router, Method::GET, "/metrics", None).await;
    assert_eq!(store_requests(&first), store_requests(&second), "the first scrape read the store");
    // Only labels can carry what a client sent (a value such as a duration's sum may hold
    // the same digits by chance).
    let labels: Vec<&str> = second
        .lines()
        .filter_map(|line| line.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map(|(labels, _)| labels))
        .collect();
    for made_up in ["4711", "BREW"] {
        assert!(
            !labels.iter().any(|labels| labels.contains(made_up)),
            "a client made a series with {made_up}:\n{second}"
        );
    }
    assert!(second.contains("method=\"OTHER\""), "an unknown method is counted as OTHER:\n{second}");
}
