//! The health state machine of one running unit. Times are the caller's monotonic clock.
//!
//! - A started unit is `unknown`. Its first passing result makes it `healthy` (it was seen
//!   working) and ends its start period.
//! - Failures during the start period (from the start, until the first pass) do not count.
//! - `threshold` consecutive failures turn an unknown or healthy unit `unhealthy`;
//!   `threshold` consecutive passes turn an unhealthy unit `healthy`. A result that agrees
//!   with the state clears the count against it, so a flapping check does not flip the state.

use std::time::Duration;

use super::check::HealthCheck;
use super::{HealthStatus, short_failure};

/// One probe's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Why it failed (cut to one short line when kept).
    Fail(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    threshold: u32,
    start_period: Duration,
    started_at: Duration,
    passed_once: bool,
    status: HealthStatus,
    /// Consecutive results against `status`.
    against: u32,
    failure: String,
}

impl Tracker {
    /// The tracker of a unit (re)started at `started_at`.
    pub fn new(check: &HealthCheck, started_at: Duration) -> Self {
        Self {
            threshold: check.threshold.max(1),
            start_period: check.start_period,
            started_at,
            passed_once: false,
            status: HealthStatus::Unknown,
            against: 0,
            failure: String::new(),
        }
    }

    pub fn status(&self) -> HealthStatus {
        self.status
    }

    /// The last failure while unhealthy; empty otherwise.
    pub fn failure(&self) -> &str {
        if self.status == HealthStatus::Unhealthy { &self.failure } else { "" }
    }

    /// Whether a failure at `now` would not count (the unit is still starting).
    pub fn starting(&self, now: Duration) -> bool {
        !self.passed_once && now.saturating_sub(self.started_at) < self.start_period
    }

    /// Takes one result at `now`; says whether the status changed.
    pub fn observe(&mut self, outcome: Outcome, now: Duration) -> bool {
        let before = self.status;
        match outcome {
            Outcome::Pass => {
                self.passed_once = true;
                match self.status {
                    HealthStatus::Unknown => self.flip(HealthStatus::Healthy),
                    HealthStatus::Healthy => self.against = 0,
                    HealthStatus::Unhealthy => self.count_against(HealthStatus::Healthy),
                }
            }
            Outcome::Fail(why) => {
                self.failure = short_failure(&why);
                if self.starting(now) {
                    return false;
                }
                match self.status {
                    HealthStatus::Unhealthy => self.against = 0,
                    HealthStatus::Unknown | HealthStatus::Healthy => self.count_against(HealthStatus::Unhealthy),
                }
            }
        }
        self.status != before
    }

    fn count_against(&mut self, to: HealthStatus) {
        self.against += 1;
        if self.against >= self.threshold {
            self.flip(to);
        }
    }

    fn flip(&mut self, to: HealthStatus) {
        self.status = to;
        self.against = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::check::{Probe, check_of};

    fn tracker(threshold: u32, start_period: u64) -> Tracker {
        let check = HealthCheck {
            probe: Probe::Tcp { host: "h".into(), port: 1 },
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            threshold,
            start_period: Duration::from_secs(start_period),
            restart: false,
        };
        Tracker::new(&check, Duration::ZERO)
    }

    fn fail() -> Outcome {
        Outcome::Fail("connection refused".into())
    }

    fn at(second: u64) -> Duration {
        Duration::from_secs(second)
    }

    #[test]
    fn one_pass_proves_a_unit_and_threshold_failures_turn_it() {
        let mut health = tracker(3, 0);
        assert_eq!(health.status(), HealthStatus::Unknown);
        assert!(health.observe(Outcome::Pass, at(1)));
        assert_eq!(health.status(), HealthStatus::Healthy);
        assert!(!health.observe(fail(), at(2)) && !health.observe(fail(), at(3)), "two of three");
        assert!(health.observe(fail(), at(4)));
        assert_eq!((health.status(), health.failure()), (HealthStatus::Unhealthy, "connection refused"));
        assert!(!health.observe(Outcome::Pass, at(5)) && !health.observe(Outcome::Pass, at(6)));
        assert!(health.observe(Outcome::Pass, at(7)), "three passes in a row turn it back");
        assert_eq!((health.status(), health.failure()), (HealthStatus::Healthy, ""));
    }

    #[test]
    fn a_unit_that_never_passes_turns_unhealthy_after_its_threshold() {
        let mut health = tracker(2, 0);
        assert!(!health.observe(fail(), at(1)));
        assert!(health.observe(fail(), at(2)));
        assert_eq!(health.status(), HealthStatus::Unhealthy);
    }

    #[test]
    fn failures_in_the_start_period_do_not_count_until_a_first_pass_ends_it() {
        let mut health = tracker(1, 30);
        assert!(!health.observe(fail(), at(10)), "still starting");
        assert_eq!(health.status(), HealthStatus::Unknown);
        assert!(health.observe(fail(), at(31)), "the start period is over");
        let mut health = tracker(1, 30);
        health.observe(Outcome::Pass, at(5));
        assert!(health.observe(fail(), at(6)), "a pass ended the start period early");
    }

    #[test]
    fn a_flapping_check_does_not_flip_the_state() {
        let mut health = tracker(2, 0);
        health.observe(Outcome::Pass, at(0));
        for second in 1..100 {
            let outcome = if second % 2 == 0 { Outcome::Pass } else { fail() };
            assert!(!health.observe(outcome, at(second)), "flipped at {second}");
        }
        assert_eq!(health.status(), HealthStatus::Healthy);
    }

    #[test]
    fn failures_are_kept_short() {
        let mut health = tracker(1, 0);
        health.observe(Outcome::Fail(format!("HTTP 500\n{}", "body ".repeat(1000))), at(0));
        assert!(health.failure().starts_with("HTTP 500 body") && health.failure().chars().count() <= 200);
    }

    proptest::proptest! {
        /// Whatever the results, the status only changes after `threshold` results in a row
        /// against it (or one pass from unknown), and never during the start period on a failure.
        #[test]
        fn the_status_flips_only_on_a_full_run_of_results(
            results in proptest::collection::vec(proptest::bool::ANY, 1..200),
            threshold in 1u32..5,
            start in 0u64..20,
        ) {
            let unit = "[X-Fleet]\nHealthCheck=tcp://h:1\n";
            let file = crate::UnitFile::parse(unit).expect("a unit");
            let mut check = check_of("a.service", file.options()).expect("valid").expect("a check");
            check.threshold = threshold;
            check.start_period = Duration::from_secs(start);
            let mut health = Tracker::new(&check, Duration::ZERO);
            let mut run: Vec<bool> = Vec::new();
            for (second, passed) in results.iter().enumerate() {
                let now = Duration::from_secs(u64::try_from(second).unwrap_or(u64::MAX));
                let before = health.status();
                let starting = health.starting(now);
                let changed = health.observe(if *passed { Outcome::Pass } else { fail() }, now);
                run.push(*passed);
                if !changed {
                    continue;
                }
                let needed = usize::try_from(threshold).unwrap_or(usize::MAX);
                let tail = &run[run.len().saturating_sub(needed)..];
                match health.status() {
                    HealthStatus::Healthy if before == HealthStatus::Unknown => proptest::prop_assert!(*passed),
                    HealthStatus::Healthy => proptest::prop_assert!(tail.len() == needed && tail.iter().all(|p| *p)),
                    HealthStatus::Unhealthy => {
                        proptest::prop_assert!(!starting, "a failure counted in the start period");
                        proptest::prop_assert!(tail.len() == needed && tail.iter().all(|p| !*p));
                    }
                    HealthStatus::Unknown => proptest::prop_assert!(false, "nothing returns to unknown"),
                }
            }
        }
    }
}
