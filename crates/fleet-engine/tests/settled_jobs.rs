//! The engine's passes while a unit on a calendar waits for its next elapse: they plan nothing
//! (a unit on a calendar used to make every pass plan every unit), and a run started by hand
//! is still claimed and placed at once. A binary of its own, with one test: it counts the
//! engine's plans in the process's metrics, which another engine test would add to.

mod common;

use common::{machine, start_engine_every};

use std::time::Duration;

use fleet_core::DesiredState;
use fleet_core::UnitFile;
use fleet_core::job::runs;
use fleet_registry::{AgentRegistry, ApiRegistry};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually_within;

const UNIT: &str = "report.service";
const WAIT: Duration = Duration::from_secs(60);

fn plans() -> u64 {
    let plans = &fleet_metrics::metrics().engine.plans;
    ["full", "changed", "skipped"]
        .into_iter()
        .map(|scope| plans.get_or_create(&fleet_metrics::PlanLabels { scope }).get())
        .sum()
}

fn passes() -> u64 {
    fleet_metrics::metrics().engine.reconciles.get()
}

#[tokio::test(flavor = "multi_thread")]
async fn passes_plan_nothing_while_a_calendar_unit_waits_and_a_run_by_hand_is_placed() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    // Due once a year: no elapse falls in the test.
    let yearly = "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=*-01-01 00:00:00\n";
    registry.put_unit(UNIT, &UnitFile::parse(yearly).unwrap(), DesiredState::Launched).await.unwrap();
    let service = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    registry.put_unit("web.service", &service, DesiredState::Launched).await.unwrap();

    let (stop, engine) = start_engine_every(&registry, Duration::from_millis(100));

    eventually_within("the service is placed and the unit's record written", WAIT, async || {
        registry.unit("web.service").await.unwrap().and_then(|view| view.machine_id).is_some()
            && registry.job_record(UNIT).await.unwrap().is_some()
    })
    .await;
    // Settled: ten passes in a row that plan nothing (a pass after a write plans once more).
    eventually_within("ten passes in a row plan nothing", WAIT, async || {
        let (passes_before, plans_before) = (passes(), plans());
        eventually_within("ten more passes", WAIT, async || passes() >= passes_before + 10).await;
        plans() == plans_before
    })
    .await;

    // A run started by hand (as `fleetctl run` writes it): the next pass sees the record move,
    // claims nothing more, and places the run.
    let stored = registry.job_record(UNIT).await.unwrap().expect("its record");
    let dispatched = runs::dispatch(&stored.record, fleet_runtime::wall_clock::now_micros(), 10).unwrap();
    assert!(registry.put_dispatched_run(UNIT, &dispatched.record, stored.version).await.unwrap());
    eventually_within("the run started by hand is placed", WAIT, async || {
        registry.unit(UNIT).await.unwrap().and_then(|view| view.machine_id).is_some()
    })
    .await;
    let record = registry.job_record(UNIT).await.unwrap().expect("its record").record;
    assert_eq!(record.runs.len(), 1, "{record:?}");
    assert!(record.runs[0].machine.is_some(), "its machine recorded: {record:?}");

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
