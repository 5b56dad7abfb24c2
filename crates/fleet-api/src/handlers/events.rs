//! `GET /fleet/v1/events`: the cluster's events as server-sent events, each with its index as
//! its id. A reader resumes after an index (`?since=` or the `Last-Event-ID` a browser sends
//! again), filtered by unit pattern, machine, kind and time (`?from=`, RFC 3339: the events
//! of that moment or later); it is told 410 with the oldest index
//! kept when events after its index were trimmed. It sees only events of what it may read.
//! `?follow=false` ends the stream once the events kept are sent.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_api_schema::ClusterEvent;
use fleet_core::access::Role;
use fleet_core::events::{Event, EventFilter, EventKind, visible_to};
use fleet_core::glob::Glob;
use fleet_registry::ChangeSignal;

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::feed_slots::FeedSlot;
use crate::query::{first_value, flag};

/// How many events one read of the log brings.
const PAGE: usize = 500;
/// About the most one write to the connection holds: a follower behind by 100,000 events
/// gets them in a few hundred writes, not 100,000.
const CHUNK_BYTES: usize = 64 * 1024;
/// A comment line now and then keeps proxies from closing an idle stream.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// The longest unit pattern or machine a filter takes.
const LONGEST_FILTER: usize = 256;

/// What a request asks for, validated.
struct Asked {
    after: u64,
    filter: EventFilter,
    follow: bool,
}

fn asked(query: &[(String, String)], headers: &HeaderMap) -> Result<Asked, ApiError> {
    let resumed = headers.get("last-event-id").map(|value| value.to_str().unwrap_or("-"));
    let after = match resumed.or_else(|| first_value(query, "since")) {
        None | Some("") => 0,
        Some(text) => text
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid since {:?}: an event index", bounded(text))))?,
    };
    let unit = match first_value(query, "unit").filter(|pattern| !pattern.is_empty()) {
        None => None,
        Some(pattern) if pattern.len() > LONGEST_FILTER => {
            return Err(ApiError::bad_request(format!("unit pattern longer than {LONGEST_FILTER} bytes")));
        }
        Some(pattern) => {
            Some(Glob::new(pattern).ok_or_else(|| ApiError::bad_request(format!("invalid unit pattern {pattern:?}")))?)
        }
    };
    let machine = match first_value(query, "machine").filter(|machine| !machine.is_empty()) {
        Some(machine) if machine.len() > LONGEST_FILTER || !machine.chars().all(|c| c.is_ascii_graphic()) => {
            return Err(ApiError::bad_request("invalid machine: a machine ID or the start of one"));
        }
        machine => machine.map(str::to_string),
    };
    let mut kinds = Vec::new();
    for name in query.iter().filter(|(key, _)| key == "kind").flat_map(|(_, value)| value.split(',')) {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let kind = EventKind::parse(name).ok_or_else(|| {
            let known: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.name()).collect();
            ApiError::bad_request(format!("invalid kind {:?}: one of {}", bounded(name), known.join(", ")))
        })?;
        kinds.push(kind);
    }
    let from = match first_value(query, "from").filter(|from| !from.is_empty()) {
        None => None,
        Some(text) => Some(fleet_core::civil_time::micros_of_rfc3339(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "invalid from {:?}: a time in RFC 3339 (2026-12-07T06:00:00Z)",
                bounded(text)
            ))
        })?),
    };
    let follow = flag(query, "follow", true)?;
    Ok(Asked { after, filter: EventFilter { unit, machine, kinds, from }, follow })
}

/// `text`, cut short for an error message.
fn bounded(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

pub fn shown(event: &Event) -> ClusterEvent {
    ClusterEvent {
        index: event.index,
        time: fleet_core::civil_time::rfc3339_of_micros(event.event.at),
        kind: event.event.kind.name().to_string(),
        unit: event.event.unit.clone(),
        units: event.event.units.clone(),
        machine_id: event.event.machine.clone(),
        by: event.event.by.clone(),
        message: event.event.message.clone(),
    }
}

/// `event` as one server-sent event.
fn encoded(event: &Event) -> String {
    match serde_json::to_string(&shown(event)) {
        Ok(json) => format!("id: {}\nevent: {}\ndata: {json}\n\n", event.index, event.event.kind.name()),
        Err(_) => ": unencodable event\n\n".to_string(),
    }
}

/// One reader's stream between events.
struct Stream {
    state: ApiState,
    role: Role,
    filter: EventFilter,
    after: u64,
    pending: VecDeque<Event>,
    changes: ChangeSignal,
    follow: bool,
    /// Ended: told it fell behind what is kept.
    ended: bool,
    /// Given back when the stream ends (dropped with the connection).
    _slot: FeedSlot,
}

impl Stream {
    /// Reads what came after the last index read; `false` when the reader fell so far behind
    /// that events it had not read were trimmed.
    async fn read_on(&mut self) -> Result<(bool, bool), ApiError> {
        self.changes.borrow_and_update();
        let page = self.state.registry.events_after(self.after, PAGE).await?;
        if page.missed_after(self.after) {
            return Ok((false, false));
        }
        self.take(page.events);
        Ok((true, page.more))
    }

    /// Takes events read after the last: this reader's next index, and those it sees and
    /// asked for to send.
    fn take(&mut self, events: Vec<Event>) {
        if let Some(last) = events.last() {
            self.after = last.index;
        }
        let (role, filter) = (&self.role, &self.filter);
        self.pending.extend(events.into_iter().filter(|e| visible_to(role, &e.event) && filter.admits(&e.event)));
    }
}

async fn next_event(mut stream: Stream) -> Option<(Result<Bytes, Infallible>, Stream)> {
    loop {
        if stream.ended {
            return None;
        }
        if !stream.pending.is_empty() {
            let mut chunk = String::new();
            while chunk.len() < CHUNK_BYTES
                && let Some(event) = stream.pending.pop_front()
            {
                chunk.push_str(&stream.state.encoded_events.sent(&event, encoded));
            }
            return Some((Ok(Bytes::from(chunk)), stream));
        }
        match stream.read_on().await {
            Ok((false, _)) => {
                // Trimmed past what this reader had read: it is told so, and reconnects.
                let text = format!("event: gone\ndata: {{\"after\":{}}}\n\n", stream.after);
                stream.ended = true;
                return Some((Ok(Bytes::from(text)), stream));
            }
            Ok((true, more)) if !stream.pending.is_empty() || more => continue,
            Ok(_) if !stream.follow => return None,
            Ok(_) => match tokio::time::timeout(KEEPALIVE, stream.changes.changed()).await {
                Err(_) => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), stream)),
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return None,
            },
            Err(_) => return None,
        }
    }
}

pub async fn get(
    state: &ApiState,
    identity: &Identity,
    headers: &HeaderMap,
    query: &[(String, String)],
) -> Result<Response, ApiError> {
    let Asked { after, filter, follow } = asked(query, headers)?;
    let mut changes = state.registry.event_changes();
    changes.borrow_and_update();
    let first = state.registry.events_after(after, PAGE).await?;
    if first.missed_after(after) {
        let oldest = first.oldest.map_or(first.trimmed_through, |oldest| oldest.saturating_sub(1));
        let message = format!(
            "events after {after} are no longer kept; the oldest kept is after {oldest}: read again with since={oldest}"
        );
        let mut gone = ApiError::new(StatusCode::GONE, message).into_response();
        gone.headers_mut().insert("x-fleet-oldest-index", HeaderValue::from(oldest));
        return Ok(gone);
    }
    let slot = match state.feed_slots.take_or_refuse(&identity.name) {
        Ok(slot) => slot,
        Err(refused) => return Ok(*refused),
    };
    let role = identity.role.clone();
    let mut stream = Stream {
        state: state.clone(),
        role,
        filter,
        after,
        pending: VecDeque::new(),
        changes,
        follow,
        ended: false,
        _slot: slot,
    };
    stream.take(first.events);
    let body = Body::from_stream(futures_util::stream::unfold(stream, next_event));
    let mut response = ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}
