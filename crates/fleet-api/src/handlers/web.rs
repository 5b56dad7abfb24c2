//! The web view: a read-only page of the cluster (assets embedded in the binary) and its live
//! feed, `/ui/events`, as server-sent events: first every row, then only the rows that change.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use tokio::sync::broadcast;

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::feed_slots::FeedSlot;
use crate::live_view::{Patch, reset};

/// The page's files, by the name they are asked for under `/ui/`.
pub const ASSETS: [(&str, &str, &str); 3] = [
    ("", "text/html; charset=utf-8", include_str!("../web/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../web/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("../web/app.css")),
];

/// A comment line now and then keeps proxies from closing an idle feed.
const KEEPALIVE: Duration = Duration::from_secs(15);

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `/` and `/ui` itself: to the page (so that its relative links resolve).
pub fn redirect_to_page() -> Response {
    hardened((StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, "/ui/")]).into_response())
}

pub fn asset(name: &str) -> Result<Response, ApiError> {
    let (_, content_type, text) =
        ASSETS.iter().find(|(asset, _, _)| *asset == name).ok_or_else(|| ApiError::not_found(""))?;
    Ok(hardened(([(header::CONTENT_TYPE, *content_type)], *text).into_response()))
}

fn event(patch: &Patch) -> Bytes {
    match serde_json::to_string(patch) {
        Ok(json) => Bytes::from(format!("event: patch\ndata: {json}\n\n")),
        Err(_) => Bytes::from_static(b": unencodable patch\n\n"),
    }
}

/// What the feed of one watcher holds between events.
struct Feed {
    state: ApiState,
    role: Role,
    patches: broadcast::Receiver<Arc<Patch>>,
    first: Option<Patch>,
    /// Given back when the feed ends (its stream dropped with the connection).
    _slot: FeedSlot,
}

async fn next_event(mut feed: Feed) -> Option<(Result<Bytes, Infallible>, Feed)> {
    if let Some(first) = feed.first.take() {
        return Some((Ok(event(&first.visible_to(&feed.role))), feed));
    }
    loop {
        match tokio::time::timeout(KEEPALIVE, feed.patches.recv()).await {
            Err(_) => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), feed)),
            Ok(Ok(patch)) => {
                let visible = patch.visible_to(&feed.role);
                if !visible.is_empty() {
                    return Some((Ok(event(&visible)), feed));
                }
            }
            // Too slow to follow: start again from a whole view.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                match crate::live_view::read_view(feed.state.registry.as_ref(), &Default::default()).await {
                    Ok(view) => return Some((Ok(event(&reset(&view).visible_to(&feed.role))), feed)),
                    Err(_) => return None,
                }
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => return None,
        }
    }
}

pub async fn events(state: &ApiState, identity: &Identity) -> Result<Response, ApiError> {
    let slot = match state.feed_slots.take_or_refuse(&identity.name) {
        Ok(slot) => slot,
        Err(refused) => return Ok(*refused),
    };
    let (view, patches) = state.live_view.watch(state.registry.clone()).await?;
    let role = identity.role.clone();
    let feed = Feed { state: state.clone(), role, patches, first: Some(reset(&view)), _slot: slot };
    let body = Body::from_stream(futures_util::stream::unfold(feed, next_event));
    let response = ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    let mut response = hardened(response);
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}
