//! The judge: what the simulation checks of every run, from samples of what runs on each
//! machine and of the store.
//!
//! - A unit runs on two machines only while one of them is out of touch with the store or
//!   the store answers no one (an election), and for [`REACTION`] after that ends (or after
//!   its fleetd thaws, starts or is reconnected). Out of touch means exactly what the chaos
//!   run judges from etcd's view: its presence is gone (its lease expired). A fleetd frozen,
//!   cut off or dead whose presence holds is in touch: the presence must never be claimed
//!   while units that may have moved still run. Past [`REACTION`] after its return a machine
//!   runs nothing that runs elsewhere.
//! - A unit that asked to run at most once (`AtMostOnce=`) never runs on two machines, not
//!   for an instant, whatever the faults: no excuse. It is looked at every tick of the
//!   simulated clock (10 ms), not only at the samples.
//! - A unit with `LostAfter=` moves off a machine out of touch only once the machine's
//!   presence has been gone for its span less `agent_ttl` (the machine was out of touch
//!   `agent_ttl` before), never with `never`; and runs on two machines only when one of
//!   them was gone that long.
//! - Once the faults end, the cluster settles within [`SETTLE_LIMIT`]: every unit meant to run
//!   runs once, on the machine the schedule names, and nothing else runs (nothing lost).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// What a machine takes, once it is back in touch, to stop what moved (docs/guarantees.md's R).
pub const REACTION: Duration = Duration::from_secs(3);
/// How long the cluster has to settle once the faults end.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// One look at the cluster.
pub struct Sample {
    /// Unit → machines whose manager runs it.
    pub running: BTreeMap<String, BTreeSet<String>>,
    /// Machines with a presence in the store.
    pub present: BTreeSet<String>,
    /// Machines out of touch now (see the module's comment).
    pub out_of_touch: BTreeSet<String>,
    /// When each machine last came back in touch (the world's record, not a sample's: an
    /// absence shorter than the sampling period counts).
    pub absence_ended: BTreeMap<String, Instant>,
    /// When each machine's presence last went (the world's record).
    pub absence_began: BTreeMap<String, Instant>,
    pub leaderless: bool,
    /// When the last election ended.
    pub election_ended: Option<Instant>,
}

#[derive(Debug)]
struct Episode {
    since: Instant,
    machines: BTreeSet<String>,
    reported: bool,
}

#[derive(Debug, Default)]
pub struct Judge {
    /// The first look.
    began: Option<Instant>,
    episodes: BTreeMap<String, Episode>,
    pub violations: Vec<String>,
    pub longest_double_run: Duration,
    /// The `AtMostOnce=` units found on two machines, and since when (reported once each).
    twice: BTreeMap<String, Instant>,
    /// Where each `LostAfter=` unit was placed at the last look.
    placed: BTreeMap<String, String>,
    /// The `LostAfter=` units found running on two machines too soon (reported once each).
    too_soon: BTreeSet<String>,
    /// Moves of `LostAfter=` units off a machine gone, in their time.
    pub lost_after_moves: usize,
}

impl Judge {
    /// Whether `machine` is out of touch, or was within [`REACTION`].
    fn excused(now: Instant, sample: &Sample, machine: &str) -> bool {
        let recently = |at: Option<&Instant>| at.is_some_and(|at| now.duration_since(*at) <= REACTION);
        sample.leaderless
            || sample.out_of_touch.contains(machine)
            || recently(sample.absence_ended.get(machine))
            || recently(sample.election_ended.as_ref())
    }

    /// Looks at where the `AtMostOnce=` units run now (unit → machines).
    pub fn look_at_most_once(&mut self, now: Instant, running: &BTreeMap<String, BTreeSet<String>>) {
        let began = *self.began.get_or_insert(now);
        self.twice.retain(|unit, _| running.get(unit).is_some_and(|on| on.len() > 1));
        for (unit, on) in running.iter().filter(|(_, on)| on.len() > 1) {
            if !self.twice.contains_key(unit) {
                self.twice.insert(unit.clone(), now);
                self.violations.push(format!(
                    "at {:?}: {unit}, which asked to run at most once, runs on {on:?}",
                    now.duration_since(began)
                ));
            }
        }
    }

    /// How long `machine`'s last absence lasted, or has lasted so far.
    fn absence_length(now: Instant, sample: &Sample, machine: &str) -> Duration {
        let Some(began) = sample.absence_began.get(machine) else { return Duration::ZERO };
        if sample.out_of_touch.contains(machine) {
            return now.duration_since(*began);
        }
        sample
            .absence_ended
            .get(machine)
            .filter(|ended| *ended > began)
            .map_or(Duration::ZERO, |ended| ended.duration_since(*began))
    }

    /// Looks at where the `LostAfter=` units (unit → span, `None`: never) are placed and run:
    /// a move off a machine gone, or a second machine running one, before the span (less
    /// `agent_ttl`, which the machine was out of touch before its presence went) is a
    /// violation.
    pub fn look_lost_after(
        &mut self,
        now: Instant,
        sample: &Sample,
        schedule: &BTreeMap<String, String>,
        lost_after: &BTreeMap<String, Option<Duration>>,
        agent_ttl: Duration,
    ) {
        let began = *self.began.get_or_insert(now);
        let enough = |span: &Option<Duration>| span.map(|span| span.saturating_sub(agent_ttl));
        for (unit, span) in lost_after {
            let now_on = schedule.get(unit);
            if let (Some(was), Some(now_on)) = (self.placed.get(unit), now_on)
                && was != now_on
                && sample.out_of_touch.contains(was)
            {
                let gone_for = Self::absence_length(now, sample, was);
                if enough(span).is_some_and(|enough| gone_for >= enough) {
                    self.lost_after_moves += 1;
                } else {
                    self.violations.push(format!(
                        "at {:?}: {unit} (LostAfter={span:?}) moved from {was} to {now_on} after {was} was gone {gone_for:?}",
                        now.duration_since(began)
                    ));
                }
            }
            match now_on {
                Some(machine) => self.placed.insert(unit.clone(), machine.clone()),
                None => self.placed.remove(unit),
            };
            let Some(on) = sample.running.get(unit).filter(|on| on.len() > 1) else {
                self.too_soon.remove(unit);
                continue;
            };
            let long_enough = on
                .iter()
                .any(|machine| enough(span).is_some_and(|enough| Self::absence_length(now, sample, machine) >= enough));
            if !long_enough && self.too_soon.insert(unit.clone()) {
                self.violations.push(format!(
                    "at {:?}: {unit} (LostAfter={span:?}) runs on {on:?}, none of them gone that long",
                    now.duration_since(began)
                ));
            }
        }
    }

    pub fn look(&mut self, now: Instant, sample: &Sample) {
        let began = *self.began.get_or_insert(now);
        self.episodes.retain(|unit, _| sample.running.get(unit).is_some_and(|on| on.len() > 1));
        for (unit, on) in sample.running.iter().filter(|(_, on)| on.len() > 1) {
            let episode = self.episodes.entry(unit.clone()).or_insert_with(|| Episode {
                since: now,
                machines: BTreeSet::new(),
                reported: false,
            });
            episode.machines.extend(on.iter().cloned());
            self.longest_double_run = self.longest_double_run.max(now.duration_since(episode.since));
            let excused = on.iter().any(|machine| Self::excused(now, sample, machine));
            let episode = self.episodes.get_mut(unit).expect("inserted above");
            if !excused && !episode.reported {
                episode.reported = true;
                let in_touch: Vec<&String> = on.iter().collect();
                self.violations.push(format!(
                    "at {:?}: {unit} runs on {in_touch:?}, all in touch with the store for over {REACTION:?}, {:?} into a double run",
                    now.duration_since(began),
                    now.duration_since(episode.since)
                ));
            }
        }
    }
}

/// Whether the cluster has settled: what differs from it, `None` when nothing does.
/// `meant`: unit → whether it is meant to run (launched); `schedule`: unit → machine.
pub fn unsettled(
    sample: &Sample,
    meant: &BTreeMap<String, bool>,
    schedule: &BTreeMap<String, String>,
) -> Option<String> {
    for (unit, on) in &sample.running {
        if !meant.get(unit).copied().unwrap_or(false) {
            return Some(format!("{unit} runs on {on:?} though it is not meant to run"));
        }
        if on.len() > 1 {
            return Some(format!("{unit} runs on {on:?}"));
        }
    }
    for (unit, _) in meant.iter().filter(|(_, run)| **run) {
        let Some(machine) = schedule.get(unit) else {
            return Some(format!("{unit} is placed nowhere"));
        };
        if !sample.present.contains(machine) {
            return Some(format!("{unit} is placed on {machine}, which is gone"));
        }
        if sample.running.get(unit).is_none_or(|on| !on.contains(machine)) {
            return Some(format!("{unit} does not run on {machine}, where it is placed"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(running: &[(&str, &[&str])], present: &[&str], leaderless: bool) -> Sample {
        Sample {
            absence_ended: BTreeMap::new(),
            absence_began: BTreeMap::new(),
            out_of_touch: ["a", "b"].iter().filter(|m| !present.contains(m)).map(|m| m.to_string()).collect(),
            election_ended: None,
            running: running
                .iter()
                .map(|(unit, on)| (unit.to_string(), on.iter().map(|m| m.to_string()).collect()))
                .collect(),
            present: present.iter().map(|m| m.to_string()).collect(),
            leaderless,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_unit_with_lost_after_moves_off_a_machine_gone_only_after_its_span() {
        let ttl = Duration::from_secs(4);
        let spans: BTreeMap<String, Option<Duration>> =
            [("l0.service".to_string(), Some(Duration::from_secs(12))), ("l1.service".to_string(), None)].into();
        let placed = |on: &str| -> BTreeMap<String, String> {
            spans.keys().map(|unit| (unit.clone(), on.to_string())).collect()
        };
        let mut judge = Judge::default();
        let mut gone = sample(&[], &["b"], false);
        judge.look_lost_after(Instant::now(), &gone, &placed("a"), &spans, ttl);
        gone.absence_began.insert("a".into(), Instant::now());
        tokio::time::advance(Duration::from_secs(7)).await;
        judge.look_lost_after(Instant::now(), &gone, &placed("b"), &spans, ttl);
        assert_eq!(judge.violations.len(), 2, "moved after 7 s of 8, and one that never moves: {:?}", judge.violations);
        let mut judge = Judge::default();
        judge.look_lost_after(Instant::now(), &gone, &placed("a"), &spans, ttl);
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut in_time = placed("b");
        in_time.insert("l1.service".into(), "a".into());
        judge.look_lost_after(Instant::now(), &gone, &in_time, &spans, ttl);
        assert!(judge.violations.is_empty(), "{:?}", judge.violations);
        assert_eq!(judge.lost_after_moves, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_double_run_is_excused_only_while_a_machine_is_out_of_touch_and_for_the_reaction_after() {
        let mut judge = Judge::default();
        let start = Instant::now();
        judge.look(start, &sample(&[("u", &["a", "b"])], &["b"], false));
        assert!(judge.violations.is_empty(), "a is out of touch");
        let mut back = sample(&[("u", &["a", "b"])], &["a", "b"], false);
        back.absence_ended.insert("a".into(), start + Duration::from_millis(1));
        judge.look(start + REACTION, &back);
        assert!(judge.violations.is_empty(), "a is back, within the reaction");
        judge.look(start + REACTION * 2, &back);
        assert_eq!(judge.violations.len(), 1, "both in touch past the reaction");
        assert_eq!(judge.longest_double_run, REACTION * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_election_excuses_everyone_and_a_live_lease_excuses_no_one() {
        let mut judge = Judge::default();
        let start = Instant::now();
        judge.look(start, &sample(&[("u", &["a", "b"])], &["a", "b"], true));
        let mut after = sample(&[("u", &["a", "b"])], &["a", "b"], false);
        after.election_ended = Some(start + Duration::from_millis(1));
        judge.look(start + REACTION, &after);
        assert!(judge.violations.is_empty());
        judge.look(start + REACTION * 2, &after);
        assert_eq!(judge.violations.len(), 1, "the election is over for longer than the reaction");
        let mut strict = Judge::default();
        strict.look(start, &sample(&[("u", &["a", "b"])], &["a", "b"], false));
        assert_eq!(strict.violations.len(), 1, "both hold their leases: no excuse");
    }

    #[tokio::test(start_paused = true)]
    async fn an_at_most_once_unit_on_two_machines_has_no_excuse() {
        let mut judge = Judge::default();
        let on = |machines: &[&str]| -> BTreeMap<String, BTreeSet<String>> {
            [("u".to_string(), machines.iter().map(|m| m.to_string()).collect())].into()
        };
        judge.look_at_most_once(Instant::now(), &on(&["a"]));
        assert!(judge.violations.is_empty());
        judge.look_at_most_once(Instant::now(), &on(&["a", "b"]));
        judge.look_at_most_once(Instant::now(), &on(&["a", "b"]));
        assert_eq!(judge.violations.len(), 1, "one episode, reported once");
    }

    #[test]
    fn settled_means_every_unit_meant_to_run_runs_once_where_it_is_placed() {
        let meant: BTreeMap<String, bool> = [("u".to_string(), true), ("off".to_string(), false)].into();
        let schedule: BTreeMap<String, String> = [("u".to_string(), "a".to_string())].into();
        assert_eq!(unsettled(&sample(&[("u", &["a"])], &["a", "b"], false), &meant, &schedule), None);
        assert!(unsettled(&sample(&[("u", &["b"])], &["a", "b"], false), &meant, &schedule).is_some());
        assert!(unsettled(&sample(&[("u", &["a"]), ("off", &["b"])], &["a", "b"], false), &meant, &schedule).is_some());
        assert!(unsettled(&sample(&[], &["a", "b"], false), &meant, &schedule).is_some(), "lost");
    }
}
