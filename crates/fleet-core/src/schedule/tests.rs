use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::glob::glob_matches;

fn machine(id: &str, metadata: &[(&str, &str)]) -> MachineState {
    MachineState {
        id: id.to_string(),
        metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

fn unit(name: &str, x_fleet: &str, scheduled_on: Option<&str>) -> UnitSpec {
    let file = crate::UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).unwrap();
    UnitSpec {
        name: name.to_string(),
        desired: DesiredState::Launched,
        requirements: Requirements::from_unit(name, &file),
        scheduled_on: scheduled_on.map(str::to_string),
    }
}

fn scheduled(plan: &Plan) -> BTreeMap<String, String> {
    plan.decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Schedule { unit, machine } => Some((unit.clone(), machine.clone())),
            Decision::Unschedule { .. } => None,
        })
        .collect()
}

#[test]
fn least_loaded_with_id_tie_break() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("b", &[]), machine("a", &[]), machine("c", &[])],
        units: vec![unit("x.service", "", Some("a")), unit("y.service", "", None), unit("z.service", "", None)],
    };
    let plan = plan(&snapshot);
    assert_eq!(scheduled(&plan), BTreeMap::from([("y.service".into(), "b".into()), ("z.service".into(), "c".into())]));
    assert!(plan.unplaced.is_empty());
}

#[test]
fn running_units_never_move() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[]), machine("b", &[])],
        units: vec![
            unit("x.service", "", Some("a")),
            unit("y.service", "", Some("a")),
            unit("z.service", "", Some("a")),
        ],
    };
    assert_eq!(plan(&snapshot), Plan::default());
}

#[test]
fn machine_loss_and_inactive_units_are_unscheduled() {
    let mut inactive = unit("i.service", "", Some("a"));
    inactive.desired = DesiredState::Inactive;
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[])],
        units: vec![inactive, unit("gone.service", "", Some("dead"))],
    };
    let plan = plan(&snapshot);
    assert_eq!(
        plan.decisions,
        vec![
            Decision::Unschedule {
                unit: "gone.service".into(),
                machine: "dead".into(),
                reason: UnscheduleReason::MachineWentAway
            },
            Decision::Unschedule {
                unit: "i.service".into(),
                machine: "a".into(),
                reason: UnscheduleReason::TargetStateInactive
            },
            Decision::Schedule { unit: "gone.service".into(), machine: "a".into() },
        ]
    );
}

#[test]
fn machine_id_full_and_short() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("aaaaaaaa1111", &[]), machine("bbbbbbbb2222", &[])],
        units: vec![
            unit("full.service", "MachineID=bbbbbbbb2222", None),
            unit("short.service", "MachineID=bbbbbbbb", None),
            unit("missing.service", "MachineID=cccccccc", None),
        ],
    };
    let plan = plan(&snapshot);
    assert_eq!(scheduled(&plan)["full.service"], "bbbbbbbb2222");
    assert_eq!(scheduled(&plan)["short.service"], "bbbbbbbb2222");
    assert_eq!(plan.unplaced[0].0, "missing.service");
    assert_eq!(plan.unplaced[0].1.to_string(), "no machine with ID cccccccc is available");
}

#[test]
fn metadata_constraints_and_reason() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[("region", "us")]), machine("b", &[("region", "eu"), ("disk", "ssd")])],
        units: vec![
            unit("eu.service", "MachineMetadata=region=eu\n", None),
            unit("either.service", "MachineMetadata=region=eu\nMachineMetadata=region=us\n", None),
            unit("asia.service", "MachineMetadata=region=asia\n", None),
        ],
    };
    let plan = plan(&snapshot);
    assert_eq!(scheduled(&plan)["eu.service"], "b");
    assert_eq!(scheduled(&plan)["either.service"], "a");
    assert_eq!(
        plan.unplaced,
        vec![(
            "asia.service".to_string(),
            UnplacedReason::NoMachineWithMetadata(BTreeMap::from([("region".into(), vec!["asia".into()])]))
        )]
    );
    assert_eq!(plan.unplaced[0].1.to_string(), "no machine has metadata region=asia");
}

#[test]
fn conflicts_both_ways_and_reason() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[])],
        units: vec![unit("web@1.service", "Conflicts=web@*.service", Some("a")), unit("web@2.service", "", None)],
    };
    let plan = plan(&snapshot);
    assert!(plan.decisions.is_empty());
    assert_eq!(plan.unplaced[0].1.to_string(), "conflicts with web@1.service on every eligible machine");
}

#[test]
fn conflicting_units_spread_then_wait() {
    let units = (0..5).map(|n| unit(&format!("conflict.{n}.service"), "Conflicts=conflict.*.service", None)).collect();
    let snapshot = ClusterSnapshot { machines: vec![machine("a", &[]), machine("b", &[]), machine("c", &[])], units };
    let plan = plan(&snapshot);
    let placed = scheduled(&plan);
    assert_eq!(placed.len(), 3);
    let machines: std::collections::BTreeSet<_> = placed.values().collect();
    assert_eq!(machines.len(), 3);
    assert_eq!(plan.unplaced.len(), 2);
}

#[test]
fn global_units_are_not_placed_but_conflict() {
    let mut global = unit("global.service", "Global=true\nMachineMetadata=role=edge\n", None);
    global.requirements.global = true;
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[("role", "edge")]), machine("b", &[])],
        units: vec![global, unit("x.service", "Conflicts=global.service", None), unit("y.service", "", None)],
    };
    let plan = plan(&snapshot);
    // a carries the global unit, so both x (conflict) and y (load) go to b first.
    assert_eq!(scheduled(&plan)["x.service"], "b");
    assert!(!scheduled(&plan).contains_key("global.service"));
}

#[test]
fn followers_go_with_their_leader_even_in_chains() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[]), machine("b", &[])],
        units: vec![
            unit("a-follower.service", "MachineOf=b-middle.service", None),
            unit("b-middle.service", "MachineOf=z-leader.service", None),
            unit("z-leader.service", "MachineID=b", None),
            unit("orphan.service", "MachineOf=nowhere.service", None),
        ],
    };
    let plan = plan(&snapshot);
    let placed = scheduled(&plan);
    assert_eq!(placed["z-leader.service"], "b");
    assert_eq!(placed["b-middle.service"], "b");
    assert_eq!(placed["a-follower.service"], "b");
    assert_eq!(plan.unplaced[0].1.to_string(), "MachineOf nowhere.service, which is not scheduled");
}

#[test]
fn followers_move_when_their_leader_moved() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[]), machine("b", &[])],
        units: vec![
            unit("leader.service", "", Some("gone")),
            unit("peer.service", "MachineOf=leader.service", Some("b")),
        ],
    };
    let placed = scheduled(&plan(&snapshot));
    assert_eq!(placed["leader.service"], "a");
    assert_eq!(placed["peer.service"], "a");
}

#[test]
fn templates_are_never_scheduled_and_no_machines_is_a_reason() {
    let snapshot =
        ClusterSnapshot { machines: vec![], units: vec![unit("t@.service", "", None), unit("u.service", "", None)] };
    let plan = plan(&snapshot);
    assert!(plan.decisions.is_empty());
    assert_eq!(plan.unplaced, vec![("u.service".into(), UnplacedReason::NoMachines)]);
}

// ---- properties over random clusters ----

fn arbitrary_snapshot() -> impl Strategy<Value = ClusterSnapshot> {
    let machines = prop::collection::btree_set(0u8..12, 0..8).prop_flat_map(|ids| {
        let ids: Vec<u8> = ids.into_iter().collect();
        let count = ids.len();
        (Just(ids), prop::collection::vec(0u8..3, count))
    });
    let raw_unit = (0u8..6, 0u8..4, prop::option::of(0u8..12), any::<bool>(), 0u8..4);
    (machines, prop::collection::vec(raw_unit, 0..25)).prop_map(|((ids, regions), raw_units)| {
        let machines: Vec<MachineState> = ids
            .iter()
            .zip(&regions)
            .map(|(id, region)| machine(&format!("m{id:02}"), &[("region", &format!("r{region}"))]))
            .collect();
        let units = raw_units
            .iter()
            .enumerate()
            .map(|(n, (kind, group, on, launched, region))| {
                let name = format!("g{group}@{n}.service");
                let x_fleet = match kind {
                    0 => format!("Conflicts=g{group}@*.service"),
                    1 => format!("MachineMetadata=region=r{region}"),
                    2 => format!("MachineID=m{:02}", on.unwrap_or(0)),
                    3 => format!("MachineOf=g{group}@{}.service", n.saturating_sub(1)),
                    _ => String::new(),
                };
                let mut spec = unit(&name, &x_fleet, on.map(|id| format!("m{id:02}")).as_deref());
                if !launched {
                    spec.desired = DesiredState::Loaded;
                }
                spec
            })
            .collect();
        ClusterSnapshot { machines, units }
    })
}

proptest! {
    #[test]
    fn decisions_respect_every_constraint_and_least_load(snapshot in arbitrary_snapshot()) {
        let result = plan(&snapshot);
        let live: BTreeMap<&str, &MachineState> = snapshot.machines.iter().map(|m| (m.id.as_str(), m)).collect();
        // Replay the plan from the snapshot.
        let mut placement: BTreeMap<String, String> = snapshot
            .units
            .iter()
            .filter_map(|u| u.scheduled_on.clone().map(|m| (u.name.clone(), m)))
            .collect();
        let load_of = |placement: &BTreeMap<String, String>, id: &str| placement.values().filter(|m| *m == id).count();
        let specs: BTreeMap<&str, &UnitSpec> = snapshot.units.iter().map(|u| (u.name.as_str(), u)).collect();
        for decision in &result.decisions {
            match decision {
                Decision::Unschedule { unit, .. } => { placement.remove(unit); }
                Decision::Schedule { unit, machine } => {
                    let spec = specs[unit.as_str()];
                    let target = live[machine.as_str()];
                    // Least-loaded: no eligible machine had a strictly lower load at that point.
                    let eligible = |m: &MachineState| {
                        spec.requirements.machine_id.as_ref().is_none_or(|id| m.matches_id(id))
                            && spec.requirements.metadata_matches(&m.metadata)
                            && spec.requirements.machine_of.iter().all(|peer| placement.get(peer) == Some(&m.id))
                            && !placement.iter().any(|(other, on)| on == &m.id
                                && spec.requirements.conflicts_with(unit, other, &specs[other.as_str()].requirements.conflicts))
                    };
                    prop_assert!(eligible(target), "{unit} placed on ineligible {machine}");
                    let chosen = load_of(&placement, machine);
                    for other in snapshot.machines.iter().filter(|m| eligible(m)) {
                        prop_assert!(load_of(&placement, &other.id) >= chosen, "{unit}: {} less loaded than {machine}", other.id);
                    }
                    placement.insert(unit.clone(), machine.clone());
                }
            }
        }
        // The final placement satisfies every constraint, and everything unplaced has a reason.
        for (unit, machine) in &placement {
            let spec = specs[unit.as_str()];
            let target = live.get(machine.as_str());
            prop_assert!(target.is_some(), "{unit} left on dead machine {machine}");
            let target = target.unwrap();
            prop_assert!(spec.desired != DesiredState::Inactive);
            prop_assert!(spec.requirements.machine_id.as_ref().is_none_or(|id| target.matches_id(id)));
            prop_assert!(spec.requirements.metadata_matches(&target.metadata));
            for peer in &spec.requirements.machine_of {
                prop_assert_eq!(placement.get(peer), Some(machine));
            }
            for (other, on) in &placement {
                if on == machine && other != unit {
                    prop_assert!(!spec.requirements.conflicts.iter().any(|p| glob_matches(p, other)), "{unit} conflicts with {other}");
                }
            }
        }
        for spec in &snapshot.units {
            let wants = spec.desired != DesiredState::Inactive;
            let placed = placement.contains_key(&spec.name);
            let reasoned = result.unplaced.iter().any(|(name, _)| name == &spec.name);
            prop_assert!(!wants || placed != reasoned, "{} placed={placed} reasoned={reasoned}", spec.name);
        }
    }
}
