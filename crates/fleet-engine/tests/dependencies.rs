//! Units that wait for units through the engine against the embedded store, with paused time:
//! a unit that requires another is placed only once that one runs, says what it waits for
//! meanwhile, and with `RequiresGrace=` is taken off once what it requires has been down that
//! long, to be placed again when it is back.

use std::time::Duration;

use fleet_core::{DesiredState, SystemdState, UnitFile, UnitState};
use fleet_registry::{AgentRegistry, ApiRegistry, StateReport};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually;

mod common;
use common::{machine, machine_of, reason, running_on, start_engine};

fn unit(x_fleet: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\n{x_fleet}\n")).unwrap()
}

fn failed_on(name: &str, machine: &str, file: &UnitFile) -> StateReport {
    StateReport::Set(UnitState {
        run: None,
        name: name.into(),
        machine_id: machine.into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "failed", "failed"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    })
}

#[tokio::test(start_paused = true)]
async fn a_unit_waits_for_what_it_requires_and_leaves_once_it_is_down_past_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let (stop, engine) = start_engine(&registry);
    let app = unit("Requires=db.service\nRequiresGrace=10s");
    registry.put_unit("app.service", &app, DesiredState::Launched).await.unwrap();
    eventually("the app waits for a db not in the cluster", async || {
        reason(&registry, "app.service").await.as_deref() == Some("waiting for db.service: not in the cluster")
    })
    .await;
    let db = unit("");
    registry.put_unit("db.service", &db, DesiredState::Launched).await.unwrap();
    eventually("the db is placed and the app waits for its report", async || {
        machine_of(&registry, "db.service").await.is_some()
            && reason(&registry, "app.service").await.as_deref() == Some("waiting for db.service: not reported by m1")
    })
    .await;
    assert_eq!(machine_of(&registry, "app.service").await, None);

    // The db runs: that report alone places the app.
    registry.report_states("m1", &[running_on("db.service", "m1", &db)]).await.unwrap();
    eventually("the app is placed", async || machine_of(&registry, "app.service").await.is_some()).await;
    assert_eq!(reason(&registry, "app.service").await, None);
    registry.report_states("m1", &[running_on("app.service", "m1", &app)]).await.unwrap();

    // The db fails: the app stays for its grace, then leaves and waits again.
    registry.report_states("m1", &[failed_on("db.service", "m1", &db)]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(machine_of(&registry, "app.service").await.as_deref(), Some("m1"), "within its grace");
    eventually("the app leaves once its grace passed", async || {
        machine_of(&registry, "app.service").await.is_none()
            && reason(&registry, "app.service").await.as_deref()
                == Some("waiting for db.service: failed on m1 (RequiresGrace=10s passed)")
    })
    .await;
    // Its machine stops it; the db runs again.
    registry.report_states("m1", &[StateReport::Remove("app.service".into())]).await.unwrap();
    registry.report_states("m1", &[running_on("db.service", "m1", &db)]).await.unwrap();
    eventually("the app is placed again", async || machine_of(&registry, "app.service").await.is_some()).await;

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
