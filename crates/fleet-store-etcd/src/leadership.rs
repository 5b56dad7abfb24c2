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
use super::session::{RENEWAL_RETRY, jitter_sample, renew};

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

/// Sends a renewal of the lease every third of its time to live, a failed renewal again within a second
/// (sooner for a short lease), until etcd says the lease is gone.
async fn keep_renewed(connection: Connection, lease: i64, clock: std::sync::Arc<LeaseClock>) {
    let period = clock.ttl / 3;
    let mut retry = Backoff::new(RENEWAL_RETRY.min(period / 2), period);
    let mut keeper = None;
    let mut wait = period;
    let mut silent = false;
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
        wait = match renew(&connection, lease, &mut keeper).await {
            Ok(true) => {
                clock.mark_renewed(sent);
                retry.reset();
                period.saturating_sub(sent.elapsed())
            }
            Ok(false) => {
                clock.gone.store(true, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                tracing::debug!(%error, since_renewed = ?clock.since_renewed(), "engine lease not renewed; trying again");
                retry.next_delay_jittered(jitter_sample())
            }
        };
    }
}
