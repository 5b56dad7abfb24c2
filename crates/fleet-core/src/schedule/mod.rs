//! The engine's decisions: `plan(snapshot) -> Plan`, a pure function.
//!
//! Units already placed stay where they are while their machine lives and they can still run
//! there (no rebalancing; a machine whose capacity shrank keeps what it has). Unplaced units go
//! to an eligible machine with room for their reservation: by default the one with the most
//! room left, then the fewest units (spreading), or the fullest one (bin-packing); ties broken
//! by machine ID. A unit that cannot be placed gets a reason.

mod candidates;
pub mod departures;
mod incremental;
pub mod lost_machines;
mod plan;
pub mod preemption;
pub mod preview;
mod reason;
mod snapshot;
mod working;

pub use incremental::{IncrementalPlanner, PlanScope};
pub use plan::plan;
pub use reason::{Closest, Refusal, UnplacedReason, UnscheduleReason};
pub use snapshot::{RequirementsCache, SnapshotUnit, contents_alone_changed};

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

/// Everything the engine decides from: the live machines, every unit, and how to choose
/// between machines that all fit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub machines: Vec<MachineState>,
    pub units: Vec<UnitSpec>,
    pub strategy: PlacementStrategy,
    /// Whether a unit that fits nowhere may take the room of units of a lower `Priority=`
    /// (`preemption = on` in the engine leader's fleet.conf): [`preemption`].
    pub preemption: bool,
    /// Units taken off their machine by preemption and not placed since, with who took their
    /// room: their reason says so while they wait. The engine remembers them; a plan adds its
    /// own.
    pub preempted: std::collections::BTreeMap<String, preemption::Preemptor>,
    /// The disruption budgets of the units' groups, as counted when the snapshot was taken:
    /// an eviction by a taint's `:evict` and a preemption are taken from them, and wait while
    /// a budget holds them ([`crate::disruption_budget`]). Empty: nothing holds them.
    pub budgets: crate::disruption_budget::Budgets,
}

/// How the engine chooses among the machines a unit fits on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacementStrategy {
    /// The machine with the most room left (in its scarcest resource), then the fewest units.
    #[default]
    Spread,
    /// The fullest machine that still fits, then the most units: whole machines stay free.
    BinPack,
}

impl std::str::FromStr for PlacementStrategy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "spread" => Ok(Self::Spread),
            "binpack" => Ok(Self::BinPack),
            _ => Err("expected spread or binpack".to_string()),
        }
    }
}

/// A change to the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Schedule { unit: String, machine: String },
    Unschedule { unit: String, machine: String, reason: UnscheduleReason },
}

/// What the engine should write, why the units it left unplaced could not go anywhere, and
/// what each machine holds once the decisions are written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    pub unplaced: Vec<(String, UnplacedReason)>,
    /// Units a drain let go that have nowhere else to go: they stay on their drained machine,
    /// with why they cannot leave.
    pub stuck: Vec<(String, UnplacedReason)>,
    /// Units `SpreadBy=` placed more than one apart from another value of its key, with why
    /// that value took none.
    pub spread_notes: Vec<(String, String)>,
    /// Units the engine keeps off every machine for now, with why (a service that moves on
    /// failure, waiting to be tried again: [`crate::job::moves`]). The planner leaves it empty.
    pub kept_off: Vec<(String, String)>,
    /// Units left on a machine gone while their stay there lasts (`LostAfter=`,
    /// `AtMostOnce=`), with why: set by the engine, as `kept_off` is.
    pub staying: Vec<(String, String)>,
    /// Units a taint's `:evict` would move that stay where they are because their group's
    /// disruption budget holds them, with why.
    pub held: Vec<(String, String)>,
    /// The units this plan takes down by choice (evicted by a taint, preempted), each with the
    /// machine it leaves: what the budgets were taken for.
    pub disrupted: Vec<(String, String)>,
    /// Every machine, in ID order, with the units (global ones included) and reservations the
    /// plan leaves on it.
    pub loads: Vec<MachineLoad>,
}

/// What one machine holds after a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineLoad {
    pub machine: String,
    pub units: u32,
    pub reserved: crate::resources::Resources,
}

/// How the reason of a unit that cannot leave its drained machine begins (then `: ` and why):
/// what clients recognise it by.
pub const CANNOT_LEAVE: &str = "cannot leave its draining machine";

impl Plan {
    /// The reasons units are unplaced, cannot leave a drained machine, were spread unevenly or
    /// are kept off every machine, as the stores keep them: unit and text, in unit name order.
    pub fn reason_texts(&self) -> Vec<(String, String)> {
        let unplaced = self.unplaced.iter().map(|(unit, reason)| (unit.clone(), reason.to_string()));
        let stuck = self.stuck.iter().map(|(unit, reason)| (unit.clone(), format!("{CANNOT_LEAVE}: {reason}")));
        let notes = self.spread_notes.iter().chain(&self.kept_off).chain(&self.staying).chain(&self.held).cloned();
        let mut texts: Vec<(String, String)> = unplaced.chain(stuck).chain(notes).collect();
        texts.sort();
        texts
    }

    /// Whether a disruption budget held back an eviction or a preemption: the plan may differ
    /// once the budget has room again, with nothing else changed.
    pub fn budget_held(&self) -> bool {
        !self.held.is_empty()
            || self.unplaced.iter().any(|(_, reason)| matches!(reason, UnplacedReason::PreemptionHeld { .. }))
    }

    /// Whether writing this plan changes anything, given the reasons written last time: an
    /// engine skips the write (and the wake-ups it causes) otherwise.
    pub fn changes_anything(&self, written_reasons: &[(String, String)]) -> bool {
        !self.decisions.is_empty() || self.reason_texts() != written_reasons
    }
}

#[cfg(test)]
mod tests;
