//! The engine against the embedded store in a temporary directory, with paused time: what it
//! places, where, and what it moves when a machine goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_engine::{Engine, EngineConfig};
use fleet_registry::embedded::EmbeddedRegistry;
use fleet_registry::{AgentRegistry, ApiRegistry};
use fleet_testkit::eventually;
use tokio::sync::watch;

fn machine(id: &str, region: &str) -> MachineState {
    MachineState {
        id: id.into(),
        public_ip: "127.0.0.1".into(),
        metadata: BTreeMap::from([("region".into(), region.into())]),
        ..Default::default()
    }
}

fn unit(x_fleet: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\n{x_fleet}\n")).unwrap()
}

async fn placement(registry: &EmbeddedRegistry) -> BTreeMap<String, Option<String>> {
    registry.units().await.unwrap().into_iter().map(|view| (view.name, view.machine_id)).collect()
}

fn start(registry: &EmbeddedRegistry) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let config = EngineConfig {
        machine_id: "m1".into(),
        reconcile_interval: Duration::from_secs(2),
        debounce: Duration::from_millis(10),
    };
    let (stop, stopped) = watch::channel(false);
    (stop, tokio::spawn(Engine::new(config, Arc::new(registry.clone())).run(stopped)))
}

#[tokio::test(start_paused = true)]
async fn places_units_least_loaded_and_moves_them_off_a_machine_that_goes() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&machine("m1", "eu")).await.unwrap();
    registry.register_machine(&machine("m2", "eu")).await.unwrap();
    let (stop, engine) = start(&registry);
    registry.put_unit("a.service", &unit("Conflicts=b.service"), DesiredState::Launched).await.unwrap();
    registry.put_unit("b.service", &unit(""), DesiredState::Launched).await.unwrap();
    registry.put_unit("asia.service", &unit("MachineMetadata=region=asia"), DesiredState::Launched).await.unwrap();
    eventually("both units are placed, apart", async || {
        let placed = placement(&registry).await;
        matches!((&placed["a.service"], &placed["b.service"]), (Some(a), Some(b)) if a != b)
    })
    .await;
    let reason = registry.unit("asia.service").await.unwrap().unwrap().reason;
    assert_eq!(reason.as_deref(), Some("no machine has metadata region=asia"), "an unplaceable unit says why");

    let lost = placement(&registry).await["a.service"].clone().unwrap();
    registry.unregister_machine(&lost).await.unwrap();
    eventually("the lost machine's unit moves, and its conflict waits", async || {
        let placed = placement(&registry).await;
        placed["b.service"].as_deref() != Some(lost.as_str()) && placed["a.service"].as_deref() != Some(lost.as_str())
    })
    .await;
    let placed = placement(&registry).await;
    let survivor = if lost == "m1" { "m2" } else { "m1" };
    let on_survivor: Vec<&String> =
        placed.iter().filter(|(_, m)| m.as_deref() == Some(survivor)).map(|(u, _)| u).collect();
    assert_eq!(on_survivor.len(), 1, "the two conflicting units never share the machine: {placed:?}");
    let waiting = if on_survivor[0] == "a.service" { "b.service" } else { "a.service" };
    let reason = registry.unit(waiting).await.unwrap().unwrap().reason.unwrap();
    assert!(reason.starts_with("conflicts with"), "{reason}");

    stop.send(true).unwrap();
    engine.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_inactive_unit_is_unscheduled() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&machine("m1", "eu")).await.unwrap();
    let (stop, engine) = start(&registry);
    registry.put_unit("a.service", &unit(""), DesiredState::Launched).await.unwrap();
    eventually("a.service is placed", async || placement(&registry).await["a.service"].is_some()).await;
    registry.set_desired_state("a.service", DesiredState::Inactive).await.unwrap();
    eventually("a.service is unscheduled", async || placement(&registry).await["a.service"].is_none()).await;
    stop.send(true).unwrap();
    engine.await.unwrap();
}
