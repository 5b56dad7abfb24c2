//! SIGUSR2 under the native supervisor: fleetd replaces itself in place (same PID) and the
//! next image takes the units over as they run: no unit process restarted, their output still
//! collected, their ends and stops still seen, and the keeper still standing behind them.

use std::collections::BTreeSet;
use std::time::Duration;

use fleet_e2e::{Fleetd, unit_processes};

const WAIT: Duration = Duration::from_secs(30);

fn write_unit(dir: &std::path::Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

fn rows(fleet: &Fleetd) -> BTreeSet<(String, String, String)> {
    fleet.unit_rows().into_iter().collect()
}

/// The highest `tick N` in the unit's journal.
fn last_tick(fleet: &Fleetd) -> u64 {
    let journal = fleet.ok(&["journal", "--lines", "50", "ticker.service"]).stdout;
    journal.lines().filter_map(|line| line.rsplit_once("tick ")?.1.trim().parse().ok()).max().unwrap_or(0)
}

/// The ticker's main process: the shell whose command line counts ticks.
fn ticker_shell(fleet: &Fleetd) -> Option<i32> {
    unit_processes(&fleet.state_dir()).into_iter().find_map(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let shell = cmdline.starts_with(b"/bin/sh") && String::from_utf8_lossy(&cmdline).contains("echo tick");
        shell.then(|| i32::try_from(pid).ok()).flatten()
    })
}

/// The forking unit's daemon.
fn daemon(fleet: &Fleetd) -> Option<i32> {
    unit_processes(&fleet.state_dir()).into_iter().find_map(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (cmdline == b"/bin/sleep\x00100011\x00").then(|| i32::try_from(pid).ok()).flatten()
    })
}

/// Waits until the next image took the units over, `upgrades` being how many it has done by
/// then, and its API answers: it takes the units over before its API listens, and a list
/// asked for in between is refused.
fn took_over(fleet: &Fleetd, upgrades: usize) {
    fleet.wait_until("the next image took the units over", WAIT, |f| {
        f.log().matches("took over the units the previous fleetd handed over").count() == upgrades
    });
    fleet.wait_until("the next image's API answers", WAIT, |f| f.fleetctl(&["list-units", "--no-legend"]).code == 0);
}

/// Sends SIGUSR2 and waits for the next image to have taken the units over, `upgrades`
/// being how many it has done by then.
fn upgrade(fleet: &Fleetd, upgrades: usize) {
    let pid = fleet.pid();
    fleet.signal(libc::SIGUSR2);
    took_over(fleet, upgrades);
    assert_eq!(fleet.pid(), pid, "the same process");
    let running = [("forked", "active", "running"), ("stays", "active", "exited"), ("ticker", "active", "running")];
    let expected: BTreeSet<_> = running
        .iter()
        .map(|(unit, active, sub)| (format!("{unit}.service"), active.to_string(), sub.to_string()))
        .collect();
    fleet.wait_until("the units reported as they run", WAIT, |f| rows(f) == expected);
}

#[test]
fn an_upgrade_in_place_keeps_the_native_units_running_and_supervised() {
    let mut fleet = Fleetd::start("e2e0inplace00001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let ticker = write_unit(
        dir.path(),
        "ticker.service",
        "[Service]\nExecStart=/bin/sh -c 'i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.1; done'\nRestart=always\nRestartSec=100ms\n",
    );
    let stays = write_unit(
        dir.path(),
        "stays.service",
        "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\nExecStop=/bin/sh -c 'echo stopping as asked'\n",
    );
    let forked = write_unit(
        dir.path(),
        "forked.service",
        "[Service]\nType=forking\nExecStart=/bin/sh -c '/bin/sleep 100011 &'\n",
    );
    fleet.ok(&["start", &ticker, &stays, &forked]);
    fleet.wait_until("ticking", WAIT, |f| last_tick(f) >= 3);
    let before = (ticker_shell(&fleet), daemon(&fleet));
    assert!(before.0.is_some() && before.1.is_some(), "{before:?}");

    upgrade(&fleet, 1);
    assert_eq!((ticker_shell(&fleet), daemon(&fleet)), before, "no unit process restarted");
    let seen = last_tick(&fleet);
    fleet.wait_until("the ticker's output still reaches its journal", WAIT, |f| last_tick(f) > seen + 3);

    // Twice: an image that took units over hands them over in turn.
    upgrade(&fleet, 2);
    let seen = last_tick(&fleet);
    fleet.wait_until("the output still reaches its journal after a second upgrade", WAIT, |f| last_tick(f) > seen + 3);

    // The adopted main process is still waited for: killed, it is restarted.
    let main_pid = ticker_shell(&fleet).expect("the ticker's shell runs");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(main_pid, libc::SIGKILL) };
    fleet.wait_until("the ticker restarted after its main process died", WAIT, |f| {
        f.ok(&["journal", "--lines", "200", "ticker.service"]).stdout.contains("Scheduled restart job")
            && last_tick(f) >= 1
    });

    // A stop reaches a unit taken over: its ExecStop runs.
    fleet.ok(&["stop", "stays.service"]);
    fleet.wait_until("the oneshot stopped", WAIT, |f| {
        f.ok(&["journal", "stays.service"]).stdout.contains("stopping as asked")
    });

    // The keeper was handed over too: a fleetd killed outright still leaves nothing running.
    assert!(!unit_processes(&fleet.state_dir()).is_empty());
    fleet.stop_with(libc::SIGKILL);
    let deadline = std::time::Instant::now() + WAIT;
    while !unit_processes(&fleet.state_dir()).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the keeper killed the units: {:?}",
            unit_processes(&fleet.state_dir())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_new_binary_that_does_not_run_is_refused_before_anything_stops() {
    let bin = tempfile::tempdir().unwrap();
    let installed = bin.path().join("fleetd");
    fleet_e2e::install_binary(&installed, &std::fs::read(fleet_e2e::binary("fleetd")).unwrap());
    let fleet = Fleetd::start_from("e2e0inplace00002", &[], fleet_e2e::Launcher::default(), &installed);
    let dir = tempfile::tempdir().unwrap();
    let kept = write_unit(dir.path(), "kept.service", "[Service]\nExecStart=/bin/sleep 100013\n");
    fleet.ok(&["start", &kept]);
    let running = || {
        unit_processes(&fleet.state_dir())
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| line == b"/bin/sleep\x00100013\x00")
            })
            .collect::<Vec<_>>()
    };
    let sleeper = running();
    assert_eq!(sleeper.len(), 1);

    // A release that cannot run here (a broken download, another architecture).
    fleet_e2e::install_binary(&installed, b"#!/bin/sh\nexit 1\n");
    fleet.signal(libc::SIGUSR2);
    fleet.wait_until("the upgrade refused", WAIT, |f| f.log().contains("not upgrading"));
    assert!(fleet.log().contains("--version failed"), "{}", fleet.log());
    assert!(!fleet.log().contains("replacing fleetd in place"), "nothing stopped: {}", fleet.log());
    assert_eq!(running(), sleeper);
    assert_eq!(fleet.ok(&["list-units", "--no-legend"]).stdout.lines().count(), 1, "the API answers on");

    // The real release put in its place: the same process runs it.
    let pid = fleet.pid();
    fleet_e2e::install_binary(&installed, &std::fs::read(fleet_e2e::binary("fleetd")).unwrap());
    fleet.signal(libc::SIGUSR2);
    took_over(&fleet, 1);
    assert_eq!(fleet.pid(), pid);
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
        installed,
        "the process runs the file now at the installed path"
    );
    fleet.wait_until("the unit reported running", WAIT, |f| {
        f.unit_rows() == vec![("kept.service".into(), "active".into(), "running".into())]
    });
    assert_eq!(running(), sleeper, "never restarted");
}
