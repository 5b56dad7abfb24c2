//! The engine leader's rollout driver: while its fleetd leads, every running rollout is
//! stepped (`fleet_core::rollout::advance`) against what the machines report, the units of
//! the next wave get their new content (written as their owner would), and the rollout is
//! stored again, so that a new leader carries on where this one stopped.
//!
//! It reads only the units of running rollouts and their states, from the store's watch-fed
//! copy, and wakes when a rollout, a unit or a state changes, or when a step is due by the
//! clock (a deadline passing, a unit ready for long enough). With no rollout running it reads
//! nothing until a rollout changes.

use fleet_core::events::{EventKind, NewEvent};
use fleet_registry::{EventSink, micros_now};
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleet_core::disruption_budget::Budgets;
use fleet_core::health::HealthStatus;
use fleet_core::rollout::dependency_order::dependencies_by_content;
use fleet_core::rollout::{Health, Observed, Rollout, RolloutState, advance_in_order, next_timed_step};
use fleet_core::secret_rotation::pinned;
use fleet_core::secrets::version_identity;
use fleet_core::{UnitFile, UnitHash, UnitState};
use fleet_registry::{RegistryError, RolledSecret, RolloutRecord, UnitChange, UnitView, Writer};
use fleet_runtime::{Lifecycle, Next};
use tokio::sync::watch;

use crate::budget_view::read_budget_view;
use crate::leader_store::LeaderStore;
use crate::now;
use fleet_registry::{BudgetView, DisruptionLedger, Shown};
use fleet_runtime::{LeaderPass, Triggers, while_leading};

/// The longest a running rollout goes without a pass though nothing changed: a safety net
/// under the change signals.
const FALLBACK: Duration = Duration::from_secs(60);

/// The longest a burst of reports is gathered, however long the last pass took.
const MOST_SETTLING: Duration = Duration::from_millis(250);

pub struct RolloutDriver {
    registry: Arc<dyn LeaderStore>,
    /// The disruptions this process decided, shared with the drain driver.
    ledger: DisruptionLedger,
    /// The unit names of each running rollout, by rollout name.
    followed: HashMap<String, Followed>,
    /// How long the last pass waited on its writes (waves and records).
    writing: Duration,
    /// Where the rollouts' steps go as events.
    events: EventSink,
}

/// How a unit runs, as a rollout counts it: active counts only once its health check (where
/// it has one) says healthy.
pub fn health(state: &UnitState) -> Health {
    match state.systemd.active.as_str() {
        "active" => match state.health.as_ref().map(|report| report.status) {
            None | Some(HealthStatus::Healthy) => Health::Active,
            Some(HealthStatus::Unknown) => Health::Changing,
            Some(HealthStatus::Unhealthy) => Health::Unhealthy,
        },
        "failed" => Health::Down,
        // Loaded and not started yet (a replacement under way), or started and gone.
        "inactive" if !state.launched => Health::Changing,
        "inactive" => Health::Down,
        _ => Health::Changing,
    }
}

/// A running rollout's unit names as a pass needs them: a set to ask the store with, and
/// each name's position in the rollout. Kept between passes and made again only when the
/// rollout's units are no longer these (another rollout of that name, an undo).
pub struct Followed {
    names: BTreeSet<String>,
    positions: HashMap<String, usize>,
    /// Whether a unit of the rollout may state a disruption budget (its content before or
    /// after does; for a secret's rollout, the content its units had when it was first read):
    /// only then does a pass count the budgets.
    budgeted: Option<bool>,
}

impl Followed {
    pub fn of(rollout: &Rollout) -> Self {
        let names = rollout.units.iter().map(|unit| unit.name.clone()).collect();
        let positions =
            rollout.units.iter().enumerate().map(|(position, unit)| (unit.name.clone(), position)).collect();
        Self { names, positions, budgeted: None }
    }

    /// Whether these are `rollout`'s units, in its order.
    fn fits(&self, rollout: &Rollout) -> bool {
        self.positions.len() == rollout.units.len()
            && rollout
                .units
                .iter()
                .enumerate()
                .all(|(position, unit)| self.positions.get(&unit.name) == Some(&position))
    }
}

/// What the machines report of each unit of `rollout`, lined up with its units (`followed`
/// holds their positions): when two machines report one (a unit on its way from one to the
/// other), the report of the content the rollout brings, else of the content it replaces.
///
/// A secret's rollout (`secret`) names the content a unit runs by the version of the secret
/// it was given (`fleet_core::secrets::version_identity`), not by its unit file.
pub fn observed<S: Borrow<UnitState>>(
    states: &[S],
    rollout: &Rollout,
    followed: &Followed,
    secret: Option<&RolledSecret>,
) -> Vec<Option<Observed>> {
    let content = |state: &UnitState| match secret {
        None => state.hash,
        Some(secret) => version_identity(&secret.name, state.secrets.get(&secret.name).copied().unwrap_or(0)),
    };
    let mut seen: Vec<Option<Observed>> = vec![None; rollout.units.len()];
    let rank = |position: usize, hash: UnitHash| {
        let unit = &rollout.units[position];
        match hash {
            hash if hash == unit.to => 2,
            hash if hash == unit.from => 1,
            _ => 0,
        }
    };
    for state in states.iter().map(Borrow::borrow) {
        let Some(&position) = followed.positions.get(state.name.as_str()) else { continue };
        let Some(slot) = seen.get_mut(position) else { continue };
        let hash = content(state);
        if slot.as_ref().is_some_and(|kept| rank(position, kept.hash) > rank(position, hash)) {
            continue;
        }
        let failure = state.health.as_ref().map(|report| report.failure.clone()).unwrap_or_default();
        *slot = Some(Observed { hash, health: health(state), failure });
    }
    seen
}

impl RolloutDriver {
    pub fn new(registry: Arc<dyn LeaderStore>) -> Self {
        Self {
            registry,
            ledger: DisruptionLedger::default(),
            followed: HashMap::new(),
            writing: Duration::ZERO,
            events: EventSink::discarding(),
        }
    }

    /// Tells `events` of each unit a rollout replaces, each hold, pause, revert and end.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    fn note(&self, name: &str, unit: Option<&str>, message: String) {
        let event = NewEvent::new(micros_now(), EventKind::Rollout, format!("rollout {name}: {message}"));
        self.events.note(match unit {
            Some(unit) => event.of_unit(unit),
            None => event,
        });
    }

    /// The driver counting disruption budgets with `ledger` (the one the drain driver uses).
    pub fn sharing(mut self, ledger: DisruptionLedger) -> Self {
        self.ledger = ledger;
        self
    }

    /// Whether a unit of `record`'s rollout may state a disruption budget: its bodies say so,
    /// or for a secret's rollout (which carries no bodies) the units' files as first read.
    async fn budgeted(&self, record: &RolloutRecord, followed: &Followed) -> Result<bool, RegistryError> {
        if let Some(budgeted) = followed.budgeted {
            return Ok(budgeted);
        }
        let states_one = |text: &str| text.contains(fleet_core::disruption_budget::KEY);
        if record.secret.is_none() {
            return Ok(record.bodies.values().any(|body| states_one(body)));
        }
        let units = self.registry.units_named(&followed.names).await?;
        Ok(!fleet_registry::budgeted_units(&units).is_empty())
    }

    /// Steps the rollouts while `leads` says this fleetd leads, until `lifecycle` ends it.
    pub async fn run(self, leads: watch::Receiver<bool>, lifecycle: watch::Receiver<Lifecycle>) {
        let changes = Triggers::none().with(self.registry.source_changes()).with(self.registry.unit_changes());
        while_leading(self, changes, leads, lifecycle).await;
    }

    /// Steps every running rollout; says when the next pass is due if any still runs.
    async fn step_running(&mut self) -> Result<Option<Duration>, RegistryError> {
        let running: Vec<Arc<RolloutRecord>> = self
            .registry
            .rollouts()
            .await?
            .into_iter()
            .filter(|record| record.rollout.state == RolloutState::Running)
            .collect();
        self.followed.retain(|name, _| running.iter().any(|record| record.name == *name));
        if running.is_empty() {
            return Ok(None);
        }
        let now = now();
        let mut next = FALLBACK;
        self.writing = Duration::ZERO;
        let mut any_budgeted = false;
        for record in &running {
            let mut followed = self.followed.remove(&record.name).unwrap_or_else(|| Followed::of(&record.rollout));
            if !followed.fits(&record.rollout) {
                followed = Followed::of(&record.rollout);
            }
            let budgeted = self.budgeted(record, &followed).await?;
            followed.budgeted = Some(budgeted);
            any_budgeted |= budgeted;
            self.followed.insert(record.name.clone(), followed);
        }
        // The budgets are counted once a pass, from every unit, only when a unit may have one.
        let budget_view = match any_budgeted {
            true => Some(read_budget_view(&*self.registry, &self.registry.units_copied().await?).await?),
            false => None,
        };
        for before in running {
            let began = tokio::time::Instant::now();
            let Some(followed) = self.followed.get(&before.name) else { continue };
            let states = self.registry.states_of(&followed.names).await?;
            let read = began.elapsed();
            // The stored record is shared with the store's copy: the step works on its own.
            let mut record = RolloutRecord::clone(&before);
            let seen = observed(&states, &record.rollout, followed, record.secret.as_ref());
            // A unit whose new content names units of the rollout waits until they are done.
            let dependencies = dependencies_by_content(&record.rollout.units, &record.bodies);
            let step = match budget_view.as_ref().filter(|_| followed.budgeted == Some(true)) {
                Some(view) => self.step_within(&mut record, &seen, now, view, &dependencies),
                None => {
                    advance_in_order(&mut record.rollout, seen.as_slice(), now, &mut Budgets::default(), &dependencies)
                }
            };
            if let Some(held) = record.rollout.held.as_ref().filter(|held| before.rollout.held.as_ref() != Some(*held))
            {
                tracing::info!(rollout = record.name, held, "rollout waits");
                self.note(&record.name, None, format!("waits: {held}"));
            }
            let stepped = began.elapsed();
            if !step.replace.is_empty() {
                tracing::info!(rollout = record.name, units = step.replace.len(), "rolling out new content");
                for unit in &step.replace {
                    self.note(&record.name, Some(unit.as_str()), "gives it its new content".to_string());
                }
                match &record.secret {
                    Some(secret) => self.move_secret(&record, secret, &step.replace).await?,
                    None => self.replace_all(&record, &step.replace).await?,
                }
            }
            let written = began.elapsed();
            self.writing += written - stepped;
            let storing = tokio::time::Instant::now();
            if record.rollout != before.rollout {
                if let Some(why) = record.rollout.reverted.as_ref().filter(|_| before.rollout.reverted.is_none()) {
                    tracing::warn!(rollout = record.name, why, "rollout reverting by itself: a gate failed");
                    self.note(&record.name, None, format!("reverting by itself: {why}"));
                }
                let state_moved = record.rollout.state != before.rollout.state;
                if let RolloutState::Paused { reason } = &record.rollout.state {
                    tracing::warn!(rollout = record.name, reason, "rollout paused");
                    if state_moved {
                        self.note(&record.name, None, format!("paused: {reason}"));
                    }
                } else if record.rollout.state == RolloutState::Done {
                    tracing::info!(rollout = record.name, "rollout done");
                    if state_moved {
                        self.note(&record.name, None, "done".to_string());
                    }
                }
                // Not over a pause, an undo or a promotion made since `before` was read:
                // that change stands, and the next pass steps from it.
                if !self.registry.put_rollout_over(&record, &before).await? {
                    tracing::info!(rollout = record.name, "rollout changed during its step; stepping it again");
                }
            }
            self.writing += storing.elapsed();
            tracing::debug!(
                rollout = record.name,
                units = record.rollout.units.len(),
                replaced = step.replace.len(),
                ?read,
                ?stepped,
                ?written,
                stored = ?began.elapsed(),
                "rollout pass"
            );
            if let Some(due) = next_timed_step(&record.rollout) {
                next = next.min(Duration::from_secs(due.saturating_sub(now)));
            }
        }
        Ok(Some(next))
    }

    /// Writes the new content of the units `names` (a wave), each as its owner, in as few
    /// requests as the store allows: a wave of a thousand units is not a thousand round trips.
    /// A write that failed fails the pass (retried; the writes that landed are the same again).
    async fn replace_all(&self, record: &RolloutRecord, names: &[String]) -> Result<(), RegistryError> {
        // Who owns each unit and what it wants, read for the wave only.
        let wave: BTreeSet<String> = names.iter().cloned().collect();
        let units: BTreeMap<String, UnitView> =
            self.registry.units_named(&wave).await?.into_iter().map(|unit| (unit.name.clone(), unit)).collect();
        let targets: HashMap<&str, UnitHash> =
            record.rollout.units.iter().map(|unit| (unit.name.as_str(), unit.to)).collect();
        // Each new content is read once, however many units take it.
        let mut files: HashMap<UnitHash, Option<UnitFile>> = HashMap::new();
        let mut by_writer: Vec<(Writer, Vec<UnitChange>)> = Vec::new();
        for name in names {
            let Some(&to) = targets.get(name.as_str()) else { continue };
            let file = files.entry(to).or_insert_with(|| {
                let file = record.bodies.get(&to.to_string()).and_then(|text| UnitFile::parse(text).ok());
                if file.is_none() {
                    tracing::error!(rollout = record.name, content = %to, "the rollout holds no readable body for this content");
                }
                file
            });
            let Some(file) = file.as_ref() else { continue };
            let Some(current) = units.get(name) else {
                tracing::warn!(rollout = record.name, unit = name, "a unit of the rollout is gone");
                continue;
            };
            let by = record.changed_by(current.source.as_deref());
            let writer = match &current.source {
                Some(source) => Writer::Source { name: source.clone(), take_over: false, drift: current.drift, by },
                None => Writer::Hand { take_over: false, by, guard: None },
            };
            let change = UnitChange { name: name.clone(), file: Some(file.clone()), desired: current.desired };
            match by_writer.iter_mut().find(|(kept, _)| *kept == writer) {
                Some((_, changes)) => changes.push(change),
                None => by_writer.push((writer, vec![change])),
            }
        }
        for (writer, changes) in &by_writer {
            for answer in self.registry.change_units_as(changes, writer).await? {
                answer?;
            }
        }
        Ok(())
    }
}

impl RolloutDriver {
    /// Moves the units `names` (a wave of a secret's rollout) to the version of `secret` the
    /// rollout takes each to: their machines restart them with it.
    async fn move_secret(
        &self,
        record: &RolloutRecord,
        secret: &RolledSecret,
        names: &[String],
    ) -> Result<(), RegistryError> {
        let wave: BTreeSet<String> = names.iter().cloned().collect();
        let units: BTreeMap<String, UnitView> =
            self.registry.units_named(&wave).await?.into_iter().map(|unit| (unit.name.clone(), unit)).collect();
        let targets: HashMap<&str, UnitHash> =
            record.rollout.units.iter().map(|unit| (unit.name.as_str(), unit.to)).collect();
        for name in names {
            let Some(version) = targets.get(name.as_str()).and_then(|&to| secret.version_of(to)) else {
                tracing::error!(
                    rollout = record.name,
                    unit = name,
                    "the rollout names no version of its secret for this unit"
                );
                continue;
            };
            let Some(current) = units.get(name) else {
                tracing::warn!(rollout = record.name, unit = name, "a unit of the rollout is gone");
                continue;
            };
            let pins = pinned(&current.secrets, &secret.name, version, false);
            self.registry.set_secret_pins(name, &pins).await?;
        }
        Ok(())
    }
}

impl RolloutDriver {
    /// One step of `record`'s rollout taken from the disruption budgets counted from `view`
    /// and the ledger; the units it replaces are noted before they are written.
    fn step_within(
        &self,
        record: &mut RolloutRecord,
        seen: &[Option<Observed>],
        now: u64,
        view: &BudgetView,
        dependencies: &fleet_core::rollout::dependency_order::RolloutDependencies,
    ) -> fleet_core::rollout::Advance {
        let mut decision = self.ledger.decide(view);
        let step = advance_in_order(&mut record.rollout, seen, now, &mut decision.budgets, dependencies);
        decision.note(|_| Some(Shown::Rollout(record.name.clone())));
        step
    }
}

impl LeaderPass for RolloutDriver {
    type Error = RegistryError;
    const NAME: &'static str = "rollout pass";
    /// States change in bursts (a wave of units restarting): one pass for the burst.
    const SETTLE: Duration = Duration::from_millis(25);

    /// Under a stream of reports a burst is gathered for as long as the last pass worked (at
    /// most [`MOST_SETTLING`]): each pass then takes more units at once and the driver takes
    /// at most about half a core. The time it waited on its writes does not count: what the
    /// store is asked to take is bounded by the budget (a wave writes only units that others
    /// done have made room for), and gathering for as long as a wave took to write doubled
    /// every wave's turn, with the driver and the store idle between them.
    fn settle(&self, took: Duration) -> Duration {
        Self::SETTLE.max(took.saturating_sub(self.writing).min(MOST_SETTLING))
    }

    /// A running rollout is stepped on every change and when a step is due by the clock; with
    /// none running, the next pass waits for a rollout to change.
    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Ok(self.step_running().await?.map_or(Next::OnChange, Next::After))
    }
}

#[cfg(test)]
mod tests {
    use fleet_core::rollout::{MaxUnavailable, RolloutUnit, Step};
    use fleet_core::{SystemdState, UnitFile};

    use super::*;

    fn hash(text: &str) -> UnitHash {
        UnitFile::parse(&format!("[Service]\nExecStart={text}\n")).expect("a unit").hash()
    }

    fn state(name: &str, machine: &str, hash: UnitHash, active: &str) -> UnitState {
        UnitState {
            run: None,
            name: name.into(),
            machine_id: machine.into(),
            hash,
            systemd: SystemdState::new("loaded", active, "running"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
        }
    }

    #[test]
    fn a_unit_reported_twice_is_seen_on_the_content_the_rollout_brings_else_the_one_it_replaces() {
        let (old, new, other) = (hash("/bin/old"), hash("/bin/new"), hash("/bin/other"));
        let rollout = Rollout {
            units: ["a.service", "b.service"]
                .iter()
                .map(|name| RolloutUnit { name: name.to_string(), from: old, to: new, step: Step::Waiting })
                .collect(),
            max_unavailable: MaxUnavailable::Count(1),
            min_ready: 0,
            deadline: 60,
            state: RolloutState::Running,
            undo: false,
            canary: None,
            auto_revert: false,
            reverted: None,
            held: None,
        };
        let states = [
            state("a.service", "m1", new, "active"),
            state("a.service", "m2", old, "failed"),
            state("b.service", "m1", other, "active"),
            state("b.service", "m2", old, "inactive"),
            state("c.service", "m1", old, "active"),
        ];
        let seen = observed(&states, &rollout, &Followed::of(&rollout), None);
        assert_eq!(seen.len(), 2, "one report per unit of the rollout, c.service not among them: {seen:?}");
        let [Some(a), Some(b)] = [&seen[0], &seen[1]] else { panic!("both units are reported: {seen:?}") };
        assert_eq!((a.hash, a.health), (new, Health::Active));
        assert_eq!((b.hash, b.health), (old, Health::Down));
    }
}
