//! Benchmark: what an idle engine leader asks of etcd. One fleetd on etcd, leading, with no
//! unit, no source and no rollout: once it settled, the requests it sends etcd over a window,
//! by kind, and per second. Every loop of the leader wakes on a watch, so the answer should
//! be the machine's own lease renewals and nothing that polls.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-idle-leader [SECONDS]`

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_e2e::{EtcdServer, Fleetd};

/// The store requests `metrics` counts, by operation.
fn requests(metrics: &str) -> BTreeMap<String, f64> {
    let prefix = "fleet_store_request_duration_seconds_count{";
    metrics
        .lines()
        .filter_map(|line| {
            let labels = line.strip_prefix(prefix)?;
            let (labels, count) = labels.split_once("} ")?;
            let operation = labels.split(',').find_map(|label| label.strip_prefix("operation="))?.trim_matches('"');
            Some((operation.to_string(), count.trim().parse().ok()?))
        })
        .collect()
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(60);
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let fleet = Fleetd::start("bench0idle000001", &[("etcd_servers", endpoint.as_str())]);
    fleet.wait_until("it leads the engine", Duration::from_secs(60), |fleet| {
        fleet.metrics().lines().any(|line| line == "fleet_engine_leader 1")
    });
    // Past its start: the first passes of every loop, the copies listed.
    std::thread::sleep(Duration::from_secs(5));
    let before = requests(&fleet.metrics());
    std::thread::sleep(Duration::from_secs(seconds));
    let after = requests(&fleet.metrics());
    println!("bench-idle-leader: one fleetd leading on etcd, no unit, no source, no rollout, {seconds} s");
    let mut total = 0.0;
    for (operation, count) in &after {
        let sent = count - before.get(operation).copied().unwrap_or(0.0);
        total += sent;
        println!("  {operation}: {sent:.0} requests, {:.2} per second", sent / seconds as f64);
    }
    println!("  every request: {total:.0}, {:.2} per second", total / seconds as f64);
}
