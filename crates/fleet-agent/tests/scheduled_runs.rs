//! The agent and scheduled units (`[X-Fleet] Schedule=`), against the embedded store and the
//! fake unit manager, with paused time: a scheduled unit given to this machine is started once
//! per load and its run reported with how it ended and the last lines of its log; one an earlier fleetd loaded is never
//! started, and its run is reported lost. A global unit on a calendar stays loaded, not
//! started, until its work carries a ticket; each ticket is started once and its run reported
//! with the ticket's number; a fleetd that starts again never runs the ticket it finds.

use std::sync::Arc;
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::job::global_runs::RunTicket;
use fleet_core::job::runs::{Outcome, RunReport};
use fleet_core::schedule::Decision;
use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_registry::{ApiRegistry, EngineLease, EngineRegistry};
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::{FakeUnitManager, eventually};
use tokio::sync::watch;

const MACHINE: &str = "m1";
const UNIT: &str = "tick.service";

fn scheduled() -> UnitFile {
    UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=hourly\n").unwrap()
}

fn plain() -> UnitFile {
    UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap()
}

fn config() -> AgentConfig {
    AgentConfig {
        machine: MachineState { id: MACHINE.into(), public_ip: "127.0.0.1".into(), ..Default::default() },
        reconcile_interval: Duration::from_secs(5),
        debounce: Duration::from_millis(10),
        presence_ttl: None,
        stop_units_when_cut_off: false,
    }
}

/// Writes what the engine would for a run: the unit, placed on this machine.
async fn place(registry: &EmbeddedRegistry) {
    registry.put_unit(UNIT, &scheduled(), DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let decision = Decision::Schedule { unit: UNIT.into(), machine: MACHINE.into() };
    registry.apply(&lease, &[decision], &[]).await.unwrap();
}

async fn reported_run(registry: &EmbeddedRegistry) -> Option<RunReport> {
    reported_run_of(registry, UNIT).await
}

async fn reported_run_of(registry: &EmbeddedRegistry, unit: &str) -> Option<RunReport> {
    let states = registry.unit_states().await.unwrap();
    states.into_iter().find(|state| state.name == unit).and_then(|state| state.run.map(|run| *run))
}

fn start(registry: &EmbeddedRegistry, manager: &Arc<FakeUnitManager>) -> watch::Sender<Lifecycle> {
    let (lifecycle, watch) = watch::channel(Lifecycle::Running);
    let agent = Agent::new(config(), Arc::new(registry.clone()), manager.clone());
    tokio::spawn(agent.run(watch));
    lifecycle
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_unit_is_started_once_per_load_and_its_run_reported() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let _agent = start(&registry, &manager);
    // A pass has done its work (a plain unit runs): what comes now was given to this machine
    // while this fleetd ran.
    registry.put_unit("plain.service", &plain(), DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let decision = Decision::Schedule { unit: "plain.service".into(), machine: MACHINE.into() };
    registry.apply(&lease, &[decision], &[]).await.unwrap();
    eventually("the plain unit runs", async || manager.starts() == 1).await;
    place(&registry).await;
    eventually("the run is reported started", async || reported_run(&registry).await.is_some()).await;
    assert_eq!(manager.starts(), 2);
    let failed = Outcome::Failed { status: Some(3), signal: None };
    manager.write_log(UNIT, "copying /srv\nno space left on device\n");
    manager.end_run(UNIT, failed.clone()).unwrap();
    eventually("its end is reported", async || {
        reported_run(&registry).await.is_some_and(|run| run.outcome == Some(failed.clone()) && run.ended.is_some())
    })
    .await;
    let ended = reported_run(&registry).await.unwrap();
    assert_eq!(ended.log.as_deref(), Some("copying /srv\nno space left on device"), "with the last lines of its log");
    // Passes go by (the fallback reconcile, a state change): the ended run is not started again.
    tokio::time::sleep(Duration::from_secs(30)).await;
    manager.end_run(UNIT, failed.clone()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 2, "a scheduled unit runs once per load");
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_unit_an_earlier_fleetd_loaded_is_not_started_and_its_run_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    place(&registry).await;
    let manager = Arc::new(FakeUnitManager::running(UNIT, &scheduled()));
    let _agent = start(&registry, &manager);
    eventually("the taken-over run is reported lost", async || {
        reported_run(&registry).await.is_some_and(|run| matches!(run.outcome, Some(Outcome::Lost { .. })))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 0, "never started again: whether its run ran is not known");
}

/// Under the native supervisor a unit dies with the fleetd that ran it: a fleetd that finds a
/// scheduled unit given to its machine when it starts cannot tell a fresh run from one begun,
/// and does not start it.
#[tokio::test(start_paused = true)]
async fn a_scheduled_unit_found_given_to_the_machine_at_start_is_not_started_and_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    place(&registry).await;
    let manager = Arc::new(FakeUnitManager::new());
    let _agent = start(&registry, &manager);
    eventually("the run found at start is reported lost", async || {
        reported_run(&registry).await.is_some_and(|run| matches!(run.outcome, Some(Outcome::Lost { .. })))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 0);
    assert!(manager.state(UNIT).is_some(), "loaded, not started");
}

/// A global unit on a calendar (`Global=true` with `Schedule=`).
const SWEEP: &str = "sweep.service";

fn sweep() -> UnitFile {
    UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nSchedule=hourly\n").unwrap()
}

async fn ticket(registry: &EmbeddedRegistry, lease: &EngineLease, id: u64) {
    let ticket = RunTicket { id, elapse: fleet_runtime::wall_clock::now_micros() };
    registry.put_run_ticket(lease, SWEEP, Some(&ticket)).await.unwrap();
}

/// A plain unit runs first: the agent's first pass is done, what comes later came while it ran.
async fn caught_up(registry: &EmbeddedRegistry, manager: &FakeUnitManager, lease: &EngineLease) {
    let plain = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    registry.put_unit("plain.service", &plain, DesiredState::Launched).await.unwrap();
    let decision = Decision::Schedule { unit: "plain.service".into(), machine: MACHINE.into() };
    registry.apply(lease, &[decision], &[]).await.unwrap();
    eventually("the plain unit runs", async || manager.state("plain.service").is_some_and(|s| s.active == "active"))
        .await;
}

#[tokio::test(start_paused = true)]
async fn each_ticket_runs_once_and_a_restarted_fleetd_runs_only_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let agent = start(&registry, &manager);
    caught_up(&registry, &manager, &lease).await;
    registry.put_unit(SWEEP, &sweep(), DesiredState::Launched).await.unwrap();
    eventually("loaded, waiting for a ticket", async || manager.state(SWEEP).is_some()).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 1, "only the plain unit started: no ticket yet");

    ticket(&registry, &lease, 1).await;
    eventually("ticket 1 runs", async || reported_run_of(&registry, SWEEP).await.is_some_and(|run| run.run == Some(1)))
        .await;
    assert_eq!(manager.starts(), 2);
    manager.end_run(SWEEP, Outcome::Succeeded).unwrap();
    eventually("its end is reported", async || {
        reported_run_of(&registry, SWEEP).await.is_some_and(|run| run.outcome == Some(Outcome::Succeeded))
    })
    .await;
    // The next ticket at once (no pass between the end and it): the unit is started again.
    ticket(&registry, &lease, 2).await;
    eventually("ticket 2 runs", async || reported_run_of(&registry, SWEEP).await.is_some_and(|run| run.run == Some(2)))
        .await;
    assert_eq!(manager.starts(), 3);
    ticket(&registry, &lease, 2).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 3, "a ticket written again is not run again");
    manager.end_run(SWEEP, Outcome::Failed { status: Some(1), signal: None }).unwrap();
    eventually("its failure is reported", async || {
        reported_run_of(&registry, SWEEP).await.is_some_and(|run| matches!(run.outcome, Some(Outcome::Failed { .. })))
    })
    .await;

    // fleetd starts again: ticket 2 (found at start) is not run, ticket 3 is.
    agent.send(Lifecycle::ShuttingDown).unwrap();
    eventually("the agent is gone", async || agent.is_closed()).await;
    let _again = start(&registry, &manager);
    eventually("the new agent reported", async || {
        registry.unit_states().await.unwrap().iter().any(|state| state.name == "plain.service")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // (Under the native supervisor a unit dies with its fleetd: the new one loads both again
    // and starts the plain unit.)
    assert_eq!(reported_run_of(&registry, SWEEP).await, None, "ticket 2, found at start, is not run again");
    assert_eq!(manager.state(SWEEP).map(|state| state.active), Some("inactive".to_string()), "loaded, not started");
    let before = manager.starts();
    ticket(&registry, &lease, 3).await;
    eventually("ticket 3 runs", async || reported_run_of(&registry, SWEEP).await.is_some_and(|run| run.run == Some(3)))
        .await;
    assert_eq!(manager.starts(), before + 1, "ticket 2 was never run again, ticket 3 once");
}
