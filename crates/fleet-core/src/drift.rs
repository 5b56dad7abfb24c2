//! Drift, sans I/O: a unit on a machine that no longer is what fleet made it (stopped with
//! `systemctl`, its unit file edited or removed on the machine), whether to put
//! it back, and when to stop trying. [`detect`] compares one unit the agent holds in sync
//! with what the unit manager shows; [`Corrections`] is the per-unit budget that keeps a
//! unit that keeps drifting from being corrected forever.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::SystemdState;
use crate::state::DesiredState;

pub use crate::drift_report::{Drift, DriftReport, LIMIT, WINDOW};

/// What a machine does about a unit that drifted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftPolicy {
    /// Report it and put it back (within the correction budget).
    #[default]
    Correct,
    /// Report it, change nothing.
    Report,
}

impl DriftPolicy {
    pub fn is_default(&self) -> bool {
        *self == Self::Correct
    }

    /// Reads `correct` or `report`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "correct" => Ok(Self::Correct),
            "report" => Ok(Self::Report),
            other => Err(format!("invalid drift policy {other:?}: correct or report")),
        }
    }
}

impl fmt::Display for DriftPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Correct => "correct",
            Self::Report => "report",
        })
    }
}

/// The unit file on the machine compared with the one fleet wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOnMachine {
    Same,
    Differs,
    Missing,
}

/// What the unit manager shows of a unit the agent holds with the content fleet wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed<'a> {
    pub state: &'a SystemdState,
    pub file: FileOnMachine,
    /// Its main process ended on its own (exited, or a oneshot that finished), rather than
    /// being stopped: an inactive unit that ended so is done, not drifted.
    pub ended_by_itself: bool,
}

/// How `observed` departs from a unit fleet wants in `desired` and has `launched` (started)
/// or not; `None`: in sync. A failed unit is not drift: it is the unit's own doing, and its
/// `Restart=` is its own business. Nor is a loaded unit found running: systemd starts units
/// for their dependents, sockets and timers.
pub fn detect(desired: DesiredState, launched: bool, observed: &Observed<'_>) -> Option<Drift> {
    if desired == DesiredState::Inactive {
        return None;
    }
    match observed.file {
        FileOnMachine::Missing => return Some(Drift::Removed),
        FileOnMachine::Differs => return Some(Drift::Changed),
        FileOnMachine::Same => {}
    }
    let stopped = observed.state.active == "inactive" && !observed.ended_by_itself;
    (desired == DesiredState::Launched && launched && stopped).then_some(Drift::Stopped)
}

/// What to do about a drift now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Put the unit back; this is correction number `n` within the window.
    Correct { n: usize },
    /// Corrected too often: leave it as it is, until fleet's wish for it changes.
    GiveUp,
    /// The policy says report only.
    ReportOnly,
}

/// One unit's correction history. Times are the caller's monotonic clock (time since some
/// fixed start); a unit given up on stays given up until [`Corrections::reset`] (its content
/// or desired state changed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Corrections {
    times: Vec<Duration>,
    given_up: bool,
}

impl Corrections {
    /// Decides about a drift seen at `now`, and records a correction when it says so.
    pub fn decide(&mut self, policy: DriftPolicy, now: Duration) -> Verdict {
        if policy == DriftPolicy::Report {
            return Verdict::ReportOnly;
        }
        if self.given_up {
            return Verdict::GiveUp;
        }
        self.times.retain(|at| now.saturating_sub(*at) < WINDOW);
        if self.times.len() >= LIMIT {
            self.given_up = true;
            return Verdict::GiveUp;
        }
        self.times.push(now);
        Verdict::Correct { n: self.times.len() }
    }

    pub fn given_up(&self) -> bool {
        self.given_up
    }

    /// Corrections made within the window before `now`.
    pub fn recent(&self, now: Duration) -> usize {
        self.times.iter().filter(|at| now.saturating_sub(**at) < WINDOW).count()
    }

    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(state: &SystemdState, file: FileOnMachine, ended_by_itself: bool) -> Observed<'_> {
        Observed { state, file, ended_by_itself }
    }

    #[test]
    fn stops_starts_and_file_changes_are_drift_but_failures_and_own_ends_are_not() {
        use DesiredState::*;
        use FileOnMachine::*;
        let running = SystemdState::new("loaded", "active", "running");
        let stopped = SystemdState::new("loaded", "inactive", "dead");
        let failed = SystemdState::new("loaded", "failed", "failed");
        assert_eq!(detect(Launched, true, &observed(&running, Same, false)), None);
        assert_eq!(detect(Launched, true, &observed(&stopped, Same, false)), Some(Drift::Stopped));
        assert_eq!(detect(Launched, true, &observed(&stopped, Same, true)), None, "it ended by itself");
        assert_eq!(detect(Launched, true, &observed(&failed, Same, false)), None, "a failure is its own");
        assert_eq!(detect(Launched, false, &observed(&stopped, Same, false)), None, "not started yet");
        assert_eq!(detect(Loaded, false, &observed(&running, Same, false)), None, "started by a dependency, a socket");
        assert_eq!(detect(Loaded, false, &observed(&stopped, Same, false)), None);
        assert_eq!(detect(Launched, true, &observed(&running, Differs, false)), Some(Drift::Changed));
        assert_eq!(detect(Loaded, false, &observed(&stopped, Missing, false)), Some(Drift::Removed));
        assert_eq!(detect(Inactive, false, &observed(&stopped, Missing, false)), None);
    }

    #[test]
    fn corrections_stop_at_the_limit_and_stay_stopped_until_reset() {
        let mut unit = Corrections::default();
        let at = Duration::from_secs;
        assert_eq!(unit.decide(DriftPolicy::Correct, at(0)), Verdict::Correct { n: 1 });
        assert_eq!(unit.decide(DriftPolicy::Correct, at(10)), Verdict::Correct { n: 2 });
        assert_eq!(unit.decide(DriftPolicy::Correct, at(20)), Verdict::Correct { n: 3 });
        assert_eq!(unit.decide(DriftPolicy::Correct, at(30)), Verdict::GiveUp);
        assert!(unit.given_up());
        assert_eq!(unit.decide(DriftPolicy::Correct, at(5000)), Verdict::GiveUp, "no loop once the window passes");
        unit.reset();
        assert_eq!(unit.decide(DriftPolicy::Correct, at(5010)), Verdict::Correct { n: 1 });
    }

    #[test]
    fn old_corrections_leave_the_window() {
        let mut unit = Corrections::default();
        let at = Duration::from_secs;
        for minute in 0..3 {
            assert!(matches!(unit.decide(DriftPolicy::Correct, at(minute * 60)), Verdict::Correct { .. }));
        }
        assert_eq!(unit.recent(at(700)), 1);
        assert_eq!(unit.decide(DriftPolicy::Correct, at(700)), Verdict::Correct { n: 2 });
    }

    #[test]
    fn report_only_never_corrects_nor_counts() {
        let mut unit = Corrections::default();
        for second in 0..10 {
            assert_eq!(unit.decide(DriftPolicy::Report, Duration::from_secs(second)), Verdict::ReportOnly);
        }
        assert_eq!(unit.recent(Duration::from_secs(10)), 0);
    }

    #[test]
    fn reports_say_what_happened() {
        let report = DriftReport { drift: Drift::Stopped, corrections: 2, correcting: true, given_up: false };
        assert_eq!(report.to_string(), "stopped outside fleet; corrected (2 of 3 allowed in 10 min)");
        let given_up = DriftReport { drift: Drift::Changed, corrections: 3, correcting: false, given_up: true };
        assert_eq!(given_up.to_string(), "unit file changed on the machine; left as is after 3 corrections in 10 min");
        assert!(DriftPolicy::parse("sometimes").is_err());
        for drift in Drift::ALL {
            assert_eq!(Drift::from_word(drift.word()), Some(drift));
        }
        assert_eq!(Drift::from_word("wandered"), None);
    }
}
