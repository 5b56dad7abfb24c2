//! The machine's work as last read from its manager, reused while its change stream says
//! nothing changed: the agent's periodic pass then costs the manager nothing (no connection
//! to open, no request), and only a change, a stream lost or [`LONGEST_KEPT`] makes it read
//! again.

use fleet_core::unpoisoned::Locked;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use fleet_api_schema::AgentWork;
use tokio::time::Instant;

/// The longest a read of the work is reused, however quiet the stream.
const LONGEST_KEPT: Duration = Duration::from_secs(30 * 60);

#[derive(Default)]
pub(crate) struct KeptWork {
    kept: Mutex<Option<Kept>>,
    /// Moves on with every word of the stream that may mean new work, and when it opens or ends.
    epoch: AtomicU64,
    /// Whether a change stream is open now (long polls keep nothing).
    following: AtomicBool,
}

struct Kept {
    work: AgentWork,
    /// The epoch when its read started: it holds while nothing moved since.
    epoch: u64,
    read_at: Instant,
}

impl KeptWork {
    fn move_on(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    pub fn stream_opened(&self) {
        self.following.store(true, Ordering::SeqCst);
        self.move_on();
    }

    pub fn stream_ended(&self) {
        self.following.store(false, Ordering::SeqCst);
        self.move_on();
    }

    /// The stream said the work may have changed (or asked for a journal).
    pub fn changes_heard(&self) {
        self.move_on();
    }

    /// Where things stand before a read of the work: what [`KeptWork::keep`] is given.
    pub fn before_read(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Keeps `work`, read from a start at `epoch`, unless what is kept is newer (a stream
    /// carried it while this read was on its way).
    pub fn keep(&self, work: &AgentWork, epoch: u64) {
        let mut kept = self.kept.locked();
        if kept.as_ref().is_some_and(|kept| kept.epoch > epoch) {
            return;
        }
        *kept = Some(Kept { work: work.clone(), epoch, read_at: Instant::now() });
    }

    /// The work kept, while a stream has been open since its read began and said nothing new.
    pub fn current(&self) -> Option<AgentWork> {
        if !self.following.load(Ordering::SeqCst) {
            return None;
        }
        let kept = self.kept.locked();
        let kept = kept.as_ref()?;
        let fresh = kept.epoch == self.epoch.load(Ordering::SeqCst) && kept.read_at.elapsed() < LONGEST_KEPT;
        fresh.then(|| kept.work.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(number: u64) -> AgentWork {
        let unit = fleet_api_schema::AgentUnit { name: format!("u{number}.service"), ..Default::default() };
        AgentWork { scheduled: vec![unit], ..AgentWork::default() }
    }

    #[tokio::test(start_paused = true)]
    async fn work_is_reused_only_while_the_stream_is_open_and_quiet() {
        let kept = KeptWork::default();
        let epoch = kept.before_read();
        kept.keep(&work(1), epoch);
        assert_eq!(kept.current(), None, "no stream open: nothing is reused");

        kept.stream_opened();
        assert_eq!(kept.current(), None, "read before the stream opened");
        let epoch = kept.before_read();
        kept.keep(&work(2), epoch);
        assert_eq!(kept.current(), Some(work(2)));

        let epoch = kept.before_read();
        kept.changes_heard();
        kept.keep(&work(3), epoch);
        assert_eq!(kept.current(), None, "a change heard while the read was on its way");
        let epoch = kept.before_read();
        kept.keep(&work(4), epoch);
        assert_eq!(kept.current(), Some(work(4)));

        tokio::time::advance(LONGEST_KEPT).await;
        assert_eq!(kept.current(), None, "read again after a while, however quiet");
        let epoch = kept.before_read();
        kept.keep(&work(5), epoch);
        kept.stream_ended();
        assert_eq!(kept.current(), None, "the stream ended");
    }
}
