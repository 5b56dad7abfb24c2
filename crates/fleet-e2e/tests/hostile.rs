//! Regressions for what hostile units, hostile requests and resource exhaustion did to a
//! single-machine fleet: real fleetd and fleetctl, the native supervisor, the embedded store.

use std::time::Duration;

use fleet_e2e::{Fleetd, write_unit};

const WAIT: Duration = Duration::from_secs(20);

/// A time span too large for a `Duration` killed the agent task while the lease lived on.
/// Now it is refused at submission with the directive named, and nothing is stored.
#[test]
fn a_time_span_that_does_not_fit_is_refused_at_submission() {
    let fleet = Fleetd::start("e2e0hostile00001", &[]);
    for directive in ["TimeoutStartSec", "RestartSec", "TimeoutStopSec"] {
        let text = format!("[Service]\nExecStart=/bin/sleep 1000\n{directive}=99999999999999999999999\n");
        let path = write_unit(fleet.dir.path(), "huge.service", &text);
        let refused = fleet.fleetctl(&["start", "--no-block", &path]);
        assert_ne!(refused.code, 0, "{refused:?}");
        assert!(
            refused.stderr.contains(&format!("invalid value \"99999999999999999999999\" for {directive}=")),
            "{refused:?}"
        );
    }
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "", "nothing was stored");
    let fine = write_unit(fleet.dir.path(), "fine.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleet.ok(&["start", &fine]);
    fleet.wait_until("the agent still runs units", WAIT, |f| {
        f.unit_rows() == vec![("fine.service".into(), "active".into(), "running".into())]
    });
    assert!(!fleet.log().contains("panicked"), "{}", fleet.log());
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// A second fleetd on the same `state_dir` killed the first one's units before it found the
/// store locked. Now it takes the state directory's lock first and touches nothing.
#[test]
fn a_second_fleetd_on_the_same_state_dir_is_refused_and_touches_nothing() {
    let fleet = Fleetd::start("e2e0hostile00002", &[]);
    let unit = write_unit(fleet.dir.path(), "keep.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleet.ok(&["start", &unit]);
    let before = fleet_e2e::unit_processes(&fleet.state_dir());
    assert_eq!(before.len(), 1);
    let state_dir = fleet.state_dir().display().to_string();
    let (code, log) = Fleetd::start_refused("e2e0hostile00003", &[("state_dir", &state_dir)]);
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains(&format!("state_dir {state_dir} is in use by another fleetd (pid {})", fleet.pid())), "{log}");
    assert_eq!(fleet_e2e::unit_processes(&fleet.state_dir()), before, "the first fleetd's unit still runs");
    assert_eq!(fleet.unit_rows(), vec![("keep.service".into(), "active".into(), "running".into())]);
}

/// fleetd created its files with whatever umask it inherited: a unit's `Environment=SECRET`
/// was readable by any user. Now the state directory is 0700 and its files 0600, the socket
/// is never wider than 0660, and a log path that is a planted link is not followed.
#[test]
fn files_are_private_and_planted_links_are_not_followed() {
    let fleet = Fleetd::start("e2e0hostile00004", &[]);
    let work = fleet.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let unit = format!(
        "[Service]\nEnvironment=SECRET=hunter2\nWorkingDirectory={}\nExecStart=/bin/sh -c 'echo started; touch made-by-unit; exec sleep 1000'\n",
        work.display()
    );
    let path = write_unit(fleet.dir.path(), "secret.service", &unit);
    fleet.ok(&["start", &path]);
    fleet.wait_until("the unit wrote its file", WAIT, |_| work.join("made-by-unit").exists());
    let state = fleet.state_dir();
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("registry.redb")), 0o600);
    assert_eq!(mode(&state.join("fleetd.lock")), 0o600);
    assert_eq!(mode(&state.join("native/logs")), 0o700);
    assert_eq!(mode(&state.join("native/logs/secret.service.log")), 0o600);
    assert_eq!(mode(&fleet.socket()), 0o660);
    assert_eq!(mode(&work.join("made-by-unit")), 0o644, "units get systemd's umask 0022");

    let target = fleet.dir.path().join("root-only");
    std::fs::write(&target, "untouched\n").unwrap();
    std::os::unix::fs::symlink(&target, state.join("native/logs/planted.service.log")).unwrap();
    let planted = write_unit(
        fleet.dir.path(),
        "planted.service",
        "[Service]\nExecStart=/bin/sh -c 'echo leaked; exec sleep 1000'\n",
    );
    fleet.ok(&["start", "--no-block", &planted]);
    fleet.wait_until("fleetd refused the planted log", WAIT, |f| f.log().contains("planted.service.log"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
}
