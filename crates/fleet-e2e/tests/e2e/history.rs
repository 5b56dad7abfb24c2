//! A unit's versions, end to end: each change of content or desired state is a version that
//! `fleetctl history` lists with when and by whom; `fleetctl revert` brings one back (through a
//! rollout where the unit runs), and `rollout undo --to` takes a rollout's units back to a
//! version. On three fleetds over etcd the versions outlive the engine leader, and every member
//! shows the same ones; on one fleetd over the embedded store, a revert of a unit that does not
//! run writes it back directly, and a version not kept is refused by name.

use std::path::Path;
use std::time::Duration;

use fleet_e2e::{Cluster, Fleetd, write_unit};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

/// A unit that writes its version into `<out>/<name>.log` at each start, then sleeps.
fn unit(dir: &Path, out: &Path, name: &str, version: u32) -> String {
    let log = out.join(format!("{name}.log"));
    write_unit(
        dir,
        name,
        &format!(
            "[Service]\nEnvironment=VERSION={version}\n\
             ExecStart=/bin/sh -c 'echo $VERSION >> {}; exec sleep 100400'\n",
            log.display()
        ),
    )
}

/// The versions `fleetctl history -o json` lists: (version, hash, desired state, current, by).
fn versions(history: &Value) -> Vec<(u64, String, String, bool, Value)> {
    history["versions"]
        .as_array()
        .unwrap_or_else(|| panic!("{history}"))
        .iter()
        .map(|version| {
            (
                version["version"].as_u64().unwrap_or_default(),
                version["hash"].as_str().unwrap_or_default().to_string(),
                version["desiredState"].as_str().unwrap_or_default().to_string(),
                version["current"] == Value::Bool(true),
                version["changedBy"].clone(),
            )
        })
        .collect()
}

fn history_json(ran: &str) -> Value {
    serde_json::from_str(ran).unwrap_or_else(|error| panic!("{error}: {ran}"))
}

/// The full hash of `unit` as `list-unit-files` shows it.
fn hash_of(fleet: &Fleetd, unit: &str) -> String {
    let listed = fleet.ok(&["list-unit-files", "--no-legend", "--full", "--fields", "unit,hash"]).stdout;
    listed
        .lines()
        .find_map(|line| line.strip_prefix(unit).map(|rest| rest.trim().to_string()))
        .unwrap_or_else(|| panic!("{unit} not listed: {listed}"))
}

fn started(out: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default().lines().map(str::to_string).collect()
}

#[test]
fn versions_outlive_the_engine_leader_and_a_revert_rolls_the_old_content_back() {
    let mut cluster = Cluster::start(3, |_| Vec::new());
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let name = "hist.service";
    cluster.any().ok(&["submit", &unit(dir.path(), out.path(), name, 1)]);
    cluster.any().ok(&["start", name]);
    cluster.wait_until("version 1 runs", WAIT, |_| started(out.path(), name) == ["1"]);
    let first_hash = hash_of(cluster.any(), name);
    cluster.any().ok(&["start", "--replace", &unit(dir.path(), out.path(), name, 2)]);
    cluster.wait_until("version 2's content runs", WAIT, |_| {
        started(out.path(), name).last().map(String::as_str) == Some("2")
    });
    let second_hash = hash_of(cluster.any(), name);
    assert_ne!(first_hash, second_hash);

    let before = versions(&history_json(&cluster.any().ok(&["history", name, "-o", "json"]).stdout));
    let summary: Vec<(u64, &str, &str, bool)> =
        before.iter().map(|(n, hash, desired, current, _)| (*n, hash.as_str(), desired.as_str(), *current)).collect();
    assert_eq!(
        summary,
        [
            (1, first_hash.as_str(), "inactive", false),
            (2, first_hash.as_str(), "launched", false),
            (3, second_hash.as_str(), "launched", true),
        ]
    );
    assert!(
        before.iter().all(|(.., by)| by["identity"].as_str().is_some_and(|who| who.starts_with("unix:"))),
        "{before:?}"
    );

    // The engine leader goes: every member still shows the same versions.
    let leader = cluster.leader().expect("a leader");
    cluster.members[leader].stop_with(libc::SIGKILL);
    cluster.wait_until("another member leads", WAIT, |cluster| cluster.leader().is_some_and(|now| now != leader));
    for member in cluster.members.iter().filter(|member| member.is_running()) {
        let shown = versions(&history_json(&member.ok(&["history", name, "-o", "json"]).stdout));
        assert_eq!(shown, before, "on {}", member.machine_id);
    }
    let table = cluster.any().ok(&["history", name]).stdout;
    assert!(table.lines().next().is_some_and(|legend| legend.starts_with("CURRENT")), "{table}");
    assert!(table.lines().any(|line| line.split_whitespace().take(2).eq(["*", "3"])), "{table}");

    // Back to version 2: the unit runs, so the old content comes back through a rollout, which
    // the next leader drives; the revert is version 4, by that rollout.
    let reverted = cluster.any().ok(&["revert", name, "--to", "2", "--min-ready", "1s"]);
    assert!(reverted.stdout.contains("reverted to version 2"), "{reverted:?}");
    cluster.wait_until("version 1's content runs again", WAIT, |_| {
        started(out.path(), name).last().map(String::as_str) == Some("1")
    });
    assert_eq!(hash_of(cluster.any(), name), first_hash);
    let after = versions(&history_json(&cluster.any().ok(&["history", name, "-o", "json"]).stdout));
    let (version, hash, desired, current, by) = after.last().cloned().expect("a version");
    assert_eq!((version, hash.as_str(), desired.as_str(), current), (4, first_hash.as_str(), "launched", true));
    assert_eq!(by["rollout"], Value::from("revert-hist"), "{by}");
    assert_eq!(after[..3].iter().map(|v| v.0).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn a_revert_of_a_unit_that_does_not_run_writes_it_back_and_a_rollout_is_undone_to_a_version() {
    let fleet = Fleetd::start("e2e0history00001", &[("unit_versions_kept", "3")]);
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let name = "kept.service";
    fleet.ok(&["submit", &unit(dir.path(), out.path(), name, 1)]);
    let first_hash = hash_of(&fleet, name);
    for version in 2..=5 {
        fleet.ok(&["submit", "--replace", &unit(dir.path(), out.path(), name, version)]);
    }
    // Five versions made, three past ones kept.
    let shown = versions(&history_json(&fleet.ok(&["history", name, "-o", "json"]).stdout));
    assert_eq!(shown.iter().map(|v| (v.0, v.3)).collect::<Vec<_>>(), [(2, false), (3, false), (4, false), (5, true)]);
    let refused = fleet.fleetctl(&["revert", name, "--to", "1"]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("keeps no version 1: it keeps versions 2 to 5"), "{refused:?}");
    let missing = fleet.fleetctl(&["history", "nope.service"]);
    assert!(missing.code != 0 && missing.stderr.contains("Unit nope.service does not exist"), "{missing:?}");

    // Not running: version 2 is written back as it was, inactive.
    fleet.ok(&["revert", name, "--to", "2"]);
    let back = versions(&history_json(&fleet.ok(&["history", name, "-o", "json"]).stdout));
    let newest = back.last().expect("a version");
    assert_eq!((newest.0, newest.1.as_str(), newest.2.as_str()), (6, shown[0].1.as_str(), "inactive"));
    assert_ne!(newest.1, first_hash, "version 2 was the second content");
    assert!(started(out.path(), name).is_empty(), "nothing was started");

    // A revert is planned as any change: the diff, and the version it would make.
    let planned = history_json(&fleet.ok(&["plan", "revert", name, "--to", "3", "-o", "json"]).stdout);
    let unit = &planned["units"][0];
    assert_eq!(
        (unit["name"].as_str(), unit["action"].as_str(), unit["versionBefore"].as_u64(), unit["version"].as_u64()),
        (Some(name), Some("change"), Some(6), Some(7)),
        "{planned}"
    );
    let table = fleet.ok(&["plan", "revert", name, "--to", "3"]).stdout;
    assert!(table.contains("-Environment=VERSION=2") && table.contains("+Environment=VERSION=3"), "{table}");
    assert_eq!(fleet.fleetctl(&["plan", "revert", name]).code, 2, "--to is needed");
    let still = versions(&history_json(&fleet.ok(&["history", name, "-o", "json"]).stdout));
    assert_eq!(still.last().map(|version| version.0), Some(6), "a plan writes nothing");
    let listed = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,version"]).stdout;
    assert!(listed.lines().any(|line| line.split_whitespace().eq([name, "6"])), "{listed}");
    let rows = history_json(&fleet.ok(&["list-unit-files", "-o", "json"]).stdout);
    let row = rows.as_array().and_then(|rows| rows.iter().find(|row| row["unit"] == name)).cloned();
    assert_eq!(row.map(|row| row["version"].clone()), Some(Value::from(6)));

    // Three instances rolled out to new content, then undone to their version 2.
    let template = dir.path().join("web@.service");
    let instances = ["web@1.service", "web@2.service", "web@3.service"];
    std::fs::write(&template, "[Service]\nEnvironment=V=1\nExecStart=/bin/sleep 100401\n").unwrap();
    let mut start = vec!["start".to_string()];
    start.extend(instances.iter().map(|instance| dir.path().join(instance).display().to_string()));
    fleet.ok(&start.iter().map(String::as_str).collect::<Vec<_>>());
    let old_hash = hash_of(&fleet, instances[0]);
    std::fs::write(&template, "[Service]\nEnvironment=V=2\nExecStart=/bin/sleep 100402\n").unwrap();
    fleet.ok(&[
        "rollout",
        "start",
        "--max-unavailable",
        "2",
        "--min-ready",
        "1s",
        "--name",
        "web",
        &template.display().to_string(),
    ]);
    fleet.ok(&["rollout", "status", "web", "--wait"]);
    assert_ne!(hash_of(&fleet, instances[0]), old_hash);
    let undone = fleet.ok(&["rollout", "undo", "web", "--to", "1"]);
    assert!(undone.stderr.contains("Rollout web-to-v1 started: 3 units"), "{undone:?}");
    for instance in instances {
        assert_eq!(hash_of(&fleet, instance), old_hash, "{instance}");
        let shown = versions(&history_json(&fleet.ok(&["history", instance, "-o", "json"]).stdout));
        let by = &shown.last().expect("a version").4;
        assert_eq!((by["rollout"].as_str(), by["identity"].as_str()), (Some("web-to-v1"), Some("unix:uid=0")), "{by}");
    }
}
