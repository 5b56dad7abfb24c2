//! A bounded chaos run in CI: two minutes of faults from a fixed seed against a three-member
//! etcd and four fleetds, with units started, replaced and destroyed; no invariant may break.
//! `bench-chaos` runs the same for 30 minutes (BENCHMARKS.md).

use std::time::Duration;

use fleet_e2e::chaos::Chaos;

#[test]
fn two_minutes_of_faults_break_no_invariant() {
    let report = Chaos::start(4, 20_261_122).run(Duration::from_secs(120));
    println!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.faults.values().sum::<usize>() >= 10, "enough faults were injected: {report}");
    assert!(report.operations.get("start").copied().unwrap_or(0) >= 10, "enough units were started: {report}");
}
