//! Benchmark: one machine whose units run under a real systemd (a user instance in a private
//! mount namespace, as in the tests); `fleetctl start` of COUNT template instances, timed
//! until systemd reports all of them active, with the CPU time fleetd spent, then fleetd's
//! CPU while the units run and nothing changes. Prints its numbers.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-systemd [COUNT] [IDLE_SECONDS]`

use std::time::{Duration, Instant};

use fleet_e2e::{Fleetd, Launcher, SystemdUser, bench_instances, cpu_seconds};

/// How many `bench@` units systemd says are active.
fn active_in_systemd(systemd: &SystemdUser) -> usize {
    let output = systemd.systemctl(&["list-units", "--no-legend", "--plain", "--state=active", "bench@*"]);
    String::from_utf8_lossy(&output.stdout).lines().count()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(500);
    let idle_seconds: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(30);
    let systemd = SystemdUser::start();
    let units_directory = systemd.units_directory().display().to_string();
    let config = [("unit_manager", "systemd"), ("systemd_user", "true"), ("units_directory", units_directory.as_str())];
    let launcher = Launcher { prefix: systemd.enter_prefix(), env: systemd.env() };
    let fleet = Fleetd::start_with("bench0systemd001", &config, launcher);
    let units = tempfile::tempdir().expect("temporary directory");
    let names = bench_instances(units.path(), count);

    let cpu_before = cpu_seconds(fleet.pid());
    let started = Instant::now();
    let mut start = vec!["start", "--no-block"];
    start.extend(names.iter().map(String::as_str));
    fleet.ok(&start);
    let deadline = started + Duration::from_secs(600);
    while active_in_systemd(&systemd) < count {
        assert!(Instant::now() < deadline, "not all units became active; fleetd log:\n{}", fleet.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let all_active = started.elapsed();
    let cpu_start = cpu_seconds(fleet.pid()) - cpu_before;
    // fleet's own view catches up from systemd's signals.
    let reported = Instant::now();
    fleet.wait_until("fleet reports every unit active", Duration::from_secs(300), |f| {
        f.ok(&["list-units", "--no-legend", "--fields", "active"]).stdout.lines().filter(|l| *l == "active").count()
            == count
    });
    let fleet_caught_up = reported.elapsed();

    let idle_before = cpu_seconds(fleet.pid());
    std::thread::sleep(Duration::from_secs(idle_seconds));
    let idle_cpu = cpu_seconds(fleet.pid()) - idle_before;

    println!("bench-systemd: fleetctl start --no-block of {count} template instances, systemd user instance");
    println!("  until systemd reports all active: {:.2} s", all_active.as_secs_f64());
    println!("  fleet's list-units all active {:.2} s later", fleet_caught_up.as_secs_f64());
    println!("  fleetd CPU time until all active: {cpu_start:.2} s");
    println!(
        "  fleetd CPU while {count} units run, {idle_seconds} s idle: {idle_cpu:.2} s ({:.2} %)",
        idle_cpu * 100.0 / idle_seconds as f64
    );

    let stop = Instant::now();
    let mut destroy = vec!["destroy".to_string()];
    destroy.extend((1..=count).map(|n| format!("bench@{n}.service")));
    let destroy: Vec<&str> = destroy.iter().map(String::as_str).collect();
    fleet.ok(&destroy);
    let deadline = Instant::now() + Duration::from_secs(300);
    while active_in_systemd(&systemd) > 0 {
        assert!(Instant::now() < deadline, "units still active after destroy");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("  fleetctl destroy of all {count}, until systemd runs none: {:.2} s", stop.elapsed().as_secs_f64());
}
