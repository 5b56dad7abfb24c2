//! A store's format end to end (issue 69): fleetd records the format of a store that records
//! none, and stays out of a store of a format it cannot run on, naming both, before it writes
//! anything: on the embedded store and on etcd.

use std::time::Duration;

use fleet_core::store_format::StoredFormat;
use fleet_e2e::{Cluster, Fleetd};
use fleet_registry::FormatRecord;
use fleet_store_embedded::EmbeddedRegistry;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A store of a later release, which only fleetds of format 2 or later may run on.
const LATER: StoredFormat = StoredFormat { format: 3, oldest_fleetd: 2 };

#[test]
fn fleetd_records_the_embedded_stores_format_and_stays_out_of_a_later_one() {
    let mut fleet = Fleetd::start("e2e0format000001", &[]);
    assert!(fleet.log().contains("recorded the store's format"), "{}", fleet.log());
    fleet.stop_with(libc::SIGTERM);
    let path = fleet.state_dir().join("registry.redb");
    let runtime = runtime();
    let store = EmbeddedRegistry::open(&path).expect("store");
    let left = runtime.block_on(fleet_registry::ApiRegistry::machines(&store)).expect("machines");
    assert!(left.is_empty(), "a clean stop takes the machine out: {left:?}");
    let recorded = runtime.block_on(store.stored_format()).expect("read");
    assert_eq!(recorded, Some(StoredFormat { format: 1, oldest_fleetd: 1 }));
    assert!(runtime.block_on(store.record_format(recorded, LATER)).expect("record"));
    drop(store);

    let (code, log) = fleet.run_refused();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("the store is of format 3, which fleetds of format 2 or later run on; this fleetd is of format 1"),
        "{log}"
    );
    // redb marks its file open and closed, so the bytes move: what is in it does not.
    let store = EmbeddedRegistry::open(&path).expect("store");
    assert_eq!(runtime.block_on(store.stored_format()).expect("read"), Some(LATER), "the format stays the later one");
    let machines = runtime.block_on(fleet_registry::ApiRegistry::machines(&store)).expect("machines");
    assert!(machines.is_empty(), "it never announced itself: {machines:?}");
}

/// The store the cluster's members use, under fleetd's default prefix.
async fn cluster_store(cluster: &Cluster) -> fleet_store_etcd::EtcdRegistry {
    let options = fleet_store_etcd::EtcdOptions {
        endpoints: vec![cluster.etcd.endpoint()],
        key_prefix: "/_coreos.com/fleet/".into(),
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let lifetimes =
        fleet_store_etcd::Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(5) };
    fleet_store_etcd::EtcdRegistry::connect(&options, lifetimes).await.expect("etcd store")
}

#[test]
fn an_etcd_member_too_old_for_the_clusters_format_stays_out() {
    let cluster = Cluster::start(1, |_| Vec::new());
    let member = &cluster.members[0];
    let runtime = runtime();
    let registry = runtime.block_on(cluster_store(&cluster));
    let recorded = runtime.block_on(registry.stored_format()).expect("read");
    assert_eq!(recorded, Some(StoredFormat { format: 1, oldest_fleetd: 1 }), "the first member recorded it");
    assert!(runtime.block_on(registry.record_format(recorded, LATER)).expect("record"));
    let config = cluster.member_config(1);
    let pairs: Vec<(&str, &str)> = config.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let (code, log) = Fleetd::start_refused("e2e0format000002", &pairs);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("staying out of the store: the store is of format 3"), "{log}");
    let machines = member.ok(&["list-machines", "--no-legend", "--full", "--fields", "machine"]).stdout;
    assert!(!machines.contains("e2e0format000002"), "it never announced itself: {machines}");
}
