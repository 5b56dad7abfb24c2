//! The bounds of a journal relayed from another machine (through the store to another member,
//! or through a manager to its pull agent). A relayed journal costs more than a local one: on
//! etcd its answer is a value written to the store and kept in etcd's history until the next
//! compaction, so an asker who may read journals could otherwise fill the store (issue 67: 250
//! requests of 100,000 lines by a viewer raised etcd's NOSPACE alarm). Each asker gets
//! [`ASKS_A_MINUTE`] relayed journals a minute (a burst of [`ASKS_AT_ONCE`]), an answer carries
//! at most [`MOST_ANSWER_BYTES`] (the newest lines that fit), and the driver bounds how many
//! are in flight here and in the cluster.

use std::collections::BTreeMap;
use std::time::Duration;

/// The most bytes a relayed answer carries (its JSON), the newest lines kept.
pub const MOST_ANSWER_BYTES: usize = 128 * 1024;
/// Relayed journals one asker may have a minute, on average.
pub const ASKS_A_MINUTE: u64 = 30;
/// Relayed journals one asker may have at once, after a quiet while.
pub const ASKS_AT_ONCE: u64 = 10;
/// Journals one fleetd relays at the same time, whoever asks.
pub const MOST_IN_FLIGHT_HERE: usize = 8;
/// Journal questions in the store at the same time, for the whole cluster.
pub const MOST_IN_FLIGHT_IN_CLUSTER: usize = 32;
/// Questions waiting for one pull agent to take them.
pub const MOST_WAITING_PER_MACHINE: usize = 16;
/// The askers whose allowances are remembered; past it, the ones whose allowance is full (as
/// good as forgotten) go first.
const MOST_ASKERS: usize = 10_000;

/// The newest whole lines of `text` that fit in `most` bytes, and whether older ones were left
/// out.
pub fn newest_lines_within(text: &str, most: usize) -> (&str, bool) {
    if text.len() <= most {
        return (text, false);
    }
    let start = text.len() - most;
    // The first line that starts at or after `start`: a line is never cut. (A newline is one
    // byte, so the byte after one begins a character.)
    let bytes = text.as_bytes();
    let kept = match bytes[start - 1] {
        b'\n' => &text[start..],
        _ => match bytes[start..].iter().position(|byte| *byte == b'\n') {
            Some(newline) => &text[start + newline + 1..],
            None => "",
        },
    };
    (kept, true)
}

/// Each asker's allowance of relayed journals: a bucket of [`ASKS_AT_ONCE`] refilled at
/// [`ASKS_A_MINUTE`], over the time the caller gives (`now`, from any fixed origin).
#[derive(Debug, Default)]
pub struct Allowances {
    /// Per asker: thousandths of an ask available, as of a moment.
    buckets: BTreeMap<String, (u64, Duration)>,
}

const ONE: u64 = 1000;

impl Allowances {
    /// Takes one ask for `asker` at `now`; when none is left, how long until one is.
    pub fn take(&mut self, asker: &str, now: Duration) -> Result<(), Duration> {
        let full = ASKS_AT_ONCE * ONE;
        let available = match self.buckets.get(asker) {
            Some(&(available, at)) => refilled(available, now.saturating_sub(at)).min(full),
            None => full,
        };
        if available < ONE {
            let missing = ONE - available;
            // Refilled at ASKS_A_MINUTE * ONE per 60,000 ms.
            let millis = (missing * 60_000).div_ceil(ASKS_A_MINUTE * ONE);
            self.buckets.insert(asker.to_string(), (available, now));
            return Err(Duration::from_millis(millis));
        }
        self.buckets.insert(asker.to_string(), (available - ONE, now));
        if self.buckets.len() > MOST_ASKERS {
            self.buckets.retain(|_, (available, at)| refilled(*available, now.saturating_sub(*at)) < full);
        }
        Ok(())
    }

    /// How many askers are remembered.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

fn refilled(available: u64, elapsed: Duration) -> u64 {
    let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    available.saturating_add(millis.saturating_mul(ASKS_A_MINUTE * ONE) / 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_keeps_the_newest_whole_lines_that_fit() {
        assert_eq!(newest_lines_within("a\nb\n", 10), ("a\nb\n", false));
        assert_eq!(newest_lines_within("one\ntwo\nthree\n", 8), ("three\n", true));
        assert_eq!(newest_lines_within("one\ntwo\nthree\n", 9), ("three\n", true), "two would be cut");
        assert_eq!(newest_lines_within("one\ntwo\nthree\n", 10), ("two\nthree\n", true), "two fits whole");
        assert_eq!(newest_lines_within("one\ntwo\nthree\n", 6), ("three\n", true), "a boundary exactly");
        assert_eq!(newest_lines_within("a-very-long-line", 4), ("", true), "no line fits");
        assert_eq!(newest_lines_within("ééé\nü\n", 4), ("ü\n", true), "never inside a character");
        let text: String = (0..10_000).map(|n| format!("line {n}\n")).collect();
        let (kept, cut) = newest_lines_within(&text, 1000);
        assert!(cut && kept.len() <= 1000 && kept.ends_with("line 9999\n") && kept.starts_with("line "));
    }

    #[test]
    fn an_asker_gets_a_burst_then_the_rate_and_others_are_not_held_up() {
        let mut allowances = Allowances::default();
        let at = |seconds: u64| Duration::from_secs(seconds);
        for _ in 0..ASKS_AT_ONCE {
            assert_eq!(allowances.take("viewer", at(0)), Ok(()));
        }
        let wait = allowances.take("viewer", at(0)).expect_err("the burst is spent");
        assert_eq!(wait, Duration::from_secs(60 / ASKS_A_MINUTE));
        assert_eq!(allowances.take("admin", at(0)), Ok(()), "another asker has its own allowance");
        assert_eq!(allowances.take("viewer", at(0) + wait), Ok(()), "one more once it refilled");
        assert!(allowances.take("viewer", at(0) + wait).is_err());
        // Over a long run an asker gets the rate and no more.
        let granted = (0..6_000u64)
            .filter(|tenth| allowances.take("steady", Duration::from_millis(tenth * 100)).is_ok())
            .count() as u64;
        assert!(granted <= ASKS_AT_ONCE + 10 * ASKS_A_MINUTE, "{granted} in ten minutes");
    }

    #[test]
    fn askers_with_a_full_allowance_are_forgotten_past_the_bound() {
        let mut allowances = Allowances::default();
        for asker in 0..=MOST_ASKERS {
            allowances.take(&format!("asker-{asker}"), Duration::ZERO).expect("a first ask");
        }
        allowances.take("late", Duration::from_secs(3600)).expect("an ask");
        assert_eq!(allowances.len(), 1, "only the one still short of a full allowance");
    }
}
