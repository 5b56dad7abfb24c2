//! Placement that knows machines: units reserve memory and CPU, machines state what they
//! offer (here in fleet.conf), and the engine never packs a machine past it. On etcd with
//! members of different sizes, and on the embedded store with a pull agent beside the manager.

use std::time::Duration;

use fleet_e2e::pki::ManagerPki;
use fleet_e2e::pull::PullFleetd;
use fleet_e2e::{Cluster, Fleetd, member_id, metric_value, write_unit};

fn sized(memory: &str, cpu: &str) -> Vec<(String, String)> {
    vec![("capacity_memory".into(), memory.into()), ("capacity_cpu".into(), cpu.into())]
}

/// Each unit's machine (empty when none) and its reason when it waits, from `-o json`.
fn schedule(fleetd: &Fleetd) -> Vec<(String, String, String)> {
    let listed = fleetd.ok(&["list-unit-files", "-o", "json"]).stdout;
    let units: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
    units
        .as_array()
        .map(|units| {
            units.iter().map(|unit| (text(&unit["unit"]), text(&unit["machine"]), text(&unit["reason"]))).collect()
        })
        .unwrap_or_default()
}

/// `list-machines` rows of `fields`, their cells joined by `|`.
fn rows(fleetd: &Fleetd, fields: &str) -> Vec<String> {
    let listed = fleetd.ok(&["list-machines", "--no-legend", "--full", "--fields", fields]).stdout;
    listed.lines().map(|row| row.split('\t').filter(|cell| !cell.is_empty()).collect::<Vec<_>>().join("|")).collect()
}

fn target_of(fleetd: &Fleetd, unit: &str) -> String {
    schedule(fleetd).into_iter().find(|(name, _, _)| name == unit).map(|(_, target, _)| target).unwrap_or_default()
}

#[test]
fn units_go_where_they_fit_one_that_fits_nowhere_says_why_and_waits_for_room() {
    let mut cluster = Cluster::start(2, |index| if index == 0 { sized("2G", "1") } else { sized("4G", "2") });
    let dir = cluster.members[0].dir.path().to_path_buf();
    let unit = |name: &str, reservation: &str| {
        write_unit(&dir, name, &format!("[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\n{reservation}\n"))
    };
    let (small, large, huge) = (member_id(0), member_id(1), member_id(2));
    let big = unit("big.service", "Memory=3G");
    let limited =
        write_unit(&dir, "limited.service", "[Service]\nExecStart=/bin/sleep 100000\nMemoryMax=1536M\nCPUQuota=50%\n");
    let nowhere = unit("nowhere.service", "Memory=8G");
    cluster.any().ok(&["start", "--no-block", &big, &limited, &nowhere]);
    cluster.wait_until("the units that fit are placed and the other has its reason", Duration::from_secs(20), |c| {
        let schedule = schedule(c.any());
        schedule.iter().filter(|(_, target, _)| !target.is_empty()).count() == 2
            && schedule.iter().any(|(unit, _, reason)| unit == "nowhere.service" && reason.contains("needs"))
    });
    let any = cluster.any();
    assert_eq!(target_of(any, "big.service"), large, "3G fits only on the 4G machine");
    // Its own MemoryMax= stands in for a reservation: 1.5G fits beside nothing on the 2G machine
    // and beside big on neither once big took 3G of 4G.
    assert_eq!(target_of(any, "limited.service"), small);
    let reason = schedule(any).into_iter().find(|(unit, _, _)| unit == "nowhere.service").map(|(_, _, r)| r);
    assert_eq!(reason.as_deref(), Some(format!("needs 8 GiB memory; the most free is 1 GiB on {large}").as_str()));
    let machines = rows(any, "machine,capacity,reserved");
    assert!(machines.contains(&format!("{small}|2 GiB, 1 CPU|1.5 GiB, 0.5 CPU")), "{machines:?}");
    assert!(machines.contains(&format!("{large}|4 GiB, 2 CPU|3 GiB, 0 CPU")), "{machines:?}");

    // A machine with room joins: the waiting unit goes there, and nothing else moves.
    cluster.add_member(2, &sized("16G", "4"));
    cluster.wait_until("the waiting unit is placed on the new machine", Duration::from_secs(20), |c| {
        target_of(c.any(), "nowhere.service") == huge
    });
    assert_eq!(target_of(cluster.any(), "big.service"), large);
    assert_eq!(target_of(cluster.any(), "limited.service"), small);

    // An unreadable reservation is refused at submission, naming the option, and nothing is stored.
    let bad = unit("bad.service", "CPU=lots");
    let refused = cluster.any().fleetctl(&["submit", &bad]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("[X-Fleet] CPU"), "{refused:?}");
    assert!(!cluster.any().ok(&["list-unit-files", "--no-legend"]).stdout.contains("bad.service"));
}

#[test]
fn a_pull_agent_states_its_capacity_and_takes_what_the_manager_has_no_room_for() {
    let pki = ManagerPki::local();
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let mut config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    config.push(("capacity_memory".into(), "1G".into()));
    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let manager = Fleetd::start("e2e0placement001", &pairs);
    let token = manager.ok(&["registration-token", "create", "edge"]).stdout.trim().to_string();
    let agent_dir = tempfile::tempdir().expect("dir");
    let agent_config = format!(
        "machine_id = edge-with-room\nstate_dir = {}\nunit_manager = native\nmanager_url = https://127.0.0.1:{port}\n\
         manager_ca_file = {}\nregistration_token = {token}\ncapacity_memory = 4G\ncapacity_cpu = 2\n",
        agent_dir.path().join("state").display(),
        pki.api_ca_file.display()
    );
    let agent = PullFleetd::start_configured(agent_dir, &agent_config, &[], &[]);
    manager.wait_until("the pull agent is listed with its capacity", Duration::from_secs(20), |m| {
        rows(m, "machine,capacity").contains(&"edge-with-room|4 GiB, 2 CPU".to_string())
    });
    let dir = tempfile::tempdir().expect("dir");
    let unit =
        write_unit(dir.path(), "roomy.service", "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nMemory=2G\n");
    manager.ok(&["start", &unit]);
    assert_eq!(target_of(&manager, "roomy.service"), "edge-with-room", "{}", agent.log());
    // The engine leader reports each machine's capacity and what is reserved there.
    let gib = |n: f64| n * f64::from(1u32 << 30);
    manager.wait_until("the metrics show the reservation", Duration::from_secs(20), |m| {
        metric_value(&m.metrics(), "fleet_machine_reserved_memory_bytes{machine=\"edge-with-room\"}") == Some(gib(2.0))
    });
    let metrics = manager.metrics();
    let series = |name: &str, machine: &str| metric_value(&metrics, &format!("{name}{{machine=\"{machine}\"}}"));
    assert_eq!(series("fleet_machine_capacity_memory_bytes", "edge-with-room"), Some(gib(4.0)));
    assert_eq!(series("fleet_machine_capacity_cpu_millicores", "edge-with-room"), Some(2000.0));
    assert_eq!(series("fleet_machine_capacity_memory_bytes", "e2e0placement001"), Some(gib(1.0)));
    assert_eq!(metric_value(&metrics, "fleet_units_unplaced_for_room"), Some(0.0));
}

#[test]
fn a_templates_instances_spread_over_zones() {
    let zone = |index: usize| vec![("metadata".to_string(), format!("zone={}", if index < 2 { "a" } else { "b" }))];
    let cluster = Cluster::start(3, zone);
    let dir = cluster.members[0].dir.path().to_path_buf();
    std::fs::write(dir.join("web@.service"), "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nSpreadBy=zone\n")
        .expect("template");
    let instances: Vec<String> = (1..=4).map(|n| dir.join(format!("web@{n}.service")).display().to_string()).collect();
    let mut args = vec!["start", "--no-block"];
    args.extend(instances.iter().map(String::as_str));
    cluster.any().ok(&args);
    cluster.wait_until("every instance is placed", Duration::from_secs(20), |c| {
        schedule(c.any()).iter().filter(|(_, machine, _)| !machine.is_empty()).count() == 4
    });
    let in_b = schedule(cluster.any()).iter().filter(|(_, machine, _)| *machine == member_id(2)).count();
    assert_eq!(in_b, 2, "half the instances in zone b, which has one machine of three");
}
