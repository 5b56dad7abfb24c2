//! The etcd store against a real etcd.

use std::time::Duration;

use etcd_client::{GetOptions, Txn, TxnOp};
use fleet_core::schedule::Decision;
use fleet_core::{DesiredState, MachineState, SystemdState, UnitFile, UnitHash, UnitState};
use fleet_testkit::{EtcdServer, eventually, eventually_within};

use super::caches::Cache;
use super::{EtcdOptions, EtcdRegistry, Lifetimes};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, MetadataChange, RegistryError, StateReport};

pub(crate) const SLEEP: &str = "[Service]\nExecStart=/bin/sleep 1000\n";

pub(crate) fn unit(text: &str) -> UnitFile {
    UnitFile::parse(text).unwrap()
}

pub(crate) fn machine(id: &str) -> MachineState {
    MachineState { id: id.into(), public_ip: "127.0.0.1".into(), ..Default::default() }
}

/// What m1's agent reports of `name` running there.
fn running_on_m1(name: &str, hash: UnitHash) -> UnitState {
    UnitState {
        run: None,
        name: name.into(),
        machine_id: "m1".into(),
        hash,
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    }
}

pub(crate) fn options(etcd: &EtcdServer) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: "/fleet-test/".into(),
        request_timeout: Duration::from_secs(2),
        ..EtcdOptions::default()
    }
}

pub(crate) async fn registry(etcd: &EtcdServer, agent_ttl: Duration) -> EtcdRegistry {
    let lifetimes = Lifetimes { agent_ttl, engine_lease_ttl: Duration::from_secs(3) };
    EtcdRegistry::connect(&options(etcd), lifetimes).await.unwrap()
}

pub(crate) async fn keys_under(registry: &EtcdRegistry, prefix: &str) -> Vec<String> {
    let reply =
        registry.connection().get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    reply.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

/// A fleetd killed just after its presence claim landed (before anything else of its start)
/// takes that presence back when it starts again: the lease was recorded before the claim
/// was sent. Otherwise it would be refused as a duplicate of itself until the lease expired
/// (the chaos run's seed 2 found that, at 1b2ed6e).
#[tokio::test]
async fn a_fleetd_killed_as_its_claim_lands_takes_its_presence_back() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(30), engine_lease_ttl: Duration::from_secs(3) };
    let options = EtcdOptions { lease_file: Some(dir.path().join("etcd-machine-lease")), ..options(&etcd) };
    let killed = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    let (lease, _) = killed.claim_new_presence(&machine("m1"), true).await.unwrap();
    drop(killed);
    let restarted = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    restarted.register_machine(&machine("m1")).await.expect("its own presence, taken back");
    let reply = restarted.connection().get(&restarted.keys().machine("m1"), None).await.unwrap();
    assert_eq!(reply.kvs().first().map(|kv| kv.lease()), Some(lease));
}

/// A fleetd that starts again under the lease its predecessor left alive drops what that
/// one reported: a unit it reported running may have stopped meanwhile (its keeper killed
/// it), and the engine would wait for this machine to stop it for as long as the lease
/// lives. The new agent reports what it holds on its first pass.
#[tokio::test]
async fn a_fleetd_taking_over_its_lease_drops_its_predecessors_reports() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(30), engine_lease_ttl: Duration::from_secs(3) };
    let options = EtcdOptions { lease_file: Some(dir.path().join("etcd-machine-lease")), ..options(&etcd) };
    let dead = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    dead.register_machine(&machine("m1")).await.unwrap();
    let state = running_on_m1("a.service", UnitHash([1; 20]));
    dead.report_states("m1", &[StateReport::Set(state)]).await.unwrap();
    dead.session("m1").unwrap().stop_keepalive();
    drop(dead);
    let restarted = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    assert_eq!(restarted.unit_states().await.unwrap().len(), 1, "the reports outlive their fleetd");
    restarted.register_machine(&machine("m1")).await.expect("its own presence, taken back");
    assert!(restarted.unit_states().await.unwrap().is_empty(), "the predecessor's reports went");
    assert_eq!(restarted.machines().await.unwrap().len(), 1, "the presence stays");
}

#[tokio::test]
async fn a_live_machine_id_is_refused_and_its_lease_carries_presence_and_states() {
    let etcd = EtcdServer::start();
    let first = registry(&etcd, Duration::from_secs(10)).await;
    let second = registry(&etcd, Duration::from_secs(10)).await;
    first.register_machine(&machine("m1")).await.unwrap();
    match second.register_machine(&machine("m1")).await {
        Err(RegistryError::MachineInUse { machine_id }) => assert_eq!(machine_id, "m1"),
        other => panic!("expected MachineInUse, got {other:?}"),
    }
    let state = running_on_m1("a.service", UnitHash([1; 20]));
    // A lone change is a plain put or delete (no transaction), under the machine's lease. The
    // second fleetd reads from its watch-fed copy, which learns of the first's writes soon after.
    let states = |expected: Vec<UnitState>| {
        let second = &second;
        async move { second.unit_states().await.is_ok_and(|states| states == expected) }
    };
    first.report_states("m1", &[StateReport::Set(state.clone())]).await.unwrap();
    eventually("the state is seen", || states(vec![state.clone()])).await;
    first.report_states("m1", &[StateReport::Remove(state.name.clone())]).await.unwrap();
    eventually("a lone removal is seen", || states(Vec::new())).await;
    first.report_states("m1", &[StateReport::Set(state.clone())]).await.unwrap();
    eventually("the state is seen again", || states(vec![state.clone()])).await;
    assert_eq!(second.machines().await.unwrap().len(), 1);
    first.unregister_machine("m1").await.unwrap();
    eventually("the machine is gone", || async { second.machines().await.is_ok_and(|machines| machines.is_empty()) })
        .await;
    eventually("states went with the lease", || states(Vec::new())).await;
    second.register_machine(&machine("m1")).await.unwrap();
}

/// A machine's work cache is held while its agent follows it: it goes when the machine
/// leaves, and comes again if it registers again.
#[tokio::test]
async fn a_machines_work_cache_goes_when_it_leaves() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    eventually("the work cache is listed", async || registry.machine_work("m1").await.is_ok()).await;
    let work = Cache::Work("m1".into());
    assert!(registry.inner.caches.running(&work).is_some(), "held while the machine's agent follows it");
    registry.unregister_machine("m1").await.unwrap();
    assert!(registry.inner.caches.running(&work).is_none(), "released with the machine");
    registry.register_machine(&machine("m1")).await.unwrap();
    eventually("the work is read again", async || registry.machine_work("m1").await.is_ok()).await;
    assert!(registry.inner.caches.running(&work).is_some());
}

#[tokio::test]
async fn a_dead_machines_lease_expires() {
    let etcd = EtcdServer::start();
    let observer = registry(&etcd, Duration::from_secs(2)).await;
    {
        let dying = registry(&etcd, Duration::from_secs(2)).await;
        dying.register_machine(&machine("m1")).await.unwrap();
        assert_eq!(observer.machines().await.unwrap().len(), 1);
        // Kept alive past its TTL while the registry lives.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(observer.machines().await.unwrap().len(), 1);
        // Dropping the registry's last handle stops nothing by itself: abort the keepalive.
        dying.session("m1").unwrap().stop_keepalive();
    }
    eventually("the machine's presence expires", || async { observer.machines().await.unwrap().is_empty() }).await;
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_deposed_leader_cannot_write() {
    let etcd = EtcdServer::start();
    let a = registry(&etcd, Duration::from_secs(10)).await;
    let b = registry(&etcd, Duration::from_secs(10)).await;
    a.put_unit("x.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    a.register_machine(&machine("m1")).await.unwrap();
    let lease_a = a.acquire_leadership("ma").await.unwrap().expect("first engine leads");
    assert!(a.engine_copy_running(), "the leader lists the cluster");
    let mut b_changes = b.engine_changes();
    eventually("b's copy shows the leader", || async { b.acquire_leadership("mb").await.unwrap().is_none() }).await;
    assert!(!b.engine_copy_running(), "a standby follows the leader key only, not the cluster");
    assert_eq!(a.acquire_leadership("ma").await.unwrap(), Some(lease_a.clone()), "renewal keeps the token");
    // a's leadership vanishes (its lease revoked as if it expired); b hears of it and takes over.
    b_changes.mark_unchanged();
    let held = a.inner.leadership.lock().await.as_ref().unwrap().lease;
    super::session::revoke(a.connection(), held).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), b_changes.changed())
        .await
        .expect("the leader key's end wakes the standby")
        .unwrap();
    eventually("b leads", || async { b.acquire_leadership("mb").await.unwrap().is_some() }).await;
    assert!(b.engine_copy_running(), "the new leader lists the cluster");
    let snapshot = b.snapshot().await.expect("the new leader's first snapshot waits for its listing");
    assert_eq!(snapshot.units.len(), 1);
    eventually("a's copy is synced", || async { a.snapshot().await.is_ok_and(|s| !s.units.is_empty()) }).await;
    let decision = Decision::Schedule { unit: "x.service".into(), machine: "m1".into() };
    match a.apply(&lease_a, &[decision], &[]).await {
        Err(RegistryError::LeadershipLost) => {}
        other => panic!("a deposed leader wrote: {other:?}"),
    }
    assert!(keys_under(&a, "/fleet-test/placement/").await.is_empty());
    assert!(a.acquire_leadership("ma").await.unwrap().is_none(), "b leads");
    assert!(!a.engine_copy_running(), "a deposed leader gives its copy back");
    let lease_b = b.acquire_leadership("mb").await.unwrap().unwrap();
    b.release_leadership(&lease_b).await.unwrap();
    assert!(!b.engine_copy_running(), "so does a leader that steps down");
}

/// A machine registered again reads its work only from a copy current since then, which the
/// listing its registration asked for makes; every read of a copy still behind asks again, so
/// a lost ask (the chaos run's seed 1820719916 lost one with a broken stream) cannot leave the
/// work unreadable.
#[tokio::test]
async fn reading_the_work_from_a_copy_behind_the_registration_asks_for_a_listing() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    // The copy is listed once read, after the registration: current since it.
    eventually("the work is read", || async { registry.machine_work("m1").await.is_ok() }).await;
    assert_eq!(registry.work_mirror("m1").read().listings, 1);
    // etcd moves on with a write none of the machine's ranges sees; the machine registers
    // again at that revision, and its ask for a listing is lost.
    let reply = registry.connection().kv().put("/elsewhere/key", "1", None).await.unwrap();
    let moved_to = reply.header().unwrap().revision();
    registry.session("m1").unwrap().note_rejoined_at(moved_to);
    assert!(matches!(registry.machine_work("m1").await, Err(RegistryError::PresenceLapsed)), "behind the registration");
    eventually("the copy lists again and the work is read", || async { registry.machine_work("m1").await.is_ok() })
        .await;
}

/// How many requests of kind `operation` this process has sent etcd.
fn requests_sent(operation: &str) -> f64 {
    let counted = format!("fleet_store_request_duration_seconds_count{{store=\"etcd\",operation=\"{operation}\"}}");
    let text = fleet_metrics::render();
    let line = text.lines().find(|line| line.starts_with(&counted));
    line.and_then(|line| line.rsplit(' ').next()).map_or(0.0, |count| count.parse::<f64>().unwrap_or(0.0))
}

/// How many lease renewals this process has sent etcd.
fn lease_renewals_sent() -> f64 {
    requests_sent("lease_keepalive")
}

/// etcd 3.4 refuses every lease renewal while it is behind in applying what it committed,
/// and a store that is away refuses everything: the leader leads on, its writes fenced by its
/// key, for as long as its lease lives by its own clock from the last renewal it sent, and
/// only then does the engine's pass fail; the lease's keeper renews it once etcd is back.
#[tokio::test]
async fn a_leader_whose_renewal_is_refused_leads_on_while_its_lease_lives() {
    let mut etcd = EtcdServer::start();
    let ttl = Duration::from_secs(9);
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: ttl };
    let a = EtcdRegistry::connect(&options(&etcd), lifetimes).await.unwrap();
    let lease = a.acquire_leadership("ma").await.unwrap().expect("the only engine leads");
    let sent = lease_renewals_sent();
    assert_eq!(a.acquire_leadership("ma").await.unwrap(), Some(lease.clone()), "renewed a moment ago");
    assert_eq!(lease_renewals_sent(), sent, "a pass asks etcd nothing: the lease's keeper renews it");
    etcd.kill();
    // Moves the last renewal sent back by half the lease's life.
    let age_by_half_a_life = || async {
        let leadership = a.inner.leadership.lock().await;
        leadership.as_ref().expect("still held").clock.age(ttl / 2);
    };
    age_by_half_a_life().await;
    assert_eq!(a.acquire_leadership("ma").await.unwrap(), Some(lease.clone()), "refused within the lease's life");
    age_by_half_a_life().await;
    assert!(a.acquire_leadership("ma").await.is_err(), "refused once the lease may be gone: the pass fails");
    etcd.resume();
    eventually("the lease is renewed once etcd is back", || async {
        a.acquire_leadership("ma").await.is_ok_and(|held| held == Some(lease.clone()))
    })
    .await;
}

/// The engine's lease is renewed in the background: a leader whose passes are all held up
/// (a first listing over a slow link, a long apply) for several of its lease's lives still
/// leads, and etcd still holds its lease (CI found a leader that lost it that way).
#[tokio::test]
async fn a_leader_keeps_its_lease_while_no_pass_comes() {
    let etcd = EtcdServer::start();
    let a = registry(&etcd, Duration::from_secs(10)).await;
    let lease = a.acquire_leadership("ma").await.unwrap().expect("the only engine leads");
    let held = a.inner.leadership.lock().await.as_ref().expect("held").lease;
    // Renewals go every third of the lease's three seconds: four of them span more than its life.
    eventually_within("the lease's keeper renews it four times", Duration::from_secs(30), async || {
        lease_renewals_sent() >= 4.0
    })
    .await;
    let left = a.connection().client().lease_time_to_live(held, None).await.unwrap().ttl();
    assert!(left > 0, "etcd holds the lease still ({left} s left)");
    assert_eq!(a.acquire_leadership("ma").await.unwrap(), Some(lease), "still the leader, with its token");
}

/// An engine that stops coming by altogether (a pass that never ends) no longer has its lease
/// renewed once it has been silent for a few of the lease's lives: the lease lapses and a
/// standby leads.
#[tokio::test]
async fn a_leader_whose_engine_stops_passing_lets_its_lease_lapse() {
    let etcd = EtcdServer::start();
    let (a, b) = (registry(&etcd, Duration::from_secs(10)).await, registry(&etcd, Duration::from_secs(10)).await);
    a.acquire_leadership("ma").await.unwrap().expect("the first engine leads");
    let held = a.inner.leadership.lock().await.as_ref().expect("held").lease;
    eventually_within("the lease of a silent engine lapses", Duration::from_secs(60), async || {
        a.connection().client().lease_time_to_live(held, None).await.unwrap().ttl() <= 0
    })
    .await;
    eventually("the standby leads", || async { b.acquire_leadership("mb").await.unwrap().is_some() }).await;
    // Once its copy shows the standby's key (or its keeper hears the lease is gone), the silent
    // engine leads no more; until then its pass fails, as its lease outlived its life.
    eventually("the silent engine leads no more", || async {
        a.acquire_leadership("ma").await.is_ok_and(|held| held.is_none())
    })
    .await;
}

#[tokio::test]
async fn copies_resume_after_an_outage() {
    let mut etcd = EtcdServer::start();
    let writer = registry(&etcd, Duration::from_secs(30)).await;
    let reader = registry(&etcd, Duration::from_secs(30)).await;
    writer.register_machine(&machine("m1")).await.unwrap();
    let _ = reader.machine_changes("m1");
    eventually("m1's copy is listed", || async { reader.machine_work("m1").await.is_ok() }).await;
    etcd.kill();
    // While etcd is down, the copy still answers with what it had.
    assert!(reader.machine_work("m1").await.unwrap().machine.is_some());
    assert!(matches!(writer.units().await, Err(RegistryError::Unavailable(_))));
    etcd.resume();
    writer
        .change_metadata(&[MetadataChange::Set { machine_id: "m1".into(), key: "region".into(), value: "eu".into() }])
        .await
        .unwrap();
    eventually("the copy sees the change made after the outage", || async {
        reader
            .machine_work("m1")
            .await
            .unwrap()
            .machine
            .is_some_and(|m| m.metadata.get("region").is_some_and(|r| r == "eu"))
    })
    .await;
}

/// Regression: etcd limits the operations of nested transactions to what their parent leaves
/// of `--max-txn-ops`; a full batch of unit transactions was refused ("too many operations").
#[tokio::test]
async fn hundreds_of_decisions_go_out_in_fenced_batches() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("u{i}.service")).collect();
    for name in &names {
        registry.put_unit(name, &unit(SLEEP), DesiredState::Launched).await.unwrap();
    }
    let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
    eventually("the engine's copy has every unit", || async {
        registry.snapshot().await.is_ok_and(|s| s.units.len() == names.len())
    })
    .await;
    let decisions: Vec<Decision> =
        names.iter().map(|name| Decision::Schedule { unit: name.clone(), machine: "m1".into() }).collect();
    let reasons: Vec<(String, String)> = vec![("u0.service".into(), "a reason".into())];
    registry.apply(&lease, &decisions, &reasons).await.unwrap();
    assert_eq!(keys_under(&registry, "/fleet-test/placement/").await.len(), 300);
    assert_eq!(keys_under(&registry, "/fleet-test/schedule/m1/").await.len(), 300);
    assert_eq!(registry.snapshot().await.unwrap().units.iter().filter(|u| u.machine_id.is_some()).count(), 300);
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let etcd = EtcdServer::start_tls();
    let certificates = etcd.certificates().unwrap();
    let mut options = options(&etcd);
    assert!(options.endpoints[0].starts_with("https://"));
    options.ca_file = certificates.ca().display().to_string();
    options.cert_file = certificates.client_cert().display().to_string();
    options.key_file = certificates.client_key().display().to_string();
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
    let registry = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    eventually("a unit is stored over TLS", || async {
        registry.put_unit("a.service", &unit(SLEEP), DesiredState::Loaded).await.is_ok()
    })
    .await;
    assert_eq!(registry.units().await.unwrap().len(), 1);
    // Without a client certificate etcd refuses the connection.
    options.cert_file.clear();
    options.key_file.clear();
    let anonymous = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    assert!(matches!(anonymous.units().await, Err(RegistryError::Unavailable(_))));
}

#[tokio::test]
async fn user_and_password() {
    let etcd = EtcdServer::start();
    let mut admin = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let mut options = options(&etcd);
    options.username = "root".into();
    options.password = fleet_core::secret::Secret::new("rootpw");
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
    let registry = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
    registry.put_unit("a.service", &unit(SLEEP), DesiredState::Loaded).await.unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    assert_eq!(registry.machines().await.unwrap().len(), 1);
    options.password = fleet_core::secret::Secret::new("wrong");
    assert!(EtcdRegistry::connect(&options, lifetimes).await.is_err(), "a wrong password is refused");
}

/// Regression: one malformed record made `GET /units` fail and stopped the engine for the
/// whole cluster. It is skipped and reported now, and the unit can still be destroyed.
#[tokio::test]
async fn a_malformed_record_is_skipped_and_its_unit_can_be_destroyed() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    registry.put_unit("good.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    registry.put_unit("bad.service", &unit("[Service]\nExecStart=/bin/true\n"), DesiredState::Launched).await.unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let keys = registry.keys();
    let corrupt =
        [TxnOp::put(keys.unit("bad.service"), "{not json", None), TxnOp::put(keys.machine("broken"), "[]", None)];
    registry.connection().txn(Txn::new().and_then(corrupt)).await.unwrap();
    let names: Vec<String> = registry.units().await.unwrap().into_iter().map(|view| view.name).collect();
    assert_eq!(names, ["good.service"]);
    let machines: Vec<String> = registry.machines().await.unwrap().into_iter().map(|machine| machine.id).collect();
    assert_eq!(machines, ["m1"]);
    assert!(matches!(registry.unit("bad.service").await, Err(RegistryError::Corrupt { .. })));
    eventually("the engine's snapshot holds the good unit and machine", || async {
        registry.snapshot().await.is_ok_and(|snapshot| {
            snapshot.units.iter().map(|unit| unit.name.as_str()).collect::<Vec<_>>() == ["good.service"]
                && snapshot.machines.len() == 1
        })
    })
    .await;
    assert!(registry.destroy_unit("bad.service").await.unwrap());
    assert_eq!(keys_under(&registry, &keys.unit("bad.service")).await, Vec::<String>::new());
}

/// Whether the engine's snapshot shows exactly the units `names`.
async fn snapshot_shows(registry: &EtcdRegistry, names: &[&str]) {
    eventually("the engine's snapshot shows the units written", async || {
        registry
            .snapshot()
            .await
            .is_ok_and(|snapshot| snapshot.units.iter().map(|unit| unit.name.as_str()).collect::<Vec<_>>() == names)
    })
    .await;
}

/// Bodies are collected by the leading engine, with no key per unit and content: the first
/// collection of a leadership deletes a body no unit has (and the reference keys earlier
/// versions wrote); a body a unit took up after the snapshot that showed it unused is kept,
/// because that unit was written since; one that lost its last unit goes. A unit taking up a
/// content whose body is there does not write the body again.
#[tokio::test]
async fn the_engine_collects_unused_bodies_but_not_one_taken_up_meanwhile() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    let keys = registry.keys().clone();
    let (used, orphan) = (unit(SLEEP), unit("[Service]\nExecStart=/bin/sleep 1\n"));
    let body_key = |file: &UnitFile| keys.body(&file.hash().to_string());
    let left_behind = [
        TxnOp::put(body_key(&orphan), fleet_registry::codec::encode(&orphan.options()), None),
        TxnOp::put(format!("{}{}/gone.service", keys.legacy_refs(), orphan.hash()), "", None),
    ];
    registry.connection().txn(Txn::new().and_then(left_behind)).await.unwrap();
    registry.put_unit("a.service", &used, DesiredState::Launched).await.unwrap();
    assert_eq!(keys_under(&registry, &keys.legacy_refs()).await.len(), 1, "units write no reference keys");
    snapshot_shows(&registry, &["a.service"]).await;
    assert_eq!(registry.delete_unused_bodies().await.unwrap(), 1);
    assert_eq!(keys_under(&registry, &keys.bodies()).await, [body_key(&used)], "the orphan went, a's body stayed");
    assert_eq!(keys_under(&registry, &keys.legacy_refs()).await, Vec::<String>::new());

    assert!(registry.destroy_unit("a.service").await.unwrap());
    snapshot_shows(&registry, &[]).await;
    let body_written = body_revision(&registry, &used).await;
    registry.put_unit("b.service", &used, DesiredState::Launched).await.unwrap();
    assert_eq!(body_revision(&registry, &used).await, body_written, "the body was there: b.service left it as it was");
    assert_eq!(registry.delete_unused_bodies().await.unwrap(), 0, "b.service was written since the snapshot");
    assert_eq!(registry.unit_body(&used.hash()).await.unwrap(), Some(used.clone()));
    snapshot_shows(&registry, &["b.service"]).await;
    assert_eq!(registry.delete_unused_bodies().await.unwrap(), 0, "b.service has it");

    assert!(registry.destroy_unit("b.service").await.unwrap());
    snapshot_shows(&registry, &[]).await;
    assert_eq!(registry.delete_unused_bodies().await.unwrap(), 1);
    assert_eq!(keys_under(&registry, &keys.bodies()).await, Vec::<String>::new());
    // The leader's cache of the cluster loses the body with the deletion's event.
    eventually("the body is gone", async || registry.unit_body(&used.hash()).await.unwrap().is_none()).await;
    assert_eq!(registry.delete_unused_bodies().await.unwrap(), 0, "nothing is left to collect");
}

/// The revision at which `file`'s body was last written.
async fn body_revision(registry: &EtcdRegistry, file: &UnitFile) -> i64 {
    let key = registry.keys().body(&file.hash().to_string());
    let reply = registry.connection().get(key.as_str(), None).await.unwrap();
    reply.kvs().first().map_or(0, |kv| kv.mod_revision())
}

/// A manager serving many machines holds one watch-fed copy for all of their work, however
/// many machines it serves, and wakes each machine only for its own changes.
#[tokio::test]
async fn serving_many_machines_takes_one_copy_for_all() {
    let etcd = EtcdServer::start();
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
    let registry =
        EtcdRegistry::connect(&EtcdOptions { serve_many_machines: true, ..options(&etcd) }, lifetimes).await.unwrap();
    let mut signals: Vec<_> = (0..200).map(|index| registry.machine_changes(&format!("m{index}"))).collect();
    fleet_testkit::eventually("the copy is listed", async || registry.machine_work("m0").await.is_ok()).await;
    for index in 0..200 {
        registry.machine_work(&format!("m{index}")).await.expect("work from the copy");
    }
    let own = |index: usize| registry.inner.caches.running(&Cache::Work(format!("m{index}")));
    assert!((0..200).all(|index| own(index).is_none()), "no copy of its own per machine");
    assert!(registry.inner.caches.running(&Cache::AllWork).is_some(), "one copy for all");
    for signal in &mut signals {
        signal.mark_unchanged();
    }
    registry.register_machine(&machine("m7")).await.unwrap();
    fleet_testkit::eventually("m7 is woken", async || signals[7].has_changed().unwrap_or(false)).await;
    let woken = signals.iter().filter(|signal| signal.has_changed().unwrap_or(false)).count();
    assert_eq!(woken, 1, "only m7's work changed");
}

#[tokio::test]
async fn the_leader_compacts_history_older_than_it_keeps() {
    let etcd = EtcdServer::start();
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
    let kept = Duration::from_millis(300);
    let registry =
        EtcdRegistry::connect(&EtcdOptions { kept_history: Some(kept), ..options(&etcd) }, lifetimes).await.unwrap();
    let file = |n: u32| fleet_core::UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep {n}\n")).unwrap();
    for n in 0..5 {
        registry.put_unit("a.service", &file(n), fleet_core::DesiredState::Launched).await.unwrap();
    }
    fleet_testkit::eventually("the engine's copy is listed", async || {
        registry.snapshot().await.is_ok_and(|snapshot| snapshot.units.len() == 1)
    })
    .await;
    assert_eq!(registry.compact_old_history().await.unwrap(), None, "the first pass only notes where history stands");
    let noted = registry.engine_mirror().read().revision;
    for n in 5..10 {
        registry.put_unit("a.service", &file(n), fleet_core::DesiredState::Launched).await.unwrap();
    }
    assert_eq!(registry.compact_old_history().await.unwrap(), None, "not due before the kept span passed");
    tokio::time::sleep(kept).await;
    assert_eq!(registry.compact_old_history().await.unwrap(), Some(noted), "compacts to the revision noted a span ago");
    let key = registry.keys().unit("a.service");
    let before = registry.connection().get(&key, Some(GetOptions::new().with_revision(noted - 1))).await;
    assert!(before.is_err_and(|error| error.to_string().contains("compacted")), "history before it is gone");
    let since = registry.connection().get(&key, Some(GetOptions::new().with_revision(noted))).await.unwrap();
    assert_eq!(since.kvs().len(), 1, "history since it is kept");
    // The copies carry on.
    registry.put_unit("b.service", &file(0), fleet_core::DesiredState::Launched).await.unwrap();
    fleet_testkit::eventually("the engine's copy sees a new write", async || {
        registry.snapshot().await.is_ok_and(|snapshot| snapshot.units.len() == 2)
    })
    .await;
}

/// A unit write starts from the API's copy, without a read; a copy behind another fleetd's
/// writes must never make it answer wrong or write over them.
#[tokio::test]
async fn a_write_from_a_stale_copy_is_checked_not_trusted() {
    let etcd = EtcdServer::start();
    let (first, second) =
        (registry(&etcd, Duration::from_secs(10)).await, registry(&etcd, Duration::from_secs(10)).await);
    let every =
        fleet_registry::PageRequest { start: 0, limit: 100, admits: std::sync::Arc::new(|_: &str| true), after: None };
    second.units_page(every.clone()).await.unwrap();
    for round in 0..20 {
        let name = format!("u{round}.service");
        first.put_unit(&name, &unit(SLEEP), DesiredState::Loaded).await.unwrap();
        // The second fleetd's copy may not have the unit yet: its answer comes from etcd.
        assert!(second.set_desired_state(&name, DesiredState::Launched).await.unwrap(), "{name} exists");
        assert!(first.destroy_unit(&name).await.unwrap());
        // Its copy may still hold the unit: the create checks the revisions it assumed.
        second.put_unit(&name, &unit("[Service]\nExecStart=/bin/true\n"), DesiredState::Loaded).await.unwrap();
        let stored = first.unit(&name).await.unwrap().expect("created again");
        assert_eq!(
            (stored.desired, stored.hash),
            (DesiredState::Loaded, unit("[Service]\nExecStart=/bin/true\n").hash())
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_units_is_a_few_transactions_and_a_stale_guess_is_written_alone() {
    use fleet_registry::{UnitChange, UnitChanged, Writer};
    let etcd = EtcdServer::start();
    let (first, second) =
        (registry(&etcd, Duration::from_secs(10)).await, registry(&etcd, Duration::from_secs(10)).await);
    let revision = async |registry: &EtcdRegistry| registry.revision().await.unwrap().unwrap();
    let template = unit("[Service]\nExecStart=/bin/sleep %i\n");
    let changes: Vec<UnitChange> = (0..1000)
        .map(|index| UnitChange {
            name: format!("many@{index}.service"),
            file: Some(template.clone()),
            desired: DesiredState::Inactive,
        })
        .collect();
    // The first batch starts the copy the guesses come from.
    second.change_units_as(&changes[..1], &Writer::BY_HAND).await.unwrap();
    let before = revision(&second).await;
    let answers = second.change_units_as(&changes, &Writer::BY_HAND).await.unwrap();
    assert!(answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))));
    let moved = revision(&second).await - before;
    assert!(moved <= 12, "1,000 units took {moved} transactions, not about one per 110");
    // Units changed through another fleetd, which the copy may not hold yet: each guess is
    // checked, and those that lost are written alone from a fresh read.
    for round in 0..10 {
        let names: Vec<String> = (0..50).map(|index| format!("many@{index}.service")).collect();
        for name in &names[..5] {
            first
                .put_unit(name, &unit(&format!("[Service]\nExecStart=/bin/r{round}\n")), DesiredState::Loaded)
                .await
                .unwrap();
        }
        let launch: Vec<UnitChange> = names
            .iter()
            .map(|name| UnitChange { name: name.clone(), file: None, desired: DesiredState::Launched })
            .collect();
        let answers = second.change_units_as(&launch, &Writer::BY_HAND).await.unwrap();
        assert!(answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))));
        for name in &names[..5] {
            let stored = first.unit(name).await.unwrap().expect("there");
            assert_eq!(
                (stored.desired, stored.hash),
                (DesiredState::Launched, unit(&format!("[Service]\nExecStart=/bin/r{round}\n")).hash()),
                "the content another fleetd wrote is kept"
            );
        }
        let reset: Vec<UnitChange> = names
            .iter()
            .map(|name| UnitChange {
                name: name.clone(),
                file: Some(template.clone()),
                desired: DesiredState::Inactive,
            })
            .collect();
        second.change_units_as(&reset, &Writer::BY_HAND).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_fails_fast_while_etcd_is_down_and_writes_once_it_is_back() {
    use fleet_registry::{UnitChange, UnitChanged, Writer};
    let mut etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    let changes: Vec<UnitChange> = (0..300)
        .map(|index| UnitChange {
            name: format!("down@{index}.service"),
            file: Some(unit("[Service]\nExecStart=/bin/sleep %i\n")),
            desired: DesiredState::Loaded,
        })
        .collect();
    registry.change_units_as(&changes[..1], &Writer::BY_HAND).await.unwrap();
    etcd.kill();
    let started = std::time::Instant::now();
    let answers = registry.change_units_as(&changes, &Writer::BY_HAND).await.unwrap();
    assert!(answers.iter().all(|answer| matches!(answer, Err(RegistryError::Unavailable(_)))), "{:?}", &answers[..3]);
    // One failed request stands for all: not one timeout per unit (300 × 2 s).
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    etcd.resume();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let answers = registry.change_units_as(&changes, &Writer::BY_HAND).await.unwrap();
            if answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("written once etcd is back");
    assert_eq!(registry.units().await.unwrap().len(), 300);
}

/// A store whose API copy is let go after `idle` without a use.
async fn registry_whose_api_copy_idles(etcd: &EtcdServer, idle: Duration) -> EtcdRegistry {
    let options = EtcdOptions { api_copy_idle: Some(idle), ..options(etcd) };
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
    EtcdRegistry::connect(&options, lifetimes).await.unwrap()
}

/// A page request for every unit (at most a hundred).
fn every_unit_page() -> fleet_registry::PageRequest {
    fleet_registry::PageRequest { start: 0, limit: 100, admits: std::sync::Arc::new(|_: &str| true), after: None }
}

#[tokio::test]
async fn the_api_copy_starts_with_a_list_and_is_released_when_idle() {
    let etcd = EtcdServer::start();
    let registry = registry_whose_api_copy_idles(&etcd, Duration::from_secs(3)).await;
    registry.put_unit("a.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    assert!(registry.cluster_cache_running().is_none(), "a write alone starts no copy of the cluster");
    let every = every_unit_page();
    assert_eq!(registry.units_page(every.clone()).await.unwrap().items.len(), 1);
    let first = registry.cluster_cache_running().expect("a list starts the copy");
    // Used every second for longer than the idle time, it stays: the same copy, never
    // released and started again.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        registry.units_page(every.clone()).await.unwrap();
    }
    let still = registry.cluster_cache_running().expect("a copy in use stays");
    assert!(std::sync::Arc::ptr_eq(&first, &still), "a copy in use stays the same copy");
    eventually("the idle copy is released", async || registry.cluster_cache_running().is_none()).await;
    // The next list starts a fresh copy that holds every write, this API's own included.
    registry.put_unit("b.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    let names: Vec<String> =
        registry.units_page(every).await.unwrap().items.into_iter().map(|unit| unit.name).collect();
    assert_eq!(names, ["a.service", "b.service"]);
}

/// A leader that serves lists reads the one cache of the cluster its API reads: one copy
/// and one watch of the units and placements in the fleetd, never a hand-off between two.
/// Unit changes wake its engine; states do not, and it holds none until something asks. With its leadership it lets go of its hold,
/// and the cache stays only as long as the API's last list lingers.
#[tokio::test]
async fn a_leader_that_serves_lists_reads_the_one_cache_of_the_cluster() {
    use std::sync::Arc;
    let etcd = EtcdServer::start();
    let registry = registry_whose_api_copy_idles(&etcd, Duration::from_secs(2)).await;
    registry.put_unit("a.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("the only engine leads");
    assert_eq!(registry.snapshot().await.unwrap().units.len(), 1);
    let cache = registry.cluster_cache_running().expect("a leader holds the cluster's cache");
    assert!(registry.states_cache_running().is_none(), "but no states: nothing asked for them");
    let every = every_unit_page();
    assert_eq!(registry.units_page(every.clone()).await.unwrap().items.len(), 1);
    let listed = registry.cluster_cache_running().expect("the API reads a cache");
    assert!(Arc::ptr_eq(&cache, &listed), "the API reads the engine's cache, not one of its own");
    drop(listed);
    let mut engine_changes = registry.engine_changes();
    engine_changes.mark_unchanged();
    registry.put_unit("b.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), engine_changes.changed())
        .await
        .expect("a unit's change wakes the engine")
        .unwrap();
    // Past the API's linger (the states' cache, which only that list held, is gone), the
    // cluster's cache stays: the engine holds it.
    eventually("the API's linger passed", async || registry.states_cache_running().is_none()).await;
    let still = registry.cluster_cache_running().expect("the leader's hold keeps the cache");
    assert!(Arc::ptr_eq(&cache, &still), "the same cache all along");
    drop((cache, still));
    registry.put_unit("c.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    let names: Vec<String> =
        registry.units_page(every).await.unwrap().items.into_iter().map(|unit| unit.name).collect();
    assert_eq!(names, ["a.service", "b.service", "c.service"], "the API's own write is in the cache");
    assert!(registry.states_cache_running().is_some(), "a list of units reads their states");
    registry.release_leadership(&lease).await.unwrap();
    assert!(!registry.engine_copy_running(), "the engine lets go of its hold with its leadership");
    assert!(registry.cluster_cache_running().is_some(), "the API's last list still lingers");
    eventually("the cache goes once the API's linger passed", async || registry.cluster_cache_running().is_none())
        .await;
}

/// A unit the API lists is in the engine's next snapshot: both read one cache, whose
/// generation moves with every change. (When the engine moved from a copy of its own to the
/// API's, each counting generations from 0, a unit written between the two listings showed
/// the same generation as the plan before it, and the engine never placed it: the README's
/// walkthrough stalled so.)
#[tokio::test]
async fn a_unit_the_api_lists_is_never_taken_for_one_the_engine_planned() {
    let etcd = EtcdServer::start();
    let registry = registry_whose_api_copy_idles(&etcd, Duration::from_secs(600)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    let _lease = registry.acquire_leadership("m1").await.unwrap().expect("the only engine leads");
    let planned = registry.snapshot().await.unwrap();
    assert!(planned.units.is_empty());
    registry.put_unit("a.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    assert_eq!(registry.units_page(every_unit_page()).await.unwrap().items.len(), 1, "the API lists the unit");
    assert_ne!(
        registry.snapshot_revision().await.unwrap(),
        Some(planned.revision),
        "the cache holds a unit the plan did not see: its generation is not the plan's"
    );
    assert_eq!(registry.snapshot().await.unwrap().units.len(), 1);
}

/// A machine whose lease expired registers again with its states kept aside, and writes
/// them again only for the units its caught-up copy still gives it: the engine moved the
/// others meanwhile, and their old states would list them twice.
#[tokio::test]
async fn a_machine_back_from_an_expired_lease_restores_only_the_states_of_units_still_its_own() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(3)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    registry.register_machine(&machine("m2")).await.unwrap();
    for name in ["kept.service", "moved.service"] {
        registry.put_unit(name, &unit(SLEEP), DesiredState::Launched).await.unwrap();
    }
    let lease = registry.acquire_leadership("m2").await.unwrap().unwrap();
    eventually("the engine's copy has both units", || async {
        registry.snapshot().await.is_ok_and(|s| s.units.len() == 2)
    })
    .await;
    let on_m1 = |name: &str| Decision::Schedule { unit: name.into(), machine: "m1".into() };
    registry.apply(&lease, &[on_m1("kept.service"), on_m1("moved.service")], &[]).await.unwrap();
    eventually("m1's copy holds both", || async {
        registry.machine_work("m1").await.is_ok_and(|work| work.scheduled.len() == 2)
    })
    .await;
    let state = |name: &str| running_on_m1(name, unit(SLEEP).hash());
    let reports = [StateReport::Set(state("kept.service")), StateReport::Set(state("moved.service"))];
    registry.report_states("m1", &reports).await.unwrap();

    // m1's lease goes (as when etcd could not be reached for agent_ttl) and the engine moves
    // one unit away before m1 notices.
    let old_lease = registry.session("m1").unwrap().lease();
    let registered_at = registry.session("m1").unwrap().rejoined_at();
    super::session::revoke(registry.connection(), old_lease).await.unwrap();
    let moved = [
        Decision::Unschedule {
            unit: "moved.service".into(),
            machine: "m1".into(),
            reason: fleet_core::schedule::UnscheduleReason::MachineWentAway,
        },
        Decision::Schedule { unit: "moved.service".into(), machine: "m2".into() },
    ];
    registry.apply(&lease, &moved, &[]).await.unwrap();
    eventually("m1 registers again", || async {
        let rejoined_at = registry.session("m1").unwrap().rejoined_at();
        rejoined_at > registered_at && rejoined_at < i64::MAX
    })
    .await;
    eventually("m1's work is read from a caught-up copy", || async {
        registry.machine_work("m1").await.is_ok_and(|work| work.scheduled.len() == 1)
    })
    .await;
    let states = keys_under(&registry, "/fleet-test/states/").await;
    assert_eq!(states, vec!["/fleet-test/states/m1/kept.service".to_string()], "only the unit still here");
    let kept = registry.connection().get("/fleet-test/states/m1/kept.service", None).await.unwrap();
    assert_eq!(kept.kvs()[0].lease(), registry.session("m1").unwrap().lease(), "under the new lease");
}

/// A presence claim whose answer was lost (etcd too busy to answer in time) may still have
/// landed: the next attempt takes that presence over instead of refusing the machine as in
/// use by another fleetd until the lease expires.
#[tokio::test]
async fn a_claim_that_landed_without_an_answer_is_taken_over_not_refused() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(30)).await;
    let lease = super::session::grant(registry.connection(), Duration::from_secs(30)).await.unwrap();
    let presence = |id: &str| (format!("/fleet-test/machines/{id}"), Some(fleet_registry::codec::encode(&machine(id))));
    registry.connection().write(&[presence("m1")], lease).await.unwrap();
    registry.note_unconfirmed_claim("m1", Some(lease));
    // Until a claim is confirmed, the machine's work shows nothing as its own: the claim
    // may have landed as a fresh presence after the engine moved its units.
    eventually("m1's copy has listed", || async {
        !matches!(registry.machine_work("m1").await, Err(RegistryError::NotListedYet))
    })
    .await;
    assert!(matches!(registry.machine_work("m1").await, Err(RegistryError::PresenceLapsed)));
    registry.register_machine(&machine("m1")).await.expect("its own landed claim is taken over");
    assert_eq!(registry.session("m1").unwrap().lease(), lease);
    // Another fleetd's live presence is still refused.
    let other = super::session::grant(registry.connection(), Duration::from_secs(30)).await.unwrap();
    registry.connection().write(&[presence("m2")], other).await.unwrap();
    registry.note_unconfirmed_claim("m2", Some(other + 1));
    assert!(matches!(registry.register_machine(&machine("m2")).await, Err(RegistryError::MachineInUse { .. })));
}

/// The first unit of each content a machine gets carries the unit's body, so the machine
/// has it from its own watch instead of reading `bodies/`; a later unit of the same content
/// carries nothing, and a carried body that does not match its hash is not taken.
#[tokio::test]
async fn a_machines_first_unit_of_each_content_carries_the_body() {
    use super::records::{Assignment, CarryingAssignment};
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    for id in ["m1", "m2"] {
        registry.register_machine(&machine(id)).await.unwrap();
    }
    let (sleeper, other) = (unit(SLEEP), unit("[Service]\nExecStart=/bin/sleep 2000\n"));
    let units = [
        ("a.service", &sleeper),
        ("b.service", &sleeper),
        ("c.service", &other),
        ("d.service", &sleeper),
        ("e.service", &sleeper),
    ];
    for (name, file) in units {
        registry.put_unit(name, file, DesiredState::Launched).await.unwrap();
    }
    let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
    eventually("the engine's copy has every unit", || async {
        registry.snapshot().await.is_ok_and(|s| s.units.len() == units.len())
    })
    .await;
    let place = |unit: &str, machine: &str| Decision::Schedule { unit: unit.into(), machine: machine.into() };
    let first =
        [place("a.service", "m1"), place("b.service", "m1"), place("c.service", "m1"), place("d.service", "m2")];
    registry.apply(&lease, &first, &[]).await.unwrap();
    registry.apply(&lease, &[place("e.service", "m1")], &[]).await.unwrap();
    let carrying = async |machine: &str| -> Vec<String> {
        let prefix = format!("/fleet-test/schedule/{machine}/");
        let reply = registry.connection().get(prefix.as_str(), Some(GetOptions::new().with_prefix())).await.unwrap();
        reply
            .kvs()
            .iter()
            .filter(|kv| String::from_utf8_lossy(kv.value()).contains("\"body\""))
            .map(|kv| String::from_utf8_lossy(kv.key()).trim_start_matches(&prefix).to_string())
            .collect()
    };
    assert_eq!(carrying("m1").await, ["a.service", "c.service"], "one carrier per content, not per unit");
    assert_eq!(carrying("m2").await, ["d.service"]);
    // The API's writes: the same content again travels nowhere, new content to its machine.
    registry.put_unit("b.service", &sleeper, DesiredState::Launched).await.unwrap();
    assert_eq!(carrying("m1").await, ["a.service", "c.service"], "m1 holds b.service's content");
    registry.put_unit("b.service", &other, DesiredState::Launched).await.unwrap();
    assert_eq!(carrying("m1").await, ["a.service", "b.service", "c.service"], "new content travels");

    // With `bodies/` gone, the machine still has both from its schedule.
    let mut kv = registry.connection().kv();
    kv.delete("/fleet-test/bodies/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    let wanted = [sleeper.hash(), other.hash()];
    eventually("m1's copy has its schedule", || async {
        AgentRegistry::unit_bodies(&registry, "m1", &wanted).await.unwrap().len() == 2
    })
    .await;
    let found = AgentRegistry::unit_bodies(&registry, "m1", &wanted).await.unwrap();
    assert_eq!(found[&sleeper.hash()].hash(), sleeper.hash());
    assert_eq!(found[&other.hash()].hash(), other.hash());

    // A carried body that is not the content its assignment names is not taken.
    let assignment = Assignment {
        hash: sleeper.hash(),
        desired: DesiredState::Launched,
        drift: Default::default(),
        secrets: Default::default(),
        places_at: None,
    };
    let forged = fleet_registry::codec::encode(&CarryingAssignment { assignment: &assignment, body: other.options() });
    kv.put("/fleet-test/schedule/m1/a.service", forged, None).await.unwrap();
    eventually("the forged body is refused, and bodies/ has no other", || async {
        AgentRegistry::unit_bodies(&registry, "m1", &[sleeper.hash()]).await.unwrap().is_empty()
    })
    .await;

    // A global unit's entry, which every machine watches, carries its body.
    let global = unit("[Service]\nExecStart=/bin/sleep 3000\n\n[X-Fleet]\nGlobal=true\n");
    registry.put_unit("g.service", &global, DesiredState::Launched).await.unwrap();
    kv.delete("/fleet-test/bodies/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    eventually("m2 has the global unit's body from its copy", || async {
        AgentRegistry::unit_bodies(&registry, "m2", &[global.hash()]).await.unwrap().len() == 1
    })
    .await;
}

/// A machine that claims a new presence reads its work only from a copy that has seen the
/// claim; a copy listed before it, whose other ranges have no event after it, lists afresh
/// (etcd's progress notices come minutes apart) so the machine is not kept waiting.
#[tokio::test]
async fn a_copy_listed_before_a_fresh_claim_catches_up_with_it() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(3)).await;
    let _changes = registry.machine_changes("m1");
    eventually("m1's copy is listed", || async { registry.machine_work("m1").await.is_ok() }).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    assert!(registry.session("m1").unwrap().rejoined_at() > 0, "a fresh claim is read as after a lapse");
    eventually("m1's work is read again, from a copy current since the claim", || async {
        registry.machine_work("m1").await.is_ok()
    })
    .await;
}

/// A machine's copy made as its agent starts (following its changes before it registers) is
/// listed once, after the registration: listed before it, it had to be listed again to be
/// current since the claim (two listings a machine where one does, 10,000 machines
/// registering at once).
#[tokio::test]
async fn a_copy_made_before_the_registration_is_listed_once_after_it() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(3)).await;
    let _changes = registry.machine_changes("m1");
    registry.register_machine(&machine("m1")).await.unwrap();
    let claimed_at = registry.session("m1").unwrap().rejoined_at();
    eventually("m1's work is read, from a copy current since the claim", || async {
        registry.machine_work("m1").await.is_ok()
    })
    .await;
    // Listed before the claim, the copy would have been readable only after a second listing.
    let copy = registry.work_mirror("m1");
    let data = copy.read();
    assert_eq!(data.listings, 1, "m1's copy was listed once");
    assert!(data.listed >= claimed_at, "and after the claim (at {claimed_at}): {}", data.listed);
}

/// A machine whose lease expired is registered again only once its agent has stopped what
/// ran there (it said so with `presence_lapse_handled`): present again in etcd's view with
/// those units still running, it would run twice what the engine moved meanwhile (a fleetd
/// frozen between the two did, in the chaos run).
#[tokio::test]
async fn a_lapsed_machine_registers_again_only_after_its_agent_stopped_its_units() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(3)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    let mut lapses = registry.presence_lapses("m1").expect("the etcd store signals lapses");
    let old_lease = registry.session("m1").unwrap().lease();
    super::session::revoke(registry.connection(), old_lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), lapses.changed()).await.expect("the lapse is signalled").unwrap();
    // Without the agent's word, the presence is not claimed again: each read is after the
    // moment a registration without the wait would have landed.
    for _ in 0..20 {
        assert!(keys_under(&registry, "/fleet-test/machines/").await.is_empty(), "registered again too soon");
    }
    registry.presence_lapse_handled("m1");
    eventually("m1 registers again once its agent stopped its units", || async {
        keys_under(&registry, "/fleet-test/machines/").await == ["/fleet-test/machines/m1".to_string()]
    })
    .await;
}

/// A journal question reaches the machine asked (and wakes it), and a manager following every
/// machine's questions (for its pull agents), each reading it from the copy that woke it; its
/// answer reaches the asker, and nothing of either is left after; a question no one answers
/// ends with `None`.
#[tokio::test(flavor = "multi_thread")]
async fn journal_questions_go_to_their_machine_and_answers_come_back() {
    use fleet_registry::{JournalInbox, JournalQuestion, JournalQuestions, PutQuestion};
    let etcd = EtcdServer::start();
    let asker = std::sync::Arc::new(registry(&etcd, Duration::from_secs(10)).await);
    let asked = registry(&etcd, Duration::from_secs(10)).await;
    let mut woken = asked.journal_question_changes("m2");
    let mut manager_woken = asked.every_journal_question_changes();
    let question = JournalQuestion { unit: "web.service".into(), lines: 5, status: false };
    let asking = {
        let (asker, question) = (asker.clone(), question.clone());
        tokio::spawn(async move { asker.ask_journal("m2", &question, Duration::from_secs(20)).await })
    };
    let id = loop {
        let questions = asked.journal_questions("m2").await.unwrap();
        if let Some((id, seen)) = questions.into_iter().next() {
            assert_eq!(seen, question);
            break id;
        }
        woken.changed().await.unwrap();
    };
    assert!(asked.journal_questions("m1").await.unwrap().is_empty(), "only the machine asked");
    let every = loop {
        let every = asked.every_journal_question().await.unwrap();
        if !every.is_empty() {
            break every;
        }
        manager_woken.changed().await.unwrap();
    };
    assert_eq!(every, [PutQuestion { machine: "m2".into(), id: id.clone(), question: question.clone() }]);
    // Once their watches are up, the copies that woke the answerers are all they read. (A copy
    // whose stream is up may not have applied the question's event yet: its answerer is woken
    // again when it does, so the test waits for it too.)
    let sent = || requests_sent("txn") + requests_sent("range");
    eventually("the questions are read from the copies alone", async || {
        let before = sent();
        let mine = asked.journal_questions("m2").await.unwrap();
        let every = asked.every_journal_question().await.unwrap();
        (mine.len(), every.len()) == (1, 1) && sent() == before
    })
    .await;
    asked.answer_journal("m2", &id, b"the answer").await.unwrap();
    assert_eq!(asking.await.unwrap().unwrap(), Some(b"the answer".to_vec()));
    assert!(keys_under(&asked, "/fleet-test/journal/").await.is_empty(), "nothing is left");
    let unanswered = asker.ask_journal("m3", &question, Duration::from_millis(300)).await.unwrap();
    assert_eq!(unanswered, None);
    assert!(keys_under(&asked, "/fleet-test/journal/").await.is_empty(), "nor of a question no one answered");
}

/// A submission's batches and a machine's registration ask etcd how far behind it is in
/// applying before they write (and would wait while it is far behind: `apply_lag`'s tests);
/// the probe answers from a real etcd.
#[tokio::test]
async fn a_submission_and_a_registration_ask_how_far_behind_etcd_is() {
    use fleet_registry::{UnitChange, UnitChanged, Writer};
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    assert!(registry.apply_lag().await.is_some(), "etcd answers the probe");
    let probes = || requests_sent("apply_probe");
    let before = probes();
    let changes: Vec<UnitChange> = (0..300)
        .map(|n| UnitChange { name: format!("u{n}.service"), file: Some(unit(SLEEP)), desired: DesiredState::Inactive })
        .collect();
    registry.change_units_as(&changes[..1], &Writer::BY_HAND).await.unwrap();
    let answers = registry.change_units_as(&changes, &Writer::BY_HAND).await.unwrap();
    assert!(answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))), "{answers:?}");
    assert!(probes() > before, "the batches asked");
    // Another fleetd (its own connection, its own last measure) registers its machine.
    let other = self::registry(&etcd, Duration::from_secs(10)).await;
    let before = probes();
    other.register_machine(&machine("m1")).await.unwrap();
    assert!(probes() > before, "the registration asked");
}

/// While the API's copy is up, the bodies the engine asks for come from it: etcd is asked only
/// for a body the copy does not hold.
#[tokio::test]
async fn bodies_the_api_copy_holds_cost_etcd_no_read() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    let sleeper = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1\n").unwrap();
    registry.put_unit("a.service", &sleeper, DesiredState::Launched).await.unwrap();
    // A list starts the API's copy, which holds the unit's body once it holds the unit.
    eventually("the API's copy lists the unit", || async {
        registry.units_page(fleet_registry::PageRequest::everything()).await.is_ok_and(|page| page.items.len() == 1)
    })
    .await;
    let before = requests_sent("txn");
    let read = EngineRegistry::unit_bodies(&registry, &[sleeper.hash()]).await.unwrap();
    assert_eq!(read.get(&sleeper.hash()), Some(&sleeper), "the body, from the copy");
    assert_eq!(requests_sent("txn"), before, "no request to etcd for a body the copy holds");
    let unknown = UnitHash([7; 20]);
    assert!(EngineRegistry::unit_bodies(&registry, &[unknown]).await.unwrap().is_empty());
    assert_eq!(requests_sent("txn"), before + 1.0, "a body the copy lacks is asked of etcd");
}

/// A unit read while the cluster's cache runs comes from it, with this API's own write, and
/// costs etcd nothing; with no cache running it is read from etcd.
#[tokio::test]
async fn a_unit_read_while_the_cluster_cache_runs_costs_etcd_no_read() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    let (first, second) = (unit(SLEEP), UnitFile::parse("[Service]\nExecStart=/bin/sleep 2\n").unwrap());
    registry.put_unit("a.service", &first, DesiredState::Launched).await.unwrap();
    let before = requests_sent("txn") + requests_sent("range");
    assert_eq!(registry.unit("a.service").await.unwrap().map(|view| view.hash), Some(first.hash()));
    assert!(requests_sent("txn") + requests_sent("range") > before, "no cache runs: read from etcd");
    assert_eq!(registry.units_page(fleet_registry::PageRequest::everything()).await.unwrap().items.len(), 1);
    registry.put_unit("a.service", &second, DesiredState::Inactive).await.unwrap();
    let before = requests_sent("txn") + requests_sent("range");
    let read = registry.unit("a.service").await.unwrap().expect("the unit");
    assert_eq!((read.hash, read.desired), (second.hash(), DesiredState::Inactive), "this API's own write");
    assert_eq!(registry.unit("b.service").await.unwrap(), None);
    assert_eq!(requests_sent("txn") + requests_sent("range"), before, "no request to etcd");
}

/// The sources and their statuses, which the source syncer reads on every pass, come from the
/// watch-fed copy of the sources: a read costs etcd no request, and still shows this
/// fleetd's own writes at once (a write and a removal, a status on a removed source not
/// kept).
#[tokio::test]
async fn sources_and_statuses_are_read_from_the_copy_with_this_fleetds_writes() {
    use fleet_registry::{SourceRecord, SourceRegistry, SourceStatus};
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    let record = |name: &str| SourceRecord::new(name, "https://git.example/units.git");
    for name in ["b", "a"] {
        registry.put_source(&record(name)).await.unwrap();
    }
    let status = SourceStatus { commit: Some("abc".into()), attempted_at: 7, ..SourceStatus::default() };
    registry.set_source_status("a", &status).await.unwrap();
    let names = |sources: Vec<SourceRecord>| sources.into_iter().map(|source| source.name).collect::<Vec<_>>();
    assert_eq!(names(registry.sources().await.unwrap()), ["a", "b"], "both, in name order, at once");
    assert_eq!(registry.source_statuses().await.unwrap(), [("a".to_string(), status.clone())]);
    let before = (requests_sent("txn"), requests_sent("range"));
    for _ in 0..3 {
        registry.sources().await.unwrap();
        registry.source_statuses().await.unwrap();
    }
    assert_eq!((requests_sent("txn"), requests_sent("range")), before, "reads cost etcd no request");
    assert!(registry.remove_source("a").await.unwrap());
    registry.set_source_status("a", &status).await.unwrap();
    assert_eq!(names(registry.sources().await.unwrap()), ["b"], "the removal shows at once");
    assert!(registry.source_statuses().await.unwrap().is_empty(), "no status kept for a removed source");
}

/// A recorded lease (the machine's, or a manager's agents') is read from the file itself: a
/// symbolic link planted in its place is not followed.
#[test]
fn a_recorded_lease_is_read_without_following_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let (file, link) = (dir.path().join("etcd-agent-lease"), dir.path().join("planted"));
    fleet_fs::write_private(&file, b"7587\n").unwrap();
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert_eq!(super::session::recorded_lease(&file), Some(7587));
    assert_eq!(super::session::recorded_lease(&link), None, "a link is not followed");
    assert_eq!(super::session::recorded_lease(&dir.path().join("absent")), None);
}

/// An import that finds a name taken once it has written some of its units (here a stray
/// placement of one of them, which the count of existing units does not see) takes back what
/// it wrote: units, placements and the machine's schedule entries.
#[tokio::test]
async fn an_import_that_finds_a_name_taken_midway_takes_back_what_it_wrote() {
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(30)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    registry
        .connection()
        .txn(Txn::new().and_then([TxnOp::put("/fleet-test/placement/app-250.service", "m1", None)]))
        .await
        .unwrap();
    let units: Vec<fleet_registry::ImportedUnit> = (0..300)
        .map(|index| fleet_registry::ImportedUnit {
            name: format!("app-{index:03}.service"),
            file: unit("[Service]\nExecStart=/bin/sleep 1000\n"),
            desired: DesiredState::Launched,
            machine: Some("m1".into()),
        })
        .collect();
    let imported = registry.import_units(&units, &fleet_registry::Writer::BY_HAND).await.unwrap();
    assert_eq!(imported, fleet_registry::Imported::Existing(vec!["app-250.service".to_string()]));
    assert!(keys_under(&registry, "/fleet-test/units/").await.is_empty(), "units taken back");
    assert_eq!(keys_under(&registry, "/fleet-test/placement/").await, ["/fleet-test/placement/app-250.service"]);
    assert!(keys_under(&registry, "/fleet-test/schedule/").await.is_empty(), "the machine's entries taken back");
}

/// The leading engine reads job records and run tickets from the cluster's cache with its own
/// writes in it, at no request to etcd; a compare that lost to another fleetd's write sends
/// its next read to etcd, which shows that write, and the one after back to the cache.
#[tokio::test]
async fn job_records_are_read_from_the_cache_and_from_etcd_after_a_lost_compare() {
    use fleet_core::job::global_runs::RunTicket;
    use fleet_core::job::runs::JobRecord;
    let etcd = EtcdServer::start();
    let engine = registry(&etcd, Duration::from_secs(10)).await;
    let other = registry(&etcd, Duration::from_secs(10)).await;
    let lease = engine.acquire_leadership("ma").await.unwrap().expect("leads");
    assert!(engine.job_records().await.unwrap().is_empty());
    assert!(engine.put_job_record(&lease, "a.service", Some(&JobRecord::new(1)), 0).await.unwrap());
    let ticket = RunTicket { id: 3, elapse: 4 };
    engine.put_run_ticket(&lease, "g.service", Some(&ticket)).await.unwrap();
    let before = (requests_sent("txn"), requests_sent("range"));
    let stored = engine.job_records().await.unwrap();
    assert_eq!(stored.len(), 1, "its own write, at once: {stored:?}");
    assert_eq!((stored[0].unit.as_str(), &stored[0].record), ("a.service", &JobRecord::new(1)));
    assert_eq!(engine.run_tickets().await.unwrap(), [("g.service".to_string(), ticket)].into());
    let one = ApiRegistry::job_record(&engine, "a.service").await.unwrap();
    assert_eq!(one.as_ref(), stored.first(), "one record, as the API reads it");
    assert_eq!((requests_sent("txn"), requests_sent("range")), before, "read from the cache");
    let ranges = requests_sent("range");
    assert_eq!(ApiRegistry::job_record(&other, "a.service").await.unwrap(), one);
    assert!(requests_sent("range") > ranges, "a fleetd whose cache does not run reads etcd, starting none");
    assert!(other.cluster_cache_running().is_none());

    // Another fleetd (a run started by hand through another member) writes over it; the
    // engine's write over the version it read loses, and its next read is etcd's.
    let version = stored[0].version;
    assert!(other.put_dispatched_run("a.service", &JobRecord::new(2), version).await.unwrap());
    let newer = engine.put_job_record(&lease, "a.service", Some(&JobRecord::new(3)), version).await.unwrap();
    assert!(!newer, "the compare on the version read loses");
    let ranges = requests_sent("range");
    let fresh = engine.job_records().await.unwrap();
    assert!(requests_sent("range") > ranges, "read from etcd after the lost compare");
    assert_eq!(fresh[0].record, JobRecord::new(2), "the other fleetd's write");
    assert!(engine.put_job_record(&lease, "a.service", None, fresh[0].version).await.unwrap());
    let before = (requests_sent("txn"), requests_sent("range"));
    assert!(engine.job_records().await.unwrap().is_empty(), "the removal, at once");
    assert_eq!((requests_sent("txn"), requests_sent("range")), before, "from the cache again");
}

/// The leading engine's snapshot and the API's pages read one decoding of a unit record: the
/// one the cluster's cache keeps with the entry until the record changes.
#[tokio::test]
async fn the_engine_and_the_api_share_a_unit_records_one_decoding() {
    use fleet_registry::UnitRecord;
    let etcd = EtcdServer::start();
    let registry = registry(&etcd, Duration::from_secs(10)).await;
    registry.put_unit("x.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    registry.acquire_leadership("m1").await.unwrap().expect("leads");
    snapshot_shows(&registry, &["x.service"]).await;
    let mirror = registry.engine_mirror();
    let key = registry.keys().unit("x.service");
    let kept = || {
        let data = mirror.read();
        let entry = data.entries.get(&key).expect("the unit in the cache");
        (format!("{:?}", entry.decoded), entry.decoded_listed::<UnitRecord>(&key).expect("decodes"))
    };
    let (after_snapshot, record) = kept();
    assert_eq!(after_snapshot, "Decoded(kept)", "the snapshot decoded it into the cache's entry");
    let page = registry.units_page(every_unit_page()).await.unwrap();
    assert_eq!(page.items[0].hash, record.hash);
    let (_, still) = kept();
    assert!(std::sync::Arc::ptr_eq(&record, &still), "the page read the same decoding, not one of its own");
}

/// `app.service` placed on m1 by a leading engine, with the record that its db runs on m2
/// written first: the registry, the engine's lease, the db's place and the record.
async fn app_placed_on_m1_requiring_db_on_m2(
    etcd: &EtcdServer,
) -> (EtcdRegistry, fleet_registry::EngineLease, fleet_registry::RequiredPlace, fleet_registry::RequiredPlaces) {
    use fleet_registry::{RequiredPlace, RequiredPlaces};
    let registry = registry(etcd, Duration::from_secs(60)).await;
    registry.register_machine(&machine("m1")).await.unwrap();
    registry.put_unit("app.service", &unit(SLEEP), DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
    eventually("the engine's copy has the unit", || async {
        registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)
    })
    .await;
    let db = RequiredPlace { unit: "db.service".into(), machine_id: "m2".into(), public_ip: "10.0.0.2".into() };
    let record = RequiredPlaces { unit: "app.service".into(), machine: "m1".into(), places: vec![db.clone()] };
    registry.record_required_places(&lease, std::slice::from_ref(&record)).await.unwrap();
    let place = Decision::Schedule { unit: "app.service".into(), machine: "m1".into() };
    registry.apply(&lease, &[place], &[]).await.unwrap();
    (registry, lease, db, record)
}

/// A unit placed with where its requirements run recorded for it is in its machine's work
/// only once the machine's copy holds that record: the engine writes the record first, in
/// another range, and etcd may deliver that range's events to the copy later (an app of the
/// dependencies e2e test once started with no `fleet-requires` file). The placement names the
/// record's revision; a copy behind it reads the work as not listed yet.
#[tokio::test]
async fn a_placement_is_read_only_with_the_record_of_where_its_requirements_run() {
    use fleet_registry::{RequiredPlace, RequiredPlaces};
    let etcd = EtcdServer::start();
    let (registry, lease, db, record) = app_placed_on_m1_requiring_db_on_m2(&etcd).await;
    let stored = registry.connection().get("/fleet-test/required-at/m1/app.service", None).await.unwrap();
    let record_revision = stored.kvs()[0].mod_revision();
    let scheduled = registry.connection().get("/fleet-test/schedule/m1/app.service", None).await.unwrap();
    let assignment: super::records::Assignment =
        fleet_registry::codec::decode("schedule", scheduled.kvs()[0].value()).unwrap();
    assert_eq!(assignment.places_at, Some(record_revision), "the placement names the record it follows");
    let work = async || {
        let work = AgentRegistry::machine_work(&registry, "m1").await;
        work.map(|work| work.scheduled.into_iter().map(|unit| unit.required_at).collect::<Vec<_>>())
    };
    eventually("m1's work has the unit with where the db runs", async || {
        work().await.is_ok_and(|units| units == [vec![db.clone()]])
    })
    .await;

    // A placement naming a record the copy does not hold yet (as etcd may deliver it): the
    // work is not read until the copy holds that range that far.
    let ahead = super::records::Assignment { places_at: Some(record_revision + 3), ..assignment };
    let mut kv = registry.connection().kv();
    let written =
        kv.put("/fleet-test/schedule/m1/app.service", fleet_registry::codec::encode(&ahead), None).await.unwrap();
    let written = written.header().unwrap().revision();
    eventually("the copy holds the placement", async || {
        let mirror = registry.work_mirror("m1");
        let data = mirror.read();
        data.entries.get("/fleet-test/schedule/m1/app.service").is_some_and(|entry| entry.mod_revision == written)
    })
    .await;
    assert!(matches!(work().await, Err(RegistryError::NotListedYet)), "{:?}", work().await);
    let moved = RequiredPlace { machine_id: "m3".into(), public_ip: "10.0.0.3".into(), ..db };
    let record = RequiredPlaces { places: vec![moved.clone()], ..record };
    registry.record_required_places(&lease, std::slice::from_ref(&record)).await.unwrap();
    eventually("read once the copy holds the record's range that far", async || {
        work().await.is_ok_and(|units| units == [vec![moved.clone()]])
    })
    .await;
}

#[tokio::test]
async fn a_placement_rewritten_through_the_api_still_names_where_its_requirements_run() {
    use fleet_registry::{RequiredPlace, RequiredPlaces};
    let etcd = EtcdServer::start();
    let (registry, lease, db, record) = app_placed_on_m1_requiring_db_on_m2(&etcd).await;
    // Where the db runs changes after the placement, and the unit is stopped by hand: the
    // API rewrites the placement, which names the record as it now stands.
    let moved = RequiredPlace { machine_id: "m3".into(), public_ip: "10.0.0.3".into(), ..db };
    let record = RequiredPlaces { places: vec![moved.clone()], ..record };
    registry.record_required_places(&lease, std::slice::from_ref(&record)).await.unwrap();
    let stored = registry.connection().get("/fleet-test/required-at/m1/app.service", None).await.unwrap();
    let record_revision = stored.kvs()[0].mod_revision();
    assert!(registry.set_desired_state("app.service", DesiredState::Loaded).await.unwrap());
    let scheduled = registry.connection().get("/fleet-test/schedule/m1/app.service", None).await.unwrap();
    let assignment: super::records::Assignment =
        fleet_registry::codec::decode("schedule", scheduled.kvs()[0].value()).unwrap();
    assert_eq!(assignment.desired, DesiredState::Loaded);
    assert_eq!(assignment.places_at, Some(record_revision), "the rewrite names the record it follows");
    eventually("m1's work has the unit with where the db runs now", async || {
        let work = AgentRegistry::machine_work(&registry, "m1").await;
        work.is_ok_and(|work| work.scheduled.iter().map(|unit| &unit.required_at).eq([&vec![moved.clone()]]))
    })
    .await;
}
