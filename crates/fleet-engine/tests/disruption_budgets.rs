//! Disruption budgets through the engine against the embedded store, with paused time: a
//! taint that evicts moves a template's instances off their machine one at a time under
//! `DisruptionBudget=1`, the one held saying which budget holds it, and the next goes once the
//! first runs elsewhere (a report, and nothing else, wakes the engine).

use fleet_core::taint::{override_entry, parse_taint};
use fleet_core::{DesiredState, UnitFile};
use fleet_registry::{AgentRegistry, ApiRegistry, MetadataChange};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually;

use crate::common::{machine, machine_of, reason, running_on, start_engine};

#[tokio::test(start_paused = true)]
async fn an_evicting_taint_moves_a_budgeted_group_one_unit_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let (stop, engine) = start_engine(&registry);
    let file = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nDisruptionBudget=1\n").unwrap();
    let names = ["web@1.service", "web@2.service"];
    for name in names {
        registry.put_unit(name, &file, DesiredState::Launched).await.unwrap();
    }
    eventually("both are placed on m1", async || {
        machine_of(&registry, names[0]).await.is_some() && machine_of(&registry, names[1]).await.is_some()
    })
    .await;
    let running: Vec<_> = names.iter().map(|name| running_on(name, "m1", &file)).collect();
    registry.report_states("m1", &running).await.unwrap();
    registry.register_machine(&machine("m2")).await.unwrap();

    let (key, value) = override_entry("maintenance", Some(&parse_taint("maintenance:evict").unwrap().1));
    registry.change_metadata(&[MetadataChange::Set { machine_id: "m1".into(), key, value }]).await.unwrap();
    eventually("one is taken off m1, the other stays held", async || {
        let placed = [machine_of(&registry, names[0]).await, machine_of(&registry, names[1]).await];
        placed.iter().filter(|machine| machine.as_deref() == Some("m1")).count() == 1
    })
    .await;
    let (moved, held) = match machine_of(&registry, names[0]).await.as_deref() {
        Some("m1") => (names[1], names[0]),
        _ => (names[0], names[1]),
    };
    eventually("the one held says why", async || reason(&registry, held).await.is_some()).await;
    assert_eq!(
        reason(&registry, held).await.as_deref(),
        Some(
            "stays on machine m1 despite its taint maintenance:evict: held by the disruption budget of web@.service: 1 down of the 1 it allows (DisruptionBudget=1)"
        )
    );

    // m1 stops the one taken off (stop before start), and it is placed on m2.
    registry.report_states("m1", &[fleet_registry::StateReport::Remove(moved.into())]).await.unwrap();
    eventually("the one taken off is placed on m2", async || {
        machine_of(&registry, moved).await.as_deref() == Some("m2")
    })
    .await;
    assert_eq!(machine_of(&registry, held).await.as_deref(), Some("m1"), "still held: the moved one is not up");
    // It runs on m2: that report alone lets the other go.
    registry.report_states("m2", &[running_on(moved, "m2", &file)]).await.unwrap();
    eventually("the other is taken off m1 too", async || machine_of(&registry, held).await.is_none()).await;
    registry.report_states("m1", &[fleet_registry::StateReport::Remove(held.into())]).await.unwrap();
    eventually("and placed on m2", async || machine_of(&registry, held).await.as_deref() == Some("m2")).await;
    assert_eq!(reason(&registry, held).await, None);

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}
