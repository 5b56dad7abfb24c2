use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::calendar::CalendarSpec;
use crate::job::Job;

const SECOND: i64 = 1_000_000;
/// 2026-12-04 00:00:00 UTC.
const START: i64 = 1_796_342_400 * SECOND;

fn job(schedule: &str, overlap: Overlap, missed: Missed) -> Job {
    Job {
        schedule: Some(CalendarSpec::parse(schedule).expect("a schedule")),
        overlap,
        missed,
        batch: false,
        retries: 0,
        retry_delay: std::time::Duration::from_secs(10),
        kept_runs: DEFAULT_KEPT_RUNS,
    }
}

fn finish_active(record: &mut JobRecord, now: i64) {
    end_active(record, now, Outcome::Succeeded);
}

fn end_active(record: &mut JobRecord, now: i64, outcome: Outcome) {
    for run in record.runs.iter_mut().filter(|run| run.is_active()) {
        run.ended = Some(now);
        run.outcome = Some(outcome.clone());
        run.released = true;
    }
}

fn failed() -> Outcome {
    Outcome::Failed { status: Some(1), signal: None }
}

fn batch(retries: u32) -> Job {
    Job {
        schedule: None,
        overlap: Overlap::Skip,
        missed: Missed::Skip,
        batch: true,
        retries,
        retry_delay: std::time::Duration::from_secs(10),
        kept_runs: DEFAULT_KEPT_RUNS,
    }
}

#[test]
fn a_batch_unit_runs_once_per_start() {
    let job = batch(0);
    let first = advance(&job, &JobRecord::new(START), START, DEFAULT_KEPT_RUNS);
    let run = first.claimed.clone().expect("its start is owed a run");
    assert_eq!((run.id, run.elapse, run.attempt), (1, None, 1));
    let again = advance(&job, &first.record, START + SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!(again.claimed, None, "one run while it runs");
    let mut record = again.record;
    finish_active(&mut record, START + 5 * SECOND);
    let done = advance(&job, &record, START + 6 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!((done.claimed, done.next_due), (None, None), "finished: not run again while it stays started");
    let stopped = Seen { wanted: false, report: None, machine_present: true };
    let record = observe(&done.record, stopped, START + 7 * SECOND);
    assert!(record.stopped_since_run);
    let restarted = advance(&job, &record, START + 8 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!(restarted.claimed.map(|run| (run.id, run.attempt)), Some((2, 1)), "started again: run again");
    assert!(!restarted.record.stopped_since_run);
}

#[test]
fn a_failed_run_is_retried_after_a_doubling_delay_away_from_the_machines_it_failed_on() {
    let job = batch(2);
    let mut record = advance(&job, &JobRecord::new(START), START, DEFAULT_KEPT_RUNS).record;
    let mut now = START;
    let mut machines = Vec::new();
    for (attempt, delay) in [(1u32, 10i64), (2, 20)] {
        let machine = format!("m{attempt}");
        record = placed(&record, &machine).expect("placed");
        machines.push(machine);
        now += 30 * SECOND;
        end_active(&mut record, now, failed());
        let early = advance(&job, &record, now + (delay - 1) * SECOND, DEFAULT_KEPT_RUNS);
        assert_eq!((early.claimed, early.next_due), (None, Some(now + delay * SECOND)), "attempt {attempt}");
        let due = advance(&job, &early.record, now + delay * SECOND, DEFAULT_KEPT_RUNS);
        let retry = due.claimed.expect("retried once its delay passed");
        assert_eq!((retry.attempt, retry.elapse, &retry.avoid), (attempt + 1, None, &machines));
        record = due.record;
        now += delay * SECOND;
    }
    record = placed(&record, "m3").expect("placed");
    end_active(&mut record, now + SECOND, failed());
    let spent = advance(&job, &record, now + 3600 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!((spent.claimed, spent.next_due), (None, None), "two retries, then no more");
    assert_eq!(spent.record.runs.len(), 3);
}

#[test]
fn a_lost_or_stopped_run_is_not_retried_and_a_restart_drops_the_retries() {
    let job = batch(3);
    let mut record = advance(&job, &JobRecord::new(START), START, DEFAULT_KEPT_RUNS).record;
    end_active(&mut record, START + SECOND, Outcome::Lost { why: "machine m1 was lost".into() });
    assert_eq!(advance(&job, &record, START + 3600 * SECOND, DEFAULT_KEPT_RUNS).claimed, None, "lost: maybe ran");
    let mut record = advance(&job, &JobRecord::new(START), START, DEFAULT_KEPT_RUNS).record;
    end_active(&mut record, START + SECOND, Outcome::Stopped);
    assert_eq!(advance(&job, &record, START + 3600 * SECOND, DEFAULT_KEPT_RUNS).claimed, None, "stopped by hand");
    let mut record = advance(&job, &JobRecord::new(START), START, DEFAULT_KEPT_RUNS).record;
    end_active(&mut record, START + SECOND, failed());
    let stopped = Seen { wanted: false, report: None, machine_present: true };
    let record = observe(&record, stopped, START + 2 * SECOND);
    let restarted = advance(&job, &record, START + 3 * SECOND, DEFAULT_KEPT_RUNS).claimed.expect("a fresh run");
    assert_eq!((restarted.attempt, restarted.avoid.len()), (1, 0));
}

#[test]
fn an_elapse_on_time_is_claimed_once_and_the_next_one_is_named() {
    let job = job("*:0/15", Overlap::Skip, Missed::Skip);
    let record = JobRecord::new(START);
    let early = advance(&job, &record, START + 10 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!((early.claimed.clone(), early.next_due), (None, Some(START + 900 * SECOND)));
    let due = advance(&job, &early.record, START + 901 * SECOND, DEFAULT_KEPT_RUNS);
    let run = due.claimed.clone().expect("claimed");
    assert_eq!((run.id, run.elapse), (1, Some(START + 900 * SECOND)));
    assert_eq!(due.next_due, Some(START + 1800 * SECOND));
    let again = advance(&job, &due.record, START + 902 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!(again.claimed, None, "read back after a lost answer: nothing claimed twice");
    assert_eq!(again.record, due.record);
}

#[test]
fn elapses_missed_while_no_leader_looked_are_skipped_or_run_once() {
    let record = JobRecord::new(START);
    let back = START + 3 * 3600 * SECOND + 300 * SECOND;
    let skip = advance(&job("*:0/15", Overlap::Skip, Missed::Skip), &record, back, DEFAULT_KEPT_RUNS);
    assert_eq!(skip.claimed, None);
    assert_eq!(
        skip.skipped,
        vec![
            Skipped { first: START + 900 * SECOND, last: START + 9_900 * SECOND, why: SkipReason::Missed },
            Skipped { first: START + 10_800 * SECOND, last: START + 10_800 * SECOND, why: SkipReason::Missed },
        ]
    );
    assert_eq!(skip.record.cursor, START + 10_800 * SECOND, "the last due elapse: 03:00");
    let once = advance(&job("*:0/15", Overlap::Skip, Missed::Once), &record, back, DEFAULT_KEPT_RUNS);
    assert_eq!(once.claimed.expect("the last missed one runs").elapse, Some(START + 10_800 * SECOND));
    assert_eq!(
        once.skipped,
        vec![Skipped { first: START + 900 * SECOND, last: START + 9_900 * SECOND, why: SkipReason::Missed }]
    );
}

#[test]
fn an_elapse_during_a_run_is_skipped_or_waits_its_turn() {
    let record = JobRecord::new(START);
    for (overlap, queued) in [(Overlap::Skip, None), (Overlap::Queue, Some(START + 120 * SECOND))] {
        let job = job("*:0/1", overlap, Missed::Skip);
        let first = advance(&job, &record, START + 61 * SECOND, DEFAULT_KEPT_RUNS);
        assert!(first.claimed.is_some());
        let second = advance(&job, &first.record, START + 121 * SECOND, DEFAULT_KEPT_RUNS);
        assert_eq!((second.claimed.clone(), second.record.queued), (None, queued), "{overlap:?}");
        let mut ended = second.record.clone();
        finish_active(&mut ended, START + 130 * SECOND);
        let third = advance(&job, &ended, START + 131 * SECOND, DEFAULT_KEPT_RUNS);
        assert_eq!(third.claimed.map(|run| run.elapse), queued.map(Some), "{overlap:?}");
    }
}

#[test]
fn a_run_by_hand_waits_for_no_elapse_but_for_the_active_run() {
    let record = JobRecord::new(START);
    let started = dispatch(&record, START + SECOND, DEFAULT_KEPT_RUNS).expect("nothing runs");
    assert_eq!((started.id, started.claimed), (1, true));
    assert_eq!(started.record.active_run().map(|run| (run.id, run.elapse)), Some((1, None)));
    assert_eq!(dispatch(&started.record, START + 2 * SECOND, DEFAULT_KEPT_RUNS), Err(DispatchError::Active(1)));
    // Ended, not let go of yet: the next one is owed, and claimed once it is let go of.
    let mut record = started.record;
    record.runs[0].outcome = Some(Outcome::Succeeded);
    record.runs[0].ended = Some(START + 3 * SECOND);
    let owed = dispatch(&record, START + 4 * SECOND, DEFAULT_KEPT_RUNS).expect("owed");
    assert_eq!((owed.id, owed.claimed, owed.record.owed_by_hand), (2, false, true));
    assert_eq!(dispatch(&owed.record, START + 5 * SECOND, DEFAULT_KEPT_RUNS), Err(DispatchError::Owed(2)));
    let job = batch(0);
    let waiting = advance(&job, &owed.record, START + 5 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!(waiting.claimed, None, "the run before still holds the unit");
    let mut record = waiting.record;
    record.runs[0].released = true;
    let claimed = advance(&job, &record, START + 6 * SECOND, DEFAULT_KEPT_RUNS);
    assert_eq!(claimed.claimed.map(|run| (run.id, run.elapse)), Some((2, None)));
    assert!(!claimed.record.owed_by_hand);
}

#[test]
fn finished_runs_beyond_the_bound_are_dropped_oldest_first() {
    let job = job("*:*:0/2", Overlap::Skip, Missed::Skip);
    let mut record = JobRecord::new(START);
    for step in 1..=10 {
        let now = START + step * 2 * SECOND;
        record = advance(&job, &record, now, 3).record;
        finish_active(&mut record, now);
    }
    let ids: Vec<u64> = record.runs.iter().map(|run| run.id).collect();
    assert_eq!(ids, vec![8, 9, 10]);
}

/// One thing that happens to a schedule: time passes (a leader's pass at the new time), a
/// second leader passes at the same moment from the same record (its write loses the
/// compare-and-swap), or the active run ends.
#[derive(Clone, Debug)]
enum Event {
    Pass { after_seconds: i64 },
    RacingLeaders { after_seconds: i64, skew_seconds: i64 },
    RunEnds { failed: bool },
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    let pass = prop_oneof![
        8 => (1i64..120).prop_map(|after_seconds| Event::Pass { after_seconds }),
        1 => (600i64..7200).prop_map(|after_seconds| Event::Pass { after_seconds }),
        2 => ((1i64..60), (0i64..5)).prop_map(|(after_seconds, skew_seconds)| Event::RacingLeaders { after_seconds, skew_seconds }),
        4 => proptest::bool::ANY.prop_map(|failed| Event::RunEnds { failed }),
    ];
    proptest::collection::vec(pass, 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Whatever passes, leader races and run ends (failed ones retried) come, no elapse is
    /// claimed twice for a first attempt nor tried more often than its retries allow, none is
    /// claimed before it is due, and every elapse up to the cursor is claimed, waiting or in a
    /// skipped range.
    #[test]
    fn every_elapse_is_claimed_at_most_once_and_accounted_for(
        schedule in proptest::sample::select(vec!["*:*:0/2", "*:*:0/7", "*:0/1", "*:0/15", "*:*:0/3,4", "Mon..Fri *-*-* 00:01..05:00"]),
        overlap in prop_oneof![Just(Overlap::Skip), Just(Overlap::Queue)],
        missed in prop_oneof![Just(Missed::Skip), Just(Missed::Once)],
        retries in 0u32..3,
        events in events(),
    ) {
        let job = Job { retries, ..job(schedule, overlap, missed) };
        let mut stored = JobRecord::new(START);
        let mut now = START;
        let mut claimed: Vec<i64> = Vec::new();
        let mut attempts: std::collections::BTreeMap<i64, Vec<u32>> = std::collections::BTreeMap::new();
        let mut skipped: Vec<Skipped> = Vec::new();
        for event in events {
            match event {
                Event::Pass { after_seconds } => {
                    now += after_seconds * SECOND;
                    let step = advance(&job, &stored, now, DEFAULT_KEPT_RUNS);
                    if let Some(run) = &step.claimed {
                        let elapse = run.elapse.expect("an elapse");
                        prop_assert!(elapse <= now, "claimed {elapse} before it was due at {now}");
                        attempts.entry(elapse).or_default().push(run.attempt);
                        if run.attempt == 1 {
                            claimed.push(elapse);
                        }
                    }
                    skipped.extend(step.skipped);
                    prop_assert!(step.record.cursor >= stored.cursor, "the cursor went back");
                    stored = step.record;
                }
                Event::RacingLeaders { after_seconds, skew_seconds } => {
                    now += after_seconds * SECOND;
                    let winner = advance(&job, &stored, now, DEFAULT_KEPT_RUNS);
                    // The loser computed from the same record; its swap fails and its claim is
                    // never carried out. It reads the winner's record back and passes again.
                    let _loser = advance(&job, &stored, now + skew_seconds * SECOND, DEFAULT_KEPT_RUNS);
                    if let Some(run) = &winner.claimed {
                        attempts.entry(run.elapse.expect("an elapse")).or_default().push(run.attempt);
                        if run.attempt == 1 {
                            claimed.push(run.elapse.expect("an elapse"));
                        }
                    }
                    skipped.extend(winner.skipped);
                    let again = advance(&job, &winner.record, now + skew_seconds * SECOND, DEFAULT_KEPT_RUNS);
                    if let Some(run) = &again.claimed {
                        attempts.entry(run.elapse.expect("an elapse")).or_default().push(run.attempt);
                        if run.attempt == 1 {
                            claimed.push(run.elapse.expect("an elapse"));
                        }
                    }
                    skipped.extend(again.skipped);
                    stored = again.record;
                    now += skew_seconds * SECOND;
                }
                Event::RunEnds { failed: false } => finish_active(&mut stored, now),
                Event::RunEnds { failed: true } => end_active(&mut stored, now, failed()),
            }
        }
        let unique: BTreeSet<i64> = claimed.iter().copied().collect();
        prop_assert_eq!(unique.len(), claimed.len(), "an elapse was claimed twice: {:?}", claimed);
        for (elapse, tried) in &attempts {
            let expected: Vec<u32> = (1..=tried.len() as u32).collect();
            prop_assert_eq!(tried, &expected, "elapse {} was tried out of order", elapse);
            prop_assert!(tried.len() as u32 <= 1 + retries, "elapse {} tried {} times", elapse, tried.len());
        }
        let spec = job.schedule.as_ref().expect("scheduled");
        let mut elapse = spec.next_after(START);
        while let Some(at) = elapse.filter(|at| *at <= stored.cursor) {
            let accounted = unique.contains(&at)
                || stored.queued == Some(at)
                || skipped.iter().any(|range| range.first <= at && at <= range.last);
            prop_assert!(accounted, "elapse {} was neither claimed, waiting nor skipped", at);
            elapse = spec.next_after(at);
        }
    }
}

fn report(machine: &str, run: Option<RunReport>) -> crate::UnitState {
    let run = run.map(Box::new);
    crate::UnitState {
        name: "backup.service".into(),
        machine_id: machine.into(),
        hash: crate::UnitHash([0; 20]),
        systemd: crate::SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
        run,
    }
}

fn claimed_on(machine: Option<&str>) -> JobRecord {
    let job = job("*:0/15", Overlap::Skip, Missed::Skip);
    let record = advance(&job, &JobRecord::new(START), START + 901 * SECOND, DEFAULT_KEPT_RUNS).record;
    match machine {
        Some(machine) => placed(&record, machine).expect("an active run without a machine"),
        None => record,
    }
}

#[test]
fn a_run_begins_ends_and_is_let_go_of_as_its_machine_reports_it() {
    let record = claimed_on(None);
    assert_eq!(runs_now(&record), Some(RunPlace::Anywhere));
    let record = placed(&record, "m1").expect("placed");
    assert_eq!(runs_now(&record), Some(RunPlace::On("m1")));
    assert_eq!(placed(&record, "m2"), None, "a run is placed once");
    let present = |report| Seen { wanted: true, report, machine_present: true };
    let loaded = report("m1", None);
    let waiting = observe(&record, present(Some(&loaded)), START + 902 * SECOND);
    assert_eq!(waiting, record, "loaded, not started: nothing changes");
    let started = report(
        "m1",
        Some(RunReport { started: START + 903 * SECOND, ended: None, outcome: None, log: None, run: None }),
    );
    let running = observe(&record, present(Some(&started)), START + 904 * SECOND);
    assert_eq!(running.runs[0].started, Some(START + 903 * SECOND));
    let failed = Outcome::Failed { status: Some(3), signal: None };
    let ended = report(
        "m1",
        Some(RunReport {
            started: START + 903 * SECOND,
            ended: Some(START + 910 * SECOND),
            outcome: Some(failed.clone()),
            log: None,
            run: None,
        }),
    );
    let ended = observe(&running, present(Some(&ended)), START + 911 * SECOND);
    assert_eq!(
        (ended.runs[0].outcome.clone(), ended.runs[0].ended),
        (Some(failed.clone()), Some(START + 910 * SECOND))
    );
    assert_eq!(runs_now(&ended), None, "an ended run's unit is taken off its machine");
    assert!(ended.active_run().is_some(), "but it holds the unit until its machine let it go");
    let let_go = observe(&ended, present(None), START + 912 * SECOND);
    assert!(let_go.active_run().is_none());
    assert_eq!(let_go.runs[0].outcome, Some(failed), "its outcome stays");
}

#[test]
fn a_run_whose_machine_is_gone_or_forgets_it_was_lost_and_a_stopped_unit_stops_its_run() {
    let record = claimed_on(Some("m1"));
    let gone = observe(&record, Seen { wanted: true, report: None, machine_present: false }, START + 950 * SECOND);
    assert_eq!(gone.runs[0].outcome, Some(Outcome::Lost { why: "machine m1 was lost".into() }));
    assert!(gone.active_run().is_none(), "not run again for its elapse");
    let started = report(
        "m1",
        Some(RunReport { started: START + 903 * SECOND, ended: None, outcome: None, log: None, run: None }),
    );
    let running = observe(&record, Seen { wanted: true, report: Some(&started), machine_present: true }, START);
    let forgotten = observe(&running, Seen { wanted: true, report: None, machine_present: true }, START + 960 * SECOND);
    assert!(matches!(forgotten.runs[0].outcome, Some(Outcome::Lost { .. })));
    assert!(forgotten.active_run().is_none());
    let stopped = observe(&running, Seen { wanted: false, report: Some(&started), machine_present: true }, START);
    assert_eq!(stopped.runs[0].outcome, Some(Outcome::Stopped));
    assert!(stopped.active_run().is_some(), "held until its machine let the unit go");
    let unplaced = observe(&claimed_on(None), Seen { wanted: false, report: None, machine_present: true }, START);
    assert_eq!((unplaced.runs[0].outcome.clone(), unplaced.active_run()), (Some(Outcome::Stopped), None));
}

#[test]
fn a_run_keeps_the_last_lines_of_its_log_bounded() {
    let many: String = (1..=30).map(|line| format!("line {line}\n")).collect();
    let tail = log_tail(&many).expect("lines");
    assert_eq!(tail.lines().count(), LOG_LINES);
    assert!(tail.starts_with("line 11\n") && tail.ends_with("line 30"), "{tail}");
    let wide = "é".repeat(LOG_BYTES);
    let tail = log_tail(&wide).expect("a tail");
    assert!(tail.len() <= LOG_BYTES && tail.chars().all(|c| c == 'é'));
    assert_eq!(log_tail("\n\n"), None);
    assert_eq!(log_tail("one line"), Some("one line".to_string()));
}
