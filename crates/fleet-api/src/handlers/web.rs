//! The web view: a read-only page of the cluster (assets embedded in the binary) and its live
//! feed, `/ui/events`, as server-sent events: first every row, then only the rows that change;
//! besides, the latest of the cluster's events the watcher may see, then each as it is stored.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use fleet_core::events::{Event, visible_to};
use fleet_registry::ChangeSignal;
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

/// The cluster's events a watcher may see, as one `happened` message (oldest first).
fn happened(events: &[Event]) -> Bytes {
    let shown: Vec<_> = events.iter().map(super::events::shown).collect();
    match serde_json::to_string(&shown) {
        Ok(json) => Bytes::from(format!("event: happened\ndata: {json}\n\n")),
        Err(_) => Bytes::from_static(b": unencodable events\n\n"),
    }
}

/// How many of the latest events a new watcher is shown.
const LATEST_SHOWN: usize = 50;
/// How far back a new watcher's latest events are looked for (a scoped operator sees few).
const LATEST_SCANNED: usize = 5_000;
/// How many events one read of the log brings while following it.
const EVENTS_PAGE: usize = 500;

/// The latest events `role` may see (at most [`LATEST_SHOWN`], oldest first), and the index
/// of the newest event kept, seen or not, to follow the log from.
async fn latest_events(state: &ApiState, role: &Role) -> Result<(Vec<Event>, u64), ApiError> {
    let mut shown = Vec::new();
    let mut before = u64::MAX;
    let mut newest = 0;
    let mut scanned = 0;
    while shown.len() < LATEST_SHOWN && scanned < LATEST_SCANNED {
        let page = state.registry.events_before(before, EVENTS_PAGE).await?;
        let Some(last) = page.last() else { break };
        before = last.index;
        newest = newest.max(page[0].index);
        scanned += page.len();
        shown.extend(page.into_iter().filter(|e| visible_to(role, &e.event)));
    }
    shown.truncate(LATEST_SHOWN);
    shown.reverse();
    Ok((shown, newest))
}

/// What the feed of one watcher holds between events.
struct Feed {
    state: ApiState,
    role: Role,
    patches: broadcast::Receiver<Arc<Patch>>,
    first: Option<Patch>,
    /// The latest events, sent after the first view.
    first_events: Option<Vec<Event>>,
    /// The last event index read from the log (seen by this watcher or not).
    events_after: u64,
    event_changes: ChangeSignal,
    /// Events were stored since the log was last read: it is read then, a view beat after the
    /// first of them (a deadline, so that rows sent meanwhile do not put it off).
    events_due: Option<tokio::time::Instant>,
    /// Given back when the feed ends (its stream dropped with the connection).
    _slot: FeedSlot,
}

impl Feed {
    /// The events stored since the last read that this watcher may see.
    async fn new_events(&mut self) -> Result<Vec<Event>, ApiError> {
        self.events_due = None;
        let mut seen = Vec::new();
        loop {
            self.event_changes.borrow_and_update();
            let page = self.state.registry.events_after(self.events_after, EVENTS_PAGE).await?;
            if let Some(last) = page.events.last() {
                self.events_after = last.index;
            }
            seen.extend(page.events.into_iter().filter(|e| visible_to(&self.role, &e.event)));
            if !page.more {
                return Ok(seen);
            }
        }
    }
}

async fn next_event(mut feed: Feed) -> Option<(Result<Bytes, Infallible>, Feed)> {
    if let Some(first) = feed.first.take() {
        return Some((Ok(event(&first.visible_to(&feed.role))), feed));
    }
    if let Some(latest) = feed.first_events.take() {
        return Some((Ok(happened(&latest)), feed));
    }
    loop {
        // Rows first; the log is looked at on the view's own beat, not at each event stored
        // (read at each, it held a unit's row back by a beat: bench-web's (c) 270 ms → 500 ms).
        let next = tokio::select! {
            biased;
            patch = feed.patches.recv() => Next::Patch(patch),
            () = sleep_until_due(feed.events_due), if feed.events_due.is_some() => Next::Events,
            changed = feed.event_changes.changed(), if feed.events_due.is_none() => match changed {
                Ok(()) => {
                    feed.events_due = Some(tokio::time::Instant::now() + crate::live_view::READ_EVERY);
                    continue;
                }
                Err(_) => return None,
            },
            () = tokio::time::sleep(KEEPALIVE) => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), feed)),
        };
        match next {
            Next::Patch(Ok(patch)) => {
                let visible = patch.visible_to(&feed.role);
                if !visible.is_empty() {
                    return Some((Ok(event(&visible)), feed));
                }
            }
            // Too slow to follow: start again from a whole view.
            Next::Patch(Err(broadcast::error::RecvError::Lagged(_))) => {
                match crate::live_view::read_view(feed.state.registry.as_ref(), &Default::default()).await {
                    Ok(view) => return Some((Ok(event(&reset(&view).visible_to(&feed.role))), feed)),
                    Err(_) => return None,
                }
            }
            Next::Patch(Err(broadcast::error::RecvError::Closed)) => return None,
            Next::Events => match feed.new_events().await {
                Ok(events) if events.is_empty() => {}
                Ok(events) => return Some((Ok(happened(&events)), feed)),
                Err(_) => return None,
            },
        }
    }
}

/// Sleeps until `due` (for ever when there is none: the branch is disabled then).
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// What woke a feed.
enum Next {
    Patch(Result<Arc<Patch>, broadcast::error::RecvError>),
    Events,
}

pub async fn events(state: &ApiState, identity: &Identity) -> Result<Response, ApiError> {
    let slot = match state.feed_slots.take_or_refuse(&identity.name) {
        Ok(slot) => slot,
        Err(refused) => return Ok(*refused),
    };
    let (view, patches) = state.live_view.watch(state.registry.clone()).await?;
    let role = identity.role.clone();
    // Followed from before the latest are read: nothing stored in between is missed.
    let mut event_changes = state.registry.event_changes();
    event_changes.borrow_and_update();
    let (latest, events_after) = latest_events(state, &role).await?;
    let feed = Feed {
        state: state.clone(),
        role,
        patches,
        first: Some(reset(&view)),
        first_events: Some(latest),
        events_after,
        event_changes,
        events_due: None,
        _slot: slot,
    };
    let body = Body::from_stream(futures_util::stream::unfold(feed, next_event));
    let response = ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    let mut response = hardened(response);
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}
