//! Priorities with preemption, on two real fleetds over a real etcd with room for two units:
//! a priority-900 unit that fits nowhere takes the room of a priority-10 one, which stops
//! before anything else starts there and waits saying who took its room; once the room is given
//! back it runs again. A malformed priority is refused at submission.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_e2e::Cluster;

const WAIT: Duration = Duration::from_secs(60);

/// unit → machine, for the units placed.
fn machines(cluster: &Cluster) -> BTreeMap<String, String> {
    cluster.placement().into_iter().filter_map(|(unit, (machine, _))| Some((unit, machine?))).collect()
}

/// unit → reason, for the units that have one.
fn reasons(cluster: &Cluster) -> BTreeMap<String, String> {
    let listed: serde_json::Value =
        serde_json::from_str(&cluster.any().ok(&["list-unit-files", "-o", "json"]).stdout).expect("JSON");
    listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| Some((row["unit"].as_str()?.to_string(), row["reason"].as_str()?.to_string())))
        .collect()
}

/// unit → the machines that report it active.
fn active(cluster: &Cluster) -> BTreeMap<String, Vec<String>> {
    let rows = cluster.any().ok(&["list-units", "--no-legend", "--full", "--fields", "unit,machine,active"]).stdout;
    let mut active: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in rows.lines() {
        if let [unit, machine, "active"] = line.split_whitespace().collect::<Vec<_>>()[..] {
            let machine = machine.split('/').next().unwrap_or_default().to_string();
            active.entry(unit.to_string()).or_default().push(machine);
        }
    }
    active
}

#[test]
fn a_unit_of_a_higher_priority_takes_the_room_of_a_lower_one_which_waits_saying_why() {
    let cluster = Cluster::start(2, |_| {
        vec![("capacity_memory".to_string(), "1G".to_string()), ("preemption".to_string(), "on".to_string())]
    });
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, x_fleet: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\n{x_fleet}")).unwrap();
        path.display().to_string()
    };
    let low = write("low@.service", "Memory=1G\nPriority=10\n");
    let high = write("high.service", "Memory=1G\nPriority=900\n");
    let bad = write("bad.service", "Priority=1001\n");

    let refused = cluster.any().fleetctl(&["submit", &bad]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("Priority") && refused.stderr.contains("1001"), "{refused:?}");

    let lows: Vec<String> =
        (1..=2).map(|i| dir.path().join(format!("low@{i}.service")).display().to_string()).collect();
    cluster.any().ok(&["submit", &low]);
    cluster.any().ok(&["start", "--no-block", &lows[0], &lows[1]]);
    cluster.wait_until("both low units run, one on each member", WAIT, |cluster| {
        let active = active(cluster);
        ["low@1.service", "low@2.service"].iter().all(|unit| active.get(*unit).is_some_and(|on| on.len() == 1))
    });
    let before = machines(&cluster);

    cluster.any().ok(&["start", "--no-block", &high]);
    cluster.wait_until("the high unit runs in the room of a low one, which waits", WAIT, |cluster| {
        let (placed, active) = (machines(cluster), active(cluster));
        placed.len() == 2 && active.get("high.service").is_some_and(|on| on.len() == 1)
    });
    let placed = machines(&cluster);
    let preempted = ["low@1.service", "low@2.service"]
        .into_iter()
        .find(|unit| !placed.contains_key(*unit))
        .expect("a low unit gave its room");
    assert_eq!(placed["high.service"], before[preempted], "it took the room of the unit it preempted");
    let why = &reasons(&cluster)[preempted];
    assert!(
        why.starts_with("preempted by high.service (priority 900): needs 1 GiB memory"),
        "the preempted unit says who took its room: {why}"
    );
    assert!(!active(&cluster).contains_key(preempted), "the preempted unit stopped");
    let listed = cluster.any().ok(&["list-unit-files", "--no-legend", "--fields", "unit,priority"]).stdout;
    assert!(
        listed.lines().any(|line| line.split_whitespace().collect::<Vec<_>>() == ["high.service", "900"]),
        "{listed}"
    );

    // The room given back, the preempted unit runs again.
    cluster.any().ok(&["destroy", "high.service"]);
    cluster.wait_until("the preempted unit runs again", WAIT, |cluster| {
        active(cluster).get(preempted).is_some_and(|on| on.len() == 1)
    });
    assert!(!reasons(&cluster).contains_key(preempted), "its reason went once it was placed");
}
