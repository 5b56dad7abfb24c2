//! The disruption ledger of the engine leader's process: every voluntary disruption (a
//! rollout's wave, a drain's units let go, the engine's evictions by a taint and its
//! preemptions) is taken from the disruption budgets of the units' groups
//! (`fleet_core::disruption_budget`), counted from what the store shows plus the disruptions
//! decided in this process that the store does not show yet.
//!
//! The deciders run side by side and read the store's watch-fed copy, which a write reaches a
//! moment later: without the ledger, a drain and a rollout stepping at once could each see one
//! unit of a budget of 1 down and take another. So each decision is made under the ledger's
//! lock, with the disruptions noted by the others and not yet shown by the copy it read counted
//! down, and notes its own before it writes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// tokio's clock: the simulation runs the engine leader's drivers on paused time, and a note's
// span is that time's.
use tokio::time::Instant;

use fleet_core::disruption_budget::Budgets;
use fleet_core::drain::Drain;
use fleet_core::rollout::{RolloutState, Step};
use fleet_core::unpoisoned::Locked;
use fleet_core::{MachineState, UnitState};

use crate::budget_members::Pending;
use crate::{BudgetedUnit, RolloutRecord, budget_members};

/// How long a disruption no view has shown yet counts down by the note alone: far past any
/// write's way to the store's copy (a write that failed leaves a note behind, held this long).
const UNSHOWN: Duration = Duration::from_secs(300);

/// How long a note outlives the first view that showed it: a pass still working from an
/// older view counts it for that long.
const SHOWN: Duration = Duration::from_secs(60);

/// What shows that a noted disruption reached the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// The unit is no longer scheduled on this machine, or the machine's drain let it go.
    Left(String),
    /// This rollout started on the unit.
    Rollout(String),
    /// A unit it `Requires=` (`unit`) was let go by the drain of `machine`.
    Drained { unit: String, machine: String },
}

#[derive(Clone, Debug)]
struct Note {
    shown: Shown,
    noted: Instant,
    /// When a view first showed it.
    seen: Option<Instant>,
}

/// The disruptions decided in this process, shared by its deciders (clones share one ledger).
#[derive(Clone, Debug, Default)]
pub struct DisruptionLedger {
    notes: Arc<Mutex<HashMap<String, Note>>>,
}

/// What a decider read of the store to count the budgets from: the budgeted units, the
/// reports of them, the drains, the rollouts and (where a budget is grouped by a key) the
/// machines.
#[derive(Clone, Debug, Default)]
pub struct BudgetView {
    pub units: Vec<BudgetedUnit>,
    pub states: Vec<Arc<UnitState>>,
    pub drains: Vec<(String, Drain)>,
    pub rollouts: Vec<Arc<RolloutRecord>>,
    pub machines: Vec<MachineState>,
}

impl BudgetView {
    /// The drains of `machines`, by machine ID, as a view holds them.
    pub fn drains_of(machines: &[MachineState]) -> Vec<(String, Drain)> {
        machines.iter().filter_map(|machine| Some((machine.id.clone(), machine.drain.clone()?))).collect()
    }

    /// The budgets as the view shows them, with nothing decided elsewhere (what a plan
    /// previews).
    pub fn budgets(&self) -> Budgets {
        let nothing = |_: &BudgetedUnit| Pending::default();
        Budgets::new(budget_members(&self.units, &self.states, &self.drains, &self.rollouts, &self.machines, nothing))
    }

    /// Whether the view shows `shown` for `unit`.
    fn shows(&self, unit: &BudgetedUnit, shown: &Shown) -> bool {
        match shown {
            // Placed elsewhere, or let go by the machine's drain (which names the machine).
            Shown::Left(machine) => {
                unit.machine_id.as_deref().is_some_and(|on| on != machine)
                    || self
                        .drains
                        .iter()
                        .find(|(drained, _)| drained == machine)
                        .is_none_or(|(_, drain)| drain.lets_go(&unit.name))
            }
            Shown::Rollout(name) => self.rollouts.iter().find(|record| record.name == *name).is_none_or(|record| {
                record.rollout.state != RolloutState::Running
                    || record.rollout.units.iter().any(|step| step.name == unit.name && step.step != Step::Waiting)
            }),
            Shown::Drained { unit: required, machine } => self
                .drains
                .iter()
                .find(|(drained, _)| drained == machine)
                .is_none_or(|(_, drain)| drain.lets_go(required)),
        }
    }
}

/// A decision under way: the budgets counted for it, which the driver takes from, and the
/// ledger's lock until it [`Decision::note`]s what it took.
pub struct Decision<'a> {
    pub budgets: Budgets,
    before: Budgets,
    notes: MutexGuard<'a, HashMap<String, Note>>,
}

impl DisruptionLedger {
    /// Counts the budgets from `view` and the notes it does not show yet, and holds the ledger
    /// until the decision is noted: the other drivers decide after.
    pub fn decide(&self, view: &BudgetView) -> Decision<'_> {
        let mut notes = self.notes.locked();
        let now = Instant::now();
        let by_name: HashMap<&str, &BudgetedUnit> = view.units.iter().map(|unit| (unit.name.as_str(), unit)).collect();
        for (name, note) in notes.iter_mut() {
            if note.seen.is_none() && by_name.get(name.as_str()).is_none_or(|unit| view.shows(unit, &note.shown)) {
                note.seen = Some(now);
            }
        }
        notes.retain(|_, note| match note.seen {
            Some(seen) => now.duration_since(seen) < SHOWN,
            None => now.duration_since(note.noted) < UNSHOWN,
        });
        // A note this view does not show counts down; one it shows, it counts by itself.
        let pending = |unit: &BudgetedUnit| match notes.get(&unit.name) {
            Some(note) if !view.shows(unit, &note.shown) => Pending {
                down: true,
                left: match &note.shown {
                    Shown::Left(machine) => Some(machine.clone()),
                    Shown::Rollout(_) | Shown::Drained { .. } => None,
                },
            },
            _ => Pending::default(),
        };
        let members = budget_members(&view.units, &view.states, &view.drains, &view.rollouts, &view.machines, pending);
        let budgets = Budgets::new(members);
        Decision { before: budgets.clone(), budgets, notes }
    }
}

impl Decision<'_> {
    /// Notes `units`, each with what will show it (the units a decision took from a copy of
    /// [`Decision::budgets`]), and lets the other deciders decide.
    pub fn note_these(mut self, units: impl IntoIterator<Item = (String, Shown)>) {
        let now = Instant::now();
        for (name, shown) in units {
            self.notes.insert(name, Note { shown, noted: now, seen: None });
        }
    }

    /// Notes every unit the decision took down, each with what will show it, and lets the
    /// other drivers decide.
    pub fn note(mut self, shown: impl Fn(&str) -> Option<Shown>) {
        let now = Instant::now();
        for name in self.budgets.taken_since(&self.before) {
            if let Some(shown) = shown(&name) {
                self.notes.insert(name, Note { shown, noted: now, seen: None });
            }
        }
    }
}
