//! Desired states, current states and what a unit manager reports.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::unit_file::UnitHash;

/// What the user asked for: `submit` → inactive, `load` → loaded, `start` → launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredState {
    Inactive,
    Loaded,
    Launched,
}

/// The state fleet derives for a scheduled unit. It has the same three values.
pub type CurrentState = DesiredState;

impl DesiredState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inactive => "inactive",
            Self::Loaded => "loaded",
            Self::Launched => "launched",
        }
    }

    /// The current state of a unit, as the original derives it from what its target machine
    /// says of it: `inactive` until it reports a state, `launched` while it says it started it.
    pub fn derive_current(target: TargetReport) -> Self {
        match target {
            TargetReport::Unscheduled | TargetReport::Silent => Self::Inactive,
            TargetReport::Loaded => Self::Loaded,
            TargetReport::Launched => Self::Launched,
        }
    }
}

/// What the machine a unit is scheduled to says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetReport {
    /// The unit is scheduled nowhere.
    Unscheduled,
    /// Its machine has reported no state for it yet.
    Silent,
    /// Its machine holds it but did not start it.
    Loaded,
    /// Its machine started it.
    Launched,
}

impl TargetReport {
    /// From whether the unit is scheduled, and its machine's report (`Some(launched)`).
    pub fn of(scheduled: bool, launched: Option<bool>) -> Self {
        match (scheduled, launched) {
            (false, _) => Self::Unscheduled,
            (true, None) => Self::Silent,
            (true, Some(false)) => Self::Loaded,
            (true, Some(true)) => Self::Launched,
        }
    }
}

impl fmt::Display for DesiredState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid desiredState: {0:?}")]
pub struct InvalidState(pub String);

impl FromStr for DesiredState {
    type Err = InvalidState;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "inactive" => Ok(Self::Inactive),
            "loaded" => Ok(Self::Loaded),
            "launched" => Ok(Self::Launched),
            other => Err(InvalidState(other.to_string())),
        }
    }
}

/// systemd's three words for a unit: LoadState, ActiveState, SubState.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SystemdState {
    pub load: String,
    pub active: String,
    pub sub: String,
}

impl SystemdState {
    pub fn new(load: &str, active: &str, sub: &str) -> Self {
        Self { load: load.into(), active: active.into(), sub: sub.into() }
    }

    pub fn is_running(&self) -> bool {
        self.load == "loaded" && self.active == "active"
    }
}

/// What one machine reports about one unit it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitState {
    pub name: String,
    pub machine_id: String,
    pub hash: UnitHash,
    pub systemd: SystemdState,
    /// Whether the agent has started the unit (the original's "launched" heartbeat).
    pub launched: bool,
    /// How the unit departs from what fleet made it on this machine, when it does (or did,
    /// and was corrected, within the correction window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<crate::drift_report::DriftReport>,
    /// What its health check says, for a checked unit that runs (our addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::HealthReport>,
    /// The version of each secret the unit was last given (our addition): what a rotation
    /// rolled out in waves follows.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub secrets: std::collections::BTreeMap<String, u64>,
    /// For a unit that runs to completion, the run its machine started since it was given the
    /// unit (our addition): the engine learns from it that a run began and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Box<crate::job::runs::RunReport>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        for state in [DesiredState::Inactive, DesiredState::Loaded, DesiredState::Launched] {
            assert_eq!(state.as_str().parse::<DesiredState>(), Ok(state));
        }
        assert_eq!("bogus".parse::<DesiredState>().unwrap_err().to_string(), "invalid desiredState: \"bogus\"");
    }

    #[test]
    fn current_state_derivation() {
        let current = |scheduled, launched| DesiredState::derive_current(TargetReport::of(scheduled, launched));
        assert_eq!(current(false, Some(true)), DesiredState::Inactive);
        assert_eq!(current(true, None), DesiredState::Inactive);
        assert_eq!(current(true, Some(false)), DesiredState::Loaded);
        assert_eq!(current(true, Some(true)), DesiredState::Launched);
    }
}
