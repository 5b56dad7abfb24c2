//! One disruption budget for every disruption, on four real fleetds over a real etcd in two
//! zones: eight instances of a template with `DisruptionBudget=1` and `DisruptionBudgetBy=zone`,
//! a member drained (max-unavailable 2) while a rollout (max-unavailable 4) replaces them all
//! with content that takes seconds to start. Each alone would take up to 2 and 4 down; together
//! they never have more than one down per zone (two in all, as the machines report them), one
//! of them says which budget holds it, and both finish.

use std::collections::BTreeSet;
use std::time::Duration;

use fleet_e2e::{Cluster, Fleetd, member_id, write_unit};

const WAIT: Duration = Duration::from_secs(120);
const INSTANCES: usize = 8;

/// The instances some machine reports active (on any content).
fn active(fleetd: &Fleetd) -> BTreeSet<String> {
    fleetd.unit_rows().into_iter().filter(|(_, active, _)| active == "active").map(|(unit, ..)| unit).collect()
}

/// The instances some machine reports active on the content the unit has now.
fn active_on_current(fleetd: &Fleetd, content: &str) -> usize {
    let listed = fleetd.ok(&["list-units", "--no-legend", "--full", "--fields", "unit,hash,active"]).stdout;
    listed
        .lines()
        .filter(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            cells.len() == 3 && cells[0].starts_with("web@") && cells[1] == content && cells[2] == "active"
        })
        .count()
}

/// What the leader decided: the units the drain let go and the rollout replaced, the holds,
/// and the engine's decisions, from every member's log.
fn disruptions(cluster: &Cluster) -> String {
    let logs = cluster.logs();
    let said = ["drain lets", "rolling out", "disruption budget", "engine decisions"];
    logs.lines().filter(|line| said.iter().any(|words| line.contains(words))).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_drain_and_a_rollout_at_once_keep_to_a_budget_of_one_down_per_zone() {
    let cluster = Cluster::start(4, |index| {
        let zone = if index < 2 { "a" } else { "b" };
        vec![("metadata".to_string(), format!("zone={zone}"))]
    });
    let dir = cluster.members[0].dir.path().to_path_buf();
    let x_fleet = "[X-Fleet]\nSpreadBy=zone\nDisruptionBudget=1\nDisruptionBudgetBy=zone\n";
    let template = write_unit(&dir, "web@.service", &format!("[Service]\nExecStart=/bin/sleep 100000\n{x_fleet}"));
    let instances: Vec<String> =
        (1..=INSTANCES).map(|n| dir.join(format!("web@{n}.service")).display().to_string()).collect();
    assert!(template.ends_with("web@.service"), "the instances' template, beside them: {template}");
    let mut start = vec!["start", "--no-block"];
    start.extend(instances.iter().map(String::as_str));
    cluster.any().ok(&start);
    cluster.wait_until("every instance runs", WAIT, |cluster| active(cluster.any()).len() == INSTANCES);
    let listed: serde_json::Value =
        serde_json::from_str(&cluster.any().ok(&["list-unit-files", "-o", "json"]).stdout).unwrap();
    let budgets: BTreeSet<String> =
        listed.as_array().into_iter().flatten().map(|row| row["disruptionBudget"].to_string()).collect();
    assert_eq!(budgets, BTreeSet::from([r#"{"by":"zone","size":"1"}"#.to_string()]), "{listed}");

    // The new content takes three seconds to start: a replaced unit is down that long.
    let new = write_unit(
        &dir,
        "web@.service",
        &format!("[Service]\nExecStartPre=/bin/sleep 3\nExecStart=/bin/sleep 200000\n{x_fleet}"),
    );
    let drained = member_id(0);
    cluster.any().ok(&["machine", "drain", "--max-unavailable", "2", &drained[..8]]);
    cluster.any().ok(&["rollout", "start", "--max-unavailable", "4", "--min-ready", "1s", &new]);

    let mut holds: BTreeSet<String> = BTreeSet::new();
    cluster.wait_until("the drain and the rollout finish", WAIT, |cluster| {
        let fleetd = cluster.any();
        let running = active(fleetd);
        let down: Vec<String> =
            (1..=INSTANCES).map(|n| format!("web@{n}.service")).filter(|unit| !running.contains(unit)).collect();
        assert!(down.len() <= 2, "at most one down per zone, two in all: {down:?} down; {}", disruptions(cluster));
        let rollout = fleetd.ok(&["rollout", "status", "web"]).stdout;
        if let Some(held) = rollout.lines().find_map(|line| line.strip_prefix("Held:")) {
            holds.insert(held.trim().to_string());
        }
        let drain = fleetd.ok(&["machine", "status", &drained[..8]]).stdout;
        if let Some(held) = drain.lines().find_map(|line| line.strip_prefix("Held:")) {
            holds.insert(held.trim().to_string());
        }
        rollout.contains("State:           done") && drain.contains("is drained")
    });
    assert!(
        holds.iter().any(|held| held.contains("held by the disruption budget of web@.service in zone=")
            && held.ends_with("1 down of the 1 it allows (DisruptionBudget=1, DisruptionBudgetBy=zone)")),
        "the rollout or the drain waited on the budget, and said so: {holds:?}"
    );
    let content = fleet_core::UnitFile::parse(&std::fs::read_to_string(&new).unwrap()).unwrap().hash().to_string();
    cluster.wait_until("every instance runs its new content", WAIT, |cluster| {
        active_on_current(cluster.any(), &content) == INSTANCES
    });
    let placement = cluster.placement();
    assert!(
        placement.iter().all(|(_, (machine, _))| machine.as_deref() != Some(drained.as_str())),
        "nothing is left on the drained member: {placement:?}"
    );
}
