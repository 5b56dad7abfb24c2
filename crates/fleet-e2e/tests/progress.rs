//! A blocking command's progress: drawn on a terminal (a pseudo-terminal made by `script`),
//! absent when the output is not a terminal.

use std::process::Command;

use fleet_e2e::{Fleetd, binary, write_unit};

#[test]
fn start_shows_progress_and_the_unplaceable_reason_only_on_a_terminal() {
    let fleet = Fleetd::start("e2e0progress0001", &[]);
    let dir = tempfile::tempdir().expect("scratch dir");
    let mut units: Vec<String> = (1..=6)
        .map(|n| write_unit(dir.path(), &format!("sleeper{n}.service"), "[Service]\nExecStart=/bin/sleep 1000\n"))
        .collect();
    units.push(write_unit(
        dir.path(),
        "nowhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=nowhere-near-any-machine-of-this-test\n",
    ));
    let endpoint = format!("--endpoint=unix://{}", fleet.socket().display());
    let command = |extra: &str| {
        format!("{} {endpoint} start --block-attempts 2 {extra} {}", binary("fleetctl").display(), units.join(" "))
    };
    // On a terminal: the progress line, with the reason the last unit waits.
    let on_terminal = Command::new("script").args(["-qec", &command(""), "/dev/null"]).output().expect("run script");
    let seen = String::from_utf8_lossy(&on_terminal.stdout).to_string();
    assert!(seen.contains("Unit sleeper1.service launched"), "{seen}");
    assert!(seen.contains("launched 6/7"), "the count of units launched: {seen}");
    // The reason is a line of its own, whole though wider than the terminal's 80 columns.
    let reason = "Unit nowhere.service cannot be scheduled: no machine has metadata \
                  region=nowhere-near-any-machine-of-this-test";
    assert!(seen.contains(reason), "{seen}");
    // Not on a terminal: the original's lines, then the reason (known by then: loaded first,
    // and waited for).
    fleet.ok(&["destroy", "nowhere.service"]);
    fleet.ok(&["load", "--no-block", &units[6]]);
    fleet.wait_until("the engine gave its reason", std::time::Duration::from_secs(30), |fleet| {
        fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout.contains("region=nowhere")
    });
    let piped = fleet.fleetctl(&["start", "--block-attempts", "1", &units[6]]);
    assert_eq!(piped.code, 1);
    assert!(!piped.stderr.contains('\u{1b}') && !piped.stderr.contains("launched 0/1"), "{piped:?}");
    assert!(piped.stderr.contains("timed out waiting for unit nowhere.service"), "{piped:?}");
    assert!(piped.stderr.contains(reason), "{piped:?}");
}
