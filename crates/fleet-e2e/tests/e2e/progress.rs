//! A blocking command's progress: drawn on a terminal (a pseudo-terminal made by `script`),
//! absent when the output is not a terminal; why a unit waits is said either way.

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

/// Regression (issue 68): a piped `fleetctl start` of a unit that fits nowhere blocked forever
/// and said nothing; it says why on stderr as soon as the engine knows, terminal or not.
#[test]
fn a_piped_start_that_blocks_says_why_the_unit_waits() {
    use std::io::{BufRead, BufReader};
    let fleet = Fleetd::start("e2e0progress0002", &[]);
    let dir = tempfile::tempdir().expect("scratch dir");
    let unit = write_unit(
        dir.path(),
        "nowhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=nowhere\n",
    );
    let mut start = Command::new(binary("fleetctl"))
        .args([&format!("--endpoint=unix://{}", fleet.socket().display()), "start", &unit])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fleetctl start");
    let stderr = start.stderr.take().expect("its stderr");
    // Read until the reason comes (or fleetctl ends, which would be a failure too).
    let said = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|line| line.contains("cannot be scheduled"))
        .unwrap_or_default();
    let still_waiting = start.try_wait().expect("its status").is_none();
    let _ = start.kill();
    let _ = start.wait();
    assert_eq!(said, "Unit nowhere.service cannot be scheduled: no machine has metadata region=nowhere");
    assert!(still_waiting, "it still blocks, as asked");
}
