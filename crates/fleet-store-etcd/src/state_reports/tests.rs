//! Unit states in pages against a real etcd: the switch from one key per unit, what a report
//! costs, what readers see, and the leader's record that every member reads pages.

use std::time::Duration;

use etcd_client::GetOptions;
use fleet_core::store_format::{PAGED_STATES, StoredFormat};
use fleet_registry::{AgentRegistry, ApiRegistry, FormatRecord, StateReport};
use fleet_testkit::{EtcdServer, eventually};

use crate::EtcdRegistry;
use crate::agent_lease::tests::running;
use crate::tests::{keys_under, machine, registry};

const MIXED: StoredFormat = StoredFormat { format: PAGED_STATES, oldest_fleetd: 1 };
const PAGED: StoredFormat = StoredFormat { format: PAGED_STATES, oldest_fleetd: PAGED_STATES };

/// The states every reader of `registry` shows, as (machine, unit) pairs.
async fn listed(registry: &EtcdRegistry) -> Vec<(String, String)> {
    let states = registry.unit_states().await.unwrap();
    states.into_iter().map(|state| (state.machine_id, state.name)).collect()
}

fn pairs(machine: &str, units: &[&str]) -> Vec<(String, String)> {
    units.iter().map(|unit| (machine.to_string(), unit.to_string())).collect()
}

/// How many puts etcd has applied so far (its `etcd_mvcc_put_total`).
fn puts(etcd: &EtcdServer) -> u64 {
    use std::io::{Read, Write};
    let address = etcd.endpoint().trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let line = text.lines().find(|line| line.starts_with("etcd_mvcc_put_total ")).expect("etcd counts its puts");
    line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()).expect("a count") as u64
}

async fn record(registry: &EtcdRegistry, expected: Option<StoredFormat>, new: StoredFormat) {
    assert!(registry.record_format(expected, new).await.unwrap());
    eventually("the copy shows the format", async || {
        let seen = registry.leader_mirror().read().entries.contains_key(&registry.keys().store_format());
        seen && registry.states_paged() == (new.oldest_fleetd >= PAGED_STATES)
    })
    .await;
}

/// While a member of format 1 may run, states are one key each (what it reads); once none
/// may, the next report writes the machine's states as one page and removes its per-unit
/// keys in the same step, and every reader shows the same states throughout.
#[tokio::test]
async fn a_machines_states_become_one_page_once_every_member_reads_pages() {
    let etcd = EtcdServer::start();
    let store = registry(&etcd, Duration::from_secs(30)).await;
    record(&store, None, MIXED).await;
    store.register_machine(&machine("m1")).await.unwrap();
    store.report_states("m1", &[running("m1", "a.service"), running("m1", "b.service")]).await.unwrap();
    assert_eq!(keys_under(&store, "/fleet-test/states/").await.len(), 2, "one key per unit");
    assert!(keys_under(&store, "/fleet-test/unit-states/").await.is_empty());
    assert_eq!(listed(&store).await, pairs("m1", &["a.service", "b.service"]));

    record(&store, Some(MIXED), PAGED).await;
    store.report_states("m1", &[running("m1", "c.service")]).await.unwrap();
    assert!(keys_under(&store, "/fleet-test/states/").await.is_empty(), "the per-unit keys went");
    assert_eq!(keys_under(&store, "/fleet-test/unit-states/").await, ["/fleet-test/unit-states/m1/0"]);
    assert_eq!(listed(&store).await, pairs("m1", &["a.service", "b.service", "c.service"]));
    let one = store.unit_states_page(fleet_registry::PageRequest::everything(), Some("m1")).await.unwrap();
    assert_eq!(one.items.len(), 3, "one machine's states, read by machine");

    // Ten units reported together: one put. A removal rewrites the page without it.
    let before = puts(&etcd);
    let ten: Vec<StateReport> = (0..10).map(|index| running("m1", &format!("u{index}.service"))).collect();
    store.report_states("m1", &ten).await.unwrap();
    assert_eq!(puts(&etcd) - before, 1, "one write for ten states");
    store.report_states("m1", &[StateReport::Remove("a.service".into())]).await.unwrap();
    let shown = listed(&store).await;
    assert_eq!(shown.len(), 12, "{shown:?}");
    assert!(!shown.contains(&("m1".to_string(), "a.service".to_string())));

    // Gone with the machine's session, in either layout.
    store.unregister_machine("m1").await.unwrap();
    eventually("the states went with the machine", async || listed(&store).await.is_empty()).await;
    assert!(keys_under(&store, "/fleet-test/unit-states/").await.is_empty());
}

/// A machine with more units than a page holds spreads them over pages, rewrites only the
/// page a report changes, and drops the pages it no longer needs.
#[tokio::test]
async fn many_units_of_one_machine_take_several_pages_and_a_report_rewrites_one() {
    let etcd = EtcdServer::start();
    let store = registry(&etcd, Duration::from_secs(30)).await;
    record(&store, None, PAGED).await;
    store.register_machine(&machine("m1")).await.unwrap();
    let many: Vec<StateReport> = (0..300).map(|index| running("m1", &format!("u{index:03}.service"))).collect();
    store.report_states("m1", &many).await.unwrap();
    let pages = keys_under(&store, "/fleet-test/unit-states/m1/").await;
    assert_eq!(pages.len(), 4, "{pages:?}");
    eventually("every state is listed", async || listed(&store).await.len() == 300).await;

    let before = puts(&etcd);
    store.report_states("m1", &[running("m1", "u007.service")]).await.unwrap();
    assert_eq!(puts(&etcd) - before, 0, "the same state again writes nothing");
    let mut changed = match running("m1", "u007.service") {
        StateReport::Set(state) => state,
        StateReport::Remove(_) => unreachable!(),
    };
    changed.launched = false;
    store.report_states("m1", &[StateReport::Set(changed)]).await.unwrap();
    assert_eq!(puts(&etcd) - before, 1, "one page rewritten");

    let removals: Vec<StateReport> =
        (0..290).map(|index| StateReport::Remove(format!("u{index:03}.service"))).collect();
    store.report_states("m1", &removals).await.unwrap();
    assert_eq!(keys_under(&store, "/fleet-test/unit-states/m1/").await.len(), 1, "ten states fit one page");
    eventually("ten states are listed", async || listed(&store).await.len() == 10).await;
}

/// The engine leader records that no fleetd of format 1 may run only once no member of
/// format 1 is present.
#[tokio::test]
async fn the_leader_records_pages_only_once_no_member_of_format_one_is_present() {
    let etcd = EtcdServer::start();
    let store = registry(&etcd, Duration::from_secs(30)).await;
    record(&store, None, MIXED).await;
    let mut old = machine("m1");
    old.store_format = 1;
    store.register_machine(&old).await.unwrap();
    let _held = store.api_mirror();
    eventually("the cluster's cache shows the member", async || {
        let cache = store.cluster_cache_running().expect("held");
        let data = cache.read();
        data.synced && data.entries.contains_key(&store.keys().machine("m1"))
    })
    .await;
    assert!(store.raise_oldest_format().await.unwrap(), "a member of format 1 is present");
    assert_eq!(store.stored_format().await.unwrap(), Some(MIXED));

    // Upgraded in place: the member registers again as format 2.
    store.register_machine(&machine("m1")).await.unwrap();
    eventually("the leader records that every member reads pages", async || {
        !store.raise_oldest_format().await.unwrap() && store.stored_format().await.unwrap() == Some(PAGED)
    })
    .await;
    eventually("the members see it", async || store.states_paged()).await;
}

/// A manager restarted takes its agents' pages over under its lease, and keeps writing them.
#[tokio::test]
async fn a_restarted_manager_takes_its_agents_pages_over() {
    let etcd = EtcdServer::start();
    let first = registry(&etcd, Duration::from_secs(30)).await;
    record(&first, None, PAGED).await;
    first.announce_for_agent(&machine("agent")).await.unwrap();
    first.report_states("agent", &[running("agent", "a.service"), running("agent", "b.service")]).await.unwrap();
    assert_eq!(keys_under(&first, "/fleet-test/unit-states/").await, ["/fleet-test/unit-states/agent/0"]);

    let second = registry(&etcd, Duration::from_secs(30)).await;
    eventually("the second sees the format", async || second.states_paged()).await;
    second.announce_for_agent(&machine("agent")).await.unwrap();
    let lease = second.agent_lease().await.unwrap();
    let reply =
        second.connection().get("/fleet-test/unit-states/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert!(reply.kvs().iter().all(|kv| kv.lease() == lease), "the page hangs on the new manager's lease");
    let before = puts(&etcd);
    second.report_states("agent", &[running("agent", "c.service")]).await.unwrap();
    assert_eq!(puts(&etcd) - before, 1, "a page taken over is known: one put, no per-unit removals");
    assert_eq!(listed(&second).await, pairs("agent", &["a.service", "b.service", "c.service"]));
}
