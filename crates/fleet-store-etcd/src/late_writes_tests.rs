//! Writes that etcd carries out after their writer gave up on them: a create held on its way
//! (its member stalled, or a cut that TCP outlasted) arrives after its answer timed out, and
//! must not bring back a unit destroyed meanwhile.

use std::net::SocketAddr;
use std::time::Duration;

use fleet_core::DesiredState;
use fleet_registry::{ApiRegistry, RegistryError};
use fleet_testkit::{EtcdServer, HoldingProxy, eventually};

use super::keys::destroyed_bucket;
use super::tests::{SLEEP, options, registry, unit};
use super::{EtcdOptions, EtcdRegistry, Lifetimes};

/// One etcd, a store that reaches it through a [`HoldingProxy`] with a short request timeout
/// and writes from its cluster cache's guesses (no read of its own first), and a store that
/// reaches it directly.
struct TwoWriters {
    etcd: EtcdServer,
    proxy: HoldingProxy,
    behind: EtcdRegistry,
    direct: EtcdRegistry,
}

impl TwoWriters {
    async fn start() -> Self {
        let etcd = EtcdServer::start();
        let address: SocketAddr = etcd.endpoint().trim_start_matches("http://").parse().unwrap();
        let proxy = HoldingProxy::start(address).await;
        let options = EtcdOptions {
            endpoints: vec![format!("http://{}", proxy.address)],
            request_timeout: Duration::from_secs(1),
            ..options(&etcd)
        };
        let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(3) };
        let behind = EtcdRegistry::connect(&options, lifetimes).await.unwrap();
        behind.units().await.unwrap();
        eventually("its cluster cache is up", async || behind.current_in_copy("any.service").is_some()).await;
        let direct = registry(&etcd, Duration::from_secs(10)).await;
        Self { etcd, proxy, behind, direct }
    }
}

/// The writes etcd has carried out (reads are not proposed).
const APPLIED: &str = "etcd_server_proposals_applied_total";

#[tokio::test(flavor = "multi_thread")]
async fn a_create_that_etcd_carries_out_after_a_destroy_does_not_bring_the_unit_back() {
    let TwoWriters { etcd, proxy, behind: stalled, direct } = TwoWriters::start().await;
    let file = unit(SLEEP);

    proxy.hold();
    let late = stalled.put_unit("back.service", &file, DesiredState::Launched).await;
    assert!(matches!(late, Err(RegistryError::Unavailable(_))), "the create's answer timed out: {late:?}");
    // Asked again elsewhere (as fleetctl does after a 503), then destroyed: both acknowledged.
    direct.put_unit("back.service", &file, DesiredState::Launched).await.unwrap();
    assert!(direct.destroy_unit("back.service").await.unwrap());
    // Carried out or refused, the held create is a write etcd applies: one more than now.
    let applied = etcd.metric(APPLIED).expect("etcd's metrics");
    proxy.release();
    eventually("etcd applied the held create", async || etcd.metric(APPLIED).is_some_and(|now| now > applied)).await;
    assert!(direct.unit("back.service").await.unwrap().is_none(), "a destroyed unit came back");
}

/// A unit name other than `name` whose destroys fence the same creates (`destroyed/` bucket).
fn neighbour_of(name: &str) -> String {
    (0..)
        .map(|index| format!("neighbour-{index}.service"))
        .find(|neighbour| destroyed_bucket(neighbour) == destroyed_bucket(name))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn units_are_created_at_once_after_a_destroy_the_writers_cache_has_not_seen() {
    // (etcd and the proxy bound, so that they live to the end.)
    let TwoWriters { etcd: _etcd, proxy: _proxy, behind, direct } = TwoWriters::start().await;
    let file = unit(SLEEP);
    let neighbour = neighbour_of("again.service");
    direct.put_unit("again.service", &file, DesiredState::Launched).await.unwrap();
    eventually("the cache holds the unit", async || {
        behind.current_in_copy("again.service").is_some_and(|current| current.record_revision != 0)
    })
    .await;
    // Destroyed elsewhere, then the same name and another of its bucket created here at once:
    // the cache may not hold the destroy yet, and a write it fences is made again from a
    // fresh read rather than refused.
    assert!(direct.destroy_unit("again.service").await.unwrap());
    behind.put_unit(&neighbour, &file, DesiredState::Launched).await.unwrap();
    behind.put_unit("again.service", &file, DesiredState::Loaded).await.unwrap();
    let again = direct.unit("again.service").await.unwrap().expect("created again");
    assert_eq!(again.desired, DesiredState::Loaded);
    assert!(direct.unit(&neighbour).await.unwrap().is_some());
}

fn imported(name: &str) -> fleet_registry::ImportedUnit {
    fleet_registry::ImportedUnit {
        name: name.into(),
        file: unit(SLEEP),
        desired: DesiredState::Launched,
        machine: Some("m1".into()),
    }
}

/// An import that failed fences what it sent before taking it back: a chunk etcd carries out
/// only after that (its answer lost on the way, as for a create above) writes nothing, so the
/// units of an import said to have failed never appear and are never adopted by their machine.
#[tokio::test(flavor = "multi_thread")]
async fn an_import_chunk_etcd_carries_out_after_the_import_gave_up_writes_nothing() {
    let etcd = EtcdServer::start();
    let store = registry(&etcd, Duration::from_secs(10)).await;
    let units = [imported("late-a.service"), imported("late-b.service")];
    let all: Vec<_> = units.iter().collect();
    let (existing, seen_at) = store.existing_units(&all).await.unwrap();
    assert!(existing.is_empty());
    let (chunk, bodies, _) = store.import_chunk(&all, 0, &fleet_registry::Writer::BY_HAND);
    // The chunk's transaction, as it was sent before the import gave up; then the give-up.
    let late = store.chunk_txn(&chunk, &bodies, seen_at);
    let sent: Vec<_> = all.iter().map(|unit| (*unit, 0)).collect();
    store.give_up(&sent).await;
    let reply = store.connection().big_txn(late).await.unwrap();
    let refused = reply
        .op_responses()
        .iter()
        .filter(|response| matches!(response, etcd_client::TxnOpResponse::Txn(inner) if !inner.succeeded()))
        .count();
    assert_eq!(refused, 2, "both units' writes refused");
    for name in ["late-a.service", "late-b.service"] {
        assert!(store.unit(name).await.unwrap().is_none(), "{name} appeared after its import failed");
    }
    let work = fleet_registry::AgentRegistry::machine_work(&store, "m1").await.unwrap();
    assert!(work.scheduled.is_empty(), "the machine was given {:?}", work.scheduled);
}

/// A destroy beside an import's units (a unit whose name shares one's destroy record) between
/// the import's read and its write costs a read, not the import: the units it fenced are seen
/// again and written.
#[tokio::test(flavor = "multi_thread")]
async fn an_import_goes_on_past_a_destroy_beside_its_units() {
    let etcd = EtcdServer::start();
    let store = registry(&etcd, Duration::from_secs(10)).await;
    let units = [imported("kept-a.service"), imported("kept-b.service")];
    let all: Vec<_> = units.iter().collect();
    let (_, seen_at) = store.existing_units(&all).await.unwrap();
    let neighbour = neighbour_of("kept-a.service");
    store.put_unit(&neighbour, &unit(SLEEP), DesiredState::Launched).await.unwrap();
    assert!(store.destroy_unit(&neighbour).await.unwrap());
    let imported = store.import_seen_absent(all, seen_at, &fleet_registry::Writer::BY_HAND).await.unwrap();
    assert_eq!(imported, fleet_registry::Imported::Written);
    for name in ["kept-a.service", "kept-b.service"] {
        let written = store.unit(name).await.unwrap().expect("imported");
        assert_eq!(written.machine_id.as_deref(), Some("m1"));
    }
}
