//! The disruption ledger the engine leader's drivers share: every voluntary disruption (a
//! rollout's wave, a drain's units let go) is taken from the disruption budgets of the units'
//! groups (`fleet_core::disruption_budget`), counted from what the store shows plus the
//! disruptions decided in this process that the store does not show yet.
//!
//! The drivers run side by side and read the store's watch-fed copy, which a write reaches a
//! moment later: without the ledger, a drain and a rollout stepping at once could each see one
//! unit of a budget of 1 down and take another. So each decision is made under the ledger's
//! lock, with the disruptions noted by the others and not yet shown by the copy it read counted
//! down, and notes its own before it writes them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_core::MachineState;
use fleet_core::disruption_budget::{Budgets, DisruptionBudget};
use fleet_core::drain::Drain;
use fleet_core::rollout::{RolloutState, Step};
use fleet_core::unpoisoned::Locked;
use fleet_registry::{RegistryError, RolloutRecord, UnitView, budget_members, budgeted_units};

use crate::leader_store::LeaderStore;

/// How long a disruption no view has shown yet counts down by the note alone: far past any
/// write's way to the store's copy (a write that failed leaves a note behind, held this long).
const UNSHOWN: Duration = Duration::from_secs(300);

/// How long a note outlives the first view that showed it: a pass still working from an
/// older view counts it for that long.
const SHOWN: Duration = Duration::from_secs(60);

/// What shows that a noted disruption reached the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// The drain of this machine let the unit go (or it left the machine).
    Drain(String),
    /// This rollout started on the unit.
    Rollout(String),
}

#[derive(Clone, Debug)]
struct Note {
    shown: Shown,
    noted: Instant,
    /// When a view first showed it.
    seen: Option<Instant>,
}

/// The disruptions decided in this process, shared by the drivers.
#[derive(Clone, Debug, Default)]
pub struct DisruptionLedger {
    notes: Arc<Mutex<HashMap<String, Note>>>,
}

/// What a driver read of the store to count the budgets: the budgeted units, the reports of
/// them, the drains, the rollouts and (where a budget is grouped by a key) the machines.
pub struct BudgetView {
    units: Vec<(UnitView, DisruptionBudget)>,
    states: Vec<Arc<fleet_core::UnitState>>,
    drains: Vec<(String, Drain)>,
    rollouts: Vec<Arc<RolloutRecord>>,
    machines: Vec<MachineState>,
}

impl BudgetView {
    /// Reads what the budgets are counted from, given every unit (`units`, the store's copy).
    /// With no unit budgeted it reads nothing more.
    pub async fn read(store: &dyn LeaderStore, units: &[UnitView]) -> Result<Self, RegistryError> {
        let budgeted = budgeted_units(units);
        let mut view = Self {
            units: budgeted.iter().map(|(unit, budget)| ((*unit).clone(), budget.clone())).collect(),
            states: Vec::new(),
            drains: Vec::new(),
            rollouts: Vec::new(),
            machines: Vec::new(),
        };
        if budgeted.is_empty() {
            return Ok(view);
        }
        let names: BTreeSet<String> = budgeted.iter().map(|(unit, _)| unit.name.clone()).collect();
        view.states = store.states_of(&names).await?;
        view.drains = store.drains().await?;
        view.rollouts = store.rollouts().await?;
        if budgeted.iter().any(|(_, budget)| budget.by.is_some()) {
            view.machines = store.machines().await?;
        }
        Ok(view)
    }

    /// Whether the view shows `shown` for `unit`.
    fn shows(&self, unit: &UnitView, shown: &Shown) -> bool {
        match shown {
            Shown::Drain(machine) => {
                unit.machine_id.as_deref() != Some(machine.as_str())
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
        }
    }
}

/// A decision under way: the budgets counted for it, which the driver takes from, and the
/// ledger's lock until it [`Decision::note`]s what it took.
pub struct Decision<'a> {
    pub budgets: Budgets,
    before: Budgets,
    notes: std::sync::MutexGuard<'a, HashMap<String, Note>>,
}

impl DisruptionLedger {
    /// Counts the budgets from `view` and the notes it does not show yet, and holds the ledger
    /// until the decision is noted: the other drivers decide after.
    pub fn decide(&self, view: &BudgetView) -> Decision<'_> {
        let mut notes = self.notes.locked();
        let now = Instant::now();
        let by_name: HashMap<&str, &UnitView> = view.units.iter().map(|(unit, _)| (unit.name.as_str(), unit)).collect();
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
        let pending = |unit: &UnitView| notes.get(&unit.name).is_some_and(|note| !view.shows(unit, &note.shown));
        let members = budget_members(&view.units, &view.states, &view.drains, &view.rollouts, &view.machines, pending);
        let budgets = Budgets::new(members);
        Decision { before: budgets.clone(), budgets, notes }
    }
}

impl Decision<'_> {
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
