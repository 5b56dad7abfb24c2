//! How many pull agents announce themselves to this manager a second, and whether one that
//! just did may open its change stream at once. After a manager restarts, every agent whose
//! stream ended comes back; streams opened while thousands still announce themselves slow
//! those down (10,000 agents were all back after 74 s when each moved to its stream 2 s after
//! its polls settled, 28 s after 15 s), while a few agents coming back to a quiet manager
//! waited 15–30 s for nothing. The manager knows which case it is in: it welcomes a stream at
//! once while fewer than [`WELCOME_BELOW`] announces came in the last second.

use std::time::{Duration, Instant};

use fleet_core::unpoisoned::Locked;

/// Announces in a second at and above which a returning agent is not welcomed on its stream
/// at once (it settles on its long polls first).
pub const WELCOME_BELOW: u32 = 100;

const WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct AnnouncePace {
    counts: std::sync::Mutex<Counts>,
}

/// Announces in the current window and the one before it.
#[derive(Default)]
struct Counts {
    started: Option<Instant>,
    current: u32,
    previous: u32,
}

impl Counts {
    /// Counts an announce at `now`; how many came within about the last window, this one
    /// included (the window before weighed by how much of it is still within a window of now).
    fn count(&mut self, now: Instant) -> u32 {
        let started = *self.started.get_or_insert(now);
        let elapsed = now.saturating_duration_since(started);
        if elapsed >= WINDOW * 2 {
            (self.previous, self.current, self.started) = (0, 0, Some(now));
        } else if elapsed >= WINDOW {
            (self.previous, self.current, self.started) = (self.current, 0, Some(started + WINDOW));
        }
        self.current = self.current.saturating_add(1);
        let into_window = now.saturating_duration_since(self.started.unwrap_or(now)).as_secs_f64();
        let left_of_previous = (1.0 - into_window / WINDOW.as_secs_f64()).clamp(0.0, 1.0);
        self.current + (f64::from(self.previous) * left_of_previous) as u32
    }
}

impl AnnouncePace {
    /// Counts an announce now; whether its agent may open its change stream at once.
    pub fn welcomes_stream(&self) -> bool {
        welcomed(self.counts.locked().count(Instant::now()))
    }
}

/// Whether an agent that announced itself with `recent` announces in the last second (its own
/// included) may open its stream at once.
fn welcomed(recent: u32) -> bool {
    recent < WELCOME_BELOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_announces_are_welcomed_and_a_crowd_is_not() {
        let start = Instant::now();
        let mut counts = Counts::default();
        let at = |millis: u64| start + Duration::from_millis(millis);
        assert!(welcomed(counts.count(at(0))));
        // 200 announces within half a second: the first 99 are welcomed, the rest not.
        let answers: Vec<bool> = (1..200).map(|i| welcomed(counts.count(at(i * 2)))).collect();
        assert_eq!(answers.iter().filter(|welcomed| **welcomed).count(), 98);
        assert!(!answers[150]);
        // Half a second into the next window, half of the crowd still counts.
        assert!(!welcomed(counts.count(at(1500))));
        // Two windows later the crowd is forgotten.
        assert_eq!(counts.count(at(4000)), 1);
    }
}
