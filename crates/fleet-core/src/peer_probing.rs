//! How a kernel watches a quiet TCP connection's peer (keepalive probes and a user timeout),
//! chosen from the span within which a peer gone without a word must be found: the pull
//! agents' change streams are watched this way at both ends, so that their heartbeats can be
//! minutes apart.

use std::time::Duration;

/// The kernel's settings for one `keep_alive`: when probing starts, how often, how many
/// unanswered probes end the connection, and the user timeout (milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probing {
    pub idle_seconds: u32,
    pub interval_seconds: u32,
    pub count: u32,
    pub user_timeout_ms: u32,
}

impl Probing {
    /// Probing that ends a connection whose peer fell silent at most `keep_alive * 3 / 2`
    /// after it was last heard (the kernel counts in whole seconds, never fewer than one: a
    /// `keep_alive` under two seconds is found within two).
    pub fn for_keep_alive(keep_alive: Duration) -> Self {
        let seconds = |span: Duration| u32::try_from(span.as_secs()).unwrap_or(u32::MAX).max(1);
        let idle_seconds = seconds(keep_alive);
        let interval_seconds = seconds(keep_alive / 4);
        let count = (seconds(keep_alive / 2) / interval_seconds).max(1);
        // The user timeout ends the connection at the probe that finds the peer silent that
        // long (and bounds data sent and never acknowledged the same).
        let probing = u64::from(idle_seconds) + u64::from(interval_seconds) * u64::from(count);
        let user_timeout_ms = u32::try_from(probing * 1000).unwrap_or(u32::MAX);
        Self { idle_seconds, interval_seconds, count, user_timeout_ms }
    }

    /// How long after its peer was last heard a connection is ended at the latest.
    pub fn detects_within(&self) -> Duration {
        Duration::from_millis(u64::from(self.user_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_peer_is_found_within_one_and_a_half_keep_alives_of_when_it_was_last_heard() {
        let probing = Probing::for_keep_alive(Duration::from_secs(15));
        assert_eq!(probing, Probing { idle_seconds: 15, interval_seconds: 3, count: 2, user_timeout_ms: 21_000 });
        assert!(probing.detects_within() <= Duration::from_millis(22_500));
        let long = Probing::for_keep_alive(Duration::from_secs(150));
        assert_eq!(long, Probing { idle_seconds: 150, interval_seconds: 37, count: 2, user_timeout_ms: 224_000 });
        // The kernel counts seconds: a short keep-alive is rounded up, never to zero.
        let short = Probing::for_keep_alive(Duration::from_millis(500));
        assert_eq!(short, Probing { idle_seconds: 1, interval_seconds: 1, count: 1, user_timeout_ms: 2000 });
        assert_eq!(short.detects_within(), Duration::from_secs(2));
    }
}
