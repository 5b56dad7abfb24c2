//! What became of a global unit's run across the machines ([`super::global_runs`]): each
//! machine's end counted once.

use serde::{Deserialize, Serialize};

use super::outcome::Outcome;

/// How many machines' failures a run keeps by name.
pub const KEPT_FAILURES: usize = 20;

/// What became of one run of a global unit across the machines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub succeeded: u32,
    pub failed: u32,
    pub lost: u32,
    pub stopped: u32,
    /// The machines counted so far, each once: kept for the latest runs only (an end
    /// reported later than that is not counted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counted: Vec<String>,
    /// The first machines it failed on or was lost on, with how ([`KEPT_FAILURES`] at most).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<MachineEnd>,
}

/// How a run ended on one machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineEnd {
    pub machine: String,
    pub outcome: Outcome,
}

impl Tally {
    /// The machines whose end it counted.
    pub fn ended(&self) -> u32 {
        self.succeeded + self.failed + self.lost + self.stopped
    }

    pub(crate) fn count(&mut self, machine: &str, outcome: &Outcome) {
        match outcome {
            Outcome::Succeeded => self.succeeded += 1,
            Outcome::Failed { .. } => self.failed += 1,
            Outcome::Lost { .. } => self.lost += 1,
            Outcome::Stopped => self.stopped += 1,
        }
        if matches!(outcome, Outcome::Failed { .. } | Outcome::Lost { .. }) && self.failures.len() < KEPT_FAILURES {
            self.failures.push(MachineEnd { machine: machine.to_string(), outcome: outcome.clone() });
        }
        self.counted.push(machine.to_string());
    }
}
