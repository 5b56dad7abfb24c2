//! `-o json` and `-o wide` of fleetctl against a real fleetd: the JSON parses back into the
//! documented schema (docs/json-output.md) and exit codes stay those of the tables.

use serde_json::Value;

use fleet_e2e::{Fleetd, examples_dir, write_unit};

fn json(fleet: &Fleetd, args: &[&str]) -> Value {
    let ran = fleet.ok(args);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|error| panic!("{args:?} printed no JSON ({error}): {ran:?}"))
}

#[test]
fn lists_and_status_print_json_and_wide_tables() {
    let fleet = Fleetd::start(
        "e2e0json00000001",
        &[("metadata", "region=test"), ("capacity_memory", "4G"), ("capacity_cpu", "2")],
    );
    fleet.ok(&["start", &examples_dir().join("hello.service").display().to_string()]);
    let dir = tempfile::tempdir().expect("scratch dir");
    let nowhere = write_unit(
        dir.path(),
        "nowhere.service",
        "[Unit]\nDescription=Waits for a machine\n[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=nowhere\n",
    );
    fleet.ok(&["start", "--no-block", &nowhere]);

    let machines = json(&fleet, &["list-machines", "-o", "json"]);
    assert_eq!(machines[0]["machine"], "e2e0json00000001");
    assert_eq!(machines[0]["ip"], "127.0.0.1");
    assert_eq!(machines[0]["metadata"]["region"], "test");
    assert_eq!(machines[0]["units"], 1);
    assert_eq!(machines[0]["connection"], "embedded");
    assert_eq!(machines[0]["leader"], true, "a single machine's engine leads: {machines}");
    assert!(machines[0]["outOfTouchSince"].is_null(), "present: {machines}");
    assert_eq!(machines[0]["version"], env!("CARGO_PKG_VERSION"), "the version its fleetd registered: {machines}");
    let versions = fleet.ok(&["list-machines", "--no-legend", "--fields", "machine,version"]).stdout;
    assert_eq!(versions, format!("e2e0json...\t{}\n", env!("CARGO_PKG_VERSION")));
    assert_eq!(machines[0]["capacity"], serde_json::json!({"memoryBytes": 4u64 << 30, "cpuMillicores": 2000}));
    assert_eq!(machines[0]["reserved"], serde_json::json!({"memoryBytes": 0, "cpuMillicores": 0}));

    let units = json(&fleet, &["list-units", "--output", "json"]);
    assert_eq!(units.as_array().map(Vec::len), Some(1), "{units}");
    let hello = &units[0];
    assert_eq!((hello["unit"].as_str(), hello["machine"].as_str()), (Some("hello.service"), Some("e2e0json00000001")));
    assert_eq!((hello["activeState"].as_str(), hello["subState"].as_str()), (Some("active"), Some("running")));
    assert_eq!(hello["loadState"], "loaded");
    assert_eq!(hello["machineIp"], "127.0.0.1");
    assert_eq!(hello["hash"].as_str().map(str::len), Some(40));

    fleet.wait_until("the unplaced unit has its reason", std::time::Duration::from_secs(10), |f| {
        json(f, &["list-unit-files", "-o", "json"])[1]["reason"].is_string()
    });
    let files = json(&fleet, &["list-unit-files", "-o", "json"]);
    assert_eq!(files[0]["unit"], "hello.service");
    assert_eq!(
        (files[0]["desiredState"].as_str(), files[0]["currentState"].as_str()),
        (Some("launched"), Some("launched"))
    );
    assert_eq!(files[0]["machine"], "e2e0json00000001");
    assert_eq!(files[0]["global"], false);
    assert_eq!(files[1]["unit"], "nowhere.service");
    assert_eq!(files[1]["description"], "Waits for a machine");
    assert!(files[1]["machine"].is_null());
    assert!(files[1]["reason"].as_str().is_some_and(|reason| reason.contains("region")), "{files}");

    let status = json(&fleet, &["status", "-o", "json", "hello.service"]);
    assert_eq!(status[0]["unit"], "hello.service");
    assert_eq!(status[0]["states"][0]["activeState"], "active");
    assert!(status[0]["log"].is_array());

    // The exit codes are the table's.
    let missing = fleet.fleetctl(&["status", "-o", "json", "ghost.service"]);
    assert_eq!(
        (missing.code, missing.stderr.as_str(), missing.stdout.as_str()),
        (1, "Unit ghost.service does not exist.\n", "")
    );
    let bad = fleet.fleetctl(&["list-units", "-o", "yaml"]);
    assert_eq!(bad.code, 2, "{bad:?}");

    let wide = fleet.ok(&["list-units", "-o", "wide"]).stdout;
    assert!(wide.starts_with("UNIT\t\tMACHINE\t\t\tACTIVE\tSUB\tLOAD\tHASH\tDRIFT\tHEALTH\n"), "{wide}");
    let wide = fleet.ok(&["list-machines", "-o", "wide"]).stdout;
    assert!(
        wide.starts_with(
            "MACHINE\t\t\tIP\t\tMETADATA\tUNITS\tCONNECTION\tLEADER\tCAPACITY\tRESERVED\tDRAIN\tTAINTS\tSTATE\tVERSION\n"
        ),
        "{wide}"
    );
    assert!(wide.contains("e2e0json00000001\t"), "-o wide shows machine IDs whole: {wide}");
    let tail = format!("\t1\tembedded\tengine\t4 GiB, 2 CPU\t0 B, 0 CPU\t-\t-\tpresent\t{}", env!("CARGO_PKG_VERSION"));
    assert!(wide.trim_end().ends_with(&tail), "{wide}");
    let wide = fleet.ok(&["list-unit-files", "-o", "wide", "--no-legend"]).stdout;
    assert!(wide.contains("Waits for a machine"), "{wide}");
}
