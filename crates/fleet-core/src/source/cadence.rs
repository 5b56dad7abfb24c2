//! When a source is synced next: at once when it changed or a sync was asked for, every
//! interval otherwise, and backing off with jitter after failures.

/// The longest wait after failures, in seconds.
pub const BACKOFF_MAX_SECONDS: u64 = 600;

/// What the cadence needs of a source and its last attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastAttempt {
    /// Seconds since the epoch; `None`: never attempted.
    pub at: Option<u64>,
    /// Whether it synced the source's current generation.
    pub current: bool,
    /// Failed attempts in a row.
    pub failures: u32,
}

/// When (seconds since the epoch) the next sync of the source named `name`, fetched every
/// `interval` seconds, is due.
pub fn next_sync(name: &str, interval: u64, last: LastAttempt) -> u64 {
    let Some(at) = last.at.filter(|_| last.current) else { return 0 };
    if last.failures == 0 {
        return at + interval;
    }
    let exponent = last.failures.min(16);
    let delay = interval.saturating_mul(1 << exponent).min(BACKOFF_MAX_SECONDS).max(interval);
    // Up to a quarter more, the same for a given source and failure count, so that sources
    // failing together (an unreachable forge) do not retry together.
    let seed =
        name.bytes().fold(u64::from(last.failures), |hash, byte| hash.wrapping_mul(31).wrapping_add(u64::from(byte)));
    at + delay + seed % (delay / 4 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_once_every_interval_and_backing_off() {
        let never = LastAttempt { at: None, current: false, failures: 0 };
        assert_eq!(next_sync("web", 15, never), 0);
        let changed = LastAttempt { at: Some(1000), current: false, failures: 0 };
        assert_eq!(next_sync("web", 15, changed), 0, "a changed source or an asked sync goes at once");
        let fine = LastAttempt { at: Some(1000), current: true, failures: 0 };
        assert_eq!(next_sync("web", 15, fine), 1015);
        let waits: Vec<u64> =
            (1..=8).map(|failures| next_sync("web", 15, LastAttempt { failures, ..fine }) - 1000).collect();
        for (failures, wait) in (1..=8).zip(&waits) {
            let delay = (15u64 << failures).min(BACKOFF_MAX_SECONDS);
            assert!((delay..=delay + delay / 4).contains(wait), "{failures} failures: {waits:?}");
        }
        assert_ne!(
            next_sync("web", 15, LastAttempt { failures: 3, ..fine }),
            next_sync("api", 15, LastAttempt { failures: 3, ..fine }),
            "sources failing together spread out"
        );
    }
}
