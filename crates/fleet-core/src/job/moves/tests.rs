use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::job::runs::DEFAULT_KEPT_RUNS;

const SECOND: i64 = 1_000_000;
/// 2026-12-04 00:00:00 UTC.
const START: i64 = 1_796_342_400 * SECOND;

fn service(retries: u32) -> Job {
    Job {
        schedule: None,
        overlap: Default::default(),
        missed: Default::default(),
        batch: false,
        retries,
        retry_delay: Duration::from_secs(10),
        kept_runs: DEFAULT_KEPT_RUNS,
    }
}

fn state(machine: &str, active: &str) -> UnitState {
    UnitState {
        name: "web.service".into(),
        machine_id: machine.into(),
        hash: crate::UnitHash([0; 20]),
        systemd: crate::SystemdState::new("loaded", active, if active == "failed" { "failed" } else { "running" }),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
        run: None,
    }
}

/// The cluster as one pass of the engine sees it: machines present, where the unit is placed,
/// what each machine reports of it.
struct World {
    present: Vec<&'static str>,
    placed_on: Option<&'static str>,
    reports: BTreeMap<&'static str, UnitState>,
    wanted: bool,
}

impl World {
    fn new(machines: &[&'static str]) -> Self {
        Self { present: machines.to_vec(), placed_on: None, reports: BTreeMap::new(), wanted: true }
    }

    fn step(&self, job: &Job, record: &JobRecord, now: i64) -> Followed {
        let report_on = |machine: &str| self.reports.get(machine);
        let present = |machine: &str| self.present.contains(&machine);
        let seen = Seen { wanted: self.wanted, placed_on: self.placed_on, report_on: &report_on, present: &present };
        follow(job, record, &seen, now)
    }

    /// The unit placed on `machine` and running there.
    fn runs_on(&mut self, machine: &'static str) {
        self.reports.clear();
        self.placed_on = Some(machine);
        self.reports.insert(machine, state(machine, "active"));
    }

    fn fails(&mut self) {
        let machine = self.placed_on.expect("placed");
        self.reports.insert(machine, state(machine, "failed"));
    }

    /// The engine took it off its machine, whose agent then let it go.
    fn let_go(&mut self) {
        self.placed_on = None;
        self.reports.clear();
    }
}

#[test]
fn a_failed_service_waits_then_moves_away_from_where_it_failed() {
    let job = service(2);
    let mut world = World::new(&["m1", "m2", "m3"]);
    let first = world.step(&job, &JobRecord::new(START), START);
    assert_eq!((first.place.clone(), first.record.runs.len()), (Place::AsWanted, 0), "nothing to keep until placed");
    world.runs_on("m1");
    let record = world.step(&job, &first.record, START + SECOND).record;
    let stay = record.active_run().expect("its stay on m1 began");
    assert_eq!((stay.machine.as_deref(), stay.attempt, stay.outcome.clone()), (Some("m1"), 1, None));

    world.fails();
    let failed = world.step(&job, &record, START + 5 * SECOND);
    let wait = Place::Off("failed on 1 machine; next try in 10s, at 2026-12-04T00:00:15Z".to_string());
    assert_eq!(failed.place, wait);
    assert_eq!(failed.next_due, Some(START + 15 * SECOND));
    // Due, but m1 still reports its failure: it stays off until m1 lets it go.
    let held = world.step(&job, &failed.record, START + 20 * SECOND);
    assert_eq!((held.place.clone(), held.next_due), (wait.clone(), None));
    assert!(held.record.active_run().is_some(), "not let go of while m1 reports it");
    world.let_go();
    let due = world.step(&job, &held.record, START + 21 * SECOND);
    assert_eq!(due.place, Place::Avoiding(vec!["m1".to_string()]));
    assert!(due.record.active_run().is_none());

    world.runs_on("m2");
    let record = world.step(&job, &due.record, START + 22 * SECOND).record;
    let stay = record.active_run().expect("its stay on m2");
    assert_eq!((stay.machine.as_deref(), stay.attempt, stay.avoid.clone()), (Some("m2"), 2, vec!["m1".to_string()]));
    world.fails();
    let failed = world.step(&job, &record, START + 30 * SECOND);
    assert_eq!(
        failed.place,
        Place::Off("failed on 2 machines; next try in 20s, at 2026-12-04T00:00:50Z".to_string()),
        "the wait doubles"
    );
    world.let_go();
    let due = world.step(&job, &failed.record, START + 50 * SECOND);
    assert_eq!(due.place, Place::Avoiding(vec!["m1".to_string(), "m2".to_string()]));
    world.runs_on("m1");
    let record = world.step(&job, &due.record, START + 51 * SECOND).record;
    world.fails();
    let spent = world.step(&job, &record, START + 52 * SECOND);
    assert_eq!(
        spent.place,
        Place::Off("failed 3 times on 2 machines; Retries=2 spent: stop and start it to try again".to_string())
    );
    world.let_go();
    let still = world.step(&job, &spent.record, START + 9999 * SECOND);
    assert!(matches!(still.place, Place::Off(_)) && still.next_due.is_none(), "no more tries: {still:?}");

    // A stop and a start begin afresh.
    world.wanted = false;
    let stopped = world.step(&job, &still.record, START + 10_000 * SECOND);
    assert_eq!(stopped.place, Place::AsWanted);
    world.wanted = true;
    let started = world.step(&job, &stopped.record, START + 10_001 * SECOND);
    assert_eq!(started.place, Place::AsWanted);
    assert!(started.record.stopped_since_run, "still fresh until it is placed");
    world.runs_on("m3");
    let record = world.step(&job, &started.record, START + 10_002 * SECOND).record;
    let stay = record.active_run().expect("a fresh stay");
    assert_eq!((stay.attempt, stay.avoid.len(), record.stopped_since_run), (1, 0, false));
}

#[test]
fn a_steady_stay_forgets_the_failures_before_it() {
    let job = service(1);
    let mut world = World::new(&["m1", "m2"]);
    world.runs_on("m1");
    let record = world.step(&job, &JobRecord::new(START), START).record;
    world.fails();
    let record = world.step(&job, &record, START + SECOND).record;
    world.let_go();
    let record = world.step(&job, &record, START + 20 * SECOND).record;
    world.runs_on("m2");
    let record = world.step(&job, &record, START + 21 * SECOND).record;
    assert_eq!(record.active_run().map(|stay| stay.attempt), Some(2));
    // An hour on m2 before it fails: its one retry is owed again.
    world.fails();
    let failed = world.step(&job, &record, START + 3600 * SECOND);
    assert_eq!(failed.place, Place::Off("failed on 1 machine; next try in 10s, at 2026-12-04T01:00:10Z".to_string()));
    assert_eq!(failed.record.runs.last().map(|stay| (stay.attempt, stay.avoid.len())), Some((1, 0)));
}

#[test]
fn a_move_or_a_lost_machine_is_no_failure() {
    let job = service(1);
    let mut world = World::new(&["m1", "m2"]);
    world.runs_on("m1");
    let record = world.step(&job, &JobRecord::new(START), START).record;
    // A drain moves it: taken off m1, placed on m2.
    world.placed_on = None;
    let moved = world.step(&job, &record, START + SECOND);
    assert_eq!(moved.record.runs[0].outcome, Some(Outcome::Stopped));
    assert_eq!(moved.place, Place::AsWanted);
    world.runs_on("m2");
    let record = world.step(&job, &moved.record, START + 2 * SECOND).record;
    assert_eq!(record.active_run().map(|stay| (stay.machine.as_deref(), stay.attempt)), Some((Some("m2"), 1)));
    // m2 is lost.
    world.present = vec!["m1"];
    let lost = world.step(&job, &record, START + 3 * SECOND);
    assert!(matches!(lost.record.runs[1].outcome, Some(Outcome::Lost { .. })));
    assert_eq!(lost.place, Place::AsWanted, "placed again at once");
    // Steady state: nothing changes, nothing is written.
    world.runs_on("m1");
    let record = world.step(&job, &lost.record, START + 4 * SECOND).record;
    assert_eq!(world.step(&job, &record, START + 5 * SECOND).record, record);
}

#[test]
fn a_service_failing_on_its_only_machine_says_so_and_keeps_a_bounded_record() {
    let job = Job { kept_runs: 3, ..service(100) };
    let mut world = World::new(&["m1"]);
    let mut record = JobRecord::new(START);
    let mut now = START;
    for attempt in 1..=6u32 {
        world.runs_on("m1");
        record = world.step(&job, &record, now).record;
        world.fails();
        now += SECOND;
        let failed = world.step(&job, &record, now);
        let Place::Off(why) = &failed.place else { panic!("off after a failure: {failed:?}") };
        let times = if attempt == 1 { "on 1 machine".to_string() } else { format!("{attempt} times on 1 machine") };
        assert!(why.starts_with(&format!("failed {times}; next try in")), "{why}");
        world.let_go();
        now = failed.next_due.expect("a try is due");
        let due = world.step(&job, &failed.record, now);
        assert_eq!(due.place, Place::Avoiding(vec!["m1".to_string()]), "it may go back to m1, the only machine");
        record = due.record;
    }
    assert_eq!(record.runs.len(), 3, "KeepRuns= bounds the stays kept");
}
