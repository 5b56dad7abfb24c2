//! Health, sans I/O: what a unit declares to be checked (`[X-Fleet] HealthCheck=` and its
//! tuning, or systemd's watchdog), the state a run of results leads to, and what a machine
//! reports of it. The agent runs the probes (`fleet-agent`); rollouts gate on what it reports
//! ([`crate::rollout`]).

pub mod check;
pub mod tracker;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use check::{HealthCheck, HealthCheckError, Probe, check_of};
pub use tracker::{Outcome, Tracker};

/// The longest failure text a report carries (a probe's output or error, cut).
pub const MAX_FAILURE_CHARS: usize = 200;

/// What the checks say of a running unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// No verdict yet: started, still in its start period, or not flipped by enough results.
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

impl HealthStatus {
    pub const ALL: [Self; 3] = [Self::Unknown, Self::Healthy, Self::Unhealthy];

    pub fn word(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
        }
    }

    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.word() == word)
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

/// What a machine reports of a checked unit's health (it travels in the unit's state).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthReport {
    pub status: HealthStatus,
    /// The last failure, short; kept while the unit is unhealthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failure: String,
    /// Restarts made for it within the budget's window (`HealthCheckRestart=`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: usize,
    /// Restarted too often: left unhealthy until its content or desired state changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub given_up: bool,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

impl HealthReport {
    /// One line, as lists show it: `healthy`, `unhealthy: connection refused`,
    /// `unhealthy (restarted 3 times, given up): …`.
    pub fn describe(&self) -> String {
        let mut text = self.status.word().to_string();
        if self.given_up {
            text.push_str(&format!(" (restarted {} times, given up)", self.restarts));
        } else if self.restarts > 0 {
            text.push_str(&format!(" (restarted {} times)", self.restarts));
        }
        if self.status == HealthStatus::Unhealthy && !self.failure.is_empty() {
            text.push_str(": ");
            text.push_str(&self.failure);
        }
        text
    }
}

/// `text` cut to [`MAX_FAILURE_CHARS`] on one line, control characters replaced: a probe's
/// output is the service's, and goes into logs and tables.
pub fn short_failure(text: &str) -> String {
    let mut short: String =
        text.trim().chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_FAILURE_CHARS + 1).collect();
    if short.chars().count() > MAX_FAILURE_CHARS {
        short = short.chars().take(MAX_FAILURE_CHARS - 1).collect();
        short.push('…');
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_cut_to_one_short_line() {
        assert_eq!(short_failure("  refused\n"), "refused");
        assert_eq!(short_failure("a\nb\tc"), "a b c");
        let long = short_failure(&"x".repeat(5000));
        assert_eq!(long.chars().count(), MAX_FAILURE_CHARS);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn reports_read_as_one_line() {
        let report =
            HealthReport { status: HealthStatus::Unhealthy, failure: "HTTP 500".into(), restarts: 3, given_up: true };
        assert_eq!(report.describe(), "unhealthy (restarted 3 times, given up): HTTP 500");
        assert_eq!(HealthReport { status: HealthStatus::Healthy, ..HealthReport::default() }.describe(), "healthy");
        for status in HealthStatus::ALL {
            assert_eq!(HealthStatus::from_word(status.word()), Some(status));
        }
    }
}
