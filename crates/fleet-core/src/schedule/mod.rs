//! The engine's decisions: `plan(snapshot) -> Plan`, a pure function.
//!
//! Units already placed stay where they are while their machine lives and they can still run
//! there (no rebalancing). Unplaced units go to the least-loaded eligible machine, ties broken
//! by machine ID. A unit that cannot be placed gets a reason.

pub mod at_most_once;
mod candidates;
mod incremental;
mod plan;
mod reason;
mod snapshot;
mod working;

pub use incremental::{IncrementalPlanner, PlanScope};
pub use plan::plan;
pub use reason::{Refusal, UnplacedReason, UnscheduleReason};
pub use snapshot::{RequirementsCache, SnapshotUnit};

use std::sync::Arc;

use crate::machine::MachineState;
use crate::requirements::Requirements;
use crate::state::DesiredState;

/// One unit as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSpec {
    pub name: String,
    pub desired: DesiredState,
    /// Shared by every listing of the same body: the engine's copy holds one per body.
    pub requirements: Arc<Requirements>,
    /// The machine the unit is scheduled on now, if any.
    pub scheduled_on: Option<String>,
}

/// Everything the engine decides from: the live machines and every unit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub machines: Vec<MachineState>,
    pub units: Vec<UnitSpec>,
}

/// A change to the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Schedule { unit: String, machine: String },
    Unschedule { unit: String, machine: String, reason: UnscheduleReason },
}

/// What the engine should write, and why the units it left unplaced could not go anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    pub unplaced: Vec<(String, UnplacedReason)>,
}

impl Plan {
    /// The reasons units are unplaced, as the stores keep them: unit and text.
    pub fn reason_texts(&self) -> Vec<(String, String)> {
        self.unplaced.iter().map(|(unit, reason)| (unit.clone(), reason.to_string())).collect()
    }

    /// Whether writing this plan changes anything, given the reasons written last time: an
    /// engine skips the write (and the wake-ups it causes) otherwise.
    pub fn changes_anything(&self, written_reasons: &[(String, String)]) -> bool {
        !self.decisions.is_empty() || self.reason_texts() != written_reasons
    }
}

#[cfg(test)]
mod tests;
