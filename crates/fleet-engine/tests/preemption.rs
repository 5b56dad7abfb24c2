//! Preemption through the engine against the embedded store, with paused time: a unit of a
//! higher priority takes the room of a lower one, which keeps saying who took it over later
//! passes, and takes the room back once it is given up.

use std::sync::Arc;
use std::time::Duration;

use fleet_core::resources::Resources;
use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_engine::{Engine, EngineConfig};
use fleet_registry::{AgentRegistry, ApiRegistry, StateReport};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually;

use crate::common::{machine_of, reason, running_on};
use tokio::sync::watch;

fn unit(x_fleet: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\n{x_fleet}\n")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_preempted_unit_says_who_took_its_room_until_it_gets_room_again() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let capacity = Some(Resources { memory: 1 << 30, cpu_millis: 1000 });
    registry.register_machine(&MachineState { id: "m1".into(), capacity, ..Default::default() }).await.unwrap();
    let config = EngineConfig {
        machine_id: "m1".into(),
        reconcile_interval: Duration::from_secs(2),
        debounce: Duration::from_millis(10),
        agent_ttl: Duration::from_secs(4),
        strategy: Default::default(),
        preemption: true,
    };
    let (stop, stopped) = watch::channel(Lifecycle::Running);
    let engine = tokio::spawn(Engine::new(config, Arc::new(registry.clone())).run(stopped));

    let low = unit("Memory=1G\nPriority=10");
    registry.put_unit("batch.service", &low, DesiredState::Launched).await.unwrap();
    eventually("the low unit is placed", async || machine_of(&registry, "batch.service").await.is_some()).await;
    registry.report_states("m1", &[running_on("batch.service", "m1", &low)]).await.unwrap();
    registry.put_unit("web.service", &unit("Memory=1G\nPriority=900"), DesiredState::Launched).await.unwrap();
    eventually("the high unit takes the low one's room", async || {
        machine_of(&registry, "web.service").await.as_deref() == Some("m1")
            && machine_of(&registry, "batch.service").await.is_none()
    })
    .await;
    // Its machine stops it and lets it go (the agent's report goes): it waits for room.
    registry.report_states("m1", &[StateReport::Remove("batch.service".into())]).await.unwrap();
    let preempted = "preempted by web.service (priority 900): needs 1 GiB memory; the most free is 0 B on m1";
    eventually("the low unit says who took its room", async || {
        reason(&registry, "batch.service").await.as_deref() == Some(preempted)
    })
    .await;

    // A later pass plans everything again (a unit waits with preemption on): the reason stays.
    registry.put_unit("far.service", &unit("MachineMetadata=region=asia"), DesiredState::Launched).await.unwrap();
    eventually("the later pass ran", async || reason(&registry, "far.service").await.is_some()).await;
    assert_eq!(reason(&registry, "batch.service").await.as_deref(), Some(preempted));

    registry.destroy_unit("web.service").await.unwrap();
    eventually("the low unit gets the room back", async || {
        machine_of(&registry, "batch.service").await.as_deref() == Some("m1")
    })
    .await;
    assert_eq!(reason(&registry, "batch.service").await, None);

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
