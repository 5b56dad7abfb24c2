//! Rollouts, sans I/O: new content reaches running units in waves. At most `max_unavailable`
//! of a rollout's units are down or unhealthy at once (being replaced, or so for any reason);
//! a replaced unit counts as done once it ran the new content, active and healthy (where it has
//! a health check), for `min_ready`; a unit that fails to get there pauses the rollout, naming
//! the unit and its state, or undoes it by itself (`auto_revert`). A canary goes first: its
//! units are replaced alone, and the rest follow once it stayed well for its bake time or is
//! promoted by hand. [`advance`] is one step: from the rollout and what the machines report,
//! the units to replace now and the rollout's next state. Whoever drives it (the engine
//! leader) stores the rollout, so that a new leader carries on where the old one stopped.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::UnitHash;
use crate::disruption_budget::Budgets;
pub use crate::max_unavailable::MaxUnavailable;

/// The longest bake time a canary may ask for (seconds): a week.
pub const MOST_BAKE: u64 = 7 * 86_400;

/// The longest a rollout waits for a unit to become ready (its deadline) or to stay ready
/// (its min-ready), in seconds: a week, as a bake.
pub const MOST_WAIT: u64 = MOST_BAKE;

/// Checks a rollout's wait (`minReadySeconds` from 0, `deadlineSeconds` from 1) as a request
/// or a source states it: at most [`MOST_WAIT`].
pub fn check_wait(option: &str, seconds: u64) -> Result<u64, String> {
    let least = u64::from(option == "deadlineSeconds");
    if (least..=MOST_WAIT).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(format!("invalid {option} {seconds}: from {least} to {MOST_WAIT} seconds (a week)"))
    }
}

/// How a rollout proves new content before it goes on, as a request or a source states it:
/// a canary of `canary` units (a count or a percentage) first, staying well for `bake`
/// seconds before the rest follow by themselves (only on a promotion without it), and whether
/// a failed gate undoes the rollout by itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gates {
    pub canary: Option<MaxUnavailable>,
    pub bake: Option<u64>,
    pub auto_revert: bool,
}

impl Gates {
    /// Reads the settings as the API and fleetctl take them.
    pub fn parse(canary: Option<&str>, bake: Option<u64>, auto_revert: bool) -> Result<Self, String> {
        let canary = canary
            .map(|text| {
                MaxUnavailable::parse(text).map_err(|_| {
                    format!("invalid canary {text:?}: a number of units (1 or more) or a percentage (1% to 100%)")
                })
            })
            .transpose()?;
        if bake.is_some() && canary.is_none() {
            return Err("a bake time needs a canary".to_string());
        }
        if bake.is_some_and(|bake| bake > MOST_BAKE) {
            return Err(format!("invalid bake time: at most {MOST_BAKE} seconds (a week)"));
        }
        Ok(Self { canary, bake, auto_revert })
    }

    /// The canary of a rollout of `total` units, if it has one: never all of them.
    pub fn canary_of(&self, total: usize) -> Option<Canary> {
        let size = self.canary?;
        let count = size.of(total).min(total.saturating_sub(1));
        (count > 0).then_some(Canary { count, bake: self.bake, done_since: None, promoted: false })
    }

    /// A new rollout's canary, and its units (`units` as asked) in the order it replaces them:
    /// the canary's, the first asked, then the rest machine by machine ([`machine_by_machine`]).
    pub fn replacement_order<'m, T>(
        &self,
        units: Vec<T>,
        machine_of: impl Fn(&T) -> Option<&'m str>,
    ) -> (Option<Canary>, Vec<T>) {
        let canary = self.canary_of(units.len());
        let first = canary.as_ref().map_or(0, |canary| canary.count);
        (canary, machine_by_machine(units, first, machine_of))
    }
}

/// Where one unit of a rollout is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Still on its old content, not yet started on.
    Waiting,
    /// Its new content was written at `since` (seconds); not yet seen running it.
    Replacing {
        since: u64,
    },
    /// Seen running the new content, active, since `since`.
    Ready {
        since: u64,
    },
    Done,
    /// It did not get there: why.
    Failed {
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutUnit {
    pub name: String,
    /// The content it had when the rollout began (what an undo goes back to).
    pub from: UnitHash,
    pub to: UnitHash,
    pub step: Step,
}

/// What the machines report of one unit: the content it runs and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub hash: UnitHash,
    pub health: Health,
    /// What its health check last found wrong, when it is unhealthy.
    pub failure: String,
}

impl Observed {
    pub fn new(hash: UnitHash, health: Health) -> Self {
        Self { hash, health, failure: String::new() }
    }
}

/// What the machines report of a rollout's units, asked of each unit by its position in
/// the rollout and its name: a map by name a test builds, or the reports the driver lines up
/// with the rollout's units (by position: a pass over 10,000 units looks nothing up).
pub trait Reports {
    fn of(&self, position: usize, name: &str) -> Option<&Observed>;
}

impl Reports for BTreeMap<String, Observed> {
    fn of(&self, _position: usize, name: &str) -> Option<&Observed> {
        self.get(name)
    }
}

impl Reports for HashMap<&str, Observed> {
    fn of(&self, _position: usize, name: &str) -> Option<&Observed> {
        self.get(name)
    }
}

/// Reports in the order of the rollout's units: the one at a unit's position is its own.
impl Reports for [Option<Observed>] {
    fn of(&self, position: usize, _name: &str) -> Option<&Observed> {
        self.get(position).and_then(Option::as_ref)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Active, and healthy where it has a health check.
    Active,
    /// Starting, stopped to be replaced, or active with no verdict from its check yet: not
    /// down for good yet.
    Changing,
    /// Active, and its health check says it does not work.
    Unhealthy,
    /// Failed, or stopped with no change under way.
    Down,
}

/// The rollout's first units, replaced before the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Canary {
    /// How many of the rollout's first units it holds.
    pub count: usize,
    /// How long (seconds) the canary must stay well once all its units are done before the
    /// rest follow by themselves; `None`: only when promoted by hand.
    pub bake: Option<u64>,
    /// When every unit of the canary was done (the bake began).
    #[serde(default)]
    pub done_since: Option<u64>,
    /// Whether the rest may follow.
    #[serde(default)]
    pub promoted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloutState {
    Running,
    /// Paused by hand or by a failure (the reason names the unit and its state).
    Paused {
        reason: String,
    },
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    #[serde(with = "stored_units")]
    pub units: Vec<RolloutUnit>,
    pub max_unavailable: MaxUnavailable,
    /// How long a replaced unit must stay active before it counts as done (seconds).
    pub min_ready: u64,
    /// How long a replaced unit may take to become active before it counts as failed.
    pub deadline: u64,
    pub state: RolloutState,
    /// It takes units back to the content they had (an undo), so its end is "undone".
    #[serde(default)]
    pub undo: bool,
    #[serde(default)]
    pub canary: Option<Canary>,
    /// A failed gate (a unit down, or unhealthy past its deadline) undoes the rollout by
    /// itself instead of pausing it.
    #[serde(default)]
    pub auto_revert: bool,
    /// Why this undo began by itself: the gate that failed.
    #[serde(default)]
    pub reverted: Option<String>,
    /// Why its next unit waits though the rollout's own budget has room: the group's
    /// disruption budget that holds it ([`crate::disruption_budget`]), as of its last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

impl Rollout {
    /// The state as the API words it: `running`, `canary` (its canary is done and waits for
    /// its bake or a promotion), `paused` (by hand), `failed` (paused by a unit that did not get
    /// there), `done`, `undone` (an undo that finished), or `reverting`/`reverted` (an undo
    /// that began by itself).
    pub fn state_word(&self) -> &'static str {
        match &self.state {
            RolloutState::Running if self.reverted.is_some() => "reverting",
            RolloutState::Running if self.canary.as_ref().is_some_and(|c| c.done_since.is_some() && !c.promoted) => {
                "canary"
            }
            RolloutState::Running => "running",
            RolloutState::Done if self.reverted.is_some() => "reverted",
            RolloutState::Paused { .. } if self.units.iter().any(|unit| matches!(unit.step, Step::Failed { .. })) => {
                "failed"
            }
            RolloutState::Paused { .. } => "paused",
            RolloutState::Done if self.undo => "undone",
            RolloutState::Done => "done",
        }
    }
}

/// What the driver must do after a step: write these units' new content (the `to` hash of
/// their [`RolloutUnit`]), in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Advance {
    pub replace: Vec<String>,
}

/// One step of `rollout` at `now` (seconds), with what the machines report per unit (a unit
/// with no report is down), where no unit has a disruption budget: [`advance_within`].
pub fn advance(rollout: &mut Rollout, observed: &(impl Reports + ?Sized), now: u64) -> Advance {
    advance_within(rollout, observed, now, &mut Budgets::default())
}

/// One step of `rollout` at `now` (seconds), with what the machines report per unit (a unit
/// with no report is down). Moves units along, pauses on a failure (or, with `auto_revert`,
/// turns the rollout into its undo), promotes a canary that baked, starts the next wave when
/// the rollout's budget allows, and says which units to replace now. Each unit replaced is
/// taken from `budgets` too: a unit its group's disruption budget holds waits (the rollout's
/// `held` says why) and the next ones may go.
pub fn advance_within(
    rollout: &mut Rollout,
    observed: &(impl Reports + ?Sized),
    now: u64,
    budgets: &mut Budgets,
) -> Advance {
    advance_in_order(rollout, observed, now, budgets, &dependency_order::RolloutDependencies::default())
}

/// [`advance_within`] for units that wait for one another: a unit whose new content
/// (`dependencies`, by hash) names units of the rollout waits until they are done
/// ([`dependency_order::Blocked`]), and the rollout's `held` says so while nothing else goes.
pub fn advance_in_order(
    rollout: &mut Rollout,
    observed: &(impl Reports + ?Sized),
    now: u64,
    budgets: &mut Budgets,
    dependencies: &dependency_order::RolloutDependencies,
) -> Advance {
    rollout.held = None;
    // Each unit's report, looked up once (in the rollout's order) for the whole step.
    let seen: Vec<Option<&Observed>> =
        rollout.units.iter().enumerate().map(|(position, unit)| observed.of(position, &unit.name)).collect();
    step_units(rollout, &seen, now);
    // An undo is not gated: it puts back content known to work, and a unit that does not
    // come back well on it stays marked while the others go on.
    if let Some(why) = rollout.units.iter().find_map(|unit| match &unit.step {
        Step::Failed { why } => Some(why.clone()),
        _ => None,
    }) && rollout.state == RolloutState::Running
        && !rollout.undo
    {
        if rollout.auto_revert && !rollout.undo {
            // The gate failed: every unit touched goes back, starting with this step.
            let mut revert = rollout.undo();
            revert.reverted = Some(why);
            *rollout = revert;
        } else {
            rollout.state = RolloutState::Paused { reason: why };
        }
    }
    let finished = |step: &Step| *step == Step::Done || (rollout.undo && matches!(step, Step::Failed { .. }));
    if rollout.units.iter().all(|unit| finished(&unit.step)) {
        rollout.state = RolloutState::Done;
    }
    if rollout.state != RolloutState::Running {
        return Advance::default();
    }
    promote_a_baked_canary(rollout, now);
    // In flight until done (a ready unit has not yet stayed well for min_ready), and the
    // others that are down or unhealthy anyway, done or not yet started on.
    let is_down = |seen: &Option<&Observed>| seen.is_none_or(|seen| seen.health != Health::Active);
    let down = rollout
        .units
        .iter()
        .zip(&seen)
        .filter(|(unit, seen)| match unit.step {
            Step::Replacing { .. } | Step::Ready { .. } => true,
            Step::Failed { .. } if !rollout.undo => true,
            Step::Waiting | Step::Done | Step::Failed { .. } => is_down(seen),
        })
        .count();
    let mut budget = rollout.max_unavailable.of(rollout.units.len()).saturating_sub(down);
    // Until a canary is promoted, only its units are replaced.
    let eligible = match &rollout.canary {
        Some(canary) if !canary.promoted => canary.count,
        _ => rollout.units.len(),
    };
    let mut advance = Advance::default();
    let blocked = dependency_order::Blocked::of(&rollout.units, dependencies);
    // A unit that is down anyway goes first and costs nothing: replacing it takes nothing
    // more down (and an undo must reach the units a bad version took down).
    let mut held = None;
    let waits = |position: usize, name: &str, held: &mut Option<String>| match blocked.waits_for(position) {
        Some(required) => {
            held.get_or_insert_with(|| format!("{name} waits for {required}, which it requires, to be done first"));
            true
        }
        None => false,
    };
    for (position, (unit, _)) in rollout
        .units
        .iter_mut()
        .zip(&seen)
        .enumerate()
        .take(eligible)
        .filter(|(_, (unit, seen))| unit.step == Step::Waiting && is_down(seen))
    {
        if waits(position, &unit.name, &mut held) {
            continue;
        }
        if let Err(why) = budgets.take([unit.name.as_str()]) {
            held.get_or_insert_with(|| format!("{} waits: {why}", unit.name));
            continue;
        }
        unit.step = Step::Replacing { since: now };
        advance.replace.push(unit.name.clone());
    }
    for (position, unit) in
        rollout.units.iter_mut().enumerate().take(eligible).filter(|(_, unit)| unit.step == Step::Waiting)
    {
        if budget == 0 {
            break;
        }
        if waits(position, &unit.name, &mut held) {
            continue;
        }
        if let Err(why) = budgets.take([unit.name.as_str()]) {
            held.get_or_insert_with(|| format!("{} waits: {why}", unit.name));
            continue;
        }
        budget -= 1;
        unit.step = Step::Replacing { since: now };
        advance.replace.push(unit.name.clone());
    }
    rollout.held = held;
    advance
}

/// Moves each unit along by what its machine reports (`seen`, in the rollout's order).
fn step_units(rollout: &mut Rollout, seen: &[Option<&Observed>], now: u64) {
    let canary_units = rollout.canary.as_ref().filter(|canary| !canary.promoted).map_or(0, |canary| canary.count);
    let (deadline, min_ready) = (rollout.deadline, rollout.min_ready);
    for (index, (unit, &seen)) in rollout.units.iter_mut().zip(seen).enumerate() {
        let running_new = seen.filter(|seen| seen.hash == unit.to);
        let failure = running_new.map_or("", |seen| seen.failure.as_str());
        let name = &unit.name;
        unit.step = match (&unit.step, running_new.map(|seen| seen.health)) {
            // With no min-ready it is done as soon as it is seen well: its place in the budget
            // goes to the next unit in the same step.
            (Step::Replacing { .. }, Some(Health::Active)) if min_ready == 0 => Step::Done,
            (Step::Replacing { .. }, Some(Health::Active)) => Step::Ready { since: now },
            (Step::Replacing { .. }, Some(Health::Down)) => {
                Step::Failed { why: format!("{name} is down on its new content") }
            }
            (Step::Replacing { since }, health) if now.saturating_sub(*since) > deadline => Step::Failed {
                why: match health {
                    Some(Health::Unhealthy) => with_failure(
                        format!("{name} was still unhealthy on its new content after {deadline}s"),
                        failure,
                    ),
                    _ => format!("{name} did not become active within {deadline}s ({})", describe(seen, unit.to)),
                },
            },
            (Step::Ready { since }, Some(Health::Active)) if stayed(*since, now, min_ready) => Step::Done,
            (Step::Ready { .. }, Some(Health::Active)) => unit.step.clone(),
            (Step::Ready { .. }, Some(Health::Down)) => {
                Step::Failed { why: format!("{name} went down within {min_ready}s of its replacement") }
            }
            (Step::Ready { .. }, Some(Health::Unhealthy)) => Step::Failed {
                why: with_failure(format!("{name} turned unhealthy within {min_ready}s of its replacement"), failure),
            },
            // Not active for a while (its machine was lost and it moves, it restarts): it has
            // its deadline again to come back.
            (Step::Ready { .. }, _) => Step::Replacing { since: now },
            // A canary stays watched until it is promoted.
            (Step::Done, Some(Health::Down)) if index < canary_units => {
                Step::Failed { why: format!("{name}, of the canary, went down before it was promoted") }
            }
            (Step::Done, Some(Health::Unhealthy)) if index < canary_units => Step::Failed {
                why: with_failure(format!("{name}, of the canary, turned unhealthy before it was promoted"), failure),
            },
            (step, _) => step.clone(),
        };
    }
}

/// Promotes the canary once every unit of it is done and it stayed so for its bake time.
fn promote_a_baked_canary(rollout: &mut Rollout, now: u64) {
    let Some(canary) = rollout.canary.as_mut().filter(|canary| !canary.promoted) else { return };
    if !rollout.units.iter().take(canary.count).all(|unit| unit.step == Step::Done) {
        return;
    }
    let since = *canary.done_since.get_or_insert(now);
    if canary.bake.is_some_and(|bake| stayed(since, now, bake)) {
        canary.promoted = true;
    }
}

/// Whether something seen in second `since` has lasted `seconds` by second `now`. The clock
/// has whole seconds, so `since` may stand for a moment just before `since + 1`: only a
/// difference past `seconds` guarantees the whole stay (up to a second more, never less).
fn stayed(since: u64, now: u64, seconds: u64) -> bool {
    seconds == 0 || now.saturating_sub(since) > seconds
}

/// The first second in which [`stayed`] holds.
fn stayed_at(since: u64, seconds: u64) -> u64 {
    if seconds == 0 { since } else { since.saturating_add(seconds).saturating_add(1) }
}

fn with_failure(text: String, failure: &str) -> String {
    if failure.is_empty() { text } else { format!("{text}: {failure}") }
}

/// When the next step of `rollout` may differ though the machines report nothing new
/// (seconds): the earliest moment a unit being replaced passes its deadline, a ready unit
/// has stayed active for `min_ready`, or a canary has baked. `None` when nothing waits on time (or it does not run).
pub fn next_timed_step(rollout: &Rollout) -> Option<u64> {
    if rollout.state != RolloutState::Running {
        return None;
    }
    let due = |unit: &RolloutUnit| match unit.step {
        Step::Replacing { since } => Some(since.saturating_add(rollout.deadline).saturating_add(1)),
        Step::Ready { since } => Some(stayed_at(since, rollout.min_ready)),
        Step::Waiting | Step::Done | Step::Failed { .. } => None,
    };
    let baked = rollout.canary.as_ref().filter(|canary| !canary.promoted).and_then(|canary| {
        let bake = canary.bake?;
        Some(stayed_at(canary.done_since?, bake))
    });
    rollout.units.iter().filter_map(due).chain(baked).min()
}

/// The units a source's rollout should carry after a sync that found `wanted` replacements
/// (each from the content running now to the source's), given the rollout under way, if any.
/// `None`: leave the rollout as it is, because it carries every wanted replacement already
/// (a sync during a rollout finds fewer changes as the rollout replaces units: that is
/// progress, not a new rollout). Otherwise every unit the rollout touched is kept, with its
/// step, unless the source now wants other content for it (a new commit): that unit starts
/// over from the content it runs; new units join at the end. A finished rollout is not
/// merged into: the sync starts a new one.
pub fn units_after_sync(existing: Option<&Rollout>, wanted: &[RolloutUnit]) -> Option<Vec<RolloutUnit>> {
    let Some(existing) = existing.filter(|rollout| rollout.state != RolloutState::Done) else {
        return Some(wanted.to_vec());
    };
    let at: std::collections::HashMap<&str, usize> =
        existing.units.iter().enumerate().map(|(index, unit)| (unit.name.as_str(), index)).collect();
    let carried =
        |unit: &RolloutUnit| at.get(unit.name.as_str()).is_some_and(|&index| existing.units[index].to == unit.to);
    if wanted.iter().all(carried) {
        return None;
    }
    let mut units = existing.units.clone();
    for unit in wanted.iter().filter(|unit| !carried(unit)) {
        match at.get(unit.name.as_str()) {
            Some(&index) => units[index] = unit.clone(),
            None => units.push(unit.clone()),
        }
    }
    Some(units)
}

impl Rollout {
    /// The rollout that takes every unit this one touched back to its old content, in the
    /// same waves. Units it never started on stay as they are, done already: they are still
    /// the undo's, so that one of them down for other reasons counts against its budget.
    pub fn undo(&self) -> Rollout {
        let back = |unit: &RolloutUnit| {
            if unit.step == Step::Waiting || unit.from == unit.to {
                RolloutUnit { name: unit.name.clone(), from: unit.from, to: unit.from, step: Step::Done }
            } else {
                RolloutUnit { name: unit.name.clone(), from: unit.to, to: unit.from, step: Step::Waiting }
            }
        };
        Rollout {
            units: self.units.iter().map(back).collect(),
            state: RolloutState::Running,
            undo: true,
            canary: None,
            auto_revert: false,
            reverted: None,
            held: None,
            ..self.clone()
        }
    }
}

fn describe(seen: Option<&Observed>, to: UnitHash) -> String {
    match seen {
        None => "no state reported".to_string(),
        Some(seen) if seen.hash != to => "still on its old content".to_string(),
        Some(seen) if seen.health == Health::Changing => "starting, or not yet healthy".to_string(),
        Some(seen) => format!("{:?}", seen.health).to_lowercase(),
    }
}

pub mod dependency_order;
mod replace_order;
mod split_units;
mod stored_units;

pub use replace_order::machine_by_machine;
pub use split_units::{FixedUnits, StepRuns, join_units, split_units};
#[cfg(test)]
mod tests;
