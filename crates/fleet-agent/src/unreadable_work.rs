//! How long a machine's work has been unreadable: after its presence lapsed, the work is read
//! only from a store copy current since the machine registered again, and until then the
//! machine runs nothing while it looks present. That state should not last; when it does,
//! the log says so (after 30 s, then at twice, four times as long…) and a gauge shows it.

use std::time::Duration;

use tokio::time::Instant;

/// How long the work may stay unreadable before the log says so the first time.
pub const UNREADABLE_WARNING: Duration = Duration::from_secs(30);

/// Since when the work has been unreadable, and when the log says so next.
#[derive(Debug, Default)]
pub struct UnreadableWork {
    since: Option<Instant>,
    next_warning: Duration,
}

/// What a read that could not show the work calls for.
#[derive(Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// The work was readable before this read.
    pub began: bool,
    /// How long it has been unreadable, when the log should say so now.
    pub warn_after: Option<Duration>,
}

impl UnreadableWork {
    /// Notes a read at `now` that could not show the work.
    pub fn unreadable(&mut self, now: Instant) -> Unreadable {
        let began = self.since.is_none();
        let since = *self.since.get_or_insert(now);
        if began {
            self.next_warning = UNREADABLE_WARNING;
        }
        let lasted = now.saturating_duration_since(since);
        let warn_after = (lasted >= self.next_warning).then(|| {
            self.next_warning *= 2;
            lasted
        });
        Unreadable { began, warn_after }
    }

    /// Notes a read that showed the work; whether it was unreadable until then.
    pub fn readable(&mut self) -> bool {
        std::mem::take(self).since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_unreadable_spell_is_told_at_growing_intervals_and_ends_with_a_read() {
        let start = Instant::now();
        let mut work = UnreadableWork::default();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert_eq!(work.unreadable(at(0)), Unreadable { began: true, warn_after: None });
        assert_eq!(work.unreadable(at(29)), Unreadable { began: false, warn_after: None });
        assert_eq!(work.unreadable(at(31)).warn_after, Some(Duration::from_secs(31)));
        assert_eq!(work.unreadable(at(45)).warn_after, None);
        assert_eq!(work.unreadable(at(60)).warn_after, Some(Duration::from_secs(60)));
        assert_eq!(work.unreadable(at(100)).warn_after, None);
        assert_eq!(work.unreadable(at(120)).warn_after, Some(Duration::from_secs(120)));
        assert!(work.readable(), "it was unreadable until now");
        assert!(!work.readable(), "and is not any more");
        assert_eq!(work.unreadable(at(200)), Unreadable { began: true, warn_after: None }, "a new spell counts afresh");
        assert_eq!(work.unreadable(at(230)).warn_after, Some(Duration::from_secs(30)));
    }
}
