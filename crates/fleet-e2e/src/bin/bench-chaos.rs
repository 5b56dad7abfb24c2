//! The chaos run as a benchmark: faults drawn from a seed against a three-member etcd and
//! four fleetds on a lab network, units started, replaced and destroyed meanwhile, and the
//! invariants checked from what really runs (see `fleet_e2e::chaos`). Prints the faults
//! injected, the operations done, the invariant violations (target 0), the longest double
//! run and the time to settle after the last fault. Exits 1 on a violation.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-chaos [SECONDS] [SEED] [MACHINES]`

use std::time::Duration;

use fleet_e2e::chaos::Chaos;

const USAGE: &str = "usage: bench-chaos [SECONDS [SEED [MACHINES]]]   (defaults: 1800 s, seed 1, 4 fleetds)";

fn main() -> std::process::ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if arguments.len() > 3 || arguments.iter().any(|argument| argument.parse::<u64>().is_err()) {
        eprintln!("{USAGE}");
        return std::process::ExitCode::from(2);
    }
    let argument = |index: usize, default: u64| arguments.get(index).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (seconds, seed, machines) = (argument(0, 1800), argument(1, 1), argument(2, 4));
    println!(
        "chaos run: {seconds} s, seed {seed}, {machines} fleetds, 3 etcd members; a unit may run twice while a machine is out of touch with etcd and {:?} after",
        Chaos::reaction()
    );
    let report = Chaos::start(machines as usize, seed).run(Duration::from_secs(seconds));
    print!("{report}");
    if report.violations.is_empty() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
}
