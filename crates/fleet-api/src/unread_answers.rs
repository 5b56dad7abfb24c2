//! Answers built and not yet read by their client. A client that never opens its HTTP/2
//! window (or never reads its socket) makes every answer it asks for wait in fleetd's memory
//! (issue 67: 32 connections of 64 streams of a 392 KB page took fleetd from 29 MB to 839 MB).
//! So what waits is bounded: a connection holds at most [`MOST_PER_CONNECTION`] bytes of
//! answers (or one answer, however large) and fleetd [`MOST_IN_ALL`] (an answer past either is
//! refused with a 503, its page dropped at once), an answer goes out [`CHUNK`] bytes at a time,
//! and a connection whose client took nothing of what it holds for [`STALL`] is closed, which
//! drops it all.
//! Streams (events, long polls) have no size and are not held here: they make what they send
//! as it is taken. And what a page costs while it is built (the store's records, their schema,
//! the JSON) is bounded by building [`PAGE_BUILDS_AT_ONCE`] at a time, whatever the number of
//! connections and streams asking.

use fleet_core::unpoisoned::Locked;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as _, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::ApiError;

/// The most bytes of unread answers one connection holds.
pub const MOST_PER_CONNECTION: usize = 4 << 20;
/// The most bytes of unread answers all connections hold together.
pub const MOST_IN_ALL: usize = 64 << 20;
/// How long a connection may hold answers its client takes nothing of.
pub const STALL: Duration = Duration::from_secs(30);
/// The bytes an answer goes out in at a time.
const CHUNK: usize = 16 << 10;

/// Pages of a list built at the same time.
pub const PAGE_BUILDS_AT_ONCE: usize = 4;

/// Every connection's unread answers, in bytes.
static IN_ALL: AtomicUsize = AtomicUsize::new(0);

static PAGE_BUILDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(PAGE_BUILDS_AT_ONCE);

/// Waits for a turn to build a page of a list; the turn lasts as long as what it returns.
pub async fn page_build_turn() -> tokio::sync::SemaphorePermit<'static> {
    // The semaphore is never closed.
    loop {
        if let Ok(turn) = PAGE_BUILDS.acquire().await {
            return turn;
        }
    }
}

/// One connection's unread answers.
pub struct ConnectionAnswers {
    held: AtomicUsize,
    /// When its client last took a piece of an answer (or it began holding one).
    progress: Mutex<Instant>,
    /// Rings when it begins holding answers.
    holding: Notify,
    most: usize,
}

impl ConnectionAnswers {
    pub fn new() -> Arc<Self> {
        Self::with_bound(MOST_PER_CONNECTION)
    }

    fn with_bound(most: usize) -> Arc<Self> {
        Arc::new(Self { held: AtomicUsize::new(0), progress: Mutex::new(Instant::now()), holding: Notify::new(), most })
    }

    /// Bytes of answers this connection holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// `response` held as this connection's until its client has taken it; a 503 instead when
    /// the connection or fleetd holds too much already.
    pub fn hold(self: &Arc<Self>, response: Response) -> Response {
        let Some(size) = response.body().size_hint().exact() else { return response };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size == 0 {
            return response;
        }
        if let Err(refused) = self.reserve(size) {
            return refused.into_response();
        }
        let (parts, body) = response.into_parts();
        let held = Held { inner: body, pending: Bytes::new(), left: size, connection: Some(self.clone()), size };
        Response::from_parts(parts, Body::new(held))
    }

    fn reserve(&self, size: usize) -> Result<(), ApiError> {
        let before = self.held.fetch_add(size, Ordering::SeqCst);
        let all = IN_ALL.fetch_add(size, Ordering::SeqCst);
        // A connection holding nothing takes one answer of any size (fleetd's bound still
        // holds): the bound is on what piles up unread, and a lone answer past it (the metrics
        // of 10,000 machines, over 4 MiB) would otherwise be refused to every client.
        let connection_full = before > 0 && before.saturating_add(size) > self.most;
        if connection_full || all.saturating_add(size) > MOST_IN_ALL {
            self.release(size);
            let why = if connection_full { "this connection" } else { "fleetd" };
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{why} holds too many answers not read yet; read those before asking for more"),
            ));
        }
        if before == 0 {
            *self.progress.locked() = Instant::now();
            self.holding.notify_one();
        }
        Ok(())
    }

    fn release(&self, size: usize) {
        self.held.fetch_sub(size, Ordering::SeqCst);
        IN_ALL.fetch_sub(size, Ordering::SeqCst);
    }

    fn took(&self) {
        *self.progress.locked() = Instant::now();
    }

    /// Resolves once this connection has held answers for [`STALL`] with nothing taken.
    pub async fn stalled(&self) {
        self.stalled_after(STALL).await;
    }

    async fn stalled_after(&self, stall: Duration) {
        loop {
            while self.held() == 0 {
                let ringing = self.holding.notified();
                if self.held() > 0 {
                    break;
                }
                ringing.await;
            }
            let since = *self.progress.locked();
            if since.elapsed() >= stall && self.held() > 0 {
                return;
            }
            tokio::time::sleep_until(since + stall).await;
        }
    }
}

/// An answer held for its connection until it is taken or dropped.
struct Held {
    inner: Body,
    /// What the inner body gave and is not out yet.
    pending: Bytes,
    left: usize,
    connection: Option<Arc<ConnectionAnswers>>,
    size: usize,
}

impl Held {
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take() {
            connection.release(self.size);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.finish();
    }
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.pending.is_empty() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.pending = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                other => return other,
            }
        }
        let piece = this.pending.split_to(this.pending.len().min(CHUNK));
        this.left = this.left.saturating_sub(piece.len());
        if let Some(connection) = &this.connection {
            connection.took();
        }
        if this.left == 0 && this.pending.is_empty() {
            this.finish();
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0 && self.pending.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(u64::try_from(self.left).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn page(bytes: usize) -> Response {
        (StatusCode::OK, vec![b'x'; bytes]).into_response()
    }

    #[tokio::test]
    async fn an_answer_goes_out_in_pieces_and_is_released_once_taken() {
        let connection = ConnectionAnswers::with_bound(1 << 20);
        let held = connection.hold(page(100_000));
        assert_eq!(held.status(), StatusCode::OK);
        assert_eq!(held.body().size_hint().exact(), Some(100_000), "its length is still known");
        assert_eq!(connection.held(), 100_000);
        let mut body = held.into_body();
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            pieces.push(frame.expect("a frame").into_data().expect("data").len());
        }
        assert!(pieces.iter().all(|piece| *piece <= CHUNK) && pieces.iter().sum::<usize>() == 100_000, "{pieces:?}");
        assert_eq!(connection.held(), 0, "taken");
        let dropped = connection.hold(page(5_000));
        assert_eq!(connection.held(), 5_000);
        drop(dropped);
        assert_eq!(connection.held(), 0, "dropped unread");
    }

    #[tokio::test]
    async fn past_the_bound_an_answer_is_refused_and_dropped() {
        let connection = ConnectionAnswers::with_bound(300_000);
        let kept: Vec<Response> = (0..3).map(|_| connection.hold(page(100_000))).collect();
        assert!(kept.iter().all(|answer| answer.status() == StatusCode::OK));
        let refused = connection.hold(page(100_000));
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(connection.held(), 300_000, "the refused page is not held");
        drop(kept);
        assert_eq!(connection.hold(page(100_000)).status(), StatusCode::OK, "room again");
    }

    #[tokio::test]
    async fn one_answer_larger_than_the_bound_goes_out_alone() {
        let connection = ConnectionAnswers::with_bound(300_000);
        let large = connection.hold(page(1_000_000));
        assert_eq!(large.status(), StatusCode::OK, "a connection holding nothing takes it");
        let refused = connection.hold(page(1_000));
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "nothing more beside it");
        drop(large);
        assert_eq!(connection.held(), 0);
        let small = connection.hold(page(1_000));
        assert_eq!(connection.hold(page(1_000_000)).status(), StatusCode::SERVICE_UNAVAILABLE, "not beside another");
        drop(small);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_client_takes_nothing_is_stalled_and_one_that_reads_is_not() {
        let connection = ConnectionAnswers::with_bound(1 << 20);
        let stall = Duration::from_secs(30);
        // Holding nothing, it never stalls.
        let idle = tokio::time::timeout(stall * 4, connection.stalled_after(stall)).await;
        assert!(idle.is_err(), "a connection holding nothing is not stalled");
        let mut body = connection.hold(page(64 * 1024)).into_body();
        // A piece taken every 20 s keeps it going.
        for _ in 0..3 {
            let waited = tokio::time::timeout(Duration::from_secs(20), connection.stalled_after(stall)).await;
            assert!(waited.is_err(), "its client reads");
            body.frame().await.expect("a piece").expect("data");
        }
        let started = Instant::now();
        connection.stalled_after(stall).await;
        assert_eq!(started.elapsed(), stall, "stalled once nothing was taken for the whole span");
    }
}
