//! Rollouts, sans I/O: new content reaches running units in waves. At most `max_unavailable`
//! of a rollout's units are down at once (being replaced, or down for any reason); a replaced
//! unit counts as done once it ran the new content, active, for `min_ready`; a unit that
//! fails to get there pauses the rollout, naming the unit and its state. [`advance`] is one
//! step: from the rollout and what the machines report, the units to replace now and the
//! rollout's next state. Whoever drives it (the engine leader) stores the rollout, so that a
//! new leader carries on where the old one stopped.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::UnitHash;

/// How many units may be down at once: a count, or a percentage of the rollout's units
/// (rounded down, at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaxUnavailable {
    Count(usize),
    Percent(u8),
}

impl MaxUnavailable {
    /// Reads `2` or `25%`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid max-unavailable {text:?}: a number of units (1 or more) or a percentage (1% to 100%)");
        match text.strip_suffix('%') {
            Some(percent) => match percent.parse::<u8>() {
                Ok(percent) if (1..=100).contains(&percent) => Ok(Self::Percent(percent)),
                _ => Err(bad()),
            },
            None => match text.parse::<usize>() {
                Ok(count) if count >= 1 => Ok(Self::Count(count)),
                _ => Err(bad()),
            },
        }
    }

    /// The number of units of a rollout of `total` that may be down at once.
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Count(count) => count,
            Self::Percent(percent) => (total * usize::from(percent) / 100).max(1),
        }
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(count) => write!(f, "{count}"),
            Self::Percent(percent) => write!(f, "{percent}%"),
        }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub hash: UnitHash,
    pub health: Health,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Active,
    /// Starting, or stopped to be replaced: not down for good yet.
    Changing,
    /// Failed, or stopped with no change under way.
    Down,
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
}

impl Rollout {
    /// The state as the API words it: `running`, `paused` (by hand), `failed` (paused by a unit
    /// that did not get there), `done`, or `undone` (an undo that finished).
    pub fn state_word(&self) -> &'static str {
        match &self.state {
            RolloutState::Running => "running",
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
/// with no report is down). Moves units along, pauses on a failure, starts the next wave
/// when the budget allows, and says which units to replace now.
pub fn advance(rollout: &mut Rollout, observed: &BTreeMap<String, Observed>, now: u64) -> Advance {
    for unit in &mut rollout.units {
        let seen = observed.get(&unit.name);
        let running_new = seen.filter(|seen| seen.hash == unit.to);
        unit.step = match (&unit.step, running_new.map(|seen| seen.health)) {
            (Step::Replacing { .. }, Some(Health::Active)) => Step::Ready { since: now },
            (Step::Replacing { since }, health) => {
                if health == Some(Health::Down) {
                    Step::Failed { why: format!("{} is down on its new content", unit.name) }
                } else if now.saturating_sub(*since) > rollout.deadline {
                    let state = describe(seen, unit.to);
                    Step::Failed {
                        why: format!("{} did not become active within {}s ({state})", unit.name, rollout.deadline),
                    }
                } else {
                    unit.step.clone()
                }
            }
            (Step::Ready { since }, Some(Health::Active)) if now.saturating_sub(*since) >= rollout.min_ready => {
                Step::Done
            }
            (Step::Ready { .. }, Some(Health::Active)) => unit.step.clone(),
            (Step::Ready { .. }, Some(Health::Down)) => Step::Failed {
                why: format!("{} went down within {}s of its replacement", unit.name, rollout.min_ready),
            },
            // Not active for a while (its machine was lost and it moves, it restarts): it has
            // its deadline again to come back.
            (Step::Ready { .. }, _) => Step::Replacing { since: now },
            (step, _) => step.clone(),
        };
    }
    if let Some(why) = rollout.units.iter().find_map(|unit| match &unit.step {
        Step::Failed { why } => Some(why.clone()),
        _ => None,
    }) && rollout.state == RolloutState::Running
    {
        rollout.state = RolloutState::Paused { reason: why };
    }
    if rollout.units.iter().all(|unit| unit.step == Step::Done) {
        rollout.state = RolloutState::Done;
    }
    if rollout.state != RolloutState::Running {
        return Advance::default();
    }
    // In flight until done (a ready unit has not yet stayed active for min_ready), and the
    // waiting units that are down anyway.
    let down = rollout
        .units
        .iter()
        .filter(|unit| match unit.step {
            Step::Replacing { .. } | Step::Ready { .. } | Step::Failed { .. } => true,
            Step::Waiting => observed.get(&unit.name).is_none_or(|seen| seen.health != Health::Active),
            Step::Done => false,
        })
        .count();
    let mut budget = rollout.max_unavailable.of(rollout.units.len()).saturating_sub(down);
    let mut advance = Advance::default();
    // A unit that is down anyway goes first and costs nothing: replacing it takes nothing
    // more down (and an undo must reach the units a bad version took down).
    let is_down = |name: &str| observed.get(name).is_none_or(|seen| seen.health != Health::Active);
    for unit in rollout.units.iter_mut().filter(|unit| unit.step == Step::Waiting && is_down(&unit.name)) {
        unit.step = Step::Replacing { since: now };
        advance.replace.push(unit.name.clone());
    }
    for unit in rollout.units.iter_mut().filter(|unit| unit.step == Step::Waiting) {
        if budget == 0 {
            break;
        }
        budget -= 1;
        unit.step = Step::Replacing { since: now };
        advance.replace.push(unit.name.clone());
    }
    advance
}

/// When the next step of `rollout` may differ though the machines report nothing new
/// (seconds): the earliest moment a unit being replaced passes its deadline, or a ready unit
/// has stayed active for `min_ready`. `None` when nothing waits on time (or it does not run).
pub fn next_timed_step(rollout: &Rollout) -> Option<u64> {
    if rollout.state != RolloutState::Running {
        return None;
    }
    let due = |unit: &RolloutUnit| match unit.step {
        Step::Replacing { since } => Some(since.saturating_add(rollout.deadline).saturating_add(1)),
        Step::Ready { since } => Some(since.saturating_add(rollout.min_ready)),
        Step::Waiting | Step::Done | Step::Failed { .. } => None,
    };
    rollout.units.iter().filter_map(due).min()
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
    let carried = |unit: &RolloutUnit| existing.units.iter().any(|kept| kept.name == unit.name && kept.to == unit.to);
    if wanted.iter().all(carried) {
        return None;
    }
    let mut units = existing.units.clone();
    for unit in wanted.iter().filter(|unit| !carried(unit)) {
        match units.iter_mut().find(|kept| kept.name == unit.name) {
            Some(kept) => *kept = unit.clone(),
            None => units.push(unit.clone()),
        }
    }
    Some(units)
}

impl Rollout {
    /// The rollout that takes every unit this one touched back to its old content, in the
    /// same waves; units it never started on stay as they are.
    pub fn undo(&self) -> Rollout {
        Rollout {
            units: self
                .units
                .iter()
                .filter(|unit| unit.step != Step::Waiting)
                .map(|unit| RolloutUnit { name: unit.name.clone(), from: unit.to, to: unit.from, step: Step::Waiting })
                .collect(),
            state: RolloutState::Running,
            undo: true,
            ..self.clone()
        }
    }
}

fn describe(seen: Option<&Observed>, to: UnitHash) -> String {
    match seen {
        None => "no state reported".to_string(),
        Some(seen) if seen.hash != to => "still on its old content".to_string(),
        Some(seen) => format!("{:?}", seen.health).to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: UnitHash = UnitHash([1; 20]);
    const NEW: UnitHash = UnitHash([2; 20]);

    fn rollout(count: usize, max_unavailable: MaxUnavailable) -> Rollout {
        Rollout {
            units: (0..count)
                .map(|n| RolloutUnit { name: format!("web@{n}.service"), from: OLD, to: NEW, step: Step::Waiting })
                .collect(),
            max_unavailable,
            min_ready: 5,
            deadline: 60,
            state: RolloutState::Running,
            undo: false,
        }
    }

    fn all(count: usize, hash: UnitHash, health: Health) -> BTreeMap<String, Observed> {
        (0..count).map(|n| (format!("web@{n}.service"), Observed { hash, health })).collect()
    }

    #[test]
    fn undo_goes_back_where_it_started() {
        let mut rollout = rollout(4, MaxUnavailable::Count(2));
        advance(&mut rollout, &all(4, OLD, Health::Active), 0);
        let undo = rollout.undo();
        assert_eq!(undo.units.len(), 2);
        assert!(undo.units.iter().all(|unit| unit.to == OLD && unit.from == NEW && unit.step == Step::Waiting));
        assert_eq!(undo.state_word(), "running");
        let mut finished = undo.clone();
        finished.state = RolloutState::Done;
        assert_eq!(finished.state_word(), "undone", "an undo that finished says so");
    }

    /// With the same reports, a step one second before the moment `next_timed_step` names
    /// changes nothing, and a step at it does.
    fn changes_first_at(rollout: &Rollout, reports: &BTreeMap<String, Observed>) -> u64 {
        let due = next_timed_step(rollout).expect("something waits on time");
        let stepped = |at: u64| {
            let mut copy = rollout.clone();
            advance(&mut copy, reports, at);
            copy
        };
        assert_eq!(&stepped(due - 1), rollout, "nothing is due before {due}");
        assert_ne!(&stepped(due), rollout, "a step is due at {due}");
        due
    }

    #[test]
    fn the_next_timed_step_is_when_a_deadline_passes_or_min_ready_is_reached() {
        let mut rollout = rollout(2, MaxUnavailable::Count(1));
        advance(&mut rollout, &all(2, OLD, Health::Active), 0);
        let mut reports = all(2, OLD, Health::Active);
        reports.insert("web@0.service".into(), Observed { hash: NEW, health: Health::Changing });
        assert_eq!(changes_first_at(&rollout, &reports), 61, "the deadline (60 s) passed");
        reports.insert("web@0.service".into(), Observed { hash: NEW, health: Health::Active });
        advance(&mut rollout, &reports, 10);
        assert_eq!(rollout.units[0].step, Step::Ready { since: 10 });
        assert_eq!(changes_first_at(&rollout, &reports), 15, "active for min_ready (5 s)");
        rollout.state = RolloutState::Paused { reason: "by hand".into() };
        assert_eq!(next_timed_step(&rollout), None, "a paused rollout waits on nothing");
    }

    fn replacing(name: &str, from: UnitHash, to: UnitHash) -> RolloutUnit {
        RolloutUnit { name: name.into(), from, to, step: Step::Waiting }
    }

    #[test]
    fn a_sync_during_a_rollout_keeps_its_progress_and_every_unit_it_touched() {
        let mut rollout = rollout(4, MaxUnavailable::Count(2));
        advance(&mut rollout, &all(4, OLD, Health::Active), 0);
        // Two units replaced: the next sync finds only the other two still to change.
        let left = [replacing("web@2.service", OLD, NEW), replacing("web@3.service", OLD, NEW)];
        assert_eq!(units_after_sync(Some(&rollout), &left), None, "the rollout goes on as it is");
        // A new commit changes one of them again and adds a unit: those start over or join,
        // the rest keep their steps.
        const NEWER: UnitHash = UnitHash([3; 20]);
        let wanted = [
            replacing("web@0.service", NEW, NEWER),
            replacing("web@3.service", OLD, NEW),
            replacing("db.service", OLD, NEWER),
        ];
        let units = units_after_sync(Some(&rollout), &wanted).expect("a change");
        assert_eq!(units.len(), 5, "every unit touched is kept: {units:?}");
        assert_eq!(units[0], replacing("web@0.service", NEW, NEWER), "new content for it starts over");
        assert_eq!(units[1], rollout.units[1], "its step is kept");
        assert_eq!(units[4], replacing("db.service", OLD, NEWER));
        // A finished rollout is not merged into.
        rollout.state = RolloutState::Done;
        assert_eq!(units_after_sync(Some(&rollout), &left).map(|units| units.len()), Some(2));
        assert_eq!(units_after_sync(None, &left).map(|units| units.len()), Some(2));
    }

    #[test]
    fn budgets_count_and_percent() {
        assert_eq!(MaxUnavailable::parse("2"), Ok(MaxUnavailable::Count(2)));
        assert_eq!(MaxUnavailable::parse("25%").map(|max| max.of(12)), Ok(3));
        assert_eq!(MaxUnavailable::parse("1%").map(|max| max.of(12)), Ok(1));
        assert!(MaxUnavailable::parse("0").is_err() && MaxUnavailable::parse("101%").is_err());
    }

    #[test]
    fn waves_of_two_each_waiting_for_the_last_to_be_ready() {
        let mut rollout = rollout(5, MaxUnavailable::Count(2));
        let mut seen = all(5, OLD, Health::Active);
        assert_eq!(advance(&mut rollout, &seen, 100).replace, vec!["web@0.service", "web@1.service"]);
        assert!(advance(&mut rollout, &seen, 101).replace.is_empty(), "two are being replaced: no budget");
        for n in 0..2 {
            seen.insert(format!("web@{n}.service"), Observed { hash: NEW, health: Health::Active });
        }
        assert!(advance(&mut rollout, &seen, 102).replace.is_empty(), "ready, not yet for min_ready");
        assert_eq!(advance(&mut rollout, &seen, 107).replace, vec!["web@2.service", "web@3.service"]);
        for n in 2..5 {
            seen.insert(format!("web@{n}.service"), Observed { hash: NEW, health: Health::Active });
        }
        advance(&mut rollout, &seen, 108);
        assert_eq!(advance(&mut rollout, &seen, 113).replace, vec!["web@4.service"]);
        advance(&mut rollout, &seen, 114);
        advance(&mut rollout, &seen, 120);
        assert_eq!(rollout.state, RolloutState::Done);
    }

    #[test]
    fn a_unit_down_for_its_own_reasons_goes_first_and_takes_from_the_budget() {
        let mut rollout = rollout(4, MaxUnavailable::Count(2));
        let mut seen = all(4, OLD, Health::Active);
        seen.insert("web@3.service".into(), Observed { hash: OLD, health: Health::Down });
        assert_eq!(advance(&mut rollout, &seen, 0).replace, vec!["web@3.service", "web@0.service"]);
    }

    #[test]
    fn an_undo_reaches_the_units_a_bad_version_took_down() {
        let mut rollout = rollout(6, MaxUnavailable::Count(2));
        let mut seen = all(6, OLD, Health::Active);
        advance(&mut rollout, &seen, 0);
        for n in 0..2 {
            seen.insert(format!("web@{n}.service"), Observed { hash: NEW, health: Health::Down });
        }
        advance(&mut rollout, &seen, 1);
        let mut undo = rollout.undo();
        assert_eq!(advance(&mut undo, &seen, 2).replace, vec!["web@0.service", "web@1.service"]);
    }

    #[test]
    fn a_failure_pauses_the_rollout_and_names_the_unit() {
        let mut rollout = rollout(6, MaxUnavailable::Count(2));
        let mut seen = all(6, OLD, Health::Active);
        advance(&mut rollout, &seen, 0);
        seen.insert("web@0.service".into(), Observed { hash: NEW, health: Health::Down });
        seen.insert("web@1.service".into(), Observed { hash: NEW, health: Health::Active });
        assert!(advance(&mut rollout, &seen, 1).replace.is_empty());
        assert_eq!(rollout.state, RolloutState::Paused { reason: "web@0.service is down on its new content".into() });
        assert_eq!(rollout.state_word(), "failed", "paused by a failure, it says so");
        let touched = rollout.units.iter().filter(|unit| unit.step != Step::Waiting).count();
        assert_eq!(touched, 2, "at most max-unavailable units were affected");
        assert!(advance(&mut rollout, &seen, 100).replace.is_empty(), "a paused rollout starts nothing");
    }

    #[test]
    fn a_ready_unit_that_moves_waits_again_and_one_that_goes_down_fails() {
        let mut rollout = rollout(2, MaxUnavailable::Count(2));
        advance(&mut rollout, &all(2, OLD, Health::Active), 0);
        advance(&mut rollout, &all(2, NEW, Health::Active), 1);
        let mut seen = all(2, NEW, Health::Active);
        seen.remove("web@0.service");
        seen.insert("web@1.service".into(), Observed { hash: NEW, health: Health::Down });
        advance(&mut rollout, &seen, 2);
        assert_eq!(rollout.units[0].step, Step::Replacing { since: 2 });
        assert!(matches!(rollout.units[1].step, Step::Failed { .. }));
    }

    #[test]
    fn a_unit_that_never_becomes_active_fails_at_the_deadline() {
        let mut rollout = rollout(1, MaxUnavailable::Count(1));
        let seen = all(1, OLD, Health::Changing);
        advance(&mut rollout, &all(1, OLD, Health::Active), 0);
        advance(&mut rollout, &seen, 30);
        assert!(matches!(rollout.units[0].step, Step::Replacing { .. }));
        advance(&mut rollout, &seen, 61);
        assert_eq!(
            rollout.state,
            RolloutState::Paused {
                reason: "web@0.service did not become active within 60s (still on its old content)".into()
            }
        );
    }

    proptest::proptest! {
        /// Whatever the machines report, a step never takes more units down than the budget
        /// allows: after it, no more are unavailable than max-unavailable or than before it.
        #[test]
        fn never_more_than_the_budget_in_flight(
            reports in proptest::collection::vec((0u8..3, 0u8..3), 1..40),
            max in 1usize..5,
            count in 1usize..12,
        ) {
            let mut rollout = rollout(count, MaxUnavailable::Count(max));
            for (now, (hash, health)) in reports.iter().enumerate() {
                let hash = if *hash == 0 { OLD } else { NEW };
                let health = [Health::Active, Health::Changing, Health::Down][usize::from(*health)];
                let seen = all(count, hash, health);
                // Unavailable: in flight, or waiting and down anyway.
                let unavailable = |rollout: &Rollout| {
                    rollout
                        .units
                        .iter()
                        .filter(|unit| match unit.step {
                            Step::Replacing { .. } | Step::Ready { .. } | Step::Failed { .. } => true,
                            Step::Waiting => seen[&unit.name].health != Health::Active,
                            Step::Done => false,
                        })
                        .count()
                };
                let before = unavailable(&rollout);
                advance(&mut rollout, &seen, u64::try_from(now).unwrap_or(0));
                let after = unavailable(&rollout);
                proptest::prop_assert!(after <= max.max(before), "{after} unavailable after, {before} before, budget {max}");
            }
        }
    }
}
