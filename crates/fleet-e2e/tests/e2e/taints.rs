//! Machines kept for some units, on two real fleetds over a real etcd: a member tainted in its
//! fleet.conf takes only the units that tolerate its taint (global units too), a taint set with
//! `fleetctl machine taint … :evict` moves off the units that do not tolerate it (and says why
//! they wait), and untainting lets them back.

use std::time::Duration;

use fleet_e2e::{Cluster, member_id};

const WAIT: Duration = Duration::from_secs(60);

/// unit → machine, for the units placed.
fn machines(cluster: &Cluster) -> std::collections::BTreeMap<String, String> {
    cluster.placement().into_iter().filter_map(|(unit, (machine, _))| Some((unit, machine?))).collect()
}

/// The machines that report `unit` (a global unit: one row per machine).
fn reporting(cluster: &Cluster, unit: &str) -> Vec<String> {
    let rows = cluster.any().ok(&["list-units", "--no-legend", "--full", "--fields", "unit,machine"]).stdout;
    rows.lines()
        .filter_map(|line| {
            let mut columns = line.split_whitespace();
            (columns.next() == Some(unit))
                .then(|| columns.next().unwrap_or_default().split('/').next().unwrap_or_default().to_string())
        })
        .collect()
}

#[test]
fn a_tainted_member_takes_only_tolerating_units_and_an_evicting_taint_moves_the_others() {
    let cluster = Cluster::start(2, |index| match index {
        0 => vec![("taints".to_string(), "gpu=yes".to_string())],
        _ => Vec::new(),
    });
    let (gpu, plain) = (member_id(0), member_id(1));
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, x_fleet: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\n{x_fleet}")).unwrap();
        path.display().to_string()
    };
    let units = [
        write("web@.service", ""),
        write("train.service", "Tolerate=gpu=yes\n"),
        write("sweep.service", "Global=true\n"),
        write("probe.service", "Global=true\nTolerate=gpu\n"),
    ];
    // (`Cluster::start` hands the cluster over once every member is listed.)
    let listed: serde_json::Value =
        serde_json::from_str(&cluster.any().ok(&["list-machines", "-o", "json"]).stdout).unwrap();
    let taints_of = |id: &str| {
        listed.as_array().and_then(|rows| rows.iter().find(|row| row["machine"] == id)).map(|row| row["taints"].clone())
    };
    assert_eq!(taints_of(&gpu), Some(serde_json::json!(["gpu=yes"])), "{listed}");
    assert_eq!(taints_of(&plain), Some(serde_json::json!([])), "{listed}");

    let web: Vec<String> = (1..=3).map(|i| dir.path().join(format!("web@{i}.service")).display().to_string()).collect();
    let mut start = vec!["start", "--no-block", &units[1], &units[2], &units[3]];
    start.extend(web.iter().map(String::as_str));
    cluster.any().ok(&start);
    cluster.wait_until("the four units placed and the globals reported", WAIT, |cluster| {
        machines(cluster).len() == 4
            && reporting(cluster, "probe.service").len() == 2
            && !reporting(cluster, "sweep.service").is_empty()
    });
    let placed = machines(&cluster);
    for i in 1..=3 {
        assert_eq!(placed[&format!("web@{i}.service")], plain, "a unit that does not tolerate gpu=yes: {placed:?}");
    }
    // The least loaded machine, and it tolerates the taint there.
    assert_eq!(placed["train.service"], gpu, "{placed:?}");
    assert_eq!(
        reporting(&cluster, "sweep.service"),
        std::slice::from_ref(&plain),
        "a global unit skips the tainted machine"
    );

    // An evicting taint on the other member: the units that do not tolerate it leave, and with
    // the first member kept for gpu, wait with why.
    cluster.any().ok(&["machine", "taint", &plain[..8], "db:evict"]);
    cluster.wait_until("the web units taken off the evicting member", WAIT, |cluster| {
        machines(cluster).keys().all(|unit| !unit.starts_with("web@"))
    });
    // Taken off, each first waits for the evicting member to stop it; then it waits with why.
    let reasons = || cluster.any().ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout;
    cluster.wait_until("the web units wait with the taint they do not tolerate", WAIT, |_| {
        let listed = reasons();
        let web: Vec<&str> = listed.lines().filter(|line| line.starts_with("web@")).collect();
        web.len() == 3 && web.iter().all(|line| line.contains("which the unit does not tolerate (Tolerate=)"))
    });
    cluster.wait_until("the global unit leaves the evicting member too", WAIT, |cluster| {
        reporting(cluster, "sweep.service").is_empty()
    });
    let listed = cluster.any().ok(&["list-machines", "--no-legend", "--full", "--fields", "machine,taints"]).stdout;
    let row = |id: &str| {
        listed.lines().find(|line| line.starts_with(id)).map(|line| line.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(row(&plain), Some(vec![plain.as_str(), "db:evict"]), "{listed}");
    assert_eq!(row(&gpu), Some(vec![gpu.as_str(), "gpu=yes"]), "{listed}");

    // Untainted, the first member takes them.
    cluster.any().ok(&["machine", "untaint", &gpu[..8], "gpu"]);
    cluster.wait_until("the web units placed on the untainted member", WAIT, |cluster| {
        let placed = machines(cluster);
        (1..=3).all(|i| placed.get(&format!("web@{i}.service")) == Some(&gpu))
    });
    let refused = cluster.any().fleetctl(&["machine", "taint", &gpu[..8], "gpu=yes:soon"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("is not a taint"), "{refused:?}");
}
