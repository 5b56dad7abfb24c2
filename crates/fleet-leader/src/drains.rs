//! The engine leader's drain driver: while its fleetd leads, the drain of every drained
//! machine is stepped (`fleet_core::drain::advance`) against what the machines report, and
//! stored when it moved on; the engine then moves the units it let go.
//!
//! It reads the drains, the units and the states of the units a drain concerns from the
//! store's watch-fed copy, and wakes when any of those change. With no machine drained it
//! reads the (empty) drains on each change and nothing more: never every machine, which at
//! 10,000 machines cost the leader a third of its CPU while their agents reported states.

use fleet_core::events::{EventKind, NewEvent};
use fleet_registry::{EventSink, micros_now};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use fleet_core::UnitState;
use fleet_core::drain::{Drain, advance_within};
use fleet_registry::{RegistryError, UnitView, budgeted_requirers, drain_unit_names, drain_units, note_required_by};
use fleet_runtime::{LeaderPass, Lifecycle, Next, Triggers, while_leading};
use tokio::sync::watch;

use crate::budget_view::read_budget_view;
use crate::leader_store::LeaderStore;
use crate::now;
use fleet_registry::{BudgetView, DisruptionLedger, Shown};

/// The longest a drain with units moving goes without a pass though nothing changed: a
/// safety net under the change signals.
const FALLBACK: Duration = Duration::from_secs(60);

pub struct DrainDriver {
    registry: Arc<dyn LeaderStore>,
    /// The disruptions this process decided, shared with the rollout driver.
    ledger: DisruptionLedger,
    /// Where the drains' steps go as events.
    events: EventSink,
}

impl DrainDriver {
    pub fn new(registry: Arc<dyn LeaderStore>) -> Self {
        Self { registry, ledger: DisruptionLedger::default(), events: EventSink::discarding() }
    }

    /// Tells `events` of each unit a drain lets go, each hold on a budget, each machine drained.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    /// The driver counting disruption budgets with `ledger` (the one the rollout driver uses).
    pub fn sharing(mut self, ledger: DisruptionLedger) -> Self {
        self.ledger = ledger;
        self
    }

    /// Steps the drains while `leads` says this fleetd leads, until `lifecycle` ends it.
    pub async fn run(self, leads: watch::Receiver<bool>, lifecycle: watch::Receiver<Lifecycle>) {
        let changes = Triggers::none().with(self.registry.unit_changes());
        while_leading(self, changes, leads, lifecycle).await;
    }

    /// Steps every drain; says whether one still has units to move.
    async fn step_drains(&self) -> Result<bool, RegistryError> {
        let drained = self.registry.drains().await?;
        if drained.is_empty() {
            return Ok(false);
        }
        let units = self.registry.units_copied().await?;
        let names = drained.iter().flat_map(|(machine, drain)| drain_unit_names(&units, machine, drain)).collect();
        let states = self.registry.states_of(&names).await?;
        let budgets = read_budget_view(&*self.registry, &units).await?;
        let (steps, unfinished) = self.step_all(drained, &units, &states, &budgets);
        for (machine, drain) in steps {
            self.registry.step_drain(&machine, &drain).await?;
        }
        Ok(unfinished)
    }
}

impl DrainDriver {
    /// Steps every drain under one decision of the ledger: the units they let go are taken from
    /// the same budgets, and noted before they are written. Returns the drains that moved on,
    /// and whether one still has units to move.
    fn step_all(
        &self,
        drained: Vec<(String, Drain)>,
        units: &[UnitView],
        states: &[Arc<UnitState>],
        budgets: &BudgetView,
    ) -> (Vec<(String, Drain)>, bool) {
        let now = now();
        let mut unfinished = false;
        let mut steps = Vec::new();
        let mut decision = self.ledger.decide(budgets);
        let mut let_go_from: HashMap<String, String> = HashMap::new();
        let mut required_from: HashMap<String, Shown> = HashMap::new();
        // A unit that budgeted units require is let go within their budgets too.
        let requirers = budgeted_requirers(&budgets.units);
        for (machine, mut drain) in drained {
            let before = drain.clone();
            let mut concerned = drain_units(units, states, &machine, &before);
            note_required_by(&mut concerned, &requirers);
            let progress = advance_within(&mut drain, &machine, &concerned, now, &mut decision.budgets);
            if drain != before {
                let let_go: Vec<&String> = drain.released.keys().filter(|unit| !before.lets_go(unit)).collect();
                if !let_go.is_empty() {
                    tracing::info!(machine, units = ?let_go, "drain lets units go");
                }
                let at = micros_now();
                self.events.note_all(let_go.iter().map(|unit| {
                    NewEvent::new(at, EventKind::Drain, "the drain lets it go").of_unit(unit).on_machine(&machine)
                }));
                // Those that require what goes lose it while it moves: their budgets took it.
                for unit in concerned.iter().filter(|unit| let_go.contains(&&unit.name)) {
                    for requirer in &unit.required_by {
                        let shown = Shown::Drained { unit: unit.name.clone(), machine: machine.clone() };
                        required_from.entry(requirer.clone()).or_insert(shown);
                    }
                }
                let_go_from.extend(let_go.into_iter().map(|unit| (unit.clone(), machine.clone())));
                if let Some(held) = drain.held.as_ref().filter(|held| before.held.as_ref() != Some(*held)) {
                    tracing::info!(machine, held, "drain waits on a disruption budget");
                    let message = format!("the drain waits: {held}");
                    self.events.note(NewEvent::new(at, EventKind::Drain, message).on_machine(&machine));
                }
                if progress.word() == "drained" {
                    tracing::info!(machine, moved = drain.moved, stay = progress.stays.len(), "machine drained");
                    let message = format!("drained: {} moved, {} stay", drain.moved, progress.stays.len());
                    self.events.note(NewEvent::new(at, EventKind::Drain, message).on_machine(&machine));
                }
                steps.push((machine, drain));
            }
            unfinished |= !progress.moving.is_empty() || !progress.left.is_empty();
        }
        decision.note(|unit| {
            let left = let_go_from.get(unit).cloned().map(Shown::Left);
            left.or_else(|| required_from.get(unit).cloned())
        });
        (steps, unfinished)
    }
}

impl LeaderPass for DrainDriver {
    type Error = RegistryError;
    const NAME: &'static str = "drain pass";
    /// States change in bursts (a wave of units starting elsewhere): one pass for the burst.
    const SETTLE: Duration = Duration::from_millis(250);

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Ok(if self.step_drains().await? { Next::After(FALLBACK) } else { Next::OnChange })
    }
}
