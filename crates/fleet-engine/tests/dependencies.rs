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

use crate::common::{machine, machine_of, reason, running_on, start_engine};

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

/// Where what a unit requires runs is recorded for the machine the unit is placed on: its
/// machine's work carries it, the API reads it, it follows the db to its new machine, and
/// it keeps the last place while the db is gone rather than going empty.
#[tokio::test(start_paused = true)]
async fn where_what_a_unit_requires_runs_reaches_its_machine_and_follows_a_move() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for (id, ip) in [("m1", "10.0.0.1"), ("m2", "10.0.0.2")] {
        registry.register_machine(&fleet_core::MachineState { public_ip: ip.into(), ..machine(id) }).await.unwrap();
    }
    let (stop, engine) = start_engine(&registry);
    let app = unit("Requires=db.service\nMachineID=m2");
    let db_on = |machine: &str| unit(&format!("MachineID={machine}"));
    registry.put_unit("app.service", &app, DesiredState::Launched).await.unwrap();
    registry.put_unit("db.service", &db_on("m1"), DesiredState::Launched).await.unwrap();
    eventually("the db is placed on m1", async || machine_of(&registry, "db.service").await.as_deref() == Some("m1"))
        .await;
    registry.report_states("m1", &[running_on("db.service", "m1", &db_on("m1"))]).await.unwrap();
    let places_in_work = async |registry: &EmbeddedRegistry| {
        let work = registry.machine_work("m2").await.unwrap();
        let app = work.scheduled.iter().find(|unit| unit.name == "app.service").cloned();
        app.map(|app| app.required_at.iter().map(|place| format!("{} {}", place.machine_id, place.public_ip)).collect())
    };
    eventually("the app is placed on m2 with the db's place in its work", async || {
        places_in_work(&registry).await == Some(vec!["m1 10.0.0.1".to_string()])
    })
    .await;
    let shown = registry.required_places_of("app.service", "m2").await.unwrap();
    assert_eq!(shown.iter().map(|place| place.unit.as_str()).collect::<Vec<_>>(), ["db.service"]);

    // The db goes: the app keeps the last place it was told; the db comes back on m2.
    registry.destroy_unit("db.service").await.unwrap();
    registry.report_states("m1", &[StateReport::Remove("db.service".into())]).await.unwrap();
    eventually("the db is gone", async || registry.unit("db.service").await.unwrap().is_none()).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(places_in_work(&registry).await, Some(vec!["m1 10.0.0.1".to_string()]), "never empty");
    registry.put_unit("db.service", &db_on("m2"), DesiredState::Launched).await.unwrap();
    eventually("the db is placed on m2", async || machine_of(&registry, "db.service").await.as_deref() == Some("m2"))
        .await;
    registry.report_states("m2", &[running_on("db.service", "m2", &db_on("m2"))]).await.unwrap();
    eventually("the app's work names the db's new place", async || {
        places_in_work(&registry).await == Some(vec!["m2 10.0.0.2".to_string()])
    })
    .await;

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
