//! Which failures of a reconciler's passes the log shows as warnings: a new failure, and the
//! same one again once a minute while it lasts. A pass that fails the same way on every wake
//! (a busy store, thousands of changes a second waking it) would otherwise fill the log with
//! one line per change; the repeats between go to the debug log.

use std::time::Duration;

use tokio::time::Instant;

/// How often a failure that lasts is warned of again.
pub const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// The last failure warned of, and when.
#[derive(Default)]
pub struct FailureLog {
    warned: Option<(String, Instant)>,
}

impl FailureLog {
    /// Whether the failure `message` at `now` is a warning (else a debug line).
    pub fn warns(&mut self, message: &str, now: Instant) -> bool {
        let repeat = self
            .warned
            .as_ref()
            .is_some_and(|(last, at)| last == message && now.saturating_duration_since(*at) < REPEAT_EVERY);
        if !repeat {
            self.warned = Some((message.to_string(), now));
        }
        !repeat
    }

    /// A pass succeeded: the next failure is news.
    pub fn recovered(&mut self) {
        self.warned = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_failure_warns_the_same_again_once_a_minute_and_after_a_success() {
        let mut log = FailureLog::default();
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert!(log.warns("etcd: no answer", at(0)));
        assert!(!log.warns("etcd: no answer", at(1)), "a repeat within the minute");
        assert!(log.warns("etcd: refused", at(2)), "another failure is news");
        assert!(!log.warns("etcd: refused", at(61)));
        assert!(log.warns("etcd: refused", at(62)), "a minute after its last warning");
        log.recovered();
        assert!(log.warns("etcd: refused", at(63)), "after a success it is news again");
    }
}
