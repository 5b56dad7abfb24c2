//! Benchmark: `fleetctl list-unit-files` and `list-units` of many units on one machine with
//! the embedded store (the etcd store's lists are timed by `bench-cluster`). The units are
//! loaded, not started: each reports a state, and no process runs. Prints its numbers, and
//! how long fleetd then takes to stop.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-lists [COUNT]`

use std::time::Instant;

use fleet_e2e::{Fleetd, bench_instances, peak_resident_mib};

fn main() {
    let count: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let fleet = Fleetd::start("bench0lists00001", &[]);
    let units = tempfile::tempdir().expect("temporary directory");
    bench_instances(units.path(), 1);
    println!("bench-lists: {count} template instances loaded on one machine (embedded store, native supervisor)");
    let loading = Instant::now();
    let range = format!("bench@{{1..{count}}}.service");
    let loaded = fleet.fleetctl_in(units.path(), &["load", "--no-block", &range]);
    assert_eq!(loaded.code, 0, "fleetctl load: {}", loaded.stderr);
    println!("  fleetctl load --no-block {range}: {:.2} s", loading.elapsed().as_secs_f64());
    let settling = Instant::now();
    fleet.wait_until("every unit reports loaded", std::time::Duration::from_secs(600), |fleet| {
        fleet
            .ok(&["list-units", "--no-legend", "--fields", "load"])
            .stdout
            .lines()
            .filter(|line| *line == "loaded")
            .count()
            == count
    });
    println!("  until every unit reported loaded: {:.2} s", settling.elapsed().as_secs_f64());
    for command in ["list-unit-files", "list-units"] {
        for run in 1..=3 {
            let listing = Instant::now();
            let rows = fleet.ok(&[command, "--no-legend"]).stdout.lines().count();
            println!("  fleetctl {command} (run {run}): {rows} rows in {:.2} s", listing.elapsed().as_secs_f64());
            assert_eq!(rows, count, "{command} shows every unit");
        }
    }
    println!("  fleetd memory (VmHWM): {:.0} MiB", peak_resident_mib(fleet.pid()));
    let mut fleet = fleet;
    let stopping = Instant::now();
    fleet.stop_with(libc::SIGTERM);
    println!("  fleetd stopped {:.2} s after SIGTERM", stopping.elapsed().as_secs_f64());
    // Where the stop's time went: the agent's leaving says how long its units took to stop and
    // unload, and their states to be withdrawn.
    if let Some(line) = fleet.log().lines().find(|line| line.contains("units stopped and their states withdrawn")) {
        println!("  the agent's leaving: {}", line.split_once("withdrawn").map_or(line, |(_, rest)| rest).trim());
    }
}
