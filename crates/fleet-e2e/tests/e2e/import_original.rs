//! Moving over from the original fleet without stopping a unit (issue 77): the original's
//! registry is written as the original kept it (etcd's v2 keys), its agent's units are started
//! in a real systemd user instance as the original's agent started them (0644 files in its
//! units directory, linked into the runtime unit path); then fleet's fleetd starts on that
//! machine and `fleetctl import-original` takes the registry over.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use fleet_e2e::original_fleet::{OriginalJob, OriginalRegistryWriter};
use fleet_e2e::{EtcdServer, Fleetd, SystemdUser};

const WAIT: Duration = Duration::from_secs(30);
const MACHINE: &str = "77777777000000000000000000000001";

fn job(name: &str, text: &str, target_state: &str, target: Option<&str>) -> OriginalJob {
    OriginalJob {
        name: name.into(),
        text: text.into(),
        target_state: target_state.into(),
        target: target.map(str::to_string),
    }
}

/// Starts `name` from `text` as the original's agent did: the file 0644 in the units
/// directory, linked into systemd's runtime path, started.
fn started_by_the_original(systemd: &SystemdUser, name: &str, text: &str) {
    let path = systemd.units_directory().join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [vec!["link", "--runtime", path.to_str().unwrap()], vec!["start", name]] {
        let ran = systemd.systemctl(&args);
        assert!(ran.status.success(), "systemctl {args:?}: {}", String::from_utf8_lossy(&ran.stderr));
    }
    wait_for(systemd, name, "SubState", "running");
}

fn wait_for(systemd: &SystemdUser, unit: &str, property: &str, value: &str) {
    let deadline = Instant::now() + WAIT;
    while systemd.show(unit, property) != value {
        assert!(Instant::now() < deadline, "{unit} {property} is not {value}; systemd log:\n{}", systemd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What shows that systemd did not restart a unit: when it last became active, and its
/// main process.
fn running_since(systemd: &SystemdUser, unit: &str) -> (String, String) {
    (systemd.show(unit, "ActiveEnterTimestamp"), systemd.show(unit, "MainPID"))
}

#[test]
fn a_running_original_cluster_is_taken_over_without_a_unit_restarting() {
    let systemd = SystemdUser::start();
    let etcd = EtcdServer::start_with_v2_api();
    std::fs::create_dir_all(systemd.units_directory()).unwrap();
    let web = "[Unit]\nDescription=web\n\n[Service]\nExecStart=/bin/sleep 100771\n";
    let worker = "[Service]\nExecStart=/bin/sleep 100772\n";
    let stray = "[Service]\nExecStart=/bin/sleep 100773\n";
    let everywhere = "[Service]\nExecStart=/bin/sleep 100776\n\n[X-Fleet]\nGlobal=true\n";
    // Its registry asks for new content the original's agent had not loaded yet.
    let (behind, caught_up) = ("[Service]\nExecStart=/bin/sleep 100777\n", "[Service]\nExecStart=/bin/sleep 100778\n");
    started_by_the_original(&systemd, "web.service", web);
    started_by_the_original(&systemd, "worker@1.service", worker);
    started_by_the_original(&systemd, "worker@2.service", worker);
    started_by_the_original(&systemd, "everywhere.service", everywhere);
    started_by_the_original(&systemd, "behind.service", behind);
    // Loaded by the original's agent, but no longer in its registry: fleet never owns it.
    started_by_the_original(&systemd, "stray.service", stray);
    let original = OriginalRegistryWriter::new(&etcd.endpoint());
    let mut jobs = vec![
        job("web.service", web, "launched", Some(MACHINE)),
        job("worker@1.service", worker, "launched", Some(MACHINE)),
        job("worker@2.service", worker, "launched", Some(MACHINE)),
        job("later.service", "[Service]\nExecStart=/bin/sleep 100774\n", "inactive", None),
        job("everywhere.service", everywhere, "launched", None),
        job("behind.service", caught_up, "launched", Some(MACHINE)),
    ];
    jobs.push(job("elsewhere.service", worker, "launched", Some("88888888000000000000000000000002")));
    original.write(&jobs, &[(MACHINE, BTreeMap::new())]);
    // A job whose unit file the original kept malformed (written by an older version).
    let garbled = "[Service\nExecStart=/bin/true\n";
    original.put_all(vec![
        (
            "job/garbled.service/object".into(),
            serde_json::json!({"Name": "garbled.service", "UnitHash": vec![7u8; 20]}).to_string(),
        ),
        ("job/garbled.service/target-state".into(), "launched".into()),
        (format!("unit/{}", "07".repeat(20)), serde_json::json!({"Raw": garbled}).to_string()),
    ]);
    let before: BTreeMap<&str, (String, String)> =
        ["web.service", "worker@1.service", "worker@2.service", "everywhere.service", "stray.service"]
            .into_iter()
            .map(|unit| (unit, running_since(&systemd, unit)))
            .collect();

    // fleet's fleetd starts where the original's agent ran: what it did not write, it leaves.
    let fleet = Fleetd::start_under(&systemd, MACHINE);
    fleet.wait_until("the agent read the units directory", WAIT, |f| {
        f.log().contains("left alone until scheduled here")
    });

    // A unit of a machine that has not joined fleet: the dry run says so and nothing is
    // imported, even for real.
    let etcd_flag = format!("--etcd={}", etcd.endpoint());
    let dry = fleet.fleetctl(&["import-original", &etcd_flag, "--dry-run"]);
    assert_eq!(dry.code, 1, "{dry:#?}");
    assert!(dry.stdout.contains("elsewhere.service") && dry.stdout.contains("has not joined fleet"), "{dry:#?}");
    assert!(dry.stdout.contains("garbled.service") && dry.stdout.contains("its unit file: line 1"), "{dry:#?}");
    assert!(dry.stdout.contains("adopt"), "{dry:#?}");
    let refused = fleet.fleetctl(&["import-original", &etcd_flag]);
    assert_eq!(refused.code, 1, "{refused:#?}");
    assert!(refused.stderr.contains("Nothing imported: 2 of 8 units refused"), "{refused:#?}");
    assert!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout.is_empty(), "a refused import wrote units");
    let elsewhere = fleet.fleetctl(&["import-original", &etcd_flag, "--prefix=/not-fleet/"]);
    assert_eq!(elsewhere.code, 1, "{elsewhere:#?}");
    assert!(elsewhere.stderr.contains("no fleet registry at /not-fleet"), "{elsewhere:#?}");

    original.delete_dir("job/elsewhere.service");
    original.delete_dir("job/garbled.service");
    let imported = fleet.ok(&["import-original", &etcd_flag]);
    let said = "Imported 6 units: 4 kept on the machine that runs them, 1 global";
    assert!(imported.stdout.contains(said), "{imported:#?}");
    for unit in ["web.service", "worker@1.service", "worker@2.service", "everywhere.service"] {
        fleet.wait_until(&format!("fleet reports {unit} running"), WAIT, |f| {
            f.unit_rows().contains(&(unit.to_string(), "active".into(), "running".into()))
        });
    }
    let files = fleet.ok(&["list-unit-files", "--no-legend", "--full", "--fields", "unit,dstate,target"]).stdout;
    let rows: BTreeMap<String, (String, String)> = files
        .lines()
        .filter_map(|line| {
            let mut cells = line.split_whitespace();
            let (unit, dstate, target) = (cells.next()?, cells.next()?, cells.next()?);
            let machine = target.split('/').next().unwrap_or_default();
            Some((unit.to_string(), (dstate.to_string(), machine.to_string())))
        })
        .collect();
    let row = |dstate: &str, machine: &str| (dstate.to_string(), machine.to_string());
    let expected = BTreeMap::from([
        ("behind.service".to_string(), row("launched", MACHINE)),
        ("everywhere.service".to_string(), row("launched", "global")),
        ("later.service".to_string(), row("inactive", "-")),
        ("web.service".to_string(), row("launched", MACHINE)),
        ("worker@1.service".to_string(), row("launched", MACHINE)),
        ("worker@2.service".to_string(), row("launched", MACHINE)),
    ]);
    assert_eq!(rows, expected, "the original's schedule, and no unit fleet does not own:\n{files}");
    // The same unit hashes as the original's.
    let hashes = fleet.ok(&["list-unit-files", "--no-legend", "--full", "--fields", "unit,hash"]).stdout;
    for (unit, text) in [("web.service", web), ("worker@1.service", worker), ("everywhere.service", everywhere)] {
        let hash = fleet_core::UnitFile::parse(text).unwrap().hash().to_string();
        assert!(hashes.lines().any(|line| line.starts_with(unit) && line.ends_with(&hash)), "{unit} {hash}:\n{hashes}");
    }
    for (unit, since) in &before {
        assert_eq!(&running_since(&systemd, unit), since, "{unit} was restarted; fleetd log:\n{}", fleet.log());
    }
    // The one whose content the registry changed runs that content now: stopped, replaced.
    fleet.wait_until("behind.service runs the registry's content", WAIT, |_| {
        systemd.show("behind.service", "ExecStart").contains("100778")
            && systemd.show("behind.service", "SubState") == "running"
    });
    let mode = std::fs::metadata(systemd.units_directory().join("web.service")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "an adopted unit's file is fleet's now");

    // fleet runs them now, and still leaves alone what it does not own.
    fleet.ok(&["stop", "worker@2.service"]);
    wait_for(&systemd, "worker@2.service", "ActiveState", "inactive");
    assert_eq!(running_since(&systemd, "stray.service"), before["stray.service"]);
    assert_eq!(running_since(&systemd, "web.service"), before["web.service"]);
}

/// A registry of 10,000 units (instances of one template, as large original clusters ran
/// them) on fleet's etcd store: imported whole, each on the machine the original put it on.
/// Prints how long the import took (BENCHMARKS.md).
#[test]
fn a_registry_of_ten_thousand_units_is_imported_whole() {
    const UNITS: usize = 10_000;
    let etcd = EtcdServer::start_with_v2_api();
    let template = "[Service]\nExecStart=/bin/sleep 100775\n";
    let jobs: Vec<OriginalJob> =
        (0..UNITS).map(|index| job(&format!("app@{index}.service"), template, "loaded", Some(MACHINE))).collect();
    let writing = Instant::now();
    OriginalRegistryWriter::new(&etcd.endpoint()).write(&jobs, &[(MACHINE, BTreeMap::new())]);
    eprintln!("the original's registry of {UNITS} units written in {:.2} s", writing.elapsed().as_secs_f64());
    let fleet = Fleetd::start(MACHINE, &[("etcd_servers", etcd.endpoint().as_str())]);
    let importing = Instant::now();
    let imported = fleet.ok(&["--request-timeout=60", "import-original", &format!("--etcd={}", etcd.endpoint())]);
    let took = importing.elapsed();
    assert!(imported.stdout.contains(&format!("Imported {UNITS} units: {UNITS} kept on the machine")), "{imported:#?}");
    println!("import-original of {UNITS} units: {:.2} s", took.as_secs_f64());
    let listed = fleet.ok(&["list-unit-files", "--no-legend", "--full", "--fields", "unit,dstate,target"]).stdout;
    let placed = listed
        .lines()
        .filter(|line| line.contains("loaded") && line.contains(MACHINE) && line.starts_with("app@"))
        .count();
    assert_eq!(placed, UNITS, "every unit listed loaded on its machine");
}
