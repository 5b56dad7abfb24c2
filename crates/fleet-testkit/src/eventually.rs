//! Waiting in tests for something that becomes true: polled, bounded, and in tokio's time,
//! so it also works (and costs nothing) under paused time.

use std::time::Duration;

/// Polls `check` every 10 ms until it holds; panics naming `what` after 10 s.
pub async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    eventually_within(what, Duration::from_secs(10), check).await;
}

/// [`eventually`], for a condition that may take up to `limit` to come.
pub async fn eventually_within(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}
