use super::*;
use crate::calendar::CalendarSpec;
use crate::job::runs::Outcome;

const SECOND: i64 = 1_000_000;
/// 2026-12-04 00:00:00 UTC.
const START: i64 = 1_796_342_400 * SECOND;

fn job(overlap: Overlap, missed: Missed) -> Job {
    Job {
        schedule: Some(CalendarSpec::parse("*:0/15").expect("a schedule")),
        overlap,
        missed,
        batch: false,
        retries: 0,
        retry_delay: std::time::Duration::from_secs(10),
        kept_runs: 3,
    }
}

fn ended(run: u64, outcome: Outcome) -> RunReport {
    RunReport { started: START, ended: Some(START + SECOND), outcome: Some(outcome), log: None, run: Some(run) }
}

#[test]
fn each_elapse_is_one_ticket_and_each_machine_is_counted_once() {
    let job = job(Overlap::Skip, Missed::Skip);
    let first = step(&job, &JobRecord::new(START), &[], true, START + SECOND);
    assert_eq!(first.ticket, None, "nothing is due before the first elapse");
    assert_eq!(first.next_due, Some(START + 900 * SECOND));
    let due = step(&job, &first.record, &[], true, START + 901 * SECOND);
    let ticket = due.ticket.expect("the elapse is a ticket");
    assert_eq!(ticket, RunTicket { id: 1, elapse: START + 900 * SECOND });
    assert!(due.record.active_run().is_none(), "no one machine holds it");
    // The same pass again (a leader that took over, a lost answer): the same ticket.
    assert_eq!(step(&job, &due.record, &[], true, START + 902 * SECOND).ticket, Some(ticket));

    let failed = Outcome::Failed { status: Some(2), signal: None };
    let (ok, bad, still) = (
        ended(1, Outcome::Succeeded),
        ended(1, failed.clone()),
        RunReport { ended: None, outcome: None, ..ended(1, Outcome::Succeeded) },
    );
    let reports = [("m1", &ok), ("m2", &bad), ("m3", &still)];
    let counted = step(&job, &due.record, &reports, true, START + 905 * SECOND);
    let counted = step(&job, &counted.record, &reports, true, START + 906 * SECOND);
    let tally = counted.record.runs[0].tally.as_deref().expect("a tally");
    assert_eq!((tally.succeeded, tally.failed, tally.ended()), (1, 1, 2), "each machine once: {tally:?}");
    assert_eq!(tally.failures, vec![MachineEnd { machine: "m2".into(), outcome: failed }]);

    // The next elapse is the next ticket; the one before keeps what it counted.
    let next = step(&job, &counted.record, &[("m3", &ended(1, Outcome::Succeeded))], true, START + 1801 * SECOND);
    assert_eq!(next.ticket, Some(RunTicket { id: 2, elapse: START + 1800 * SECOND }));
    assert_eq!(next.record.runs[0].tally.as_deref().map(Tally::ended), Some(3), "a late end of run 1 still counts");
    // Stopped: no ticket, and nothing claimed while it is.
    let stopped = step(&job, &next.record, &[], false, START + 2701 * SECOND);
    assert_eq!((stopped.ticket, stopped.record.runs.len()), (None, 2));
}

#[test]
fn a_run_started_by_hand_is_a_ticket_too_and_old_runs_forget_their_machines() {
    let job = job(Overlap::Skip, Missed::Skip);
    let mut record = JobRecord::new(START);
    for elapse in 1..=4 {
        record = step(&job, &record, &[], true, START + (900 * elapse + 1) * SECOND).record;
        let id = record.runs.last().expect("a run").id;
        let report = ended(id, Outcome::Succeeded);
        record = step(&job, &record, &[("m1", &report)], true, START + (900 * elapse + 2) * SECOND).record;
    }
    assert_eq!(record.runs.len(), 3, "KeepRuns= bounds them");
    let counted: Vec<usize> =
        record.runs.iter().map(|run| run.tally.as_deref().map_or(0, |tally| tally.counted.len())).collect();
    assert_eq!(counted, vec![0, 1, 1], "only the latest two keep the machines they counted");
    let dispatched = runs::dispatch(&record, START + 3700 * SECOND, 3).expect("a run by hand").record;
    let stepped = step(&job, &dispatched, &[], true, START + 3701 * SECOND);
    assert_eq!(stepped.ticket, Some(RunTicket { id: 5, elapse: START + 3700 * SECOND }));
    assert!(stepped.record.active_run().is_none());
}

#[test]
fn a_machine_runs_each_ticket_once_by_its_rules() {
    let skip = job(Overlap::Skip, Missed::Skip);
    let ticket = RunTicket { id: 4, elapse: START };
    let seen = |baseline: Option<u64>, last: Option<u64>, running: bool| HereSeen { baseline, last, running };
    assert_eq!(here(&skip, Some(&ticket), &seen(None, Some(3), false), START + SECOND), Here::Start(4));
    assert_eq!(here(&skip, Some(&ticket), &seen(None, Some(4), false), START + SECOND), Here::Idle, "once");
    assert_eq!(here(&skip, Some(&ticket), &seen(Some(4), None, false), START + SECOND), Here::Idle, "found at start");
    assert_eq!(here(&skip, None, &seen(None, None, false), START), Here::Idle);
    assert_eq!(here(&skip, Some(&ticket), &seen(None, Some(3), true), START + SECOND), Here::Skip(4));
    assert_eq!(here(&skip, Some(&ticket), &seen(None, Some(4), true), START + SECOND), Here::Running);
    let queue = job(Overlap::Queue, Missed::Skip);
    assert_eq!(here(&queue, Some(&ticket), &seen(None, Some(3), true), START + SECOND), Here::Running);
    assert_eq!(here(&queue, Some(&ticket), &seen(None, Some(3), false), START + 2 * SECOND), Here::Start(4));
    // Too late: skipped, unless Missed=once.
    let late = START + GRACE_MICROS + SECOND;
    assert_eq!(here(&skip, Some(&ticket), &seen(None, None, false), late), Here::Skip(4));
    let once = job(Overlap::Skip, Missed::Once);
    assert_eq!(here(&once, Some(&ticket), &seen(None, None, false), late), Here::Start(4));
}

#[test]
fn a_global_batch_unit_is_one_ticket_per_start_and_never_late() {
    let batch = Job { schedule: None, batch: true, ..job(Overlap::Skip, Missed::Skip) };
    let started = step(&batch, &JobRecord::new(START), &[], true, START);
    assert_eq!(started.ticket, Some(RunTicket { id: 1, elapse: START }), "its start is a ticket");
    let again = step(&batch, &started.record, &[], true, START + 60 * SECOND);
    assert_eq!((again.ticket, again.record.runs.len()), (started.ticket, 1), "one run while it stays started");
    let stopped = step(&batch, &again.record, &[], false, START + 61 * SECOND);
    assert_eq!(stopped.ticket, None);
    let restarted = step(&batch, &stopped.record, &[], true, START + 62 * SECOND);
    assert_eq!(restarted.ticket, Some(RunTicket { id: 2, elapse: START + 62 * SECOND }), "a start again runs again");
    // A machine that comes an hour later runs the current start's run; one on a calendar would not.
    let later = START + 3600 * SECOND;
    let ticket = RunTicket { id: 2, elapse: START + 62 * SECOND };
    assert_eq!(here(&batch, Some(&ticket), &HereSeen::default(), later), Here::Start(2));
    let calendar = job(Overlap::Skip, Missed::Skip);
    assert_eq!(here(&calendar, Some(&ticket), &HereSeen::default(), later), Here::Skip(2));
}
