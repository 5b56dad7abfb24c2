//! A bounded chaos run in CI: 75 seconds of faults against a three-member etcd and four
//! fleetds, with units started, replaced and destroyed; no invariant may break. Each run
//! draws a new seed and prints it (`FLEET_CHAOS_SEED=N` replays one); `bench-chaos` runs the
//! same for longer (BENCHMARKS.md).

use std::time::Duration;

use fleet_e2e::chaos::Chaos;

#[test]
fn seventy_five_seconds_of_faults_break_no_invariant() {
    let seed = match std::env::var("FLEET_CHAOS_SEED") {
        Ok(seed) => seed.parse().expect("FLEET_CHAOS_SEED is a number"),
        Err(_) => {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            since.as_secs() ^ u64::from(since.subsec_nanos())
        }
    };
    println!("chaos seed {seed} (replay: FLEET_CHAOS_SEED={seed})");
    let report = Chaos::start(4, seed).run(Duration::from_secs(75));
    println!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.faults.values().sum::<usize>() >= 10, "enough faults were injected: {report}");
    assert!(report.operations.get("start").copied().unwrap_or(0) >= 10, "enough units were started: {report}");
}
