//! What a machine reports of a unit that drifted (it travels in the unit's state), and the
//! correction budget the report counts against. The decisions about drift are in
//! [`crate::drift`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// At most this many corrections of one unit within [`WINDOW`]; one more drift in that
/// time and the unit is left as it is, marked.
pub const LIMIT: usize = 3;
pub const WINDOW: Duration = Duration::from_secs(600);

/// How a unit departs from what fleet made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Drift {
    /// Stopped while fleet wants it launched (and not because it ended by itself).
    Stopped,
    /// Its unit file on the machine is not the one fleet wrote.
    Changed,
    /// Its unit file on the machine is gone.
    Removed,
}

impl Drift {
    /// Every kind of drift.
    pub const ALL: [Self; 3] = [Self::Stopped, Self::Changed, Self::Removed];

    /// Its one-word name, as it travels between a pull agent and its manager.
    pub fn word(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Changed => "changed",
            Self::Removed => "removed",
        }
    }

    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|drift| drift.word() == word)
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stopped => "stopped outside fleet",
            Self::Changed => "unit file changed on the machine",
            Self::Removed => "unit file removed from the machine",
        })
    }
}

/// What a machine reports about a unit that drifted: how, and what it did about it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DriftReport {
    pub drift: Drift,
    /// Corrections made within the window.
    pub corrections: usize,
    /// Whether the machine puts it back (`false`: report only, or given up).
    pub correcting: bool,
    pub given_up: bool,
}

impl fmt::Display for DriftReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.drift)?;
        if self.given_up {
            write!(f, "; left as is after {} corrections in {} min", LIMIT, WINDOW.as_secs() / 60)
        } else if self.correcting {
            write!(f, "; corrected ({} of {} allowed in {} min)", self.corrections, LIMIT, WINDOW.as_secs() / 60)
        } else {
            write!(f, "; reported only")
        }
    }
}
