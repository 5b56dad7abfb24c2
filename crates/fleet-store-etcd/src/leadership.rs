//! The engine leadership this fleetd holds, and the keeper that renews its lease in the
//! background: a pass that waits on a slow store (a first listing over a lossy link, a long
//! apply) must not leave the lease unrenewed, or etcd ends the leadership under a healthy
//! leader and the standby takes over for nothing. The keeper renews only while the engine
//! comes by (a pass, a batch of its writes) within [`ENGINE_SILENCE`] lives of the lease: an
//! engine wedged in a pass that never ends lets its lease lapse, and a standby leads.

use fleet_core::unpoisoned::Locked;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_core::backoff::Backoff;
use tokio::time::Instant;

use super::connection::Connection;
use super::session::{RENEWAL_RETRY, jitter_sample, renew, renewal_patience};

/// How many lives of the lease the engine may go without coming by before its keeper stops
/// renewing the lease.
pub const ENGINE_SILENCE: u32 = 3;

/// The engine leadership this fleetd holds. Dropping it stops its keeper.
pub struct Leadership {
    pub lease: i64,
    /// The leader key's create revision: the fence every schedule write checks.
    pub token: i64,
    pub clock: std::sync::Arc<LeaseClock>,
    keeper: tokio::task::AbortHandle,
}

impl Leadership {
    /// Holds `lease` (granted for `ttl` when `granted` was sent) under `token`, renewed from
    /// now on by a keeper on `connection`.
    pub fn hold(connection: Connection, lease: i64, token: i64, ttl: Duration, granted: Instant) -> Self {
        let clock = std::sync::Arc::new(LeaseClock {
            ttl,
            renewed: Mutex::new(granted),
            came_by: Mutex::new(granted),
            gone: AtomicBool::new(false),
        });
        let keeper = tokio::spawn(keep_renewed(connection, lease, clock.clone())).abort_handle();
        Self { lease, token, clock, keeper }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// What the keeper knows of the lease: when the last renewal that worked was sent (etcd
/// started counting later, when it received it), when the engine last came by, and whether
/// etcd said the lease is gone.
pub struct LeaseClock {
    ttl: Duration,
    renewed: Mutex<Instant>,
    came_by: Mutex<Instant>,
    gone: AtomicBool,
}

impl LeaseClock {
    /// Whether the lease lives by this clock: etcd has not said it is gone, and its time to
    /// live has not passed since the last renewal sent.
    pub fn lives(&self) -> bool {
        !self.gone() && self.since_renewed() < self.ttl
    }

    /// Whether etcd said the lease is gone.
    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Notes that the engine is at work (a pass began, or a batch of its writes).
    pub fn came_by(&self) {
        *self.came_by.locked() = Instant::now();
    }

    /// Whether the engine came by within [`ENGINE_SILENCE`] lives of the lease.
    fn engine_at_work(&self) -> bool {
        self.came_by.locked().elapsed() < self.ttl * ENGINE_SILENCE
    }

    pub fn since_renewed(&self) -> Duration {
        self.renewed.locked().elapsed()
    }

    fn mark_renewed(&self, sent: Instant) {
        let mut renewed = self.renewed.locked();
        *renewed = (*renewed).max(sent);
    }

    /// Moves the last renewal back by `by`, as if time had passed without one.
    #[cfg(test)]
    pub fn age(&self, by: Duration) {
        let mut renewed = self.renewed.locked();
        *renewed = renewed.checked_sub(by).unwrap_or(*renewed);
    }
}

/// Sends a renewal of the lease every third of its time to live, until etcd says the lease is
/// gone. A renewal etcd refused is tried again within a second (sooner for a short lease); one
/// that got no answer within its patience (a quarter of the lease's life at most) is tried
/// again at once on a new stream: it already waited, and a lease of a few seconds over a
/// lossy link would otherwise end behind one stalled connection while its leader is healthy.
async fn keep_renewed(connection: Connection, lease: i64, clock: std::sync::Arc<LeaseClock>) {
    let period = clock.ttl / 3;
    let patience = renewal_patience(connection.timeout, clock.ttl);
    let mut retry = Backoff::new(RENEWAL_RETRY.min(period / 2), period);
    let mut keeper = None;
    let mut wait = period;
    let (mut silent, mut told_late) = (false, false);
    loop {
        tokio::time::sleep(wait).await;
        if !clock.engine_at_work() {
            if !std::mem::replace(&mut silent, true) {
                tracing::warn!(
                    lives = ENGINE_SILENCE,
                    "the engine has not passed for that many lives of its lease: the lease is left to lapse"
                );
            }
            wait = period;
            continue;
        }
        silent = false;
        let sent = Instant::now();
        wait = match renew(&connection, lease, &mut keeper, patience).await {
            Ok(true) => {
                clock.mark_renewed(sent);
                retry.reset();
                told_late = false;
                period.saturating_sub(sent.elapsed())
            }
            Ok(false) => {
                clock.gone.store(true, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                let since_renewed = clock.since_renewed();
                if since_renewed >= clock.ttl / 2 && !std::mem::replace(&mut told_late, true) {
                    tracing::warn!(%error, ?since_renewed, ttl = ?clock.ttl, "the engine lease has not been renewed for half its life; trying again");
                } else {
                    tracing::debug!(%error, ?since_renewed, "engine lease not renewed; trying again");
                }
                retry_after_failure(sent.elapsed(), patience, &mut retry)
            }
        };
    }
}

/// How long the keeper waits to renew again after a renewal that failed having waited
/// `waited`: at once when it got no answer within its `patience` (the wait is spent; the next
/// renewal opens a new stream), after `retry`'s next delay when etcd refused it.
fn retry_after_failure(waited: Duration, patience: Duration, retry: &mut Backoff) -> Duration {
    if waited >= patience { Duration::ZERO } else { retry.next_delay_jittered(jitter_sample()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_without_an_answer_is_tried_again_at_once_and_a_refused_one_after_a_delay() {
        let patience = Duration::from_millis(750);
        let mut retry = Backoff::new(Duration::from_millis(500), Duration::from_secs(1));
        assert_eq!(retry_after_failure(patience, patience, &mut retry), Duration::ZERO, "no answer within patience");
        let refused = retry_after_failure(Duration::from_millis(3), patience, &mut retry);
        assert!(refused > Duration::ZERO, "a refusal waits before the next try: {refused:?}");
        assert!(refused <= Duration::from_secs(1), "within the backoff's bound: {refused:?}");
    }

    #[test]
    fn a_renewal_waits_a_quarter_of_a_short_lease_and_the_request_timeout_of_a_long_one() {
        let (lab, default) = (Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!(renewal_patience(Duration::from_secs(2), lab), Duration::from_millis(750));
        assert_eq!(renewal_patience(Duration::from_secs(1), default), Duration::from_secs(1));
    }
}
