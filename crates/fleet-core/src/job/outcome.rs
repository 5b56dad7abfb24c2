//! How a run ended, as records keep it and machines report it.

use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Succeeded,
    /// Exited with a status other than 0, or was killed by a signal.
    Failed {
        status: Option<i32>,
        signal: Option<String>,
    },
    /// Its machine was lost before it reported an end: whether it ran is not known, and it is
    /// not run again for the same elapse.
    Lost {
        why: String,
    },
    /// The unit was stopped (or destroyed) while it ran.
    Stopped,
}

impl Outcome {
    /// `succeeded`, `failed`, `lost` or `stopped`: the outcome in one word, as reports carry it.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed { .. } => "failed",
            Outcome::Lost { .. } => "lost",
            Outcome::Stopped => "stopped",
        }
    }

    /// The outcome a machine reports in words: a status and a signal only for `failed` (a
    /// signal's name at most 16 characters), a `lost` one with why its machine says so.
    pub fn from_report(word: &str, status: Option<i32>, signal: Option<&str>) -> Option<Self> {
        let signal = signal.filter(|name| name.len() <= 16 && name.bytes().all(|b| b.is_ascii_alphanumeric()));
        match word {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed { status, signal: signal.map(str::to_string) }),
            "lost" => Some(Outcome::Lost { why: "its machine lost track of it".to_string() }),
            "stopped" => Some(Outcome::Stopped),
            _ => None,
        }
    }
}
