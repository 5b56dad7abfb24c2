//! Drift on a real systemd (a user instance in a private mount namespace, fleetd inside it):
//! a unit stopped with `systemctl`, or its unit file edited or removed on the machine, is
//! reported and put back; one that keeps drifting is marked and left alone; a unit that ends
//! by itself is not drift; a source set to report only is reported, never corrected. The
//! first test keeps its state in a real etcd, the others in the embedded store.
//! Assertions read systemd's own view (`systemctl --user show`).

use std::time::{Duration, Instant};

use fleet_e2e::{EtcdServer, Fleetd, Launcher, SystemdUser, write_unit};
use fleet_testkit::GitRepo;

const WAIT: Duration = Duration::from_secs(30);
const MACHINE: &str = "6d6d6d6d0000000000000000000000aa";

fn fleetd_on(systemd: &SystemdUser) -> Fleetd {
    fleetd_with_store(systemd, None)
}

/// fleetd in `systemd`'s namespace, on etcd at `etcd` or on the embedded store.
fn fleetd_with_store(systemd: &SystemdUser, etcd: Option<&EtcdServer>) -> Fleetd {
    let units = systemd.units_directory().display().to_string();
    let endpoint = etcd.map(EtcdServer::endpoint);
    let mut config = vec![("unit_manager", "auto"), ("systemd_user", "true"), ("units_directory", units.as_str())];
    if let Some(endpoint) = &endpoint {
        config.push(("etcd_servers", endpoint.as_str()));
    }
    Fleetd::start_with(MACHINE, &config, Launcher { prefix: systemd.enter_prefix(), env: systemd.env() })
}

/// Waits until `check` holds of systemd's view.
fn wait_for(systemd: &SystemdUser, what: &str, check: impl Fn(&SystemdUser) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check(systemd) {
        assert!(Instant::now() < deadline, "timed out waiting until {what}; systemd log:\n{}", systemd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn running(systemd: &SystemdUser, unit: &str) -> bool {
    systemd.show(unit, "SubState") == "running"
}

/// What `list-units` says of `unit`'s drift ("-" when none).
fn drift(fleet: &Fleetd, unit: &str) -> String {
    fleet
        .ok(&["list-units", "--no-legend", "--fields", "unit,drift"])
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix(unit).map(|rest| rest.trim().to_string()))
        .unwrap_or_default()
}

/// Stops `unit` behind fleet's back and waits until fleet has started it again: a new
/// main process.
fn stop_and_see_it_corrected(systemd: &SystemdUser, unit: &str) {
    let before = systemd.show(unit, "MainPID");
    let stopped = systemd.systemctl(&["stop", unit]);
    assert!(stopped.status.success(), "{stopped:?}");
    wait_for(systemd, "fleet starts the stopped unit again", |systemd| {
        running(systemd, unit) && systemd.show(unit, "MainPID") != before
    });
}

#[test]
fn stopped_edited_and_removed_units_are_put_back_and_one_that_keeps_drifting_is_left_marked() {
    let etcd = EtcdServer::start();
    let systemd = SystemdUser::start();
    let fleet = fleetd_with_store(&systemd, Some(&etcd));
    let dir = tempfile::tempdir().unwrap();
    let steady = write_unit(dir.path(), "steady.service", "[Service]\nExecStart=/bin/sleep 700001\n");
    fleet.ok(&["start", &steady]);
    wait_for(&systemd, "steady runs", |systemd| running(systemd, "steady.service"));

    // systemctl stop: reported and started again.
    stop_and_see_it_corrected(&systemd, "steady.service");
    fleet.wait_until("list-units reports the correction", WAIT, |fleet| {
        drift(fleet, "steady.service").starts_with("stopped outside fleet; corrected (1 of 3")
    });
    let listed = fleet.fleetctl(&["list-units"]);
    assert!(listed.stderr.contains("1 unit(s) drifted on their machines"), "{listed:?}");

    // The unit file edited in place, and picked up by systemd: fleet's content comes back.
    let file = systemd.units_directory().join("steady.service");
    let pid = systemd.show("steady.service", "MainPID");
    std::fs::write(&file, "[Service]\nExecStart=/bin/sleep 7999999\n").unwrap();
    systemd.systemctl(&["daemon-reload"]);
    fleet.wait_until("fleet writes its unit file back", WAIT, |_| {
        std::fs::read_to_string(&file).is_ok_and(|text| text.contains("700001"))
            && systemd.show("steady.service", "ExecStart").contains("700001")
            && running(&systemd, "steady.service")
            && systemd.show("steady.service", "MainPID") != pid
    });
    fleet.wait_until("list-units says the file was changed", WAIT, |fleet| {
        drift(fleet, "steady.service").starts_with("unit file changed on the machine; corrected (2 of 3")
    });

    // Removed: written again.
    std::fs::remove_file(&file).unwrap();
    fleet.wait_until("fleet writes the removed unit file again", WAIT, |_| file.exists());
    wait_for(&systemd, "it runs again", |systemd| running(systemd, "steady.service"));

    // A fourth drift within ten minutes: left as it is, and marked.
    let stopped = systemd.systemctl(&["stop", "steady.service"]);
    assert!(stopped.status.success(), "{stopped:?}");
    fleet.wait_until("list-units says fleet gave up on it", WAIT, |fleet| {
        drift(fleet, "steady.service").starts_with("stopped outside fleet; left as is after 3 corrections")
    });
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(systemd.show("steady.service", "ActiveState"), "inactive", "not started a fourth time");
    assert!(fleet.log().contains("unit drifted from what fleet made it"), "{}", fleet.log());
    assert!(fleet.metrics().contains("fleet_agent_drift_corrections_total 3"), "{}", fleet.metrics());

    // Asking for it again (stop, start) gives it a fresh budget.
    fleet.ok(&["stop", "steady.service"]);
    fleet.ok(&["start", "steady.service"]);
    wait_for(&systemd, "it runs again", |systemd| running(systemd, "steady.service"));
    stop_and_see_it_corrected(&systemd, "steady.service");
}

#[test]
fn units_that_end_by_themselves_are_not_drift() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    let runs = |unit: &str| {
        std::fs::read_to_string(dir.path().join(format!("{unit}.runs"))).map_or(0, |text| text.lines().count())
    };
    let log = |unit: &str| format!("echo ran >> {}/{unit}.runs", dir.path().display());
    let once = write_unit(
        dir.path(),
        "once.service",
        &format!("[Service]\nType=oneshot\nExecStart=/bin/sh -c '{}'\n", log("once")),
    );
    let quits = write_unit(
        dir.path(),
        "quits.service",
        &format!("[Service]\nExecStart=/bin/sh -c '{}; sleep 1'\n", log("quits")),
    );
    fleet.ok(&["start", "--no-block", &once, &quits]);
    wait_for(&systemd, "both ran and ended", |systemd| {
        runs("once") == 1
            && runs("quits") == 1
            && systemd.show("once.service", "ActiveState") == "inactive"
            && systemd.show("quits.service", "ActiveState") == "inactive"
    });
    // Past a fallback reconcile (5 s): neither was started again nor reported.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!((runs("once"), runs("quits")), (1, 1), "started again:\n{}", fleet.log());
    assert_eq!(drift(&fleet, "once.service"), "-");
    assert_eq!(drift(&fleet, "quits.service"), "-");
}

#[test]
fn a_source_that_reports_only_says_so_and_changes_nothing() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let repo = GitRepo::new();
    let commit = repo.commit(&[("units/watched.service", Some("[Service]\nExecStart=/bin/sleep 700002\n"))], "first");
    let url = repo.url();
    fleet.ok(&["source", "add", "--repo", &url, "--interval", "1s", "--drift", "report", "watched"]);
    fleet.wait_until("the source synced", WAIT, |fleet| {
        fleet.ok(&["source", "status", "watched"]).stdout.contains(&format!("Commit:    {commit}"))
    });
    wait_for(&systemd, "the source's unit runs", |systemd| running(systemd, "watched.service"));
    let status = fleet.ok(&["source", "status", "watched"]).stdout;
    assert!(status.contains("Drift:     reported only"), "{status}");

    let stopped = systemd.systemctl(&["stop", "watched.service"]);
    assert!(stopped.status.success(), "{stopped:?}");
    fleet.wait_until("the drift is reported", WAIT, |fleet| {
        drift(fleet, "watched.service") == "stopped outside fleet; reported only"
    });
    fleet.wait_until("source status lists it", WAIT, |fleet| {
        fleet
            .ok(&["source", "status", "watched"])
            .stdout
            .contains("Drifted:   watched.service on 6d6d6d6d0000000000000000000000aa: stopped outside fleet")
    });
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(systemd.show("watched.service", "ActiveState"), "inactive", "report only: not started again");
}
