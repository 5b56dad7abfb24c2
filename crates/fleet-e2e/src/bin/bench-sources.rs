//! Benchmark: desired state from git at a size. A real etcd and one fleetd (the engine leader,
//! its agent on the native supervisor); a git repository of N unit files (10,000 by default,
//! all `loaded` by its fleet-desired.conf, so that no process is started for them). Printed:
//! (a) source added → every unit in the cluster, (b) → every unit scheduled, (c) a one-file
//! commit and a signed push webhook → the new unit scheduled (several pushes: each and the
//! slowest), (d) the leader's CPU while the source is fetched every interval with no change.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-sources [UNITS] [PUSHES]`

use fleet_e2e::argument;
use std::time::{Duration, Instant};

use fleet_e2e::webhook::{post, signature};
use fleet_e2e::{EtcdServer, Fleetd, cpu_seconds};
use fleet_testkit::GitRepo;

const UNIT: &str = "[Service]\nExecStart=/bin/sleep 1000\n";
const LIMIT: Duration = Duration::from_secs(600);

/// A field of `fleetctl source status`.
fn status_field(fleet: &Fleetd, field: &str) -> String {
    let status = fleet.ok(&["source", "status", "bench"]).stdout;
    let prefix = format!("{field}:");
    status.lines().find_map(|line| line.strip_prefix(&prefix).map(|value| value.trim().to_string())).unwrap_or_default()
}

/// How many units the API shows placed on a machine.
fn scheduled(fleet: &Fleetd) -> usize {
    fleet.api_units().iter().filter(|unit| unit["machineID"].is_string()).count()
}

fn wait(what: &str, mut done: impl FnMut() -> bool, every: Duration) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < LIMIT, "{what} did not happen within {LIMIT:?}");
        std::thread::sleep(every);
    }
    started.elapsed()
}

fn main() {
    let (units, pushes) = (argument(1, 10_000), argument(2, 5));
    let etcd = EtcdServer::start();
    let secrets = tempfile::tempdir().expect("a secrets dir");
    std::fs::write(secrets.path().join("hook"), "bench-secret\n").expect("the webhook secret");
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let (endpoint, secrets_dir) = (etcd.endpoint(), secrets.path().display().to_string());
    // Room for the pushed units beside the first commit's: a source past its bound changes
    // nothing, and the pushes would wait for units that never come.
    let most_units = (units + pushes).to_string();
    let fleet = Fleetd::start(
        "bebebebe000000000000000000000002",
        &[
            ("etcd_servers", endpoint.as_str()),
            ("api_listen", listen.as_str()),
            ("source_credentials_dir", secrets_dir.as_str()),
            ("unit_manager", "native"),
            ("source_max_units", most_units.as_str()),
        ],
    );
    let repo = GitRepo::new();
    let names: Vec<String> = (0..units).map(|n| format!("units/app-{n:05}.service")).collect();
    let mut files: Vec<(&str, Option<&str>)> = names.iter().map(|name| (name.as_str(), Some(UNIT))).collect();
    files.push(("units/fleet-desired.conf", Some("*.service = loaded\n")));
    let first = repo.commit(&files, "many units");
    println!("git source of {units} unit files into an empty cluster (one etcd, one fleetd)");

    let added = Instant::now();
    fleet.ok(&["source", "add", "--repo", &repo.url(), "--webhook-secret", "hook", "--interval", "15s", "bench"]);
    let expected = units.to_string();
    wait(
        "the first sync",
        || status_field(&fleet, "Commit") == first && status_field(&fleet, "Units").starts_with(&expected),
        Duration::from_millis(50),
    );
    println!("  (a) source added → {units} units in the cluster: {:.2} s", added.elapsed().as_secs_f64());
    wait("every unit scheduled", || scheduled(&fleet) == units, Duration::from_millis(500));
    println!("  (b) source added → {units} units scheduled: {:.2} s", added.elapsed().as_secs_f64());

    let mut latencies = Vec::new();
    for push in 0..pushes {
        let name = format!("pushed-{push}.service");
        let commit = repo.commit(&[(&format!("units/{name}"), Some(UNIT))], "one more");
        let body = format!("{{\"ref\":\"refs/heads/main\",\"after\":\"{commit}\"}}");
        let signed = signature("bench-secret", &body);
        let pushed = Instant::now();
        let (code, answer) =
            post(port, "/fleet/v1/sources/bench/webhook", &[("X-Hub-Signature-256", signed.as_str())], &body);
        assert_eq!(code, 202, "{answer}");
        let path = format!("/fleet/v1/units/{name}");
        let placed = || fleet.api("GET", &path, "").contains("\"machineID\"");
        wait("the pushed unit scheduled", placed, Duration::from_millis(5));
        latencies.push(pushed.elapsed());
    }
    let shown: Vec<String> =
        latencies.iter().map(|latency| format!("{:.0} ms", latency.as_secs_f64() * 1000.0)).collect();
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    println!(
        "  (c) one-file commit + webhook → the new unit scheduled: {} (slowest {:.0} ms)",
        shown.join(", "),
        slowest.as_secs_f64() * 1000.0
    );

    let over = Duration::from_secs(45);
    let before = cpu_seconds(fleet.pid());
    std::thread::sleep(over);
    let share = (cpu_seconds(fleet.pid()) - before) / over.as_secs_f64() * 100.0;
    println!("  (d) fleetd CPU with the source fetched every 15 s, nothing changing: {share:.1}% over {over:?}");
}
