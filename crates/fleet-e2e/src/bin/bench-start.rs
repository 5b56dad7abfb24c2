//! Benchmark: one machine with the native supervisor; `fleetctl start` of 1,000 template
//! instances, timed until all report active. Prints its numbers.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-start [COUNT]`

use std::time::Instant;

use fleet_e2e::{Fleetd, bench_instances, cpu_seconds};

fn main() {
    let count: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(1000);
    let fleet = Fleetd::start("bench0start00001", &[]);
    let units = tempfile::tempdir().expect("temporary directory");
    let names = bench_instances(units.path(), count);
    let cpu_before = cpu_seconds(fleet.pid());
    let started = Instant::now();
    let mut start = vec!["start"];
    start.extend(names.iter().map(String::as_str));
    fleet.ok(&start);
    let elapsed = started.elapsed();
    let rows = fleet.ok(&["list-units", "--no-legend", "--fields", "active"]).stdout;
    let active = rows.lines().filter(|line| *line == "active").count();
    let cpu = cpu_seconds(fleet.pid()) - cpu_before;
    println!("bench-start: fleetctl start of {count} template instances on one machine (native supervisor)");
    println!("  until all active: {:.2} s", elapsed.as_secs_f64());
    println!("  units reported active afterwards: {active}/{count}");
    println!("  fleetd CPU time during the start: {cpu:.2} s");
    assert_eq!(active, count, "every instance runs");
    let stop = Instant::now();
    let mut stop_args = vec!["destroy".to_string()];
    stop_args.extend((1..=count).map(|n| format!("bench@{n}.service")));
    let stop_args: Vec<&str> = stop_args.iter().map(String::as_str).collect();
    fleet.ok(&stop_args);
    println!("  fleetctl destroy of all {count}: {:.2} s", stop.elapsed().as_secs_f64());
}
