use std::sync::Arc;

use super::*;
use crate::schedule::tests::{machine, unit};

fn requirements(name: &str, x_fleet: &str) -> Option<Arc<Requirements>> {
    Some(unit(name, x_fleet, None).requirements)
}

fn start(name: &str, x_fleet: &str) -> PreviewChange {
    PreviewChange::Set {
        name: name.to_string(),
        desired: DesiredState::Launched,
        requirements: requirements(name, x_fleet),
    }
}

fn cluster(units: Vec<UnitSpec>) -> ClusterSnapshot {
    ClusterSnapshot { machines: vec![machine("a", &[]), machine("b", &[])], units, ..ClusterSnapshot::default() }
}

fn at(name: &str, before: Option<&str>, after: Option<&str>, changed: bool) -> PreviewedUnit {
    PreviewedUnit {
        name: name.to_string(),
        before: before.map(str::to_string),
        after: after.map(str::to_string),
        waiting: None,
        changed,
    }
}

#[test]
fn a_new_unit_goes_where_the_engine_would_put_it_and_nothing_else_moves() {
    let cluster = cluster(vec![unit("x.service", "", Some("a"))]);
    let preview = preview(&cluster, &[start("y.service", "")]);
    assert_eq!(preview.units, vec![at("y.service", None, Some("b"), true)]);
}

#[test]
fn the_units_a_change_moves_are_listed_after_the_ones_it_names() {
    let cluster = cluster(vec![unit("old.service", "", Some("a")), unit("other.service", "", Some("b"))]);
    let preview = preview(&cluster, &[start("new.service", "Replaces=old.service")]);
    assert_eq!(
        preview.units,
        vec![at("new.service", None, Some("a"), true), at("old.service", Some("a"), Some("b"), false)],
        "the new unit takes the machine of the one it replaces, which moves"
    );
}

#[test]
fn a_destroyed_or_stopped_unit_leaves_its_machine() {
    let cluster = cluster(vec![unit("x.service", "", Some("a")), unit("y.service", "", Some("b"))]);
    let changes = [
        PreviewChange::Destroy { name: "x.service".into() },
        PreviewChange::Set { name: "y.service".into(), desired: DesiredState::Inactive, requirements: None },
    ];
    let preview = preview(&cluster, &changes);
    assert_eq!(preview.units, vec![at("x.service", Some("a"), None, true), at("y.service", Some("b"), None, true)]);
}

#[test]
fn a_unit_no_machine_can_take_waits_with_the_engines_reason() {
    let cluster = cluster(vec![]);
    let preview = preview(&cluster, &[start("picky.service", "MachineMetadata=role=db")]);
    let [picky] = preview.units.as_slice() else { panic!("one unit: {preview:?}") };
    assert_eq!((picky.before.as_deref(), picky.after.as_deref()), (None, None));
    let reason = picky.waiting.as_deref().unwrap_or_default();
    assert!(reason.contains("role=db"), "the planner's reason names what it lacks: {reason:?}");
}

#[test]
fn what_the_engine_owes_the_cluster_anyway_is_not_the_changes_doing() {
    // `pending.service` is not placed yet: the engine places it whatever the change, so the
    // preview counts it as placed before and does not list it as moved.
    let cluster = cluster(vec![unit("x.service", "", Some("a")), unit("pending.service", "", None)]);
    let preview = preview(&cluster, &[start("y.service", "")]);
    assert_eq!(preview.units, vec![at("y.service", None, Some("a"), true)]);
}

#[test]
fn new_content_keeps_a_unit_where_it_may_stay_and_moves_it_where_it_may_not() {
    let mut cluster = cluster(vec![unit("x.service", "", Some("a"))]);
    cluster.machines = vec![machine("a", &[("role", "web")]), machine("b", &[("role", "db")])];
    let stays = preview(&cluster, &[start("x.service", "MachineMetadata=role=web")]);
    assert_eq!(stays.units, vec![at("x.service", Some("a"), Some("a"), true)]);
    let moves = preview(&cluster, &[start("x.service", "MachineMetadata=role=db")]);
    assert_eq!(moves.units, vec![at("x.service", Some("a"), Some("b"), true)]);
}

#[test]
fn a_drain_shows_where_each_unit_of_the_machine_goes_and_which_stay_and_why() {
    let cluster = cluster(vec![
        unit("x.service", "", Some("a")),
        unit("pinned.service", "MachineID=a", Some("a")),
        unit("z.service", "", Some("b")),
    ]);
    let preview = preview(&cluster, &[PreviewChange::Drain { machine: "a".into() }]);
    let [pinned, x] = preview.units.as_slice() else { panic!("the drained machine's two units: {preview:?}") };
    assert_eq!((x.name.as_str(), x.before.as_deref(), x.after.as_deref()), ("x.service", Some("a"), Some("b")));
    assert_eq!(
        (pinned.name.as_str(), pinned.before.as_deref(), pinned.after.as_deref()),
        ("pinned.service", Some("a"), Some("a"))
    );
    let reason = pinned.waiting.as_deref().unwrap_or_default();
    assert!(reason.starts_with("cannot leave its draining machine"), "{reason:?}");
}

/// With preemption on, a plan shows the unit a change would take the room of, and why it
/// would wait.
#[test]
fn a_change_that_would_preempt_shows_the_unit_that_leaves_and_why() {
    let full = crate::MachineState {
        capacity: Some(crate::resources::Resources { memory: 1 << 30, cpu_millis: 1000 }),
        ..machine("a", &[])
    };
    let cluster = ClusterSnapshot {
        machines: vec![full],
        units: vec![unit("batch.service", "Memory=1G\nPriority=10", Some("a"))],
        preemption: true,
        ..ClusterSnapshot::default()
    };
    let preview = preview(&cluster, &[start("web.service", "Memory=1G\nPriority=900")]);
    let waiting = "preempted by web.service (priority 900): needs 1 GiB memory; the most free is 0 B on a";
    assert_eq!(
        preview.units,
        vec![
            at("web.service", None, Some("a"), true),
            PreviewedUnit { waiting: Some(waiting.to_string()), ..at("batch.service", Some("a"), None, false) },
        ]
    );
}
