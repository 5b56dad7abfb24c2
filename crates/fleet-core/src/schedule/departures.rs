//! Units on their way off a machine that is still present. The engine takes a unit off a
//! machine (an unload, a move, a drain) by deleting its placement; the machine's agent stops
//! it when it next reads its work. A fleetd that is down, frozen or cut off while its
//! presence holds reads nothing, and keeps running the unit. Were the unit placed elsewhere
//! meanwhile, it would run twice while both machines are in touch with the store. So a unit
//! taken off a present machine is placed again only once that machine no longer reports it
//! running (its agent stopped it) or is gone (its presence lapsed, and its agent stops what
//! it runs before it registers again): stop before start.
//!
//! The engine learns departures from its own decisions, and an engine that takes over the
//! leadership from the states of the units it finds unplaced on its first look (the one
//! before it may have taken them off a machine that still runs them).
//!
//! A machine that had not reported the unit when it was taken off may run it all the same (it
//! started it and its report was lost, or it was cut off before writing it): its silence
//! proves nothing. Nor does a report that it stopped, written before the unit was taken off
//! and not since: the machine may have started it again and not said so yet (one back from a
//! lapse starts what is still its own before its report lands). Such a departure ends when
//! the machine reports the unit stopped (anew), or once the machine has surely seen the
//! change or stopped what it runs: a hold of `agent_ttl` (and
//! the clocks' drift) after the unit was taken off, which a cut-off machine's agent never
//! outlasts with its units running. The leader keeps these silent departures in the store
//! ([`SilentDeparture`]), so that one taking over holds them too, counted from its own sight:
//! its first look's reports cannot show a unit its machine never reported.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::reason::UnplacedReason;
use super::{ClusterSnapshot, Decision, Plan, UnitSpec};
use crate::UnitState;
use crate::state::DesiredState;

/// Whether a machine's report of a unit says it may be running there: anything but stopped
/// (`inactive`) or `failed`. A unit loaded and not started is not running.
pub fn reports_running(state: &UnitState) -> bool {
    !matches!(state.systemd.active.as_str(), "inactive" | "failed")
}

/// What the machines report of some units: the (unit, machine) pairs whose report says the
/// unit may be running there, and the reports that say it stopped (a pair in neither has no
/// report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reports {
    pub running: BTreeSet<(String, String)>,
    pub stopped: BTreeMap<(String, String), UnitState>,
}

impl Reports {
    pub fn of<'a>(states: impl IntoIterator<Item = &'a UnitState>) -> Self {
        let mut reports = Self::default();
        for state in states {
            let pair = (state.name.clone(), state.machine_id.clone());
            if reports_running(state) {
                reports.running.insert(pair);
            } else {
                reports.stopped.insert(pair, state.clone());
            }
        }
        reports
    }
}

/// One unit on its way off a present machine.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Leaving {
    machine: String,
    /// For a unit the machine had not reported running when it was taken off: until when its
    /// silence (or the report it had) does not mean it stopped.
    silent_until: Option<Instant>,
    /// The report that it stopped the machine had made when it was taken off, if any: until
    /// the machine writes another (or removes it), it says nothing of now.
    stopped_before: Option<UnitState>,
}

/// A unit taken off a present machine that had not reported it, as the leader records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SilentDeparture {
    pub unit: String,
    pub machine: String,
}

/// Unit → the present machine it was taken off and may still run on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Departures {
    leaving: BTreeMap<String, Leaving>,
}

/// Whether the plan would place `unit` if it could: unplaced, not global, meant to be loaded
/// or running.
fn awaits_placement(unit: &UnitSpec) -> bool {
    unit.scheduled_on.is_none() && !unit.requirements.global && unit.desired != DesiredState::Inactive
}

impl Departures {
    /// The (unit, machine) pairs `decisions` take off a machine present in `cluster`: what to
    /// ask the machines' reports about before the decisions are written.
    pub fn taken_off(decisions: &[Decision], cluster: &ClusterSnapshot) -> BTreeSet<(String, String)> {
        decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Unschedule { unit, machine, .. }
                    if cluster.machines.iter().any(|present| present.id == *machine) =>
                {
                    Some((unit.clone(), machine.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Notes the units `decisions` take off a machine present in `cluster`; `before`, what
    /// the machines reported of them before the decisions were written. A unit its machine had
    /// not reported is held at least until `silent_until`.
    pub fn note_decisions(
        &mut self,
        decisions: &[Decision],
        cluster: &ClusterSnapshot,
        before: &Reports,
        silent_until: Instant,
    ) {
        for pair in Self::taken_off(decisions, cluster) {
            let silent_until = (!before.running.contains(&pair)).then_some(silent_until);
            let stopped_before = before.stopped.get(&pair).cloned();
            let (unit, machine) = pair;
            self.leaving.insert(unit, Leaving { machine, silent_until, stopped_before });
        }
    }

    /// The units of `cluster` an engine that just took over must ask the machines about: the
    /// unplaced ones it would place.
    pub fn unknown_on_takeover(cluster: &ClusterSnapshot) -> BTreeSet<String> {
        cluster.units.iter().filter(|unit| awaits_placement(unit)).map(|unit| unit.name.clone()).collect()
    }

    /// The departures from a machine that had not reported the unit running, in unit order:
    /// what the leader records for one that takes over.
    pub fn silent(&self) -> Vec<SilentDeparture> {
        self.leaving
            .iter()
            .filter(|(_, leaving)| leaving.silent_until.is_some())
            .map(|(unit, leaving)| SilentDeparture { unit: unit.clone(), machine: leaving.machine.clone() })
            .collect()
    }

    /// Of the silent departures a leader before recorded, those a leader taking over holds:
    /// of units of `cluster` still awaiting placement whose machine is present.
    pub fn adoptable<'a>(
        recorded: &'a [SilentDeparture],
        cluster: &ClusterSnapshot,
    ) -> impl Iterator<Item = &'a SilentDeparture> + 'a {
        let present: BTreeSet<String> = cluster.machines.iter().map(|machine| machine.id.clone()).collect();
        let waiting: BTreeSet<String> =
            cluster.units.iter().filter(|unit| awaits_placement(unit)).map(|unit| unit.name.clone()).collect();
        recorded
            .iter()
            .filter(move |departure| present.contains(&departure.machine) && waiting.contains(&departure.unit))
    }

    /// Takes over the [`Departures::adoptable`] silent departures a leader before recorded:
    /// each held until `silent_until`, or until its machine reports it anew (what `reports`
    /// holds now may be from before).
    pub fn adopt_silent(
        &mut self,
        recorded: &[SilentDeparture],
        cluster: &ClusterSnapshot,
        reports: &Reports,
        silent_until: Instant,
    ) {
        for departure in Self::adoptable(recorded, cluster) {
            let pair = (departure.unit.clone(), departure.machine.clone());
            let stopped_before = reports.stopped.get(&pair).cloned();
            let leaving =
                Leaving { machine: departure.machine.clone(), silent_until: Some(silent_until), stopped_before };
            self.leaving.entry(departure.unit.clone()).or_insert(leaving);
        }
    }

    /// The units whose departure is still to be confirmed.
    pub fn units(&self) -> BTreeSet<String> {
        self.leaving.keys().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.leaving.is_empty()
    }

    /// Takes in what the machines report of the units asked about, at `now`. A departure ends
    /// once its machine is gone from `cluster`, or no longer reports the unit running: reports
    /// it stopped, or has no report of it (for a unit it had not reported running when it was
    /// taken off, only by a report made since or once its silence may be trusted). With
    /// `takeover`, the units asked about that a present machine still runs while they await
    /// placement are departures too.
    pub fn settle(&mut self, reports: &Reports, cluster: &ClusterSnapshot, takeover: bool, now: Instant) {
        let present: BTreeSet<&str> = cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
        self.leaving
            .retain(|unit, leaving| present.contains(leaving.machine.as_str()) && leaving.holds(unit, reports, now));
        if takeover {
            let waiting: BTreeSet<&str> =
                cluster.units.iter().filter(|unit| awaits_placement(unit)).map(|unit| unit.name.as_str()).collect();
            for (unit, machine) in &reports.running {
                if waiting.contains(unit.as_str()) && present.contains(machine.as_str()) {
                    let leaving = Leaving { machine: machine.clone(), silent_until: None, stopped_before: None };
                    self.leaving.entry(unit.clone()).or_insert(leaving);
                }
            }
        }
    }

    /// As [`Departures::settle`] with the machines unchanged: says whether a departure ended.
    pub fn settle_running(&mut self, reports: &Reports, now: Instant) -> bool {
        let before = self.leaving.len();
        self.leaving.retain(|unit, leaving| leaving.holds(unit, reports, now));
        self.leaving.len() != before
    }

    /// Restarts the count of every silent machine's silence, to end no sooner than `until`:
    /// while the store answered nobody, no machine could report (and etcd restarts every
    /// lease's clock after an election, so a machine cut off meanwhile is still present), so
    /// the silence before says nothing.
    pub fn restart_silences(&mut self, until: Instant) {
        for leaving in self.leaving.values_mut() {
            if let Some(silent_until) = &mut leaving.silent_until {
                *silent_until = (*silent_until).max(until);
            }
        }
    }

    /// The earliest time a silent machine's departure may end by itself: the engine looks again
    /// then.
    pub fn next_silence_end(&self) -> Option<Instant> {
        self.leaving.values().filter_map(|leaving| leaving.silent_until).min()
    }

    /// The units of `cluster` the plan must not place yet, with the machine each waits for:
    /// awaiting placement while the machine they left may still run them.
    pub fn held(&self, cluster: &ClusterSnapshot) -> BTreeMap<String, String> {
        cluster
            .units
            .iter()
            .filter(|unit| awaits_placement(unit))
            .filter_map(|unit| Some((unit.name.clone(), self.leaving.get(&unit.name)?.machine.clone())))
            .collect()
    }
}

impl Leaving {
    /// Whether `unit` is still on its way off this machine, given `reports` at `now`: it
    /// reports the unit running, or says nothing new of it while its silence is not trusted
    /// (no report where it had none, or the report that it stopped it had made before).
    fn holds(&self, unit: &str, reports: &Reports, now: Instant) -> bool {
        let pair = (unit.to_string(), self.machine.clone());
        if reports.running.contains(&pair) {
            return true;
        }
        // No report, where it had none; or the very report that it stopped it had made.
        let nothing_new = reports.stopped.get(&pair) == self.stopped_before.as_ref();
        nothing_new && self.silent_until.is_some_and(|until| now < until)
    }
}

impl Plan {
    /// Drops the placements of the units this plan also takes off a machine present in
    /// `cluster` (a move: a drain, a changed requirement): they are placed once that machine
    /// stopped them, and wait with that reason. Says whether it dropped any.
    pub fn defer_moves_off(&mut self, cluster: &ClusterSnapshot) -> bool {
        let present: BTreeSet<&str> = cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
        let leaving: BTreeMap<String, String> = self
            .decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Unschedule { unit, machine, .. } if present.contains(machine.as_str()) => {
                    Some((unit.clone(), machine.clone()))
                }
                _ => None,
            })
            .collect();
        let mut deferred = Vec::new();
        self.decisions.retain(|decision| match decision {
            Decision::Schedule { unit, .. } => match leaving.get(unit) {
                Some(machine) => {
                    deferred.push((unit.clone(), machine.clone()));
                    false
                }
                None => true,
            },
            Decision::Unschedule { .. } => true,
        });
        let any = !deferred.is_empty();
        self.wait_for_departures(deferred);
        any
    }

    /// Gives the units held for the machine they leave, (unit, machine), their reason.
    pub fn wait_for_departures(&mut self, held: impl IntoIterator<Item = (String, String)>) {
        self.unplaced.extend(held.into_iter().map(|(unit, machine)| (unit, UnplacedReason::LeavingMachine(machine))));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::machine::MachineState;
    use crate::requirements::Requirements;
    use crate::schedule::{UnscheduleReason, plan};

    fn unit(name: &str, on: Option<&str>, desired: DesiredState) -> UnitSpec {
        UnitSpec {
            name: name.into(),
            desired,
            requirements: Arc::new(Requirements::default()),
            scheduled_on: on.map(str::to_string),
        }
    }

    fn cluster(machines: &[&str], units: Vec<UnitSpec>) -> ClusterSnapshot {
        ClusterSnapshot {
            machines: machines
                .iter()
                .map(|id| MachineState { id: id.to_string(), ..MachineState::default() })
                .collect(),
            units,
            ..ClusterSnapshot::default()
        }
    }

    /// Reports that the units run on the machines of `pairs`.
    fn running(pairs: &[(&str, &str)]) -> Reports {
        let pairs: BTreeSet<(String, String)> =
            pairs.iter().map(|(unit, machine)| (unit.to_string(), machine.to_string())).collect();
        Reports { running: pairs, stopped: BTreeMap::new() }
    }

    /// Reports that the units of `pairs` are `active` ("inactive", "failed") there, each
    /// report telling `which` apart from another of the same.
    fn reported(pairs: &[(&str, &str)], active: &str, which: u64) -> Reports {
        let states: Vec<UnitState> = pairs
            .iter()
            .map(|(unit, machine)| UnitState {
                name: unit.to_string(),
                machine_id: machine.to_string(),
                hash: crate::UnitHash([0; 20]),
                systemd: crate::SystemdState::new("loaded", active, "dead"),
                launched: false,
                drift: None,
                health: None,
                secrets: BTreeMap::from([("which".to_string(), which)]),
                run: None,
            })
            .collect();
        Reports::of(&states)
    }

    /// One moment: the tests' clock.
    fn at(seconds: u64) -> Instant {
        *START + std::time::Duration::from_secs(seconds)
    }

    static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    fn unscheduled(unit: &str, machine: &str) -> Decision {
        Decision::Unschedule {
            unit: unit.into(),
            machine: machine.into(),
            reason: UnscheduleReason::TargetStateInactive,
        }
    }

    #[test]
    fn a_unit_taken_off_a_present_machine_waits_until_that_machine_stopped_it() {
        let mut departures = Departures::default();
        let before = cluster(&["a", "b"], vec![unit("u.service", Some("a"), DesiredState::Inactive)]);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[("u.service", "a")]), at(0));
        // Loaded again while a still runs it: held, so the plan places it nowhere.
        let again = cluster(&["a", "b"], vec![unit("u.service", None, DesiredState::Launched)]);
        departures.settle(&running(&[("u.service", "a")]), &again, false, at(1));
        assert_eq!(departures.held(&again), BTreeMap::from([("u.service".to_string(), "a".to_string())]));
        let without: Vec<UnitSpec> =
            again.units.iter().filter(|u| !departures.held(&again).contains_key(&u.name)).cloned().collect();
        assert!(plan(&cluster(&["a", "b"], without)).decisions.is_empty());
        // a reports it stopped: it may go anywhere.
        departures.settle(&running(&[]), &again, false, at(1));
        assert!(departures.held(&again).is_empty() && departures.is_empty());
        assert_eq!(plan(&again).decisions.len(), 1);
    }

    #[test]
    fn a_move_off_a_present_machine_is_a_stop_now_and_a_start_once_it_stopped() {
        let mut moved = Plan {
            decisions: vec![
                unscheduled("u.service", "a"),
                Decision::Schedule { unit: "u.service".into(), machine: "b".into() },
                unscheduled("gone.service", "x"),
                Decision::Schedule { unit: "gone.service".into(), machine: "b".into() },
                Decision::Schedule { unit: "new.service".into(), machine: "a".into() },
            ],
            ..Plan::default()
        };
        let cluster = cluster(&["a", "b"], vec![]);
        assert!(moved.defer_moves_off(&cluster));
        assert_eq!(
            moved.decisions,
            vec![
                unscheduled("u.service", "a"),
                unscheduled("gone.service", "x"),
                Decision::Schedule { unit: "gone.service".into(), machine: "b".into() },
                Decision::Schedule { unit: "new.service".into(), machine: "a".into() },
            ],
            "x is gone (its agent stops what it runs before it is back); new.service moves nowhere"
        );
        assert_eq!(
            moved.reason_texts(),
            vec![("u.service".to_string(), "waits for machine a to stop it".to_string())],
            "the deferred unit says what it waits for"
        );
        assert!(!moved.defer_moves_off(&cluster), "nothing left to defer");
    }

    /// Seed 796431134 of `fleet-sim --scheduled 4 --moving 3 --prioritized 8`: a machine started
    /// a unit, its report was lost and it was cut off; the unit was preempted off it, and with
    /// no report of it there the engine started it elsewhere at once, while it still ran.
    #[test]
    fn a_unit_its_machine_had_not_reported_waits_until_its_silence_may_be_trusted() {
        let mut departures = Departures::default();
        let before = cluster(&["a", "b"], vec![unit("u.service", Some("a"), DesiredState::Launched)]);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[]), at(10));
        let waiting = cluster(&["a", "b"], vec![unit("u.service", None, DesiredState::Launched)]);
        departures.settle(&running(&[]), &waiting, false, at(5));
        assert_eq!(departures.held(&waiting).len(), 1, "no report yet proves nothing");
        assert_eq!(departures.next_silence_end(), Some(at(10)));
        let stopped = reported(&[("u.service", "a")], "inactive", 1);
        let mut told = departures.clone();
        assert!(told.settle_running(&stopped, at(6)), "a report that it stopped ends it");
        assert!(!departures.settle_running(&running(&[("u.service", "a")]), at(11)), "running, held past the silence");
        assert!(departures.settle_running(&running(&[]), at(11)), "silent past the hold: its agent stopped it");

        // A unit its machine had reported ends as before, when the report goes.
        let mut reported = Departures::default();
        reported.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[("u.service", "a")]), at(10));
        assert!(reported.settle_running(&running(&[]), at(1)));
    }

    /// Seed 50503 of `fleet-sim --scheduled 4 --moving 3 --prioritized 12` with a fresh
    /// registration asking again at once: a machine back from a lapse had stopped its units and
    /// reported them stopped, started them again and was cut off before reporting that; they
    /// were preempted off it, the stale "inactive" taken for a stop, and they started elsewhere
    /// while it ran them with its presence held.
    #[test]
    fn a_report_that_it_stopped_made_before_it_was_taken_off_proves_nothing() {
        let mut departures = Departures::default();
        let before = cluster(&["a", "b"], vec![unit("u.service", Some("a"), DesiredState::Launched)]);
        let stale = reported(&[("u.service", "a")], "inactive", 1);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &stale, at(10));
        assert_eq!(departures.silent().len(), 1, "recorded for a leader that takes over");
        assert!(!departures.clone().settle_running(&stale, at(5)), "the same report: nothing new");
        assert!(departures.clone().settle_running(&stale, at(10)), "past the hold, trusted as a silence");
        let anew = reported(&[("u.service", "a")], "inactive", 2);
        assert!(departures.clone().settle_running(&anew, at(5)), "a report made since: stopped");
        assert!(departures.clone().settle_running(&running(&[]), at(5)), "its report removed: the agent let it go");
        assert!(!departures.settle_running(&running(&[("u.service", "a")]), at(11)), "running, held past the hold");

        // A leader that takes over holds what it finds reported stopped the same way.
        let waiting = cluster(&["a", "b"], vec![unit("u.service", None, DesiredState::Launched)]);
        let recorded = [SilentDeparture { unit: "u.service".into(), machine: "a".into() }];
        let mut new = Departures::default();
        new.adopt_silent(&recorded, &waiting, &stale, at(30));
        new.settle(&stale, &waiting, true, at(20));
        assert_eq!(new.held(&waiting).len(), 1, "the stopped report found on taking over proves nothing");
        assert!(new.settle_running(&anew, at(21)), "one made since does");
    }

    /// Seed 796436631 (`--scheduled 4 --moving 3 --prioritized 8`): a unit preempted off a
    /// machine cut off before it reported the unit; an election of 9.7 s then kept every lease
    /// alive and the machine silent, and its silence was taken for a stop.
    #[test]
    fn a_silence_counts_again_once_the_store_answers_again() {
        let mut departures = Departures::default();
        let before = cluster(&["a", "b"], vec![unit("u.service", Some("a"), DesiredState::Launched)]);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[]), at(10));
        departures.restart_silences(at(30));
        assert_eq!(departures.next_silence_end(), Some(at(30)));
        assert!(!departures.settle_running(&running(&[]), at(11)), "silent while nobody could report");
        assert!(departures.settle_running(&running(&[]), at(30)), "silent since the store answers again");
        let mut reported = Departures::default();
        reported.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[("u.service", "a")]), at(10));
        reported.restart_silences(at(30));
        assert_eq!(reported.next_silence_end(), None, "a reported unit waits for its report, not a silence");
    }

    /// Seed 796436631 (`--scheduled 4 --moving 3 --prioritized 8`): a unit preempted off a
    /// machine cut off that had not reported it; the leader changed, and the new one placed it
    /// at once while the machine, still present, ran it from its stale copy.
    #[test]
    fn a_new_leader_holds_the_silent_departures_recorded_before_it() {
        let mut old = Departures::default();
        let before = cluster(
            &["a", "b"],
            vec![
                unit("u.service", Some("a"), DesiredState::Launched),
                unit("v.service", Some("a"), DesiredState::Launched),
            ],
        );
        let both = [unscheduled("u.service", "a"), unscheduled("v.service", "a")];
        old.note_decisions(&both, &before, &running(&[("v.service", "a")]), at(10));
        let recorded = old.silent();
        assert_eq!(recorded, [SilentDeparture { unit: "u.service".into(), machine: "a".into() }], "v was reported");

        let waiting = cluster(
            &["a", "b"],
            vec![unit("u.service", None, DesiredState::Launched), unit("v.service", None, DesiredState::Launched)],
        );
        let mut new = Departures::default();
        new.adopt_silent(&recorded, &waiting, &Reports::default(), at(30));
        assert_eq!(new.held(&waiting).keys().collect::<Vec<_>>(), ["u.service"]);
        assert!(!new.settle_running(&running(&[]), at(29)), "silent, counted from the new leader's sight");
        assert!(new.settle_running(&running(&[]), at(30)));

        let mut gone = Departures::default();
        gone.adopt_silent(&recorded, &cluster(&["b"], waiting.units.clone()), &Reports::default(), at(30));
        assert!(gone.is_empty(), "its machine is gone: nothing to wait for");
        let mut placed = Departures::default();
        placed.adopt_silent(&recorded, &before, &Reports::default(), at(30));
        assert!(placed.is_empty(), "placed again meanwhile: nothing to wait for");
    }

    #[test]
    fn a_departure_ends_when_its_machine_is_gone() {
        let mut departures = Departures::default();
        let before = cluster(&["a", "b"], vec![unit("u.service", Some("a"), DesiredState::Launched)]);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[("u.service", "a")]), at(0));
        let gone = cluster(&["b"], vec![unit("u.service", None, DesiredState::Launched)]);
        departures.settle(&running(&[("u.service", "a")]), &gone, false, at(1));
        assert!(departures.is_empty(), "a's presence lapsed: its agent stops what it runs before it is back");
    }

    #[test]
    fn only_units_taken_off_a_present_machine_are_noted() {
        let mut departures = Departures::default();
        let before = cluster(&["b"], vec![unit("u.service", Some("a"), DesiredState::Launched)]);
        departures.note_decisions(
            &[unscheduled("u.service", "a"), Decision::Schedule { unit: "u.service".into(), machine: "b".into() }],
            &before,
            &running(&[]),
            at(0),
        );
        assert!(departures.is_empty(), "a is gone already");
    }

    #[test]
    fn an_engine_that_takes_over_learns_departures_from_what_present_machines_run() {
        let cluster = cluster(
            &["a", "b"],
            vec![
                unit("waiting.service", None, DesiredState::Launched),
                unit("placed.service", Some("b"), DesiredState::Launched),
                unit("off.service", None, DesiredState::Inactive),
            ],
        );
        assert_eq!(Departures::unknown_on_takeover(&cluster), BTreeSet::from(["waiting.service".to_string()]));
        let mut departures = Departures::default();
        departures.settle(
            &running(&[
                ("waiting.service", "a"),
                ("placed.service", "a"),
                ("off.service", "a"),
                ("waiting.service", "gone"),
            ]),
            &cluster,
            true,
            at(1),
        );
        assert_eq!(departures.units(), BTreeSet::from(["waiting.service".to_string()]));
        assert_eq!(departures.held(&cluster), BTreeMap::from([("waiting.service".to_string(), "a".to_string())]));
    }

    #[test]
    fn a_unit_unloaded_stays_a_departure_but_holds_nothing_until_it_is_loaded_again() {
        let mut departures = Departures::default();
        let before = cluster(&["a"], vec![unit("u.service", Some("a"), DesiredState::Inactive)]);
        departures.note_decisions(&[unscheduled("u.service", "a")], &before, &running(&[("u.service", "a")]), at(0));
        let off = cluster(&["a"], vec![unit("u.service", None, DesiredState::Inactive)]);
        assert!(departures.held(&off).is_empty());
        assert!(!departures.is_empty());
    }
}
