//! The agents' lease against a real etcd: managers are registries on one etcd, pull agents
//! are the machines they announce for.

use std::time::Duration;

use etcd_client::GetOptions;
use fleet_core::{SystemdState, UnitHash, UnitState};
use fleet_registry::{AgentRegistry, ApiRegistry, StateReport};
use fleet_testkit::{EtcdServer, eventually, eventually_within};

use crate::EtcdRegistry;
use crate::tests::{keys_under, machine, registry};

pub(crate) fn running(machine_id: &str, name: &str) -> StateReport {
    StateReport::Set(UnitState {
        run: None,
        name: name.into(),
        machine_id: machine_id.into(),
        hash: UnitHash([7; 20]),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    })
}

/// Every key under `prefix` with the lease it hangs on.
async fn leases_under(registry: &EtcdRegistry, prefix: &str) -> Vec<(String, i64)> {
    let reply =
        registry.connection().get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    reply.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease())).collect()
}

/// Two managers on one new etcd, with `agent_ttl` of `ttl`.
async fn two_managers(ttl: Duration) -> (EtcdServer, EtcdRegistry, EtcdRegistry) {
    let etcd = EtcdServer::start();
    let (first, second) = (registry(&etcd, ttl).await, registry(&etcd, ttl).await);
    (etcd, first, second)
}

async fn lease_count(registry: &EtcdRegistry) -> usize {
    registry.connection().client().leases().await.unwrap().leases().len()
}

#[tokio::test]
async fn a_managers_pull_agents_hang_on_one_lease_and_one_given_up_goes_alone() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(30)).await;
    for index in 0..20 {
        manager.announce_for_agent(&machine(&format!("agent{index:02}"))).await.unwrap();
    }
    manager.report_states("agent03", &[running("agent03", "a.service")]).await.unwrap();
    manager
        .report_states("agent04", &[running("agent04", "a.service"), running("agent04", "b.service")])
        .await
        .unwrap();
    assert_eq!(lease_count(&manager).await, 1, "one lease for twenty agents");
    let lease = manager.inner.agent_lease.current();
    let held =
        [leases_under(&manager, "/fleet-test/machines/").await, leases_under(&manager, "/fleet-test/states/").await];
    assert_eq!(held[0].len(), 20);
    assert_eq!(held[1].len(), 3);
    assert!(held.iter().flatten().all(|(_, held)| *held == lease), "{held:?} not all under {lease}");
    let renewed = manager.presence_renewed("agent03");
    assert!(matches!(renewed, fleet_registry::Renewal::SentAt(_)), "{renewed:?}");

    // Silent for agent_ttl: its presence and states go, no one else's.
    manager.unregister_machine("agent03").await.unwrap();
    let machines = keys_under(&manager, "/fleet-test/machines/").await;
    assert_eq!(machines.len(), 19);
    assert!(!machines.iter().any(|key| key.ends_with("/agent03")));
    let states = keys_under(&manager, "/fleet-test/states/").await;
    assert_eq!(states, vec!["/fleet-test/states/agent04/a.service", "/fleet-test/states/agent04/b.service"]);
    assert!(matches!(manager.presence_renewed("agent03"), fleet_registry::Renewal::NotHeld));
    assert_eq!(lease_count(&manager).await, 1);
}

/// A manager dies: an agent that reconnected to another manager meanwhile was taken over
/// there and outlives the dead manager's lease, with its states; one that did not goes with
/// the lease. The dead manager's sweep, had it run, would have left the moved agent alone.
#[tokio::test]
async fn an_agent_another_manager_took_over_outlives_its_first_managers_lease() {
    let (_etcd, first, second) = two_managers(Duration::from_secs(2)).await;
    for id in ["moved", "stayed"] {
        first.announce_for_agent(&machine(id)).await.unwrap();
        first.report_states(id, &[running(id, "a.service")]).await.unwrap();
    }
    second.announce_for_agent(&machine("moved")).await.unwrap();
    let second_lease = second.inner.agent_lease.current();
    first.unregister_machine("moved").await.unwrap();
    assert_eq!(
        leases_under(&first, "/fleet-test/machines/moved").await,
        vec![("/fleet-test/machines/moved".to_string(), second_lease)],
        "the first manager gave up only what it still held"
    );

    first.inner.agent_lease.stop_keepalive();
    eventually("the dead manager's lease expires, and the agent it kept with it", || async {
        keys_under(&second, "/fleet-test/machines/").await == ["/fleet-test/machines/moved"]
    })
    .await;
    assert_eq!(keys_under(&second, "/fleet-test/states/").await, ["/fleet-test/states/moved/a.service"]);
    assert!(leases_under(&second, "/fleet-test/").await.iter().all(|(_, lease)| *lease == second_lease));
}

/// A manager cut off from etcd past `agent_ttl` loses its agents' lease: on its next
/// renewal it claims again, under a new lease, every agent it still holds, and lets go of
/// one another manager took meanwhile.
#[tokio::test]
async fn agents_whose_lease_expired_are_claimed_again_unless_another_manager_holds_them() {
    // Long enough that the keepalive leaves the renewals to the test.
    let (_etcd, first, second) = two_managers(Duration::from_secs(60)).await;
    for id in ["kept", "taken"] {
        first.announce_for_agent(&machine(id)).await.unwrap();
    }
    let expired = first.inner.agent_lease.current();
    super::super::session::revoke(first.connection(), expired).await.unwrap();
    assert!(keys_under(&first, "/fleet-test/machines/").await.is_empty());
    second.announce_for_agent(&machine("taken")).await.unwrap();

    first.renew_agent_lease(&mut None).await.unwrap();
    let lease = first.inner.agent_lease.current();
    assert!(lease != 0 && lease != expired);
    let mut held = leases_under(&first, "/fleet-test/machines/").await;
    held.sort();
    let second_lease = second.inner.agent_lease.current();
    assert_eq!(
        held,
        vec![
            ("/fleet-test/machines/kept".to_string(), lease),
            ("/fleet-test/machines/taken".to_string(), second_lease)
        ]
    );
    assert!(first.session("taken").is_none(), "let go");
    // Its work is read only from a copy that has seen it claimed again.
    eventually("the kept agent's work reads again", || async { first.machine_work("kept").await.is_ok() }).await;
}

/// The same, left to the keepalive: an agent whose lease was revoked is present again soon
/// after, under a new lease.
#[tokio::test]
async fn the_keepalive_claims_agents_again_once_their_lease_expired() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(2)).await;
    manager.announce_for_agent(&machine("agent")).await.unwrap();
    let expired = manager.inner.agent_lease.current();
    super::super::session::revoke(manager.connection(), expired).await.unwrap();
    eventually("the agent is present again under a new lease", || async {
        let held = leases_under(&manager, "/fleet-test/machines/").await;
        held.len() == 1 && held[0].1 != expired
    })
    .await;
    assert_eq!(lease_count(&manager).await, 1);
}

/// A write that finds the agents' lease gone (it expired while etcd was too busy to apply
/// its renewals) drops it at once: the next announcement goes under a new lease, and the
/// keepalive, woken, claims the other agents again, long before its next turn (here
/// `agent_ttl` is ten minutes).
#[tokio::test]
async fn a_write_that_finds_the_lease_gone_has_the_agents_claimed_again_at_once() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(600)).await;
    for id in ["a", "b"] {
        manager.announce_for_agent(&machine(id)).await.unwrap();
    }
    let expired = manager.inner.agent_lease.current();
    super::super::session::revoke(manager.connection(), expired).await.unwrap();
    let refused = manager.report_states("a", &[running("a", "a.service")]).await;
    assert!(refused.is_err(), "the state went under the gone lease: {refused:?}");
    assert_eq!(manager.inner.agent_lease.current(), 0, "the gone lease is dropped");
    eventually("both agents are present again under one new lease", || async {
        let held = leases_under(&manager, "/fleet-test/machines/").await;
        held.len() == 2 && held.iter().all(|(_, lease)| *lease != 0 && *lease != expired && *lease == held[0].1)
    })
    .await;
    manager.report_states("a", &[running("a", "a.service")]).await.unwrap();
}

/// An announcement that reached the agent's first manager late (the agent had moved on)
/// writes its presence under that manager's lease, which would give it up after `agent_ttl`
/// of silence: the manager the agent talks to takes it back as soon as the agent reads its
/// work there. And an agent that announces itself again to a manager holding it writes its
/// presence again, whatever happened to it meanwhile.
#[tokio::test]
async fn the_manager_an_agent_talks_to_holds_its_presence_whoever_wrote_it_last() {
    let (_etcd, first, second) = two_managers(Duration::from_secs(60)).await;
    first.announce_for_agent(&machine("agent")).await.unwrap();
    second.announce_for_agent(&machine("agent")).await.unwrap();
    let second_lease = second.inner.agent_lease.current();
    first.announce_for_agent(&machine("agent")).await.unwrap();
    let held = || async { leases_under(&second, "/fleet-test/machines/agent").await.first().map(|(_, lease)| *lease) };
    assert_eq!(held().await, Some(first.inner.agent_lease.current()), "the late announcement landed");
    eventually("the agent's manager takes its presence back once it reads its work there", || async {
        second.machine_work("agent").await.is_ok_and(|work| work.machine.is_some())
            && held().await == Some(second_lease)
    })
    .await;
    first.unregister_machine("agent").await.unwrap();
    assert_eq!(held().await, Some(second_lease), "the first manager's sweep leaves it alone");

    // Gone (given up by a manager, as the first one did before the fix), it comes back when
    // it announces itself again to the manager that still has a session for it.
    let delete = etcd_client::TxnOp::delete("/fleet-test/machines/agent", None);
    second.connection().txn(etcd_client::Txn::new().and_then([delete])).await.unwrap();
    assert_eq!(held().await, None);
    second.announce_for_agent(&machine("agent")).await.unwrap();
    assert_eq!(held().await, Some(second_lease));
}

/// An agent that announces itself again, unchanged, to the manager that holds it (a request
/// of its timed out on a loaded manager, say) costs the store no write; a changed record,
/// or one gone from the store, is written.
#[tokio::test]
async fn an_agent_announced_again_unchanged_costs_the_store_no_write() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(30)).await;
    manager.announce_for_agent(&machine("agent")).await.unwrap();
    manager.report_states("agent", &[running("agent", "a.service")]).await.unwrap();
    let revision = || async {
        let reply = manager.connection().get("/fleet-test/machines/", Some(GetOptions::new().with_prefix())).await;
        reply.unwrap().header().unwrap().revision()
    };
    let before = revision().await;
    manager.announce_for_agent(&machine("agent")).await.unwrap();
    assert_eq!(revision().await, before, "nothing written");

    let mut moved = machine("agent");
    moved.public_ip = "10.9.9.9".into();
    manager.announce_for_agent(&moved).await.unwrap();
    let after_change = revision().await;
    assert!(after_change > before, "a changed record is written");

    let delete = etcd_client::TxnOp::delete("/fleet-test/machines/agent", None);
    manager.connection().txn(etcd_client::Txn::new().and_then([delete])).await.unwrap();
    manager.announce_for_agent(&moved).await.unwrap();
    let held = leases_under(&manager, "/fleet-test/machines/agent").await;
    assert_eq!(held.len(), 1, "a record gone from the store is written again");
    assert_eq!(leases_under(&manager, "/fleet-test/states/agent/").await.len(), 1, "with the agent's states");
}

/// Pull agents that report at the same time (a change that reached them all) are written in a
/// few transactions, not one request each; one machine twice in a batch is written twice.
#[tokio::test(flavor = "multi_thread")]
async fn states_many_agents_report_at_once_are_written_together() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(30)).await;
    let agents: Vec<String> = (0..300).map(|index| format!("agent{index:03}")).collect();
    for agent in &agents {
        manager.announce_for_agent(&machine(agent)).await.unwrap();
    }
    let before = manager.revision().await.unwrap().unwrap();
    // Every report waits until all are in; then they go.
    let held = manager.inner.state_batches.hold_turn().await;
    let reports = agents
        .iter()
        .map(|agent| (agent.clone(), "everywhere.service"))
        .chain([("agent000".to_string(), "again.service"), ("agent000".to_string(), "again.service")]);
    let writes = reports.map(|(agent, unit)| {
        let manager = manager.clone();
        tokio::spawn(async move { manager.report_states(&agent, &[running(&agent, unit)]).await })
    });
    let writes: Vec<_> = writes.collect();
    while manager.inner.state_batches.waiting() < 302 {
        tokio::task::yield_now().await;
    }
    drop(held);
    for write in writes {
        write.await.unwrap().unwrap();
    }
    // At most 128 a transaction, and agent000's second report in a transaction of its own.
    let moved = manager.revision().await.unwrap().unwrap() - before;
    assert!(moved <= 5, "302 reports took {moved} transactions");
    let states = leases_under(&manager, "/fleet-test/states/").await;
    assert_eq!(states.len(), 301, "every agent's state, and the one reported twice");
    let lease = manager.inner.agent_lease.current();
    assert!(states.iter().all(|(_, held)| *held == lease));
}

/// Agents that announce at the same time are taken over together: fifty arriving while a
/// take-over is under way are written in one transaction (one etcd revision), each under the
/// agents' lease with the states it reported before (through another manager), and each held
/// here afterwards. An agent given twice in the batch is taken over once.
#[tokio::test]
async fn agents_announcing_at_once_are_taken_over_in_one_write() {
    let (_etcd, first, second) = two_managers(Duration::from_secs(30)).await;
    first.announce_for_agent(&machine("agent00")).await.unwrap();
    first.report_states("agent00", &[running("agent00", "a.service")]).await.unwrap();
    second.announce_for_agent(&machine("warm")).await.unwrap();
    let revision =
        || async { first.connection().get("/fleet-test/", None).await.unwrap().header().unwrap().revision() };
    let before = revision().await;

    let held = second.inner.presence_batches.hold_turn().await;
    let mut announcing = Vec::new();
    for index in 0..50 {
        let (manager, id) = (second.clone(), format!("agent{index:02}"));
        announcing.push(tokio::spawn(async move { manager.announce_for_agent(&machine(&id)).await }));
    }
    let again = second.clone();
    announcing.push(tokio::spawn(async move { again.announce_for_agent(&machine("agent07")).await }));
    eventually("every announcement waits for the turn", || async { second.inner.presence_batches.waiting() == 51 })
        .await;
    drop(held);
    for announced in announcing {
        announced.await.unwrap().unwrap();
    }

    assert_eq!(revision().await, before + 1, "fifty presences and a state, one write");
    let lease = second.inner.agent_lease.current();
    let machines = leases_under(&second, "/fleet-test/machines/").await;
    assert_eq!(machines.len(), 51, "{machines:?}");
    assert!(machines.iter().all(|(_, held)| *held == lease), "{machines:?} not all under {lease}");
    assert_eq!(
        leases_under(&second, "/fleet-test/states/").await,
        vec![("/fleet-test/states/agent00/a.service".to_string(), lease)]
    );
    for index in 0..50 {
        let id = format!("agent{index:02}");
        assert!(matches!(second.presence_renewed(&id), fleet_registry::Renewal::SentAt(_)), "{id} held here");
    }
}

/// A manager restarted while its agents' lease lives (recorded in its state directory) holds
/// them on it again: an agent that announces itself to it costs the store no write, its
/// presence and states stay as they were, and an agent that does not come back within
/// `agent_ttl` is given up.
#[tokio::test]
async fn a_manager_restarted_on_its_live_lease_takes_its_agents_back_writing_nothing() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let options = crate::EtcdOptions {
        agent_lease_file: Some(dir.path().join("etcd-agent-lease")),
        ..crate::tests::options(&etcd)
    };
    let lifetimes = crate::Lifetimes { agent_ttl: Duration::from_secs(4), engine_lease_ttl: Duration::from_secs(3) };
    let before = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    for agent in ["back", "gone"] {
        before.announce_for_agent(&machine(agent)).await.unwrap();
    }
    before.report_states("back", &[running("back", "a.service")]).await.unwrap();
    let lease = before.inner.agent_lease.current();
    before.inner.agent_lease.stop_keepalive();
    drop(before);

    let after = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    let revision = |registry: &EtcdRegistry| {
        let connection = registry.connection().clone();
        async move { connection.get("/fleet-test/", None).await.unwrap().header().unwrap().revision() }
    };
    let unchanged = revision(&after).await;
    after.announce_for_agent(&machine("back")).await.unwrap();
    assert_eq!(after.inner.agent_lease.current(), lease, "the lease of the manager's previous life");
    assert_eq!(revision(&after).await, unchanged, "taking the agent back wrote nothing");
    assert_eq!(lease_count(&after).await, 1);
    assert!(matches!(after.presence_renewed("back"), fleet_registry::Renewal::SentAt(_)));
    let held = leases_under(&after, "/fleet-test/states/back/").await;
    assert_eq!(held, vec![("/fleet-test/states/back/a.service".to_string(), lease)]);

    eventually_within("the agent that did not come back is given up", Duration::from_secs(30), || async {
        keys_under(&after, "/fleet-test/machines/").await == ["/fleet-test/machines/back".to_string()]
    })
    .await;
    assert_eq!(leases_under(&after, "/fleet-test/machines/").await, vec![("/fleet-test/machines/back".into(), lease)]);
}
