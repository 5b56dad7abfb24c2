//! Draining a machine: it takes no new units, its units move to the others in waves of at
//! most max-unavailable down at once (global units and units pinned to it stay), a unit with
//! nowhere to go stays with its reason, and an undrained machine takes units again. On etcd
//! with three members, and on the embedded store with a pull agent beside the manager.

use std::time::Duration;

use fleet_e2e::pki::ManagerPki;
use fleet_e2e::pull::PullFleetd;
use fleet_e2e::{Cluster, Fleetd, member_id, metric_value, write_unit};

/// Each unit state a machine reports, as (unit, machine, active state), from `list-units -o json`.
fn units(fleetd: &Fleetd) -> Vec<(String, String, String)> {
    let listed = fleetd.ok(&["list-units", "-o", "json"]).stdout;
    let units: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
    units
        .as_array()
        .map(|units| units.iter().map(|u| (text(&u["unit"]), text(&u["machine"]), text(&u["activeState"]))).collect())
        .unwrap_or_default()
}

/// The machine's drain as `GET …/drain` answers it (`null` when it is not drained).
fn drain_of(fleetd: &Fleetd, machine: &str) -> serde_json::Value {
    let answer = fleetd.api("GET", &format!("/fleet/v1/machines/{machine}/drain"), "");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
    if value.get("error").is_some() { serde_json::Value::Null } else { value }
}

fn drain_column(fleetd: &Fleetd, machine: &str) -> String {
    let listed = fleetd.ok(&["list-machines", "--no-legend", "--full", "--fields", "machine,drain"]).stdout;
    listed
        .lines()
        .filter_map(|row| row.split_once('\t'))
        .find(|(id, _)| id.trim() == machine)
        .map(|(_, drain)| drain.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn a_drained_member_hands_its_units_on_in_waves_keeps_the_pinned_and_takes_units_again_once_undrained() {
    let cluster = Cluster::start(3, |_| Vec::new());
    let dir = cluster.members[0].dir.path().to_path_buf();
    let drained = member_id(0);
    let unit = |name: &str, x_fleet: &str| {
        write_unit(&dir, name, &format!("[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\n{x_fleet}\n"))
    };
    let mut files: Vec<String> = (1..=6).map(|n| unit(&format!("web{n}.service"), "")).collect();
    files.push(unit("pinned.service", &format!("MachineID={drained}")));
    files.push(unit("everywhere.service", "Global=true"));
    let mut start = vec!["start", "--no-block"];
    start.extend(files.iter().map(String::as_str));
    cluster.any().ok(&start);
    let active_names = |c: &Cluster| -> std::collections::BTreeSet<String> {
        units(c.any()).into_iter().filter(|(_, _, active)| active == "active").map(|(name, ..)| name).collect()
    };
    let all_active = |c: &Cluster| active_names(c).iter().filter(|name| *name != "everywhere.service").count() == 7;
    cluster.wait_until("every unit runs", Duration::from_secs(30), all_active);
    let on_drained = |c: &Cluster| {
        units(c.any()).into_iter().filter(|(name, machine, _)| *machine == drained && name.starts_with("web")).count()
    };
    assert!(on_drained(&cluster) > 0, "spreading put some web units on {drained}");

    let started = cluster.any().ok(&["machine", "drain", &drained[..8]]);
    assert!(started.stderr.contains("at most 1 down at once; 1 stay"), "{started:?}");
    // However the waves go, no more than one web unit is ever seen down, and none lands on
    // the drained machine.
    cluster.wait_until("the machine is drained", Duration::from_secs(60), |c| {
        let running = active_names(c);
        let down = (1..=6).filter(|n| !running.contains(&format!("web{n}.service"))).count();
        assert!(down <= 1, "at most one web unit down at once: {running:?}");
        drain_of(c.any(), &drained)["state"] == "drained"
    });
    assert_eq!(on_drained(&cluster), 0, "every web unit left {drained}");
    cluster.wait_until("every unit runs again", Duration::from_secs(30), all_active);
    let drain = drain_of(cluster.any(), &drained);
    assert_eq!(
        drain["stays"],
        serde_json::json!([{"name": "pinned.service", "reason": "MachineID= names this machine"}])
    );
    assert_eq!(drain_column(cluster.any(), &drained), "drained");
    let status = cluster.any().ok(&["machine", "status", &drained]).stdout;
    assert!(status.contains("pinned.service\tstays"), "{status}");
    let pinned_on = |c: &Cluster| units(c.any()).into_iter().find(|(name, ..)| name == "pinned.service").map(|u| u.1);
    assert_eq!(pinned_on(&cluster), Some(drained.clone()));

    // A new unit pinned there waits; one that may go anywhere goes elsewhere.
    let late = unit("late.service", &format!("MachineID={drained}"));
    cluster.any().ok(&["start", "--no-block", &late]);
    cluster.wait_until("the late unit says why it waits", Duration::from_secs(20), |c| {
        c.any().ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout.contains("is draining")
    });

    let undrained = cluster.any().ok(&["machine", "uncordon", &drained]);
    assert!(undrained.stderr.contains("takes units again"), "{undrained:?}");
    cluster.wait_until("the waiting unit runs on the undrained machine", Duration::from_secs(30), |c| {
        units(c.any())
            .iter()
            .any(|(name, machine, active)| name == "late.service" && *machine == drained && active == "active")
    });
    assert_eq!(drain_column(cluster.any(), &drained), "-");
    let again = cluster.any().fleetctl(&["machine", "undrain", &drained]);
    assert_ne!(again.code, 0, "a machine that is not drained cannot be undrained: {again:?}");
    assert!(again.stderr.contains("is not drained"), "{again:?}");
}

#[test]
fn a_drained_pull_agent_hands_on_what_fits_and_names_what_has_nowhere_to_go() {
    let pki = ManagerPki::local();
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let mut config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    config.push(("capacity_memory".into(), "1G".into()));
    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let manager = Fleetd::start("e2e0drain0000001", &pairs);
    let token =
        manager.ok(&["registration-token", "create", "--metadata", "kind=edge", "edge"]).stdout.trim().to_string();
    let agent_dir = tempfile::tempdir().expect("dir");
    let agent_config = format!(
        "machine_id = edge-drained\nstate_dir = {}\nunit_manager = native\nmanager_url = https://127.0.0.1:{port}\n\
         manager_ca_file = {}\nregistration_token = {token}\ncapacity_memory = 4G\ncapacity_cpu = 2\n",
        agent_dir.path().join("state").display(),
        pki.api_ca_file.display()
    );
    let agent = PullFleetd::start_configured(agent_dir, &agent_config, &[], &[]);
    manager.wait_until("the pull agent is listed", Duration::from_secs(20), |m| {
        m.ok(&["list-machines", "--no-legend", "--full"]).stdout.contains("edge-drained")
    });
    let dir = tempfile::tempdir().expect("dir");
    let roomy =
        write_unit(dir.path(), "roomy.service", "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nMemory=2G\n");
    let small = write_unit(
        dir.path(),
        "small.service",
        "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nMemory=256M\nMachineMetadata=kind=edge\n",
    );
    // `small` may run only on machines with kind=edge: the agent, until the manager has it too.
    manager.ok(&["start", "--block-attempts", "100", &roomy, &small]);
    let on = |m: &Fleetd, unit: &str| units(m).into_iter().find(|(name, ..)| name == unit).map(|u| u.1);
    assert_eq!(on(&manager, "roomy.service").as_deref(), Some("edge-drained"), "{}", agent.log());
    assert_eq!(on(&manager, "small.service").as_deref(), Some("edge-drained"));
    // The drain's answer says at once that both can go nowhere (the planner's reasons).
    let drained = manager.ok(&["machine", "drain", "edge-drained", "--max-unavailable", "2"]);
    assert!(
        drained.stderr.contains(
            "2 units can go to no other machine now and keep running here until one may take them: \
             roomy.service, small.service"
        ),
        "{drained:?}"
    );
    manager.wait_until("both units are stuck, each with its reason", Duration::from_secs(30), |m| {
        let drain = drain_of(m, "edge-drained");
        let moving = drain["moving"].as_array().cloned().unwrap_or_default();
        moving.len() == 2 && moving.iter().all(|unit| unit["reason"].is_string())
    });
    let drain = drain_of(&manager, "edge-drained");
    assert_eq!(drain["state"], "draining");
    let reason = |unit: &str| {
        drain["moving"].as_array().and_then(|moving| {
            moving.iter().find(|u| u["name"] == unit).and_then(|u| u["reason"].as_str().map(str::to_string))
        })
    };
    assert_eq!(
        reason("roomy.service").as_deref(),
        Some("cannot leave its draining machine: needs 2 GiB memory; the most free is 1 GiB on e2e0drain0000001")
    );
    assert_eq!(
        reason("small.service").as_deref(),
        Some("cannot leave its draining machine: its rules allow no other machine")
    );
    manager.wait_until("the metrics show the drain", Duration::from_secs(20), |m| {
        metric_value(&m.metrics(), "fleet_units_stuck_draining") == Some(2.0)
    });
    let metrics = manager.metrics();
    assert_eq!(metric_value(&metrics, "fleet_machine_draining{machine=\"edge-drained\"}"), Some(1.0));
    assert_eq!(metric_value(&metrics, "fleet_machine_draining{machine=\"e2e0drain0000001\"}"), Some(0.0));
    assert_eq!(metric_value(&metrics, "fleet_machine_drain_units_moving{machine=\"edge-drained\"}"), Some(2.0));
    // Stuck, they keep running where they are.
    assert!(units(&manager).iter().all(|(_, machine, active)| machine == "edge-drained" && active == "active"));
    // Room appears for one of them (the manager gets the metadata): it moves, the other stays.
    let patch = r#"[{"op":"add","path":"/e2e0drain0000001/metadata/kind","value":"edge"}]"#;
    manager.api("PATCH", "/fleet/v1/machines", patch);
    manager.wait_until("the small unit moved to the manager", Duration::from_secs(30), |m| {
        on(m, "small.service").as_deref() == Some("e2e0drain0000001")
    });
    assert_eq!(on(&manager, "roomy.service").as_deref(), Some("edge-drained"));
    manager.ok(&["machine", "undrain", "edge-drained"]);
    assert!(manager.ok(&["machine", "status", "edge-drained"]).stdout.contains("is not drained"));
}
