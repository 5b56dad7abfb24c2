//! The engine running a global unit on a calendar (`Global=true`, `Schedule=`) against the
//! embedded store, on the real clock, the machines' agents played by the test: at each elapse
//! the leader claims one run and publishes it as the ticket every machine's work carries; each
//! machine's end is counted once into the run's tally; a stop takes the ticket away.

use crate::common::{machine, start_engine};

use std::time::Duration;

use fleet_core::job::global_runs::MachineEnd;
use fleet_core::job::runs::{JobRecord, Outcome, RunReport};
use fleet_core::{DesiredState, SystemdState, UnitFile, UnitState};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, StateReport};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually_within;

const UNIT: &str = "sweep.service";
const WAIT: Duration = Duration::from_secs(60);

fn sweep() -> UnitFile {
    UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nSchedule=*:*:0/2\n").unwrap()
}

async fn record(registry: &EmbeddedRegistry) -> Option<JobRecord> {
    registry.job_records().await.unwrap().into_iter().find(|stored| stored.unit == UNIT).map(|stored| stored.record)
}

fn ended(machine: &str, run: u64, outcome: Outcome) -> StateReport {
    StateReport::Set(UnitState {
        name: UNIT.into(),
        machine_id: machine.into(),
        hash: sweep().hash(),
        systemd: SystemdState::new("loaded", "inactive", "dead"),
        launched: false,
        drift: None,
        health: None,
        secrets: Default::default(),
        run: Some(Box::new(RunReport {
            started: 1,
            ended: Some(2),
            outcome: Some(outcome),
            log: None,
            run: Some(run),
        })),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn each_elapse_is_a_ticket_every_machine_carries_and_each_end_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2", "m3"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let (stop, engine) = start_engine(&registry);
    registry.put_unit(UNIT, &sweep(), DesiredState::Launched).await.unwrap();
    eventually_within("a run is claimed and every machine's work carries it", WAIT, async || {
        let tickets = registry.run_tickets().await.unwrap();
        let mut carried = true;
        for id in ["m1", "m2", "m3"] {
            let work = registry.machine_work(id).await.unwrap();
            carried &= work.globals.iter().any(|unit| unit.name == UNIT && unit.run == tickets.get(UNIT).copied());
        }
        tickets.contains_key(UNIT) && carried
    })
    .await;
    let ticket = registry.run_tickets().await.unwrap()[UNIT];
    assert_eq!(registry.unit(UNIT).await.unwrap().and_then(|view| view.machine_id), None, "placed on no one machine");
    let failed = Outcome::Failed { status: Some(4), signal: None };
    registry.report_states("m1", &[ended("m1", ticket.id, Outcome::Succeeded)]).await.unwrap();
    registry.report_states("m2", &[ended("m2", ticket.id, failed.clone())]).await.unwrap();
    // m2 reports again (a report is written whole each time it changes): counted once.
    registry.report_states("m2", &[ended("m2", ticket.id, failed.clone())]).await.unwrap();
    eventually_within("the ends are counted", WAIT, async || {
        record(&registry).await.is_some_and(|record| {
            let run = record.runs.iter().find(|run| run.id == ticket.id);
            run.and_then(|run| run.tally.as_deref()).is_some_and(|tally| tally.ended() == 2)
        })
    })
    .await;
    let record = record(&registry).await.unwrap();
    let tally = record.runs.iter().find(|run| run.id == ticket.id).and_then(|run| run.tally.clone()).unwrap();
    assert_eq!((tally.succeeded, tally.failed), (1, 1));
    assert_eq!(tally.failures, vec![MachineEnd { machine: "m2".into(), outcome: failed }]);
    eventually_within("the next elapse is the next ticket", WAIT, async || {
        registry.run_tickets().await.unwrap().get(UNIT).is_some_and(|next| next.id > ticket.id)
    })
    .await;

    registry.set_desired_state(UNIT, DesiredState::Inactive).await.unwrap();
    eventually_within("a stopped unit has no ticket", WAIT, async || registry.run_tickets().await.unwrap().is_empty())
        .await;
    let record = registry.job_records().await.unwrap();
    let elapses: Vec<i64> =
        record.iter().flat_map(|stored| stored.record.runs.iter().filter_map(|run| run.elapse)).collect();
    assert!(elapses.windows(2).all(|pair| pair[0] < pair[1]), "each elapse claimed once: {elapses:?}");

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A global batch unit: each start is one ticket every machine's work carries; a stop takes it
/// away and a start again is the next ticket.
#[tokio::test(flavor = "multi_thread")]
async fn each_start_of_a_global_batch_unit_is_one_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let (stop, engine) = start_engine(&registry);
    let patch =
        UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nBatch=true\n").unwrap();
    registry.put_unit("patch.service", &patch, DesiredState::Launched).await.unwrap();
    let ticket = async || registry.run_tickets().await.unwrap().get("patch.service").map(|ticket| ticket.id);
    eventually_within("the start is a ticket", WAIT, async || ticket().await == Some(1)).await;
    let work = registry.machine_work("m2").await.unwrap();
    assert_eq!(
        work.globals.iter().find(|unit| unit.name == "patch.service").and_then(|unit| unit.run).map(|t| t.id),
        Some(1)
    );
    registry.set_desired_state("patch.service", DesiredState::Inactive).await.unwrap();
    eventually_within("a stop takes it away", WAIT, async || ticket().await.is_none()).await;
    registry.set_desired_state("patch.service", DesiredState::Launched).await.unwrap();
    eventually_within("a start again is the next ticket", WAIT, async || ticket().await == Some(2)).await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
