//! A single-machine fleet, end to end: real fleetd on the embedded store with the native
//! supervisor, driven by the real fleetctl.

use std::path::Path;
use std::time::Duration;

use fleet_e2e::{Fleetd, examples_dir, unit_processes};

fn example(name: &str) -> String {
    examples_dir().join(name).display().to_string()
}

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn a_unit_that_never_becomes_active_fails_the_start_after_two_quiet_seconds() {
    let fleet = Fleetd::start("e2e0neveractive1", &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.service");
    std::fs::write(&path, "[Service]\nExecStart=/bin/false\n").unwrap();
    let ran = fleet.fleetctl(&["start", &path.display().to_string()]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(
        ran.stderr
            .contains("Error waiting for units: Failed to find an active unit never.service within 2s, err: unit is "),
        "{ran:?}"
    );
    assert!(
        ran.stderr
            .contains("\nError waiting for systemd unit states, err: Failed to find an active unit never.service"),
        "the original's second line: {ran:?}"
    );
}

#[test]
fn hello_runs_and_stops() {
    let fleet = Fleetd::start("e2e0hello0000001", &[]);
    let started = fleet.ok(&["start", &example("hello.service")]);
    assert_eq!(started.stdout, "Unit hello.service inactive\nUnit hello.service launched on e2e0hell.../127.0.0.1\n");
    // The original's table, and beneath it on stderr which machine leads (issue 68).
    let machines = fleet.fleetctl(&["list-machines"]);
    assert_eq!(machines.stdout, "MACHINE\t\tIP\t\tMETADATA\ne2e0hell...\t127.0.0.1\t-\n");
    assert_eq!(machines.stderr, "Engine leader: e2e0hell... (-o wide shows more)\n");
    assert_eq!(fleet.fleetctl(&["list-machines", "--no-legend"]).stderr, "", "scripts get the table alone");
    // A reader that stops early ends fleetctl quietly (it panicked on the broken pipe): here
    // a pipe whose reader is gone before fleetctl writes.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let piped = std::process::Command::new(fleet_e2e::binary("fleetctl"))
        .arg(format!("--endpoint=unix://{}", fleet.socket().display()))
        .arg("list-machines")
        .stdout(writer)
        .output()
        .expect("fleetctl");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(piped.status.code(), Some(141), "{stderr}");
    assert_eq!(fleet.unit_rows(), vec![("hello.service".into(), "active".into(), "running".into())]);
    assert_eq!(unit_processes(&fleet.state_dir()).len(), 2, "sh and its sleep run under the supervisor");
    let table = fleet.ok(&["list-units"]).stdout;
    assert_eq!(table, "UNIT\t\tMACHINE\t\t\tACTIVE\tSUB\nhello.service\te2e0hell.../127.0.0.1\tactive\trunning\n");
    fleet.wait_until("the journal shows the greeting", WAIT, |f| {
        f.ok(&["journal", "hello.service"]).stdout.contains("Hello, World!")
    });
    let status = fleet.ok(&["status", "hello.service"]).stdout;
    assert!(status.contains("Active: active (running) since "), "{status}");
    // The native supervisor's report, in systemctl status's words.
    assert!(status.contains("   Main PID: ") && status.contains(" (sh)\n"), "{status}");
    assert!(status.contains("Hello, World!"), "the log's last lines: {status}");
    let stopped = fleet.ok(&["stop", "hello.service"]);
    assert_eq!(stopped.stderr, "Successfully stopped units [hello.service].\n");
    assert!(unit_processes(&fleet.state_dir()).is_empty(), "stop kills the unit's processes");
    assert_eq!(fleet.unit_rows(), vec![("hello.service".into(), "inactive".into(), "dead".into())]);
    let status = fleet.fleetctl(&["status", "hello.service"]);
    assert_eq!(status.code, 3, "a unit that is not active exits as systemctl status does: {status:?}");
    let again = fleet.fleetctl(&["stop", "hello.service"]);
    assert_eq!(again.code, 0, "a loaded unit is already stopped: {again:?}");
    fleet.ok(&["unload", "hello.service"]);
    let inactive = fleet.fleetctl(&["stop", "hello.service"]);
    assert_eq!((inactive.code, inactive.stderr.as_str()), (1, "Unable to stop unit hello.service in state inactive\n"));
    assert_eq!(fleet.ok(&["destroy", "hello.service"]).stdout, "Destroyed hello.service\n");
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "");
}

#[test]
fn templates_cycles_order_and_cat() {
    let fleet = Fleetd::start("e2e0templates001", &[]);
    let instances: Vec<String> = (1..=9).map(|n| example(&format!("hello@{n}.service"))).collect();
    let args: Vec<&str> = std::iter::once("submit").chain(instances.iter().map(String::as_str)).collect();
    fleet.ok(&args);
    let files = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,dstate"]).stdout;
    assert_eq!(files.lines().count(), 9, "{files}");
    assert!(files.lines().all(|line| line.ends_with("inactive")));
    // As the original: a description is shown as written, its specifiers not expanded
    // (issue 68 asked; the original's `desc` is the unit file's value as is).
    let described = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,desc"]).stdout;
    assert!(described.lines().any(|line| line == "hello@1.service\tHello instance %i"), "{described}");
    // Loaded, then started, then stopped, then unloaded, then destroyed: twice.
    for _ in 0..2 {
        fleet.ok(&["load", &example("hello@1.service"), &example("hello@2.service")]);
        fleet.wait_until("two units are loaded", WAIT, |f| f.unit_rows().len() == 2);
        fleet.ok(&["start", "hello@1", "hello@2"]);
        assert!(fleet.unit_rows().iter().all(|(_, active, _)| active == "active"));
        // `status` reads as systemctl status: the name's specifiers expanded.
        let status = fleet.ok(&["status", "hello@1"]).stdout;
        assert!(status.starts_with("● hello@1.service - Hello instance 1\n"), "{status}");
        fleet.ok(&["restart", "hello@1", "hello@2"]);
        assert!(fleet.unit_rows().iter().all(|(_, active, _)| active == "active"));
        fleet.ok(&["stop", "hello@1", "hello@2"]);
        fleet.ok(&["unload", "hello@1", "hello@2"]);
        assert!(fleet.unit_rows().is_empty());
    }
    let cat = fleet.ok(&["cat", "hello@3.service"]).stdout;
    let template = std::fs::read_to_string(examples_dir().join("hello@.service")).unwrap();
    assert_eq!(cat.trim(), template.trim());
    let names: Vec<String> =
        fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit"]).stdout.lines().map(str::to_string).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let destroy: Vec<&str> = std::iter::once("destroy").chain(instances.iter().map(String::as_str)).collect();
    fleet.ok(&destroy);
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "");
}

#[test]
fn replace_changes_the_stored_unit() {
    let fleet = Fleetd::start("e2e0replace00001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("changing.service");
    std::fs::write(&path, "[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    let unit = path.display().to_string();
    fleet.ok(&["start", &unit]);
    std::fs::write(&path, "[Service]\nExecStart=/bin/sleep 2000\n").unwrap();
    let warned = fleet.ok(&["start", &unit]);
    assert!(warned.stderr.contains("differs from local unit file"), "{warned:?}");
    assert!(fleet.ok(&["cat", "changing.service"]).stdout.contains("sleep 1000"));
    // Unit writes: one unit's PUT, or a batch (fleetctl sends batches to fleetd).
    let writes = || {
        let log = fleet.log();
        log.matches("method=PUT path=\"/fleet/v1/units/changing.service\"").count()
            + log.matches("method=POST path=\"/fleet/v1/units\"").count()
    };
    let before = writes();
    let replaced = fleet.ok(&["start", "--replace", &unit]);
    // One write carries the new version and its desired state: the old version runs until the
    // new one is asked for, so a replace cut short never leaves the unit stopped.
    assert_eq!(writes(), before + 1, "{replaced:?}");
    assert!(!replaced.stdout.contains("inactive"), "{replaced:?}");
    assert!(replaced.stdout.contains("Unit changing.service launched"), "{replaced:?}");
    assert!(fleet.ok(&["cat", "changing.service"]).stdout.contains("sleep 2000"));
    fleet.wait_until("the new version runs", WAIT, |f| {
        f.unit_rows() == vec![("changing.service".into(), "active".into(), "running".into())]
    });
    let same = fleet.ok(&["submit", "--replace", &unit]);
    assert_eq!(same.stdout, "Found same Unit(changing.service) in Registry, nothing to do\n");
}

#[test]
fn malformed_units_are_refused_and_nothing_is_stored() {
    let fleet = Fleetd::start("e2e0malformed001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.service");
    std::fs::write(&bad, "[Service]\nExecStart=/bin/true\nthis is not an option\n").unwrap();
    let ran = fleet.fleetctl(&["start", &bad.display().to_string()]);
    assert_eq!(ran.code, 1);
    assert!(ran.stderr.contains("bad.service: line 3: expected \"Name=Value\""), "{ran:?}");
    let combo = dir.path().join("combo.service");
    std::fs::write(&combo, "[Service]\nExecStart=/bin/true\n[X-Fleet]\nMachineID=abc\nGlobal=true\n").unwrap();
    let ran = fleet.fleetctl(&["submit", &combo.display().to_string()]);
    assert_eq!(ran.code, 1);
    assert!(ran.stderr.contains("MachineID cannot be used with Global"), "{ran:?}");
    let scheduled = dir.path().join("nightly.service");
    std::fs::write(&scheduled, "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=Mon *-*-* 25:00\n")
        .unwrap();
    let ran = fleet.fleetctl(&["submit", &scheduled.display().to_string()]);
    assert_eq!(ran.code, 1);
    assert!(
        ran.stderr.contains("invalid value \"Mon *-*-* 25:00\" for [X-Fleet] Schedule: the hour 25 is outside 0..23"),
        "{ran:?}"
    );
    let missing = fleet.fleetctl(&["start", "nowhere.service"]);
    assert_eq!(
        (missing.code, missing.stderr.as_str()),
        (1, "Error creating units: unable to find Unit(nowhere.service) in Registry or on filesystem\n")
    );
    let template = fleet.fleetctl(&["start", &example("hello@.service")]);
    assert_eq!(template.code, 1);
    assert!(template.stderr.contains("cannot activate template \"hello@.service\""), "{template:?}");
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit"]).stdout, "hello@.service\n");
}

/// Regression (issue 68): typos in a unit file were stored silently and the unit failed with
/// "unit is failed/failed". They are still stored, as the original did, but submission warns
/// with the option meant, and `status` names what is unknown.
#[test]
fn typos_in_a_unit_file_are_warned_about_with_the_option_meant() {
    let fleet = Fleetd::start("e2e0typos0000001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.service");
    std::fs::write(
        &typo,
        "[Service]\nExecStrat=/bin/sleep 1000\n[Servce]\nUser=nobody\n[X-Fleet]\nMachineMetdata=zone=a\n",
    )
    .unwrap();
    let submitted = fleet.fleetctl(&["submit", &typo.display().to_string()]);
    assert_eq!(submitted.code, 0, "still accepted: {submitted:?}");
    assert_eq!(
        submitted.stderr,
        "Unit typo.service: unknown option ExecStrat= in [Service], which systemd ignores; did you mean ExecStart=?\n\
         Unit typo.service: unknown section [Servce], which systemd ignores; did you mean [Service]?\n\
         Unit typo.service: unrecognized requirement in [X-Fleet] section: \"MachineMetdata\"; did you mean \"MachineMetadata\"?\n"
    );
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit"]).stdout, "typo.service\n");
    // A metadata requirement without its value is ignored, as the original does: said so.
    let loose = dir.path().join("loose.service");
    std::fs::write(&loose, "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=role\n").unwrap();
    let submitted = fleet.fleetctl(&["submit", &loose.display().to_string()]);
    assert_eq!(
        (submitted.code, submitted.stderr.as_str()),
        (
            0,
            "Unit loose.service: metadata requirement \"role\" is not one key=value, and is ignored (as the original does): it does not restrict where the unit runs\n"
        ),
        "{submitted:?}"
    );
    fleet.ok(&["start", "--no-block", "loose.service"]);
    fleet.wait_until("loose.service runs", WAIT, |fleet| {
        fleet.ok(&["list-units", "--no-legend", "--fields", "unit,active"]).stdout.contains("loose.service\tactive")
    });
    let status = fleet.ok(&["status", "-o", "json", "loose.service"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).expect("json");
    assert_eq!(
        status[0]["unknownOptions"][0],
        "metadata requirement \"role\" is not one key=value, and is ignored (as the original does): it does not restrict where the unit runs",
        "{status}"
    );
    fleet.ok(&["destroy", "loose.service"]);
    // Submitted again unchanged: nothing is written, nothing said again.
    let again = fleet.fleetctl(&["submit", &typo.display().to_string()]);
    assert_eq!((again.code, again.stderr.as_str()), (0, ""), "{again:?}");
    let started = fleet.fleetctl(&["start", "--no-block", "typo.service"]);
    assert_eq!(started.code, 0, "{started:?}");
    fleet.wait_until("the unit without ExecStart= fails", WAIT, |fleet| {
        fleet.ok(&["list-units", "--no-legend", "--fields", "unit,active"]).stdout.contains("failed")
    });
    let status = fleet.fleetctl(&["status", "typo.service"]);
    assert!(
        status.stdout.contains(
            "   Warning: unknown option ExecStrat= in [Service], which systemd ignores; did you mean ExecStart=?\n"
        ),
        "{status:?}"
    );
    let json = fleet.fleetctl(&["status", "-o", "json", "typo.service"]);
    let json: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(json[0]["unknownOptions"].as_array().map(Vec::len), Some(3), "{json}");
}

#[test]
fn usage_errors_and_version() {
    let fleet = Fleetd::start("e2e0usage0000001", &[]);
    for args in [&["bogus"][..], &["list-units", "--bogus"], &["cat"], &["destroy"]] {
        assert_eq!(fleet.fleetctl(args).code, 2, "{args:?}");
    }
    let version = fleet.ok(&["version"]).stdout;
    // The original's line first; then the commit and the store format (issue 69).
    let lines: Vec<&str> = version.lines().collect();
    assert_eq!(lines[0], format!("fleetctl version {}", env!("CARGO_PKG_VERSION")));
    assert!(
        lines[1].starts_with("commit ") && lines[2] == format!("store format {}", fleet_core::store_format::CURRENT),
        "{version}"
    );
    assert_eq!(fleet.ok(&["list-units", "--version"]).stdout, version);
    assert!(fleet.ok(&["help"]).stdout.contains(env!("CARGO_PKG_VERSION")));
    assert!(!fleet.ok(&[]).stdout.is_empty());
    assert!(!fleet.ok(&["-h"]).stdout.is_empty());
    assert_eq!(
        fleet.ok(&["list-m", "--no-legend", "--fields", "machine"]).stdout,
        "e2e0usag...\n",
        "unique prefixes work"
    );
    let with_env = std::process::Command::new(fleet_e2e::binary("fleetctl"))
        .args(["list-machines", "--no-legend", "--fields", "machine"])
        .env("FLEETCTL_ENDPOINT", format!("unix://{}", fleet.socket().display()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&with_env.stdout), "e2e0usag...\n", "FLEETCTL_ENDPOINT works like --endpoint");
    let unreachable: fleet_e2e::Ran = std::process::Command::new(fleet_e2e::binary("fleetctl"))
        .args(["--endpoint=unix:///nonexistent/fleet.sock", "list-machines"])
        .output()
        .unwrap()
        .into();
    assert_eq!(unreachable.code, 1);
    assert!(
        unreachable.stderr.starts_with("Error retrieving list of active machines from fleet API ("),
        "{unreachable:?}"
    );
    let bad_fields = fleet.fleetctl(&["list-units", "--fields", "bogus"]);
    // The original's line, then the fields there are.
    assert_eq!(
        (bad_fields.code, bad_fields.stderr.as_str()),
        (1, "Invalid key in output format: \"bogus\"\nValid fields: active,drift,hash,health,load,machine,sub,unit\n")
    );
    let none = fleet.fleetctl(&["list-unit-files", "--fields", ""]);
    assert!(none.stderr.starts_with("Must define output format\nValid fields: budget,desc,dstate,"), "{none:?}");
    // -l on list-unit-files as on list-units, and -n for journal's --lines.
    assert_eq!(fleet.fleetctl(&["list-unit-files", "-l"]).code, 0);
    let journal = fleet.fleetctl(&["journal", "-n", "2", "nothing.service"]);
    assert!(journal.stderr.contains("Unit nothing.service does not exist."), "{journal:?}");
}

#[test]
fn units_survive_a_fleetd_restart_and_die_with_it() {
    let mut fleet = Fleetd::start("e2e0restart00001", &[]);
    fleet.ok(&["start", &example("hello.service")]);
    assert!(!unit_processes(&fleet.state_dir()).is_empty());
    // SIGTERM: units stop cleanly and fleetd exits 0.
    assert_eq!(fleet.stop_with(libc::SIGTERM), Some(0));
    assert!(unit_processes(&fleet.state_dir()).is_empty(), "SIGTERM stops the units");
    // The store kept the unit: a new fleetd starts it again.
    fleet.launch();
    fleet.wait_until("hello runs again", WAIT, |f| {
        f.unit_rows() == vec![("hello.service".into(), "active".into(), "running".into())]
    });
    // SIGKILL: every unit process dies with fleetd, children included (the keeper sees the
    // death and kills what carries the marker).
    fleet.stop_with(libc::SIGKILL);
    let state_dir = fleet.state_dir();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !unit_processes(&state_dir).is_empty() {
        assert!(std::time::Instant::now() < deadline, "unit processes outlived a killed fleetd");
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.launch();
    fleet.wait_until("hello runs after the crash", WAIT, |f| {
        f.unit_rows() == vec![("hello.service".into(), "active".into(), "running".into())]
    });
}

#[test]
fn daemons_that_leave_their_group_die_with_a_crashed_fleetd() {
    let mut fleet = Fleetd::start("e2e0crash0000001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("escapes.service");
    std::fs::write(&path, "[Service]\nExecStart=/bin/sh -c 'setsid sleep 1000 & sleep 1001'\n").unwrap();
    fleet.ok(&["start", &path.display().to_string()]);
    let state_dir = fleet.state_dir();
    fleet.wait_until("both processes run", WAIT, |_| unit_processes(&state_dir).len() == 3);
    // The cgroups fleetd made for its units, where the machine has a writable cgroup v2.
    let base = unit_processes(&state_dir)
        .into_iter()
        .find_map(fleet_e2e::cgroups::cgroup2_dir_of)
        .and_then(|unit| unit.parent().map(Path::to_path_buf))
        .filter(|base| base.file_name().is_some_and(|name| name.to_string_lossy().starts_with("fleet-units.")));
    fleet.stop_with(libc::SIGKILL);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !unit_processes(&state_dir).is_empty() {
        assert!(std::time::Instant::now() < deadline, "{:?} outlived a killed fleetd", unit_processes(&state_dir));
        std::thread::sleep(Duration::from_millis(50));
    }
    // The keeper leaves nothing behind, as a clean shutdown does: no cgroup of the dead
    // fleetd's (a test machine had gathered over a thousand empty ones).
    if let Some(base) = base {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while base.exists() {
            assert!(std::time::Instant::now() < deadline, "{} outlived the keeper", base.display());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn sighup_reloads_without_touching_units() {
    let fleet = Fleetd::start("e2e0reload000001", &[("metadata", "region=one")]);
    fleet.ok(&["start", &example("hello.service")]);
    let before = unit_processes(&fleet.state_dir());
    let config = std::fs::read_to_string(fleet.config_path()).unwrap().replace("region=one", "region=two");
    std::fs::write(fleet.config_path(), config).unwrap();
    fleet.signal(libc::SIGHUP);
    fleet.wait_until("the new metadata is published", WAIT, |f| {
        f.ok(&["list-machines", "--no-legend", "--fields", "metadata"]).stdout == "region=two\n"
    });
    assert!(fleet.log().contains("Reloading configuration"));
    let mut after = unit_processes(&fleet.state_dir());
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "no unit was restarted");
    assert_eq!(fleet.unit_rows(), vec![("hello.service".into(), "active".into(), "running".into())]);
}

#[test]
fn fleetd_refuses_bad_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.conf");
    std::fs::write(&config, "machine_id = x1\ntoken_limit = lots\n").unwrap();
    let output = std::process::Command::new(fleet_e2e::binary("fleetd")).arg("-config").arg(&config).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("option token_limit"), "{stderr}");
    let output = std::process::Command::new(fleet_e2e::binary("fleetd")).arg("extra").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("Did you mean to invoke fleetctl instead?"));
}

#[test]
fn no_block_global_units_and_reasons() {
    let fleet = Fleetd::start("e2e0reasons00001", &[("metadata", "region=local")]);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let quick = write("quick.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    let ran = fleet.ok(&["start", "--no-block", &quick]);
    assert_eq!(ran.stdout, "Unit quick.service inactive\nTriggered unit quick.service start\n", "announced once");
    let global = write("everywhere.service", "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nGlobal=true\n");
    assert_eq!(
        fleet.ok(&["start", &global]).stdout,
        "Unit everywhere.service\nTriggered global unit everywhere.service start\n"
    );
    fleet.wait_until("the global unit runs here", WAIT, |f| {
        f.unit_rows().contains(&("everywhere.service".into(), "active".into(), "running".into()))
    });
    let files = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,state,target"]).stdout;
    assert!(files.contains("everywhere.service\t-\t\tglobal"), "{files}");
    let elsewhere =
        write("elsewhere.service", "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=eu\n");
    let ran = fleet.fleetctl(&["start", "--block-attempts=1", &elsewhere]);
    assert_eq!(ran.code, 1);
    // The reason as soon as the engine said it, then the original's two lines.
    let timed_out = "timed out waiting for unit elsewhere.service to report state launched";
    let reason = "Unit elsewhere.service cannot be scheduled: no machine has metadata region=eu\n";
    let original =
        format!("Error waiting for units: {timed_out}\nError waiting for unit states, exit status: {timed_out}\n");
    assert!(ran.stderr.contains(reason) && ran.stderr.contains(&original), "{ran:?}");
    assert_eq!(ran.stderr.matches(reason).count(), 1, "said once: {ran:?}");
    let reasons = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout;
    assert!(reasons.contains("elsewhere.service\tno machine has metadata region=eu"), "{reasons}");
    // Runtime metadata counts: once the machine says region=eu, the unit is placed.
    let patch = r#"[{"op":"add","path":"/e2e0reasons00001/metadata/region","value":"eu"}]"#;
    let answer = fleet.api("PATCH", "/fleet/v1/machines", patch);
    assert!(answer.starts_with("HTTP/1.0 204") || answer.starts_with("HTTP/1.1 204"), "{answer}");
    fleet.wait_until("the unit is placed", WAIT, |f| {
        f.unit_rows().contains(&("elsewhere.service".into(), "active".into(), "running".into()))
    });
}

#[test]
fn units_named_by_range_list_file_and_pattern() {
    let fleet = Fleetd::start("e2e0ranges000001", &[]);
    let examples = examples_dir();
    let in_examples = |args: &[&str]| {
        let ran = fleet.fleetctl_in(&examples, args);
        assert_eq!(ran.code, 0, "{args:?}: {ran:?}");
        ran
    };
    in_examples(&["submit", "hello@{1..6}.service"]);
    let files = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit"]).stdout;
    assert_eq!(files.lines().count(), 6, "{files}");

    let list = tempfile::NamedTempFile::new().expect("a list file");
    std::fs::write(list.path(), "hello@7.service\n# the rest\n  hello@{8..9}.service  \n\n").expect("write the list");
    let list_path = list.path().display().to_string();
    in_examples(&["start", "--from-file", &list_path]);
    let running: Vec<String> = fleet.unit_rows().into_iter().map(|(unit, _, _)| unit).collect();
    assert_eq!(running, ["hello@7.service", "hello@8.service", "hello@9.service"]);

    let stopped = fleet.ok(&["stop", "hello@[7-8].service"]);
    assert_eq!(stopped.stderr, "Successfully stopped units [hello@7.service hello@8.service].\n");
    let bad_range = fleet.fleetctl(&["start", "hello@{3..1}.service"]);
    assert_eq!(
        (bad_range.code, bad_range.stderr.as_str()),
        (2, "invalid range {3..1} in hello@{3..1}.service: the end is before the start\n")
    );
    let no_match = fleet.fleetctl(&["destroy", "web@*.service"]);
    assert_eq!((no_match.code, no_match.stderr.as_str()), (1, "no unit in the cluster matches web@*.service\n"));
    let missing_list = fleet.fleetctl(&["start", "--from-file", "/nonexistent/list"]);
    assert_eq!(missing_list.code, 2);
    assert!(missing_list.stderr.starts_with("cannot read the unit list /nonexistent/list:"), "{missing_list:?}");

    // Regression (issue 68): a pattern matching nothing left the other arguments undone.
    let partly = fleet.fleetctl(&["destroy", "hello@7.service", "hello@*", "c@*"]);
    assert_eq!((partly.code, partly.stderr.as_str()), (1, "no unit in the cluster matches c@*\n"), "{partly:?}");
    assert!(partly.stdout.contains("Destroyed hello@9.service"), "the rest was done: {partly:?}");
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "");
}

/// A batch unit under the native supervisor, run twice: `fleetctl runs` shows as the last
/// run's log that run's lines only (it showed the runs' before it too), its output before the
/// supervisor's line that it ended; `journal` of it between runs says where its logs are.
#[test]
fn a_runs_log_under_the_native_supervisor_is_that_runs_own() {
    let fleet = Fleetd::start("e2e0runlogs00001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let path = dir.path().join("count.service");
    std::fs::write(
        &path,
        format!(
            "[Unit]\nDescription=Counting\n[Service]\nType=oneshot\nExecStart=/bin/sh -c 'n=$(cat {0} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {0}; echo counted $n'\n[X-Fleet]\nBatch=true\n",
            counter.display()
        ),
    )
    .unwrap();
    fleet.ok(&["start", &path.display().to_string()]);
    let runs_ended = |f: &Fleetd, count: usize| {
        let json: serde_json::Value =
            serde_json::from_str(&f.ok(&["runs", "count.service", "-o", "json"]).stdout).unwrap();
        json["runs"].as_array().is_some_and(|runs| {
            runs.len() == count && runs.iter().all(|run| run["state"] == "succeeded" && run["log"].is_string())
        })
    };
    fleet.wait_until("the first run ended", WAIT, |f| runs_ended(f, 1));
    fleet.ok(&["run", "count.service"]);
    fleet.wait_until("the second run ended", WAIT, |f| runs_ended(f, 2));
    let shown = fleet.ok(&["runs", "count.service"]).stdout;
    let log = shown.split("The last lines of run 2's log:\n").nth(1).expect("the last run's log");
    assert!(log.contains(": counted 2\n"), "{shown}");
    assert!(!log.contains("counted 1"), "the first run's lines in the second's log: {shown}");
    assert_eq!(log.matches("Starting Counting...").count(), 1, "{shown}");
    let output = log.find(": counted 2").expect("the run's output");
    let ended = log.find("count.service: Deactivated successfully.").expect("the supervisor's end line");
    assert!(output < ended, "the output comes before the line that the run ended: {shown}");
    let journal = fleet.fleetctl(&["journal", "count.service"]);
    assert_eq!(journal.code, 1, "{journal:?}");
    assert_eq!(
        journal.stderr,
        "Unit count.service does not appear to be running.\nIts runs' last lines: fleetctl runs count.service\n"
    );
}
