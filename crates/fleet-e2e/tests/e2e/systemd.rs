//! fleetd handing units to a real systemd: a user instance in a private mount namespace
//! (fleet-testkit's `SystemdUser`), fleetd with `systemd_user = true` inside it, driven by
//! fleetctl. Assertions read systemd's own view (`systemctl --user show`).

use std::time::{Duration, Instant};

use fleet_e2e::{AGENT_TTL_SECONDS, EtcdServer, Fleetd, Launcher, SystemdUser, write_unit};

const WAIT: Duration = Duration::from_secs(20);
const MACHINE: &str = "5d5d5d5d0000000000000000000000aa";

fn fleetd_on(systemd: &SystemdUser) -> Fleetd {
    Fleetd::start_under(systemd, MACHINE)
}

/// Waits until systemd reports `value` for `property` of `unit`.
fn wait_for(systemd: &SystemdUser, unit: &str, property: &str, value: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = systemd.show(unit, property);
        if now == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{unit} {property} is {now:?}, not {value:?}; systemd log:\n{}",
            systemd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn row(fleet: &Fleetd, unit: &str) -> Option<(String, String)> {
    fleet.unit_rows().into_iter().find(|(name, _, _)| name == unit).map(|(_, active, sub)| (active, sub))
}

#[test]
fn units_are_loaded_started_replaced_stopped_and_unloaded_through_systemd() {
    let systemd = SystemdUser::start();
    let mut fleet = fleetd_on(&systemd);
    assert!(fleet.log().contains("using the user's systemd instance as the unit manager"), "{}", fleet.log());
    let dir = tempfile::tempdir().unwrap();
    let hello = write_unit(dir.path(), "hello.service", "[Service]\nExecStart=/bin/sleep 100001\n");

    fleet.ok(&["load", &hello]);
    wait_for(&systemd, "hello.service", "LoadState", "loaded");
    assert_eq!(systemd.show("hello.service", "ActiveState"), "inactive");
    assert_eq!(systemd.show("hello.service", "UnitFileState"), "linked-runtime");
    let file = systemd.units_directory().join("hello.service");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "[Service]\nExecStart=/bin/sleep 100001\n");
    fleet.wait_until("list-units says loaded/inactive", WAIT, |f| {
        row(f, "hello.service") == Some(("inactive".into(), "dead".into()))
    });

    fleet.ok(&["start", "hello.service"]);
    wait_for(&systemd, "hello.service", "SubState", "running");
    fleet.wait_until("list-units says active/running", WAIT, |f| {
        row(f, "hello.service") == Some(("active".into(), "running".into()))
    });
    let first_pid = systemd.show("hello.service", "MainPID");

    // New content: the unit is replaced, systemd runs the new command.
    let hello = write_unit(dir.path(), "hello.service", "[Service]\nExecStart=/bin/sleep 100002\n");
    fleet.ok(&["start", "--replace", &hello]);
    fleet.wait_until("systemd runs the new ExecStart", WAIT, |_| {
        systemd.show("hello.service", "ExecStart").contains("100002")
            && systemd.show("hello.service", "SubState") == "running"
    });
    let replaced_pid = systemd.show("hello.service", "MainPID");
    assert_ne!(first_pid, replaced_pid);

    // fleetd dying does not touch systemd's units; a new fleetd adopts them as they are.
    fleet.stop_with(libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(systemd.show("hello.service", "MainPID"), replaced_pid);
    fleet.launch();
    fleet.wait_until("the restarted fleetd reports the running unit", WAIT, |f| {
        row(f, "hello.service") == Some(("active".into(), "running".into()))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(systemd.show("hello.service", "MainPID"), replaced_pid, "adopted, not restarted");

    fleet.ok(&["stop", "hello.service"]);
    wait_for(&systemd, "hello.service", "ActiveState", "inactive");
    fleet.ok(&["unload", "hello.service"]);
    wait_for(&systemd, "hello.service", "LoadState", "not-found");
    assert!(!file.exists(), "the unit file is removed");
    assert!(!systemd.runtime_dir().join("systemd/user/hello.service").exists(), "the runtime link is removed");
}

#[test]
fn install_sections_enable_peers_and_failures_say_failed_while_the_rest_runs() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    // The original's TestInstallUnit: discovery is wanted by hello through its [Install].
    let hello = write_unit(
        dir.path(),
        "hello.service",
        "[Service]\nExecStart=/bin/sh -c 'echo Hello, World!; exec sleep 100003'\n",
    );
    let discovery = write_unit(
        dir.path(),
        "discovery.service",
        "[Unit]\nPartOf=hello.service\n\n[Service]\nExecStart=/bin/sleep 100004\n\n[Install]\nWantedBy=hello.service\n\n[X-Fleet]\nMachineOf=hello.service\n",
    );
    fleet.ok(&["load", &hello, &discovery]);
    wait_for(&systemd, "discovery.service", "LoadState", "loaded");
    assert_eq!(systemd.show("discovery.service", "ActiveState"), "inactive");
    assert_eq!(systemd.show("discovery.service", "UnitFileState"), "enabled-runtime");
    fleet.ok(&["start", "hello.service"]);
    wait_for(&systemd, "discovery.service", "ActiveState", "active");
    fleet.wait_until("fleet sees discovery active too", WAIT, |f| {
        row(f, "discovery.service") == Some(("active".into(), "running".into()))
    });
    // status and journal come from systemctl and journalctl.
    let status = fleet.ok(&["status", "hello.service"]).stdout;
    assert!(status.contains("Active: active (running)") && status.contains("linked-runtime"), "{status}");
    fleet.wait_until("the unit's output is in its journal", WAIT, |f| {
        f.ok(&["journal", "hello.service"]).stdout.contains("Hello, World!")
    });
    fleet.ok(&["stop", "hello.service"]);
    wait_for(&systemd, "discovery.service", "ActiveState", "inactive");

    // A unit whose process fails, and one whose file systemd refuses.
    let crashing = write_unit(dir.path(), "crashing.service", "[Service]\nExecStart=/bin/false\n");
    let broken = write_unit(dir.path(), "broken.service", "[Service]\nExecStart=relative/path\n");
    let ran = fleet.fleetctl(&["start", "--no-block", &crashing, &broken]);
    assert_eq!(ran.code, 0, "{ran:?}");
    wait_for(&systemd, "crashing.service", "ActiveState", "failed");
    fleet.wait_until("both failures show as failed", WAIT, |f| {
        row(f, "crashing.service").is_some_and(|(active, _)| active == "failed")
            && row(f, "broken.service").is_some_and(|(active, _)| active == "failed")
    });
    assert!(fleet.log().contains("systemd refused to start the unit"), "{}", fleet.log());
    assert!(fleet.log().contains("broken.service"), "{}", fleet.log());
    // fleetd goes on serving and running the others.
    fleet.ok(&["start", "hello.service"]);
    wait_for(&systemd, "hello.service", "SubState", "running");
    assert!(fleet.is_running());
    // Unloading a failed unit resets it: systemd forgets it.
    fleet.ok(&["destroy", "crashing.service"]);
    wait_for(&systemd, "crashing.service", "LoadState", "not-found");
    // A unit fleet enabled is disabled as it goes: its [Install] link goes with it (units
    // without one are not asked about, which saves systemd a search of every unit path).
    let wants = systemd.runtime_dir().join("systemd/user/hello.service.wants/discovery.service");
    assert!(wants.symlink_metadata().is_ok(), "enabled through hello.service.wants");
    fleet.ok(&["destroy", "discovery.service"]);
    wait_for(&systemd, "discovery.service", "LoadState", "not-found");
    assert!(wants.symlink_metadata().is_err(), "the [Install] link is removed with the unit");
}

#[test]
fn a_lost_bus_connection_is_made_again_without_stopping_units() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    let steady = write_unit(dir.path(), "steady.service", "[Service]\nExecStart=/bin/sleep 100005\n");
    fleet.ok(&["start", &steady]);
    wait_for(&systemd, "steady.service", "SubState", "running");
    let pid = systemd.show("steady.service", "MainPID");
    systemd.restart_bus();
    // systemd re-attaches to the new bus; fleetd reconnects on its own.
    let later = write_unit(dir.path(), "later.service", "[Service]\nExecStart=/bin/sleep 100006\n");
    fleet.ok(&["start", &later]);
    wait_for(&systemd, "later.service", "SubState", "running");
    fleet.wait_until("fleet reports both units running", WAIT, |f| {
        row(f, "steady.service") == Some(("active".into(), "running".into()))
            && row(f, "later.service") == Some(("active".into(), "running".into()))
    });
    assert_eq!(systemd.show("steady.service", "MainPID"), pid, "the running unit was never touched");
    assert!(fleet.log().contains("lost the D-Bus connection to systemd"), "{}", fleet.log());
    // State changes still arrive by signal after the reconnect: a stop made outside fleet
    // is seen, and put back.
    systemd.systemctl(&["stop", "steady.service"]);
    fleet.wait_until("fleet starts the unit stopped outside it again", WAIT, |_| {
        systemd.show("steady.service", "SubState") == "running" && systemd.show("steady.service", "MainPID") != pid
    });
    fleet.wait_until("fleet reports the drift", WAIT, |f| {
        f.ok(&["list-units", "--no-legend", "--fields", "unit,drift"]).stdout.contains("stopped outside fleet")
    });
}

/// How a fleetd is kept from acting in [`at_most_once_under`].
enum Silenced {
    Frozen,
    Killed,
}

/// A unit that asked to run at most once, on a machine of an etcd cluster: when its fleetd
/// is frozen or killed, systemd's own fence timer kills it by the time the machine's
/// presence may have lapsed (fleetd cannot); once fleetd is back and its presence holds
/// again, it runs again.
fn at_most_once_under(silenced: Silenced) {
    let systemd = SystemdUser::start();
    let etcd = EtcdServer::start();
    let units = systemd.units_directory().display().to_string();
    let (endpoint, ttl) = (etcd.endpoint(), format!("{AGENT_TTL_SECONDS}s"));
    let config = [
        ("unit_manager", "auto"),
        ("systemd_user", "true"),
        ("units_directory", units.as_str()),
        ("etcd_servers", endpoint.as_str()),
        ("agent_ttl", ttl.as_str()),
        ("etcd_request_timeout", "2"),
    ];
    let mut fleet =
        Fleetd::start_with(MACHINE, &config, Launcher { prefix: systemd.enter_prefix(), env: systemd.env() });
    let dir = tempfile::tempdir().unwrap();
    let once =
        write_unit(dir.path(), "once.service", "[Service]\nExecStart=/bin/sleep 100003\n[X-Fleet]\nAtMostOnce=true\n");
    fleet.ok(&["start", &once]);
    wait_for(&systemd, "once.service", "SubState", "running");

    let silenced_at = Instant::now();
    match silenced {
        Silenced::Frozen => fleet.signal(libc::SIGSTOP),
        Silenced::Killed => {
            fleet.stop_with(libc::SIGKILL);
        }
    }
    wait_for(&systemd, "once.service", "ActiveState", "failed");
    let killed = silenced_at.elapsed();
    println!(
        "AtMostOnce under systemd: the unit killed by systemd's fence timer {killed:?} after fleetd stopped acting"
    );
    assert!(
        killed <= Duration::from_secs(AGENT_TTL_SECONDS) + Duration::from_millis(500),
        "killed {killed:?} after; systemd log:\n{}",
        systemd.log()
    );
    match silenced {
        Silenced::Frozen => fleet.signal(libc::SIGCONT),
        Silenced::Killed => fleet.launch(),
    }
    fleet.wait_until("the unit runs again once the presence holds", WAIT, |f| {
        row(f, "once.service") == Some(("active".into(), "running".into()))
    });
    assert!(!fleet.log().contains("no keeper"), "systemd has one: {}", fleet.log());
}

#[test]
fn a_frozen_fleetd_cannot_keep_an_at_most_once_unit_running_systemd_kills_it() {
    at_most_once_under(Silenced::Frozen);
}

#[test]
fn a_killed_fleetd_leaves_no_at_most_once_unit_running_systemd_kills_it() {
    at_most_once_under(Silenced::Killed);
}

/// A unit's reservation reaches systemd as the limits it left open (a drop-in beside its link);
/// its own limits win; the drop-in goes with the unit.
#[test]
fn a_reservation_reaches_systemd_as_the_limits_the_unit_left_open() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    let reserving = write_unit(
        dir.path(),
        "reserving.service",
        "[Service]\nExecStart=/bin/sleep 100011\n[X-Fleet]\nMemory=64M\nCPU=0.5\n",
    );
    let own = write_unit(
        dir.path(),
        "own.service",
        "[Service]\nExecStart=/bin/sleep 100012\nMemoryMax=96M\n[X-Fleet]\nMemory=64M\nCPU=0.25\n",
    );
    fleet.ok(&["start", &reserving, &own]);
    wait_for(&systemd, "reserving.service", "SubState", "running");
    wait_for(&systemd, "own.service", "SubState", "running");
    assert_eq!(systemd.show("reserving.service", "MemoryMax"), (64u64 << 20).to_string());
    assert_eq!(systemd.show("reserving.service", "CPUQuotaPerSecUSec"), "500ms");
    assert_eq!(systemd.show("own.service", "MemoryMax"), (96u64 << 20).to_string(), "its own limit wins");
    assert_eq!(systemd.show("own.service", "CPUQuotaPerSecUSec"), "250ms", "the limit it left open is its reservation");
    // The unit file systemd runs is the unit as written: the limits come in a drop-in.
    let file = systemd.units_directory().join("reserving.service");
    assert!(!std::fs::read_to_string(&file).unwrap().contains("MemoryMax"));
    let drop_in = systemd.runtime_dir().join("systemd/user/reserving.service.d/50-fleet-reservation.conf");
    assert!(std::fs::read_to_string(&drop_in).unwrap().contains("MemoryMax=67108864"));
    fleet.ok(&["destroy", "reserving.service"]);
    wait_for(&systemd, "reserving.service", "LoadState", "not-found");
    // systemd forgets the unit once its link is gone; the drop-in goes a moment after.
    let drop_in_dir = drop_in.parent().unwrap().to_path_buf();
    fleet_e2e::poll_until("the drop-in goes with the unit", WAIT, || !drop_in_dir.exists(), || fleet.log());
}

#[test]
fn health_checks_probe_units_systemd_runs() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    let (serving, closed) = (fleet_testkit::free_port(), fleet_testkit::free_port());
    let fast = "HealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n";
    let server = fleet_e2e::binary("health-server");
    let web = write_unit(
        dir.path(),
        "web.service",
        &format!(
            "[Service]\nExecStart={} {serving} 200\n[X-Fleet]\nHealthCheck=http://127.0.0.1:{serving}/health\n{fast}",
            server.display()
        ),
    );
    let db = write_unit(
        dir.path(),
        "db.service",
        &format!("[Service]\nExecStart=/bin/sleep 100021\n[X-Fleet]\nHealthCheck=tcp://127.0.0.1:{closed}\n{fast}"),
    );
    let job = write_unit(
        dir.path(),
        "job.service",
        &format!("[Service]\nExecStart=/bin/sleep 100022\n[X-Fleet]\nHealthCheck=exec:/bin/sh -c 'echo fine'\n{fast}"),
    );
    fleet.ok(&["start", &web, &db, &job]);
    wait_for(&systemd, "web.service", "SubState", "running");
    let health = |fleet: &Fleetd| {
        let listed = fleet.ok(&["list-units", "--no-legend", "--fields", "unit,health"]).stdout;
        listed.lines().map(|line| line.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>()
    };
    let wanted = ["db.service unhealthy:", "job.service healthy", "web.service healthy"];
    let deadline = Instant::now() + WAIT;
    loop {
        let now = health(&fleet);
        if now.len() == 3 && now.iter().zip(wanted).all(|(row, want)| row.starts_with(want)) {
            assert!(now[0].contains(&format!("connecting to 127.0.0.1:{closed}")), "{now:?}");
            break;
        }
        assert!(Instant::now() < deadline, "health under systemd: {now:?}; fleetd log:\n{}", fleet.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = fleet.fleetctl(&["status", "web.service"]).stdout;
    assert!(status.contains("Health: healthy"), "{status}");
}

/// A `Type=notify` service with `WatchdogSec=` and no `HealthCheck=` is checked by systemd's
/// watchdog: healthy while it pings, unhealthy once it is late (before systemd kills it),
/// and systemd's `Result=watchdog` after that.
#[test]
fn a_notify_service_is_healthy_while_it_pings_its_watchdog_and_unhealthy_once_it_is_late() {
    let systemd = SystemdUser::start();
    let fleet = fleetd_on(&systemd);
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("pinging");
    std::fs::write(&flag, "").unwrap();
    let pinger = format!(
        "/bin/sh -c 'systemd-notify --ready; while :; do if [ -e {} ]; then systemd-notify WATCHDOG=1; fi; sleep 0.5; done'",
        flag.display()
    );
    let unit = write_unit(
        dir.path(),
        "pinger.service",
        &format!(
            "[Service]\nType=notify\nNotifyAccess=all\nWatchdogSec=9s\nExecStart={pinger}\n[X-Fleet]\nHealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n"
        ),
    );
    fleet.ok(&["start", &unit]);
    wait_for(&systemd, "pinger.service", "SubState", "running");
    let health = |fleet: &Fleetd| fleet.ok(&["list-units", "--no-legend", "--fields", "unit,health"]).stdout;
    // The health column's first word: `healthy`, `unhealthy:` (and the failure), `unknown`.
    let wait_for_health = |want: &str| {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = health(&fleet);
            if now.split_whitespace().nth(1).is_some_and(|word| word.trim_end_matches(':') == want) {
                return now;
            }
            assert!(Instant::now() < deadline, "waiting for {want:?}: {now:?}; fleetd log:\n{}", fleet.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for_health("healthy");
    std::fs::remove_file(&flag).unwrap();
    let late = wait_for_health("unhealthy");
    assert!(late.contains("no watchdog ping for"), "{late}");
    wait_for(&systemd, "pinger.service", "Result", "watchdog");
}

/// Issue 69: `SIGUSR2` exits for an upgrade. The units systemd runs are left running, the
/// machine's presence kept; the next fleetd (the new binary) takes both over, on etcd, without
/// restarting anything: the unit's main process and its start time are the same after.
#[test]
fn an_upgrade_in_place_leaves_the_units_running_and_takes_the_lease_over() {
    let systemd = SystemdUser::start();
    let etcd = EtcdServer::start();
    let units = systemd.units_directory().display().to_string();
    let endpoint = etcd.endpoint();
    let config = [
        ("unit_manager", "auto"),
        ("systemd_user", "true"),
        ("units_directory", units.as_str()),
        ("etcd_servers", endpoint.as_str()),
        ("etcd_request_timeout", "2"),
    ];
    let fleet = Fleetd::start_with(MACHINE, &config, Launcher { prefix: systemd.enter_prefix(), env: systemd.env() });
    let dir = tempfile::tempdir().unwrap();
    let kept = write_unit(dir.path(), "kept.service", "[Service]\nExecStart=/bin/sleep 100007\n");
    fleet.ok(&["start", &kept]);
    wait_for(&systemd, "kept.service", "SubState", "running");
    let (pid, since) = (systemd.show("kept.service", "MainPID"), systemd.show("kept.service", "ActiveEnterTimestamp"));

    let fleetd_pid = fleet.pid();
    fleet.signal(libc::SIGUSR2);
    fleet.wait_until("the next image took the machine's lease over", WAIT, |f| {
        f.log().contains("taking over the machine lease this fleetd holds already")
    });
    assert!(fleet.log().contains("upgrading in place"), "{}", fleet.log());
    assert_eq!(fleet.pid(), fleetd_pid, "replaced in place");
    fleet.wait_until("the next image reports the unit it took over", WAIT, |f| {
        row(f, "kept.service") == Some(("active".into(), "running".into()))
    });
    assert_eq!(systemd.show("kept.service", "MainPID"), pid, "never restarted");
    assert_eq!(systemd.show("kept.service", "ActiveEnterTimestamp"), since, "never restarted");
}

/// A unit's secret under systemd: written 0400 under `credentials_dir` and handed to the unit
/// by a drop-in (in a user instance, which delivers no credentials before systemd 254, as
/// `CREDENTIALS_DIRECTORY`); both go when the unit is destroyed.
#[test]
fn a_units_secret_reaches_it_under_systemd_and_goes_with_it() {
    let systemd = SystemdUser::start();
    let units = systemd.units_directory().display().to_string();
    let credentials = tempfile::tempdir().unwrap();
    let base = credentials.path().display().to_string();
    let config = [
        ("unit_manager", "systemd"),
        ("systemd_user", "true"),
        ("units_directory", units.as_str()),
        ("credentials_dir", base.as_str()),
    ];
    let fleet = Fleetd::start_with(MACHINE, &config, Launcher { prefix: systemd.enter_prefix(), env: systemd.env() });
    let value = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(value.path(), b"systemd-secret-value").unwrap();
    fleet.ok(&["secret", "set", "token", "--from-file", &value.path().display().to_string()]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let unit = write_unit(
        dir.path(),
        "creds.service",
        &format!(
            "[Service]\nExecStart=/bin/sh -c 'cat \"$CREDENTIALS_DIRECTORY/T\" > {}; exec sleep 100025'\n[X-Fleet]\nSecret=token:T\n",
            out.display()
        ),
    );
    fleet.ok(&["start", &unit]);
    wait_for(&systemd, "creds.service", "SubState", "running");
    let deadline = Instant::now() + WAIT;
    while std::fs::read(&out).unwrap_or_default() != b"systemd-secret-value" {
        assert!(Instant::now() < deadline, "the unit did not read its credential: {:?}", std::fs::read_to_string(&out));
        std::thread::sleep(Duration::from_millis(50));
    }
    let drop_in = systemd.runtime_dir().join("systemd/user/creds.service.d/50-fleet-credentials.conf");
    let text = std::fs::read_to_string(&drop_in).expect("the drop-in");
    assert!(text.contains("CREDENTIALS_DIRECTORY="), "{text}");
    assert!(!text.contains("systemd-secret-value"), "the drop-in names the file, not the value");
    let file = credentials.path().join(MACHINE).join("creds.service/T");
    assert!(file.exists());

    fleet.ok(&["destroy", "creds.service"]);
    let deadline = Instant::now() + WAIT;
    while file.exists() || drop_in.exists() {
        assert!(Instant::now() < deadline, "the credential and its drop-in went with the unit");
        std::thread::sleep(Duration::from_millis(50));
    }
}
