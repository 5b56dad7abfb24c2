//! Whether a simulated fleetd is frozen (SIGSTOP), for everything it does to wait on. Not a
//! `watch` channel: tokio's wakes its waiters in a random order, and a seed must replay the
//! same run; a `Notify` wakes them in the order they came.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Gate {
    frozen: AtomicBool,
    thawed: Notify,
}

impl Gate {
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        self.thawed.notify_waiters();
    }

    /// Returns at once unless frozen; then when thawed.
    pub async fn passed(&self) {
        loop {
            let thawed = self.thawed.notified();
            tokio::pin!(thawed);
            thawed.as_mut().enable();
            if !self.frozen.load(Ordering::SeqCst) {
                return;
            }
            thawed.await;
        }
    }
}
