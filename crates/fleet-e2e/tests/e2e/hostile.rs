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

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn journal_over_api(fleet: &Fleetd, unit: &str, lines: usize) -> String {
    let answer = fleet.api("GET", &format!("/fleet/v1/journal/{unit}?lines={lines}"), "");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let journal: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    journal["text"].as_str().unwrap_or_default().to_string()
}

/// Output without a newline took fleetd to 2 GiB resident and `journal?lines=1` returned
/// the whole of it. Lines are now split at 48 KiB and tails read in bounded memory.
#[test]
fn output_without_newlines_keeps_memory_bounded() {
    let fleet = Fleetd::start("e2e0hostile00005", &[]);
    let before = resident_kib(fleet.pid());
    // 256 MiB on one line, then a marker.
    let unit = "[Service]\nExecStart=/bin/sh -c 'head -c 268435456 /dev/zero | tr \"\\\\0\" x; echo; echo done; exec sleep 1000'\n";
    let path = write_unit(fleet.dir.path(), "noline.service", unit);
    fleet.ok(&["start", &path]);
    let mut peak = before;
    fleet.wait_until("the unit printed everything", Duration::from_secs(120), |f| {
        peak = peak.max(resident_kib(f.pid()));
        journal_over_api(f, "noline.service", 1).contains("done")
    });
    assert!(peak < before + 64 * 1024, "fleetd grew from {before} KiB to {peak} KiB");
    let last = journal_over_api(&fleet, "noline.service", 3);
    assert!(last.len() < 2 * 48 * 1024, "three lines of at most 48 KiB each: {} bytes", last.len());
    let logs = fleet.state_dir().join("native/logs");
    let total: u64 = std::fs::read_dir(&logs).unwrap().map(|entry| entry.unwrap().metadata().unwrap().len()).sum();
    assert!(total <= 3 * (4 << 20) + 64 * 1024, "the default rotation keeps three 4 MiB files: {total} bytes");
}

/// Logs were never rotated (545 MB in 20 s from `yes`). They rotate by size now, keeping
/// `unit_log_files` files of at most `unit_log_max_bytes`.
#[test]
fn chatty_units_have_their_logs_rotated() {
    let fleet = Fleetd::start("e2e0hostile00006", &[("unit_log_max_bytes", "256K"), ("unit_log_files", "2")]);
    let path = write_unit(fleet.dir.path(), "chatty.service", "[Service]\nExecStart=/usr/bin/yes fleet\n");
    fleet.ok(&["start", &path]);
    let logs = fleet.state_dir().join("native/logs");
    fleet.wait_until("the log was rotated", WAIT, |_| logs.join("chatty.service.log.1").exists());
    std::thread::sleep(Duration::from_secs(2));
    let names = || {
        let mut names: Vec<String> =
            std::fs::read_dir(&logs).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    // Right after a rotation the current file may not be open again yet: it is opened by the
    // unit's next write. Never more than two files, though.
    fleet.wait_until("the current log and one rotated file", WAIT, |_| {
        let names = names();
        assert!(names.len() <= 2, "{names:?}");
        names == ["chatty.service.log", "chatty.service.log.1"]
    });
    let names = names();
    for name in names {
        let size = std::fs::metadata(logs.join(&name)).unwrap().len();
        assert!(size <= 256 * 1024, "{name}: {size} bytes");
    }
    assert_eq!(journal_over_api(&fleet, "chatty.service", 5).lines().count(), 5);
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count())
}

/// `list-units` rows, or none when this one request failed (the waits poll again; the test
/// asserts the API's answers where it matters, not on every poll of a loaded machine).
fn rows_now(fleet: &Fleetd) -> Vec<String> {
    let ran = fleet.fleetctl(&["list-units", "--no-legend", "--fields", "unit,active"]);
    if ran.code != 0 {
        return Vec::new();
    }
    ran.stdout.lines().map(str::to_string).collect()
}

fn active_now(fleet: &Fleetd) -> usize {
    rows_now(fleet).iter().filter(|row| row.split('\t').any(|cell| cell == "active")).count()
}

/// 1,100 units under the usual soft limit of 1,024 descriptors failed loads and took the API
/// down, still down after a restart. fleetd now raises its own soft limit, holds no
/// descriptor for an idle unit, and keeps answering.
#[test]
fn more_units_than_the_inherited_descriptor_limit() {
    let launcher =
        fleet_e2e::Launcher { prefix: vec!["prlimit".into(), "--nofile=1024:".into(), "--".into()], env: Vec::new() };
    let mut fleet = Fleetd::start_with("e2e0hostile00007", &[], launcher);
    let count = 1_100;
    let instances = fleet_e2e::bench_instances(fleet.dir.path(), count);
    let mut load = vec!["load", "--no-block"];
    load.extend(instances.iter().map(String::as_str));
    fleet.ok(&load);
    fleet.wait_until("every unit is loaded", Duration::from_secs(60), |f| rows_now(f).len() == count);
    let idle = open_descriptors(fleet.pid());
    assert!(idle < 200, "{idle} descriptors open with {count} idle units");
    let mut start = vec!["start", "--no-block"];
    start.extend(instances.iter().map(String::as_str));
    fleet.ok(&start);
    fleet.wait_until("every unit runs", Duration::from_secs(120), |f| active_now(f) == count);
    assert!(open_descriptors(fleet.pid()) > 1024, "more descriptors than the inherited soft limit are in use");
    fleet.ok(&["list-machines"]);
    fleet.stop_with(libc::SIGKILL);
    fleet.launch();
    fleet.wait_until("every unit runs again after a restart", Duration::from_secs(120), |f| active_now(f) == count);
    // Nothing left over from the killed fleetd (its keeper) stops them afterwards.
    std::thread::sleep(Duration::from_secs(3));
    let active = fleet.unit_rows().iter().filter(|(_, active, _)| active == "active").count();
    assert_eq!(active, count, "units still running a while after the restart");
}

/// The PIDs of running processes whose command line is exactly `argv`.
fn pids_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv.iter().flat_map(|arg| arg.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline == wanted))
        .filter(|pid| {
            // Zombies keep their command line for a moment; only running processes count.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        })
        .collect()
}

/// With `Type=forking`, `User=nobody` and a PID file in a directory that user owns, fleetd
/// killed an unrelated root process on stop. A PID is trusted now only if it is the unit's.
#[test]
fn a_pid_file_cannot_make_fleetd_kill_another_process() {
    use std::os::unix::fs::PermissionsExt;
    let fleet = Fleetd::start("e2e0hostile00008", &[]);
    let mut victim = std::process::Command::new("sleep").arg("4242008").spawn().unwrap();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = shared.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let nobody = 65534;
    let path = std::ffi::CString::new(run.display().to_string()).unwrap();
    // SAFETY: chown only reads the NUL-terminated path, which lives until the call returns.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), nobody, nobody) }, 0);
    let pid_file = run.join("daemon.pid");
    let unit = format!(
        "[Service]\nType=forking\nUser=nobody\nPIDFile={pid}\nExecStart=/bin/sh -c 'echo {victim} > {pid}; sleep 1000 &'\n",
        pid = pid_file.display(),
        victim = victim.id()
    );
    let unit = write_unit(fleet.dir.path(), "liar.service", &unit);
    fleet.ok(&["start", &unit]);
    fleet.ok(&["stop", "liar.service"]);
    assert!(victim.try_wait().unwrap().is_none(), "the process the PID file named still runs");
    let journal = fleet.ok(&["journal", "liar.service"]).stdout;
    assert!(journal.contains("which is not one of the unit's processes; ignoring it"), "{journal}");
    victim.kill().unwrap();
    let _ = victim.wait();
}

/// A `setsid` child survived a unit stop, and a child started with `env -i` (or one that set
/// the marker itself) survived a SIGKILL of fleetd and ran twice after the restart. Each
/// unit has its own cgroup now, which none of them can leave.
#[test]
fn unit_processes_cannot_escape_the_supervisor() {
    escapes_end_with_their_unit(Fleetd::start("e2e0hostile00009", &[]), 4242900);
}

/// Regression (issue 67): an `exec:` health check's `setsid` child left its process group and
/// lived on in fleetd's own cgroup, outside the unit's limits, past `destroy` and fleetd's
/// shutdown. A check's command now runs as one of the unit's processes: what it leaves is in
/// the unit's cgroup, and goes with the unit. (The check waits for its `setsid` child, so that
/// the child has left the check's process group before the check ends: every probe leaves one.)
#[test]
fn what_a_health_check_starts_is_the_units_and_goes_with_it() {
    let fleet = Fleetd::start("e2e0hostile0000c", &[]);
    let unit = "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nHealthCheck=exec:/bin/sh -c \"setsid sleep 99124 & wait\"\nHealthCheckInterval=1s\n";
    let path = write_unit(fleet.dir.path(), "checked.service", unit);
    fleet.ok(&["start", "--no-block", &path]);
    let left = || pids_running(&["sleep", "99124"]);
    fleet.wait_until("the check left processes behind", Duration::from_secs(60), |_| left().len() >= 2);
    for pid in left() {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        assert!(cgroup.contains("/checked.service"), "process {pid} is the unit's: {cgroup}");
    }
    fleet.ok(&["destroy", "checked.service"]);
    fleet.wait_until("nothing the check started outlives the unit", Duration::from_secs(60), |_| left().is_empty());
}

/// Where no cgroup v2 hierarchy was mounted (a host of cgroup v1 controllers only), a unit's
/// `setsid` child outlived `fleetctl stop` and ran twice after a restart: units were tracked
/// by process group and environment only. fleetd mounts the hierarchy itself now, so the same
/// escapes end with their unit.
#[test]
fn unit_processes_cannot_escape_where_no_cgroup_v2_was_mounted() {
    let without_cgroup2 = "for mount in $(findmnt -n -t cgroup2 -o TARGET); do umount \"$mount\"; done; \
        if grep -q ' - cgroup2 ' /proc/self/mountinfo; then exit 97; fi; exec \"$@\"";
    let launcher = fleet_e2e::Launcher {
        prefix: ["unshare", "--mount", "--propagation", "private", "sh", "-c", without_cgroup2, "sh"]
            .map(str::to_string)
            .to_vec(),
        env: Vec::new(),
    };
    let fleet = Fleetd::start_with("e2e0hostile0000a", &[], launcher);
    assert!(fleet.log().contains("mounted the cgroup v2 hierarchy"), "{}", fleet.log());
    escapes_end_with_their_unit(fleet, 4242910);
}

/// A unit whose processes leave its process group, its session and its environment: a stop,
/// and fleetd's death, end them all; after a restart each runs once.
fn escapes_end_with_their_unit(mut fleet: Fleetd, base: u32) {
    let n = |offset: u32| (base + offset).to_string();
    let escapes: [[String; 2]; 5] = [
        ["sleep".into(), n(0)],
        ["sleep".into(), n(1)],
        ["/bin/sleep".into(), n(2)],
        ["/bin/sleep".into(), n(3)],
        ["/bin/sleep".into(), n(4)],
    ];
    let unit = format!(
        "[Service]\nExecStart=/bin/sh -c 'setsid sleep {} & env -i /bin/sleep {} & FLEET_NATIVE_SUPERVISOR=forged /bin/sleep {} & setsid -f env -i /bin/sleep {}; exec sleep {}'\n",
        n(1),
        n(2),
        n(3),
        n(4),
        n(0)
    );
    let path = write_unit(fleet.dir.path(), "escape.service", &unit);
    let running =
        |count: usize| escapes.iter().all(|argv| pids_running(&[argv[0].as_str(), argv[1].as_str()]).len() == count);
    fleet.ok(&["start", &path]);
    fleet.wait_until("every escaping process runs", WAIT, |_| running(1));
    fleet.ok(&["stop", "escape.service"]);
    fleet.wait_until("a stop ends them all", WAIT, |_| running(0));

    fleet.ok(&["start", &path]);
    fleet.wait_until("every escaping process runs again", WAIT, |_| running(1));
    fleet.stop_with(libc::SIGKILL);
    fleet.wait_until("fleetd's death ends them all", WAIT, |_| running(0));
    fleet.launch();
    fleet.wait_until("the unit runs again after the restart", WAIT, |_| running(1));
    fleet.ok(&["stop", "escape.service"]);
    fleet.wait_until("a stop after the restart ends them all", WAIT, |_| running(0));
}

/// One unit ignoring SIGTERM with `TimeoutStopSec=infinity` kept every other unit from
/// starting, and SIGTERM of fleetd hung. Stops run apart now and shutdown is bounded.
#[test]
fn a_unit_that_never_stops_blocks_neither_the_agent_nor_shutdown() {
    let mut fleet = Fleetd::start("e2e0hostile00010", &[("shutdown_timeout", "2s")]);
    // The unit says when it ignores SIGTERM: a stop sent before its shell set the trap would
    // end it at once.
    let ignoring = fleet.dir.path().join("ignores-term");
    let stubborn = format!(
        "[Service]\nExecStart=/bin/sh -c 'trap \"\" TERM; touch {}; while :; do sleep 0.1; done'\nTimeoutStopSec=infinity\n",
        ignoring.display()
    );
    let stubborn = write_unit(fleet.dir.path(), "stubborn.service", &stubborn);
    fleet.ok(&["start", &stubborn]);
    fleet.wait_until("the stubborn unit ignores SIGTERM", WAIT, |_| ignoring.exists());
    fleet.ok(&["stop", "--no-block", "stubborn.service"]);
    let other = write_unit(fleet.dir.path(), "other.service", "[Service]\nExecStart=/bin/sleep 4242010\n");
    let started = std::time::Instant::now();
    fleet.ok(&["start", &other]);
    assert!(started.elapsed() < Duration::from_secs(10), "another unit started in {:?}", started.elapsed());
    let started = std::time::Instant::now();
    fleet.stop_with(libc::SIGTERM);
    assert!(started.elapsed() < Duration::from_secs(10), "shutdown took {:?}", started.elapsed());
    let deadline = std::time::Instant::now() + WAIT;
    while !fleet_e2e::unit_processes(&fleet.state_dir()).is_empty() {
        assert!(std::time::Instant::now() < deadline, "nothing outlived fleetd");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fleet.log().contains("units did not stop in time; killing them"), "{}", fleet.log());
}

/// The original's client habits: `submit hello` reads `hello.service` from the working
/// directory (and `sub/web` reads `sub/web.service`), `submit bad.unittype` is refused, and
/// an invalid name is reported in the original's words.
#[test]
fn fleetctl_reads_unit_files_named_without_their_suffix() {
    let fleet = Fleetd::start("e2e0hostile00011", &[]);
    let work = fleet.dir.path().join("work");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    write_unit(&work, "hello.service", "[Service]\nExecStart=/bin/sleep 4242011\n");
    write_unit(&work.join("sub"), "web.service", "[Service]\nExecStart=/bin/sleep 4242012\n");
    write_unit(&work, "bad.unittype", "[Service]\nExecStart=/bin/true\n");
    let submitted = fleet.fleetctl_in(&work, &["submit", "hello", "sub/web"]);
    assert_eq!(submitted.code, 0, "{submitted:?}");
    assert_eq!(submitted.stdout, "Unit hello.service inactive\nUnit web.service inactive\n");
    let cat = fleet.ok(&["cat", "web"]).stdout;
    assert!(cat.contains("ExecStart=/bin/sleep 4242012"), "{cat}");
    let refused = fleet.fleetctl_in(&work, &["submit", "bad.unittype"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("unable to find Unit(bad.unittype.service) in Registry or on filesystem"),
        "{refused:?}"
    );
    let invalid = fleet.fleetctl_in(&work, &["submit", "bad!.service"]);
    assert_eq!(invalid.code, 1);
    assert!(invalid.stderr.contains(": invalid character '!' in unit name\n"), "{invalid:?}");
    assert!(!invalid.stderr.contains("invalid unit name"), "{invalid:?}");
    let template = fleet.fleetctl_in(&work, &["submit", "x@y.device"]);
    assert!(template.stderr.contains(": invalid unit type for template: \"device\"\n"), "{template:?}");
}

/// A `registry.redb` truncated to 0 bytes started as an empty store without a word, and the
/// machine then stopped every unit. fleetd now refuses to start, naming the file and what to
/// do, and leaves the file as it found it.
#[test]
fn a_truncated_store_file_is_refused_at_start() {
    let state = tempfile::tempdir().expect("state dir");
    let store = state.path().join("registry.redb");
    std::fs::write(&store, b"").expect("an empty store file");
    let state_dir = state.path().display().to_string();
    let (code, log) = Fleetd::start_refused("e2e0hostile00009", &[("state_dir", &state_dir)]);
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains(&format!("embedded store {} is empty (0 bytes)", store.display())), "{log}");
    assert!(log.contains("restore it from a backup, or move it aside"), "{log}");
    assert_eq!(std::fs::metadata(&store).expect("still there").len(), 0, "left as it was");
}

/// Unit names that begin with `-` reached `systemctl`'s argument lists, `.service` and
/// `...service` were accepted as names, and `Nice=`, `OOMScoreAdjust=`, `StartLimitBurst=`,
/// `LimitNOFILE=` took `NaN`, `-1` and `1e23`. Each is refused at submission with the
/// original's style of message, and nothing is stored.
#[test]
fn bad_names_and_numbers_are_refused_at_submission() {
    let fleet = Fleetd::start("e2e0hostile0000b", &[]);
    let body = r#"{"desiredState":"loaded","options":[{"section":"Service","name":"ExecStart","value":"/bin/true"}]}"#;
    for (name, says) in [
        ("-foo.service", "unit name cannot start in \\\"-\\\""),
        (".service", "unit name cannot start in \\\".\\\""),
        ("...service", "unit name cannot start in \\\".\\\""),
    ] {
        let answer = fleet.api("PUT", &format!("/fleet/v1/units/{name}"), body);
        assert!(answer.starts_with("HTTP/1.0 400") || answer.starts_with("HTTP/1.1 400"), "{name}: {answer}");
        assert!(answer.contains(says), "{name}: {answer}");
    }
    for (directive, value) in
        [("Nice", "NaN"), ("OOMScoreAdjust", "-1001"), ("StartLimitBurst", "-1"), ("LimitNOFILE", "1e23")]
    {
        let text = format!("[Service]\nExecStart=/bin/sleep 1000\n{directive}={value}\n");
        let path = write_unit(fleet.dir.path(), "numbers.service", &text);
        let refused = fleet.fleetctl(&["start", "--no-block", &path]);
        assert_ne!(refused.code, 0, "{refused:?}");
        assert!(refused.stderr.contains(&format!("invalid value \"{value}\" for {directive}=")), "{refused:?}");
    }
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "", "nothing was stored");
}
