//! The engine running a scheduled unit (`[X-Fleet] Schedule=`) against the embedded store, on
//! the real clock (elapses are wall-clock times), with the machines' agents played by the test
//! through the store's agent facet: a run is claimed at its elapse, placed once, taken off its
//! machine when that machine reports its end, and the next one waits until the machine let the
//! unit go; a run whose machine is lost is recorded lost and never placed elsewhere. A batch
//! unit runs once per start, and its failed run is retried on the other machine.

use crate::common::{machine, start_engine};

use std::time::Duration;

use fleet_core::job::runs::{JobRecord, Outcome, RunReport};
use fleet_core::{DesiredState, SystemdState, UnitFile, UnitState};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, StateReport};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually_within;

const UNIT: &str = "backup.service";
/// Long enough for a few elapses every 2 s on a machine kept busy by something else.
const WAIT: Duration = Duration::from_secs(60);

fn scheduled() -> UnitFile {
    UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=*:*:0/2\n").unwrap()
}

async fn record(registry: &EmbeddedRegistry) -> Option<JobRecord> {
    registry.job_records().await.unwrap().into_iter().find(|stored| stored.unit == UNIT).map(|stored| stored.record)
}

async fn placed_on(registry: &EmbeddedRegistry) -> Option<String> {
    registry.unit(UNIT).await.unwrap().and_then(|view| view.machine_id)
}

/// What the agent of `machine` reports of the unit: loaded and started by it, with `run`.
fn report(machine: &str, active: &str, run: RunReport) -> StateReport {
    report_of(&scheduled(), machine, active, run)
}

fn report_of(file: &UnitFile, machine: &str, active: &str, run: RunReport) -> StateReport {
    StateReport::Set(UnitState {
        name: UNIT.into(),
        machine_id: machine.into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", active, if active == "active" { "running" } else { "dead" }),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
        run: Some(Box::new(run)),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_unit_runs_once_per_elapse_on_one_machine_and_a_lost_run_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let (stop, engine) = start_engine(&registry);
    registry.put_unit(UNIT, &scheduled(), DesiredState::Launched).await.unwrap();

    // The first elapse: one run claimed, placed, recorded on the machine it was placed on.
    eventually_within("the first run is placed", WAIT, async || placed_on(&registry).await.is_some()).await;
    let first_machine = placed_on(&registry).await.unwrap();
    let first = record(&registry).await.expect("a record");
    assert_eq!(first.runs.len(), 1, "{first:?}");
    assert_eq!(first.runs[0].machine.as_deref(), Some(first_machine.as_str()), "recorded before it was placed");
    let first_elapse = first.runs[0].elapse.expect("an elapse");

    // Its machine runs it to its end: the engine takes the unit off, and while the machine
    // still holds it no other run starts, though elapses pass.
    let started = first_elapse + 100_000;
    let ran =
        RunReport { started, ended: Some(started + 200_000), outcome: Some(Outcome::Succeeded), log: None, run: None };
    registry.report_states(&first_machine, &[report(&first_machine, "inactive", ran)]).await.unwrap();
    eventually_within("the ended run's unit is taken off its machine", WAIT, async || {
        placed_on(&registry).await.is_none()
    })
    .await;
    let ended = record(&registry).await.unwrap();
    assert_eq!(ended.runs[0].outcome, Some(Outcome::Succeeded));
    assert_eq!(ended.runs[0].started, Some(started));
    assert!(ended.active_run().is_some(), "held until its machine let the unit go");

    // The machine lets it go: the next elapse gets the next run.
    registry.report_states(&first_machine, &[StateReport::Remove(UNIT.into())]).await.unwrap();
    eventually_within("the second run is placed", WAIT, async || placed_on(&registry).await.is_some()).await;
    let second = record(&registry).await.unwrap();
    let run = second.active_run().expect("the second run").clone();
    assert_eq!(run.id, 2);
    assert!(run.elapse.expect("an elapse") > first_elapse, "{second:?}");
    assert!(!second.runs[0].is_active(), "the first run was let go");

    // Its machine is lost while it runs: recorded lost, never placed elsewhere for its elapse.
    let second_machine = run.machine.clone().expect("placed");
    let running = RunReport { started: run.elapse.unwrap() + 50_000, ended: None, outcome: None, log: None, run: None };
    registry.report_states(&second_machine, &[report(&second_machine, "active", running)]).await.unwrap();
    eventually_within("the run is seen started", WAIT, async || {
        record(&registry).await.unwrap().runs.iter().any(|seen| seen.id == 2 && seen.started.is_some())
    })
    .await;
    registry.unregister_machine(&second_machine).await.unwrap();
    eventually_within("the run is recorded lost", WAIT, async || {
        record(&registry).await.unwrap().runs.iter().any(|seen| seen.id == 2 && seen.outcome.is_some())
    })
    .await;
    let lost = record(&registry).await.unwrap();
    let second_run = lost.runs.iter().find(|seen| seen.id == 2).unwrap();
    assert!(matches!(&second_run.outcome, Some(Outcome::Lost { why }) if why.contains(&second_machine)), "{lost:?}");
    assert_eq!(second_run.machine.as_deref(), Some(second_machine.as_str()), "never given another machine");

    // The next elapse runs on the machine left.
    let survivor = if second_machine == "m1" { "m2" } else { "m1" };
    eventually_within("the third run is placed on the machine left", WAIT, async || {
        placed_on(&registry).await.as_deref() == Some(survivor)
    })
    .await;
    let third = record(&registry).await.unwrap();
    let elapses: Vec<i64> = third.runs.iter().filter_map(|seen| seen.elapse).collect();
    let mut distinct = elapses.clone();
    distinct.dedup();
    assert_eq!(elapses, distinct, "no elapse ran twice");
    assert!(elapses.windows(2).all(|pair| pair[0] < pair[1]), "{elapses:?}");

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A scheduled unit stopped while its run is placed has that run stopped and taken off; once
/// its machine let it go and the unit is destroyed, its record goes too.
#[tokio::test(flavor = "multi_thread")]
async fn stopping_a_scheduled_unit_stops_its_run_and_destroying_it_removes_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let (stop, engine) = start_engine(&registry);
    registry.put_unit(UNIT, &scheduled(), DesiredState::Launched).await.unwrap();
    eventually_within("a run is placed", WAIT, async || placed_on(&registry).await.is_some()).await;
    let running = RunReport { started: 1, ended: None, outcome: None, log: None, run: None };
    registry.report_states("m1", &[report("m1", "active", running)]).await.unwrap();
    registry.set_desired_state(UNIT, DesiredState::Inactive).await.unwrap();
    eventually_within("the run is stopped and taken off", WAIT, async || {
        placed_on(&registry).await.is_none()
            && record(&registry).await.is_some_and(|record| record.runs[0].outcome == Some(Outcome::Stopped))
    })
    .await;
    registry.report_states("m1", &[StateReport::Remove(UNIT.into())]).await.unwrap();
    registry.destroy_unit(UNIT).await.unwrap();
    eventually_within("the record goes with the unit", WAIT, async || record(&registry).await.is_none()).await;

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A batch unit (`Batch=true`) runs once when started; its failed run is retried after its
/// delay on the machine it did not fail on; once a run succeeded it is not run again while it
/// stays started.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_unit_runs_once_and_its_failed_run_is_retried_on_another_machine() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let file = UnitFile::parse(
        "[Service]\nType=oneshot\nExecStart=/bin/false\n[X-Fleet]\nBatch=true\nRetries=1\nRetryDelay=1s\n",
    )
    .unwrap();
    let (stop, engine) = start_engine(&registry);
    registry.put_unit(UNIT, &file, DesiredState::Launched).await.unwrap();
    eventually_within("the run is placed", WAIT, async || placed_on(&registry).await.is_some()).await;
    let failed_on = placed_on(&registry).await.unwrap();
    let failed = RunReport {
        started: 1,
        ended: Some(2),
        outcome: Some(Outcome::Failed { status: Some(1), signal: None }),
        log: None,
        run: None,
    };
    registry.report_states(&failed_on, &[report_of(&file, &failed_on, "failed", failed)]).await.unwrap();
    eventually_within("the failed run is taken off", WAIT, async || placed_on(&registry).await.is_none()).await;
    registry.report_states(&failed_on, &[StateReport::Remove(UNIT.into())]).await.unwrap();

    let other = if failed_on == "m1" { "m2" } else { "m1" };
    eventually_within("the retry is placed on the other machine", WAIT, async || {
        placed_on(&registry).await.as_deref() == Some(other)
    })
    .await;
    let retry = record(&registry).await.unwrap().active_run().cloned().expect("the retry");
    assert_eq!((retry.id, retry.attempt, retry.avoid.clone()), (2, 2, vec![failed_on.clone()]));
    let succeeded = RunReport { started: 3, ended: Some(4), outcome: Some(Outcome::Succeeded), log: None, run: None };
    registry.report_states(other, &[report_of(&file, other, "inactive", succeeded)]).await.unwrap();
    eventually_within("the retry's end is kept and its unit taken off", WAIT, async || {
        placed_on(&registry).await.is_none()
            && record(&registry).await.is_some_and(|record| record.runs.last().unwrap().outcome.is_some())
    })
    .await;
    registry.report_states(other, &[StateReport::Remove(UNIT.into())]).await.unwrap();
    eventually_within("the retry is let go of", WAIT, async || {
        record(&registry).await.is_some_and(|record| record.active_run().is_none())
    })
    .await;
    let done = record(&registry).await.unwrap();
    let outcomes: Vec<&str> = done.runs.iter().filter_map(|run| run.outcome.as_ref().map(Outcome::word)).collect();
    assert_eq!(outcomes, vec!["failed", "succeeded"]);
    assert_eq!(registry.unit(UNIT).await.unwrap().map(|view| view.desired), Some(DesiredState::Launched));
    assert_eq!(placed_on(&registry).await, None, "done: not run again while it stays started");

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
