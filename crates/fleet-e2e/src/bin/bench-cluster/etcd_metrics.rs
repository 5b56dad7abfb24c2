//! etcd's own counters (its Prometheus `/metrics`): requests by kind and store operations.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

/// Counter name (with the gRPC method for request counters) → value.
pub type Counters = BTreeMap<String, f64>;

fn scrape(address: &str) -> String {
    let Ok(mut stream) = std::net::TcpStream::connect(address) else { return String::new() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let end = labels[start..].find('"')? + start;
    Some(&labels[start..end])
}

/// The raft entries etcd committed: each write request (a put, a transaction that writes, a
/// lease grant), however many keys it writes, is one, and etcd applies them one by one.
pub const PROPOSALS: &str = "etcd_server_proposals_committed_total";

/// Messages received per gRPC method (unary requests and stream messages alike, so a
/// keepalive counts once per renewal), etcd's MVCC operation totals, its committed raft
/// entries and the bytes its clients sent and received.
pub fn read(address: &str) -> Counters {
    let mut counters = Counters::new();
    for line in scrape(address).lines() {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        if let Some(labels) = series.strip_prefix("grpc_server_msg_received_total") {
            if let Some(method) = label(labels, "grpc_method") {
                *counters.entry(format!("grpc {method}")).or_insert(0.0) += value;
            }
        } else if (series.starts_with("etcd_mvcc_") && series.ends_with("_total") && !series.contains('{'))
            || series.starts_with("etcd_network_client_grpc_")
            || series == PROPOSALS
        {
            counters.insert(series.to_string(), value);
        }
    }
    counters
}

/// `after - before`: every store operation counter, and the request kinds that moved.
pub fn delta(before: &Counters, after: &Counters) -> Counters {
    after
        .iter()
        .map(|(name, value)| (name.clone(), value - before.get(name).copied().unwrap_or(0.0)))
        .filter(|(name, moved)| *moved != 0.0 || name.starts_with("etcd_mvcc_"))
        .collect()
}

/// etcd's store size now: keys, revisions kept, and database size (allocated and in use).
pub fn store_size(address: &str) -> Vec<(&'static str, f64)> {
    let text = scrape(address);
    let gauge = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).unwrap_or(0.0)
    };
    vec![
        ("keys", gauge("etcd_debugging_mvcc_keys_total")),
        ("revision", gauge("etcd_debugging_mvcc_current_revision")),
        ("compacted revision", gauge("etcd_debugging_mvcc_compact_revision")),
        ("db size MiB", gauge("etcd_mvcc_db_total_size_in_bytes") / 1_048_576.0),
        ("db in use MiB", gauge("etcd_mvcc_db_total_size_in_use_in_bytes") / 1_048_576.0),
    ]
}
