//! The engine moving a service that fails (`[X-Fleet] Retries=` on a service) against the
//! embedded store, with the machines' agents played by the test through the store's agent
//! facet: a service its machine reports failed is taken off that machine with a reason that
//! says when it is tried again, placed on the other machine once that wait passed and its
//! machine let it go, and after its retries are spent kept off every machine, saying so, until
//! it is stopped and started again.

use crate::common::{machine, start_engine};

use std::time::Duration;

use fleet_core::{DesiredState, SystemdState, UnitFile, UnitState};
use fleet_registry::{AgentRegistry, ApiRegistry, StateReport};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually_within;

const UNIT: &str = "web.service";
const WAIT: Duration = Duration::from_secs(60);

fn service() -> UnitFile {
    UnitFile::parse("[Service]\nExecStart=/bin/web\n[X-Fleet]\nRetries=1\nRetryDelay=1s\n").unwrap()
}

async fn placed_on(registry: &EmbeddedRegistry) -> Option<String> {
    registry.unit(UNIT).await.unwrap().and_then(|view| view.machine_id)
}

async fn reason(registry: &EmbeddedRegistry) -> Option<String> {
    registry.unit(UNIT).await.unwrap().and_then(|view| view.reason)
}

/// What the agent of `machine` reports of the service.
fn report(machine: &str, active: &str) -> StateReport {
    StateReport::Set(UnitState {
        name: UNIT.into(),
        machine_id: machine.into(),
        hash: service().hash(),
        systemd: SystemdState::new("loaded", active, if active == "active" { "running" } else { "failed" }),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
        run: None,
    })
}

/// The service fails on the machine it is placed on, which then lets it go once the engine
/// took it off; returns that machine.
async fn fails_where_placed(registry: &EmbeddedRegistry, expected_reason: &str) -> String {
    let machine = placed_on(registry).await.expect("placed");
    registry.report_states(&machine, &[report(&machine, "active")]).await.unwrap();
    registry.report_states(&machine, &[report(&machine, "failed")]).await.unwrap();
    eventually_within("the failed service is taken off its machine, saying why", WAIT, async || {
        placed_on(registry).await.is_none()
            && reason(registry).await.is_some_and(|why| why.starts_with(expected_reason))
    })
    .await;
    registry.report_states(&machine, &[StateReport::Remove(UNIT.into())]).await.unwrap();
    machine
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_service_moves_once_then_stays_off_saying_its_retries_are_spent() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let (stop, engine) = start_engine(&registry);
    registry.put_unit(UNIT, &service(), DesiredState::Launched).await.unwrap();
    eventually_within("the service is placed", WAIT, async || placed_on(&registry).await.is_some()).await;
    eventually_within("its stay is recorded", WAIT, async || {
        registry.job_record(UNIT).await.unwrap().is_some_and(|stored| stored.record.active_run().is_some())
    })
    .await;
    let first = fails_where_placed(&registry, "failed on 1 machine; next try in 1s, at ").await;
    let other = if first == "m1" { "m2" } else { "m1" };
    eventually_within("tried again on the other machine", WAIT, async || {
        placed_on(&registry).await.as_deref() == Some(other)
    })
    .await;
    assert_eq!(reason(&registry).await, None, "placed: no reason");
    eventually_within("its second stay is recorded", WAIT, async || {
        registry.job_record(UNIT).await.unwrap().is_some_and(|stored| {
            stored.record.active_run().is_some_and(|stay| stay.attempt == 2 && stay.machine.as_deref() == Some(other))
        })
    })
    .await;
    fails_where_placed(&registry, "failed on 2 machines; Retries=1 spent: stop and start it to try again").await;
    let record = registry.job_record(UNIT).await.unwrap().expect("its record").record;
    let outcomes: Vec<&str> = record.runs.iter().filter_map(|stay| stay.outcome.as_ref().map(|o| o.word())).collect();
    assert_eq!(outcomes, vec!["failed", "failed"]);
    assert_eq!(placed_on(&registry).await, None, "not moved again");

    registry.set_desired_state(UNIT, DesiredState::Inactive).await.unwrap();
    eventually_within("the stop is seen", WAIT, async || {
        registry.job_record(UNIT).await.unwrap().is_some_and(|stored| stored.record.stopped_since_run)
    })
    .await;
    registry.set_desired_state(UNIT, DesiredState::Launched).await.unwrap();
    eventually_within("a start begins afresh", WAIT, async || placed_on(&registry).await.is_some()).await;
    eventually_within("with a first stay", WAIT, async || {
        registry.job_record(UNIT).await.unwrap().is_some_and(|stored| {
            stored.record.active_run().is_some_and(|stay| stay.attempt == 1 && stay.avoid.is_empty())
        })
    })
    .await;

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
