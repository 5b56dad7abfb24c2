use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::agent_plan::{DesiredUnit, GlobalUnit, add_global_units};
use crate::glob::glob_matches;
use crate::resources::Resources;
use crate::unit_file::UnitHash;

pub(super) fn machine(id: &str, metadata: &[(&str, &str)]) -> MachineState {
    MachineState {
        id: id.to_string(),
        metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

pub(super) fn unit(name: &str, x_fleet: &str, scheduled_on: Option<&str>) -> UnitSpec {
    let file = crate::UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).unwrap();
    UnitSpec {
        name: name.to_string(),
        desired: DesiredState::Launched,
        requirements: std::sync::Arc::new(Requirements::from_unit(name, &file)),
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
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
    };
    let result = plan(&snapshot);
    assert!(result.decisions.is_empty() && result.unplaced.is_empty(), "{result:?}");
    let held: Vec<(&str, u32)> = result.loads.iter().map(|load| (load.machine.as_str(), load.units)).collect();
    assert_eq!(held, [("a", 3), ("b", 0)], "the plan says what each machine holds");
}

#[test]
fn machine_loss_and_inactive_units_are_unscheduled() {
    let mut inactive = unit("i.service", "", Some("a"));
    inactive.desired = DesiredState::Inactive;
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[])],
        units: vec![inactive, unit("gone.service", "", Some("dead"))],
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert!(plan.decisions.is_empty());
    assert_eq!(plan.unplaced[0].1.to_string(), "conflicts with web@1.service on every eligible machine");
}

#[test]
fn conflicting_units_spread_then_wait() {
    let units = (0..5).map(|n| unit(&format!("conflict.{n}.service"), "Conflicts=conflict.*.service", None)).collect();
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[]), machine("b", &[]), machine("c", &[])],
        units,
        ..ClusterSnapshot::default()
    };
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
    std::sync::Arc::make_mut(&mut global.requirements).global = true;
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[("role", "edge")]), machine("b", &[])],
        units: vec![global, unit("x.service", "Conflicts=global.service", None), unit("y.service", "", None)],
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
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
        ..ClusterSnapshot::default()
    };
    let placed = scheduled(&plan(&snapshot));
    assert_eq!(placed["leader.service"], "a");
    assert_eq!(placed["peer.service"], "a");
}

#[test]
fn templates_are_never_scheduled_and_no_machines_is_a_reason() {
    let snapshot = ClusterSnapshot {
        machines: vec![],
        units: vec![unit("t@.service", "", None), unit("u.service", "", None)],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert!(plan.decisions.is_empty());
    assert_eq!(plan.unplaced, vec![("u.service".into(), UnplacedReason::NoMachines)]);
}

#[test]
fn replacing_unit_takes_the_machine_and_the_replaced_unit_moves_with_its_followers() {
    // The original's TestScheduleReplace, with followers on the replaced unit.
    let snapshot = ClusterSnapshot {
        machines: vec![machine("m0", &[]), machine("m1", &[]), machine("m2", &[])],
        units: vec![
            unit("replace.0.service", "", Some("m1")),
            unit("replace.0-peer.service", "MachineOf=replace.0.service", Some("m1")),
            unit("other.service", "", Some("m0")),
            unit("other2.service", "", Some("m0")),
            unit("kick.service", "Replaces=replace.0.service", None),
        ],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert_eq!(
        plan.decisions,
        vec![
            Decision::Schedule { unit: "kick.service".into(), machine: "m1".into() },
            Decision::Unschedule {
                unit: "replace.0.service".into(),
                machine: "m1".into(),
                reason: UnscheduleReason::ReplacedBy("kick.service".into()),
            },
            Decision::Unschedule {
                unit: "replace.0-peer.service".into(),
                machine: "m1".into(),
                reason: UnscheduleReason::CannotRunThere(Refusal::PeerNotScheduled("replace.0.service".into())),
            },
            Decision::Schedule { unit: "replace.0.service".into(), machine: "m2".into() },
            Decision::Schedule { unit: "replace.0-peer.service".into(), machine: "m2".into() },
        ]
    );
    assert!(plan.unplaced.is_empty());
}

#[test]
fn a_replaced_unit_with_nowhere_else_to_go_waits_with_a_reason() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("m0", &[])],
        units: vec![unit("old.service", "", Some("m0")), unit("new.service", "Replaces=old.*", None)],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert_eq!(scheduled(&plan)["new.service"], "m0");
    assert_eq!(plan.unplaced.len(), 1);
    assert_eq!(plan.unplaced[0].0, "old.service");
    assert_eq!(plan.unplaced[0].1.to_string(), "replaced by new.service on every eligible machine");
    // Once settled, nothing changes: the replaced unit keeps waiting.
    let settled = ClusterSnapshot {
        machines: snapshot.machines.clone(),
        units: vec![unit("old.service", "", None), unit("new.service", "Replaces=old.*", Some("m0"))],
        ..ClusterSnapshot::default()
    };
    let again = super::plan(&settled);
    assert!(again.decisions.is_empty());
    assert_eq!(again.unplaced, plan.unplaced);
}

#[test]
fn units_replacing_each_other_run_one_at_a_time() {
    // The original's TestScheduleCircularReplace: two machines, yet only one runs.
    let machines = vec![machine("m0", &[]), machine("m1", &[])];
    let snapshot = ClusterSnapshot {
        machines: machines.clone(),
        units: vec![
            unit("replace.0.service", "Replaces=replace.1.service", Some("m0")),
            unit("replace.1.service", "Replaces=replace.0.service", None),
        ],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert!(plan.decisions.is_empty());
    assert_eq!(
        plan.unplaced[0].1.to_string(),
        "replaces replace.0.service, which replaces it in turn: only one of them runs"
    );
    // Submitted together, the first in name order runs.
    let fresh = ClusterSnapshot {
        machines,
        units: vec![
            unit("replace.1.service", "Replaces=replace.0.service", None),
            unit("replace.0.service", "Replaces=replace.1.service", None),
        ],
        ..ClusterSnapshot::default()
    };
    let plan = super::plan(&fresh);
    assert_eq!(scheduled(&plan).keys().collect::<Vec<_>>(), vec!["replace.0.service"]);
    assert_eq!(plan.unplaced[0].0, "replace.1.service");
}

#[test]
fn a_unit_avoids_machines_of_units_that_replace_it() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("m0", &[]), machine("m1", &[])],
        units: vec![
            unit("new.service", "Replaces=old.service", Some("m0")),
            unit("filler.service", "", Some("m1")),
            unit("filler2.service", "", Some("m1")),
            unit("old.service", "", None),
        ],
        ..ClusterSnapshot::default()
    };
    assert_eq!(scheduled(&plan(&snapshot))["old.service"], "m1");
}

#[test]
fn global_units_give_way_to_scheduled_units_they_conflict_with() {
    // A global unit submitted after a unit it conflicts with skips that unit's machine
    // instead of evicting it, as the agent does; units placed later avoid the global unit.
    let mut global = unit("global.service", "Global=true\nConflicts=db.service\n", None);
    std::sync::Arc::make_mut(&mut global.requirements).global = true;
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[]), machine("b", &[])],
        units: vec![
            global,
            unit("db.service", "", Some("a")),
            unit("web.service", "", None),
            unit("db2.service", "Conflicts=global.service", None),
        ],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert!(!plan.decisions.iter().any(|decision| matches!(decision, Decision::Unschedule { .. })));
    // a holds db only; b holds the global unit: web goes to the less loaded a... after db2,
    // which cannot share b with the global unit, takes a first.
    let placed = scheduled(&plan);
    assert_eq!(placed["db2.service"], "a");
    assert_eq!(placed["web.service"], "b");
}

// ---- properties over random clusters ----

/// Whether `unit`'s `Replaces=` matches `other` and not the other way round.
fn replaces_one_way(unit: &UnitSpec, other: &UnitSpec) -> bool {
    let matches = |spec: &UnitSpec, name: &str| spec.requirements.replaces.iter().any(|p| glob_matches(p, name));
    unit.name != other.name && matches(unit, &other.name) && !matches(other, &unit.name)
}

fn circular(unit: &UnitSpec, other: &UnitSpec) -> bool {
    let matches = |spec: &UnitSpec, name: &str| spec.requirements.replaces.iter().any(|p| glob_matches(p, name));
    unit.name != other.name && matches(unit, &other.name) && matches(other, &unit.name)
}

fn conflicts(unit: &UnitSpec, other: &UnitSpec) -> bool {
    let matches = |spec: &UnitSpec, name: &str| spec.requirements.conflicts.iter().any(|p| glob_matches(p, name));
    unit.name != other.name && (matches(unit, &other.name) || matches(other, &unit.name))
}

/// Whether `unit` may land beside `other` by pushing it off (it replaces it, nothing more).
fn only_replaces(unit: &UnitSpec, other: &UnitSpec) -> bool {
    replaces_one_way(unit, other) && !conflicts(unit, other)
}

fn excludes(unit: &UnitSpec, other: &UnitSpec) -> bool {
    unit.requirements.excludes(&unit.name, &other.name, &other.requirements)
}

/// The global units each machine runs under the agent's own rule, given who is placed where.
pub(super) fn global_residents(
    snapshot: &ClusterSnapshot,
    placement: &BTreeMap<String, String>,
) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let specs: BTreeMap<&str, &UnitSpec> = snapshot.units.iter().map(|u| (u.name.as_str(), u)).collect();
    let hash = UnitHash([0; 20]);
    let globals: Vec<GlobalUnit<'_>> = snapshot
        .units
        .iter()
        .filter(|u| u.requirements.global)
        .map(|u| GlobalUnit {
            name: &u.name,
            desired: DesiredUnit {
                hash,
                state: u.desired,
                drift: Default::default(),
                secrets: Default::default(),
                places: Default::default(),
            },
            requirements: &u.requirements,
        })
        .collect();
    snapshot
        .machines
        .iter()
        .map(|m| {
            let here: BTreeMap<String, Requirements> = placement
                .iter()
                .filter(|(_, on)| **on == m.id)
                .map(|(unit, _)| (unit.clone(), (*specs[unit.as_str()].requirements).clone()))
                .collect();
            let mut desired = BTreeMap::new();
            add_global_units(m, &mut desired, &here, &globals);
            (m.id.clone(), desired.into_keys().collect())
        })
        .collect()
}

pub(super) fn arbitrary_snapshot() -> impl Strategy<Value = ClusterSnapshot> {
    let machines = prop::collection::btree_set(0u8..12, 0..8).prop_flat_map(|ids| {
        let ids: Vec<u8> = ids.into_iter().collect();
        let count = ids.len();
        let capacities = prop::collection::vec(prop::option::weighted(0.6, (0u64..5, 0u64..5)), count);
        let drained = prop::collection::vec(prop::bool::weighted(0.2), count);
        let taints = prop::collection::vec(0u8..8, count);
        (Just(ids), prop::collection::vec(0u8..3, count), capacities, drained, taints)
    });
    let raw_unit = (
        0u8..10,
        0u8..4,
        prop::option::of(0u8..12),
        any::<bool>(),
        0u8..4,
        0usize..25,
        0u8..6,
        any::<bool>(),
        0u8..5,
        0u8..4,
    );
    (machines, prop::collection::vec(raw_unit, 0..25), any::<bool>()).prop_map(
        |((ids, regions, capacities, drained, taints), raw_units, bin_pack)| {
            let mut machines: Vec<MachineState> = ids
                .iter()
                .zip(&regions)
                .zip(&capacities)
                .zip(&drained)
                .zip(&taints)
                .map(|((((id, region), capacity), drained), taint)| MachineState {
                    capacity: capacity.map(|(gib, cores)| Resources { memory: gib << 30, cpu_millis: cores * 1000 }),
                    drain: drained.then(|| crate::drain::Drain::new(crate::rollout::MaxUnavailable::Count(1), 0)),
                    // Most machines untainted; some kept for t=1 or t=2, evicting or not.
                    taints: crate::taint::parse_taints(match taint {
                        1 => "t=1",
                        2 => "t=1:evict",
                        3 => "t=2:evict",
                        4 => "t",
                        _ => "",
                    })
                    .expect("a test's taints"),
                    ..machine(&format!("m{id:02}"), &[("region", &format!("r{region}"))])
                })
                .collect();
            // Drains let go of some of the units on their machines.
            for (n, raw) in raw_units.iter().enumerate() {
                let (_, group, on, .., let_go, _, _) = raw;
                if let (Some(on), true) = (on, let_go)
                    && let Some(drain) =
                        machines.iter_mut().find(|m| m.id == format!("m{on:02}")).and_then(|m| m.drain.as_mut())
                {
                    drain.released.insert(format!("g{group}@{n}.service"), 0);
                }
            }
            let units = raw_units
                .iter()
                .enumerate()
                .map(|(n, (kind, group, on, launched, region, other, reserves, _, tolerates, priority))| {
                    let name = format!("g{group}@{n}.service");
                    let rule = match kind {
                        0 => format!("Conflicts=g{group}@*.service"),
                        1 => format!("MachineMetadata=region=r{region}"),
                        2 => format!("MachineID=m{:02}", on.unwrap_or(0)),
                        3 => format!("MachineOf=g{group}@{}.service", n.saturating_sub(1)),
                        4 => format!("Global=true\nMachineMetadata=region=r{region}"),
                        5 => format!("Global=true\nConflicts=g{group}@*.service"),
                        6 => format!("Replaces=g{group}@{other}.service"),
                        7 => format!("Replaces=g{group}@*.service"),
                        _ => String::new(),
                    };
                    let reservation = match reserves {
                        1 => "\nMemory=1G",
                        2 => "\nCPU=1",
                        3 => "\nMemory=2G\nCPU=0.5",
                        _ => "",
                    };
                    let toleration = match tolerates {
                        1 => "\nTolerate=t",
                        2 => "\nTolerate=t=1",
                        3 => "\nTolerate=t=2 other",
                        _ => "",
                    };
                    // Most at the default priority; some below it, some above.
                    let priority = match priority {
                        1 => "\nPriority=10",
                        2 => "\nPriority=900",
                        _ => "",
                    };
                    let global = matches!(kind, 4 | 5);
                    let scheduled_on = on.filter(|_| !global).map(|id| format!("m{id:02}"));
                    let mut spec =
                        unit(&name, &format!("{rule}{reservation}{toleration}{priority}"), scheduled_on.as_deref());
                    if !launched {
                        spec.desired = DesiredState::Loaded;
                    }
                    spec
                })
                .collect();
            let strategy = if bin_pack { PlacementStrategy::BinPack } else { PlacementStrategy::Spread };
            ClusterSnapshot { machines, units, strategy, ..ClusterSnapshot::default() }
        },
    )
}

/// The order a strategy tries machines in, worked out apart from the planner: spreading by
/// room left in thousandths of the scarcest resource, then units; bin-packing by memory left,
/// then CPU left, then the most units.
fn order_key(
    strategy: PlacementStrategy,
    capacity: Option<Resources>,
    reserved: Resources,
    units: usize,
) -> (u64, u64, u64) {
    match strategy {
        PlacementStrategy::Spread => {
            let room = capacity.map_or(1000, |capacity| {
                let share = |capacity: u64, reserved: u64| {
                    (capacity > 0).then(|| u128::from(capacity.saturating_sub(reserved)) * 1000 / u128::from(capacity))
                };
                [share(capacity.memory, reserved.memory), share(capacity.cpu_millis, reserved.cpu_millis)]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(0) as u64
            });
            (1000 - room, units as u64, 0)
        }
        PlacementStrategy::BinPack => {
            let free = capacity.map_or(Resources { memory: u64::MAX, cpu_millis: u64::MAX }, |capacity| {
                capacity.saturating_sub(reserved)
            });
            (free.memory, free.cpu_millis, u64::from(u32::MAX) - units as u64)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn decisions_respect_every_constraint_and_least_load(snapshot in arbitrary_snapshot()) {
        let result = plan(&snapshot);
        let live: BTreeMap<&str, &MachineState> = snapshot.machines.iter().map(|m| (m.id.as_str(), m)).collect();
        let specs: BTreeMap<&str, &UnitSpec> = snapshot.units.iter().map(|u| (u.name.as_str(), u)).collect();
        let initial: BTreeMap<String, String> = snapshot
            .units
            .iter()
            .filter_map(|u| u.scheduled_on.clone().map(|m| (u.name.clone(), m)))
            .collect();
        let mut placement = initial.clone();
        // Each unit is unscheduled at most once and scheduled at most once, in that order.
        let mut seen: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for decision in &result.decisions {
            match decision {
                Decision::Unschedule { unit, .. } => {
                    let entry = seen.entry(unit.as_str()).or_default();
                    prop_assert!(entry.0 == 0 && entry.1 == 0, "{unit} unscheduled twice or after scheduling");
                    entry.0 += 1;
                }
                Decision::Schedule { unit, .. } => {
                    let entry = seen.entry(unit.as_str()).or_default();
                    prop_assert!(entry.1 == 0, "{unit} scheduled twice");
                    entry.1 += 1;
                }
            }
        }
        // Replay: first the units that leave, then the global units count where the agent
        // runs them, then each placement is checked against the state at that point.
        let first_schedule = result.decisions.iter().position(|d| matches!(d, Decision::Schedule { .. }));
        let (leaving, rest) = result.decisions.split_at(first_schedule.unwrap_or(result.decisions.len()));
        for decision in leaving {
            if let Decision::Unschedule { unit, machine, .. } = decision {
                prop_assert_eq!(placement.remove(unit), Some(machine.clone()));
            }
        }
        let mut globals = global_residents(&snapshot, &placement);
        for decision in rest {
            match decision {
                Decision::Unschedule { unit, machine, .. } => {
                    prop_assert_eq!(placement.remove(unit), Some(machine.clone()));
                }
                Decision::Schedule { unit, machine } => {
                    let spec = specs[unit.as_str()];
                    prop_assert!(spec.desired != DesiredState::Inactive);
                    prop_assert!(!spec.requirements.global);
                    // The units it replaces are unscheduled right after it.
                    let before = placement.clone();
                    let evictable = |other: &str, m: &str| {
                        before.get(other).map(String::as_str) == Some(m)
                            && initial.get(other).map(String::as_str) == Some(m)
                    };
                    let circular_blocked = before.keys().any(|other| circular(spec, specs[other.as_str()]));
                    let eligible = |m: &MachineState| {
                        m.drain.is_none()
                            && crate::taint::first_untolerated(&m.taints, &spec.requirements.tolerate, false).is_none()
                            && !circular_blocked
                            && spec.requirements.machine_id.as_ref().is_none_or(|id| m.matches_id(id))
                            && spec.requirements.metadata_matches(&m.metadata)
                            && spec.requirements.machine_of.iter().all(|peer| before.get(peer) == Some(&m.id))
                            && before.iter().filter(|(_, on)| **on == m.id).all(|(other, _)| {
                                let other_spec = specs[other.as_str()];
                                !excludes(spec, other_spec)
                                    || (only_replaces(spec, other_spec) && evictable(other, &m.id))
                            })
                            && globals[&m.id].iter().all(|g| {
                                let g = specs[g.as_str()];
                                !excludes(spec, g) || only_replaces(spec, g)
                            })
                    };
                    let load = |m: &str| before.values().filter(|on| *on == m).count() + globals[m].len();
                    let reserved = |m: &str| {
                        before
                            .iter()
                            .filter(|(_, on)| *on == m)
                            .map(|(other, _)| other)
                            .chain(&globals[m])
                            .fold(Resources::ZERO, |sum, other| sum.saturating_add(specs[other.as_str()].requirements.reservation))
                    };
                    // Its own reservation and its waiting followers', chains included.
                    let mut needs = Resources::ZERO;
                    let mut group = vec![spec.name.clone()];
                    let mut next = vec![spec.name.clone()];
                    while let Some(member) = next.pop() {
                        needs = needs.saturating_add(specs[member.as_str()].requirements.reservation);
                        for follower in snapshot.units.iter().filter(|u| u.requirements.machine_of.contains(&member)) {
                            let waits = !before.contains_key(&follower.name)
                                && follower.desired != DesiredState::Inactive
                                && !follower.requirements.global
                                && !crate::unit_name::UnitNameInfo::new(&follower.name).is_template();
                            if waits && !group.contains(&follower.name) {
                                group.push(follower.name.clone());
                                next.push(follower.name.clone());
                            }
                        }
                    }
                    let has_room = |m: &MachineState| {
                        needs.is_zero() || m.capacity.is_none_or(|capacity| needs.fits_in(capacity.saturating_sub(reserved(&m.id))))
                    };
                    let eligible = |m: &MachineState| eligible(m) && has_room(m);
                    prop_assert!(eligible(live[machine.as_str()]), "{unit} placed on ineligible {machine}");
                    let holds_replaced = |m: &MachineState| {
                        before.iter().any(|(other, on)| *on == m.id && only_replaces(spec, specs[other.as_str()]))
                    };
                    let candidates: Vec<&MachineState> = snapshot.machines.iter().filter(|m| eligible(m)).collect();
                    let preferred: Vec<&MachineState> = candidates.iter().copied().filter(|m| holds_replaced(m)).collect();
                    let pool = if preferred.is_empty() { candidates } else { preferred };
                    let first_of = |pool: &[&MachineState]| {
                        pool.iter()
                            .map(|m| (order_key(snapshot.strategy, m.capacity, reserved(&m.id), load(&m.id)), m.id.clone()))
                            .min()
                            .map(|(_, id)| id)
                    };
                    let best = first_of(&pool);
                    // A replaced unit this plan took off its machine (its peer was not there)
                    // may be put back once its peer is, and then give its place to this unit:
                    // the plan shows only that it left. Taking that place is taking a replaced
                    // unit's place too.
                    let left_for_good_from = |m: &MachineState| {
                        result.decisions.iter().any(|d| match d {
                            Decision::Unschedule { unit: other, machine: from, .. } => {
                                let other_spec = specs[other.as_str()];
                                *from == m.id
                                    && only_replaces(spec, other_spec)
                                    && !result.decisions.iter().any(|d| matches!(d, Decision::Schedule { unit: again, .. } if again == other))
                                    && other_spec.requirements.machine_of.iter().all(|peer| before.get(peer) == Some(&m.id))
                            }
                            Decision::Schedule { .. } => false,
                        })
                    };
                    let took_place: Vec<&MachineState> =
                        snapshot.machines.iter().filter(|m| eligible(m) && left_for_good_from(m)).collect();
                    prop_assert!(
                        best.as_ref() == Some(machine) || first_of(&took_place).as_ref() == Some(machine),
                        "{} not first in the strategy's order: {:?}", unit, best
                    );
                    // Global units it replaces stop counting there.
                    if let Some(here) = globals.get_mut(machine) {
                        here.retain(|g| !only_replaces(spec, specs[g.as_str()]));
                    }
                    placement.insert(unit.clone(), machine.clone());
                }
            }
        }
        // No machine the plan put a unit on holds more of a resource that unit reserves than it
        // has (globals may over-commit a machine by themselves; a unit placed there then
        // reserves none of what is over-committed).
        for machine in &snapshot.machines {
            let Some(capacity) = machine.capacity else { continue };
            let asked = scheduled(&result)
                .iter()
                .filter(|(_, on)| **on == machine.id)
                .fold(Resources::ZERO, |sum, (unit, _)| sum.saturating_add(specs[unit.as_str()].requirements.reservation));
            let reserved = placement
                .iter()
                .filter(|(_, on)| **on == machine.id)
                .map(|(unit, _)| unit)
                .chain(&globals[&machine.id])
                .fold(Resources::ZERO, |sum, unit| sum.saturating_add(specs[unit.as_str()].requirements.reservation));
            prop_assert!(asked.memory == 0 || reserved.memory <= capacity.memory, "{} over-reserved: {reserved} of {capacity}", machine.id);
            prop_assert!(asked.cpu_millis == 0 || reserved.cpu_millis <= capacity.cpu_millis, "{} over-reserved: {reserved} of {capacity}", machine.id);
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
            // A unit stays beside a taint it does not tolerate only when it was there before
            // and the taint does not evict.
            let untolerated = |evicting| crate::taint::first_untolerated(&target.taints, &spec.requirements.tolerate, evicting);
            prop_assert!(untolerated(true).is_none(), "{unit} stays beside an evicting taint on {machine}");
            prop_assert!(initial.get(unit) == Some(machine) || untolerated(false).is_none(), "{unit} placed beside a taint on {machine}");
            for peer in &spec.requirements.machine_of {
                prop_assert_eq!(placement.get(peer), Some(machine));
            }
            for (other, on) in &placement {
                prop_assert!(on != machine || !excludes(spec, specs[other.as_str()]), "{unit} shares {machine} with {other}");
                prop_assert!(!circular(spec, specs[other.as_str()]), "{unit} and {other} replace each other and both run");
            }
            for global in &globals[machine] {
                prop_assert!(!excludes(spec, specs[global.as_str()]), "{unit} shares {machine} with global {global}");
            }
        }
        // Drained machines take no unit; a unit a drain let go either left, or stays with a
        // reason it cannot leave (and is not also called unplaced).
        let stuck: BTreeMap<&str, &UnplacedReason> = result.stuck.iter().map(|(unit, why)| (unit.as_str(), why)).collect();
        for (unit, machine) in &placement {
            let Some(drain) = &live[machine.as_str()].drain else { continue };
            prop_assert_eq!(initial.get(unit), Some(machine), "{} placed on drained {}", unit, machine);
            prop_assert!(!drain.lets_go(unit) || stuck.contains_key(unit.as_str()), "{unit} let go, stays without a reason");
        }
        for unit in stuck.keys() {
            let on = placement.get(*unit).map(String::as_str);
            prop_assert!(on.is_some_and(|m| live[m].drain.is_some()), "{unit} stuck but not on a drained machine");
        }
        let mut reasoned = std::collections::BTreeSet::new();
        for (name, _) in &result.unplaced {
            prop_assert!(reasoned.insert(name.as_str()), "{name} has two reasons");
        }
        for spec in snapshot.units.iter().filter(|u| !u.requirements.global) {
            let wants = spec.desired != DesiredState::Inactive;
            let placed = placement.contains_key(&spec.name);
            let has_reason = reasoned.contains(spec.name.as_str());
            prop_assert!(!wants || placed != has_reason, "{} placed={placed} reasoned={has_reason}", spec.name);
            prop_assert!(wants || !placed);
        }
    }
}

/// A refusal on one machine reads as one: "on every eligible machine" is only for a unit
/// that could go nowhere.
#[test]
fn one_machines_refusal_is_not_called_everywhere() {
    let on_one = UnscheduleReason::CannotRunThere(Refusal::ConflictsWith("web@1.service".into()));
    assert_eq!(on_one.to_string(), "can no longer run there: conflicts with web@1.service");
    assert_eq!(
        Refusal::ConflictsWith("web@1.service".into()).everywhere().to_string(),
        "conflicts with web@1.service on every eligible machine"
    );
    assert_eq!(Refusal::ReplacedBy("new.service".into()).to_string(), "replaced by new.service");
    assert_eq!(
        Refusal::PeerNotScheduled("db.service".into()).to_string(),
        "MachineOf db.service, which is not scheduled"
    );
}

#[test]
fn a_plan_that_changes_nothing_is_not_written() {
    let unplaced = Plan {
        decisions: Vec::new(),
        unplaced: vec![("u.service".into(), UnplacedReason::NoMachines)],
        ..Plan::default()
    };
    let written = vec![("u.service".to_string(), "no machines are available".to_string())];
    assert!(!unplaced.changes_anything(&written), "the same reason again");
    assert!(unplaced.changes_anything(&[]), "a new reason");
    assert!(Plan::default().changes_anything(&written), "a reason to clear");
    let moving = Plan {
        decisions: vec![Decision::Schedule { unit: "u.service".into(), machine: "m1".into() }],
        unplaced: Vec::new(),
        ..Plan::default()
    };
    assert!(moving.changes_anything(&[]));
}

pub(super) fn sized(id: &str, gib: u64, cores: u64) -> MachineState {
    MachineState { capacity: Some(Resources { memory: gib << 30, cpu_millis: cores * 1000 }), ..machine(id, &[]) }
}

#[test]
fn a_unit_that_fits_nowhere_says_what_it_needs_and_what_came_closest() {
    let snapshot = ClusterSnapshot {
        machines: vec![sized("m1", 4, 8), sized("m2", 8, 8)],
        units: vec![unit("held.service", "Memory=2G", Some("m2")), unit("big.service", "Memory=8G", None)],
        ..ClusterSnapshot::default()
    };
    let result = plan(&snapshot);
    assert!(scheduled(&result).is_empty());
    assert_eq!(
        result.reason_texts(),
        [("big.service".to_string(), "needs 8 GiB memory; the most free is 6 GiB on m2".to_string())]
    );
    let cpu = ClusterSnapshot { units: vec![unit("busy.service", "CPU=9", None)], ..snapshot.clone() };
    assert_eq!(plan(&cpu).reason_texts()[0].1, "needs 9 CPU; the most free is 8 on m1");
    let together = ClusterSnapshot {
        machines: vec![sized("m1", 8, 1), sized("m2", 1, 8)],
        units: vec![unit("both.service", "Memory=4G\nCPU=4", None)],
        ..ClusterSnapshot::default()
    };
    assert_eq!(
        plan(&together).reason_texts()[0].1,
        "needs 4 GiB memory and 4 CPU on one machine; no machine has both free (the most memory free is 8 GiB on m1, the most CPU 8 on m2)"
    );
    // Once room appears (a bigger machine joins), the waiting unit is placed there.
    let grown =
        ClusterSnapshot { machines: vec![sized("m1", 4, 8), sized("m2", 8, 8), sized("m3", 16, 8)], ..snapshot };
    assert_eq!(scheduled(&plan(&grown)).get("big.service").map(String::as_str), Some("m3"));
}

#[test]
fn spreading_takes_the_roomiest_machine_and_bin_packing_the_fullest_that_fits() {
    let machines = vec![sized("m1", 8, 4), sized("m2", 8, 4), sized("m3", 8, 4)];
    let units = vec![
        unit("a.service", "Memory=6G", Some("m1")),
        unit("b.service", "Memory=2G", Some("m2")),
        unit("new.service", "Memory=1G", None),
        unit("small.service", "", None),
    ];
    let spread = ClusterSnapshot { machines: machines.clone(), units: units.clone(), ..ClusterSnapshot::default() };
    let placed = scheduled(&plan(&spread));
    assert_eq!(placed["new.service"], "m3", "the empty machine has the most room");
    assert_eq!(placed["small.service"], "m3", "then fewest units among the roomiest");
    let packed = ClusterSnapshot { machines, units, strategy: PlacementStrategy::BinPack, ..Default::default() };
    let placed = scheduled(&plan(&packed));
    assert_eq!(placed["new.service"], "m1", "the fullest machine that still fits");
    assert_eq!(placed["small.service"], "m1", "m3 stays empty");
}

#[test]
fn a_machine_whose_capacity_shrank_keeps_its_units_and_takes_no_more() {
    let snapshot = ClusterSnapshot {
        machines: vec![sized("m1", 2, 4), sized("m2", 8, 4)],
        units: vec![
            unit("a.service", "Memory=2G", Some("m1")),
            unit("b.service", "Memory=2G", Some("m1")),
            unit("c.service", "Memory=1G", None),
        ],
        ..ClusterSnapshot::default()
    };
    let result = plan(&snapshot);
    assert_eq!(result.decisions, [Decision::Schedule { unit: "c.service".into(), machine: "m2".into() }]);
    // A unit that reserves nothing still fits beside them.
    let free = ClusterSnapshot {
        machines: vec![sized("m1", 2, 4)],
        units: vec![unit("a.service", "Memory=4G", Some("m1")), unit("light.service", "", None)],
        ..ClusterSnapshot::default()
    };
    assert_eq!(scheduled(&plan(&free))["light.service"], "m1");
}

#[test]
fn a_leader_goes_where_its_followers_fit_too() {
    let snapshot = ClusterSnapshot {
        machines: vec![sized("m1", 2, 4), sized("m2", 4, 4)],
        units: vec![
            unit("app.service", "Memory=1G", None),
            unit("sidecar.service", "MachineOf=app.service\nMemory=2G", None),
        ],
        strategy: PlacementStrategy::BinPack,
        ..ClusterSnapshot::default()
    };
    let placed = scheduled(&plan(&snapshot));
    assert_eq!((placed["app.service"].as_str(), placed["sidecar.service"].as_str()), ("m2", "m2"));
    let too_big = ClusterSnapshot {
        units: vec![
            unit("app.service", "Memory=1G", None),
            unit("sidecar.service", "MachineOf=app.service\nMemory=4G", None),
        ],
        ..snapshot
    };
    let reasons = plan(&too_big).reason_texts();
    assert_eq!(reasons[0], ("app.service".to_string(), "needs 5 GiB memory; the most free is 4 GiB on m2".to_string()));
}

fn zoned(id: &str, zone: &str) -> MachineState {
    machine(id, &[("zone", zone)])
}

#[test]
fn instances_spread_over_a_keys_values_before_the_strategys_order() {
    // Zone a has three machines, zone b one: by load alone most would land in a.
    let machines = vec![zoned("m1", "a"), zoned("m2", "a"), zoned("m3", "a"), zoned("m4", "b")];
    let units: Vec<UnitSpec> = (1..=6).map(|n| unit(&format!("web@{n}.service"), "SpreadBy=zone", None)).collect();
    let snapshot = ClusterSnapshot { machines, units, ..ClusterSnapshot::default() };
    let placed = scheduled(&plan(&snapshot));
    let in_zone = |zone: &str| {
        placed
            .values()
            .filter(|machine| snapshot.machines.iter().any(|m| &m.id == *machine && m.metadata["zone"] == zone))
            .count()
    };
    assert_eq!((in_zone("a"), in_zone("b")), (3, 3), "{placed:?}");
    // A unit that does not spread goes by load, as before.
    let plain = ClusterSnapshot { units: vec![unit("other.service", "", None)], ..snapshot.clone() };
    assert_eq!(scheduled(&plan(&plain))["other.service"], "m1");
    // Where the rules leave only one value, the unit still goes there.
    let pinned = ClusterSnapshot {
        units: vec![
            unit("db@1.service", "SpreadBy=zone\nMachineMetadata=zone=a", None),
            unit("db@2.service", "SpreadBy=zone\nMachineMetadata=zone=a", None),
        ],
        ..snapshot
    };
    assert_eq!(scheduled(&plan(&pinned)).len(), 2);
}

#[test]
fn units_naming_the_same_pattern_spread_as_one_group() {
    let machines = vec![zoned("m1", "a"), zoned("m2", "a"), zoned("m3", "b")];
    let grouped = "SpreadBy=zone\nSpreadGroup=web-*";
    let mut units: Vec<UnitSpec> =
        ["web-1.service", "web-2.service"].iter().map(|name| unit(name, grouped, None)).collect();
    // Not in the group: it names no pattern, so it spreads alone.
    units.push(unit("web-3.service", "SpreadBy=zone", None));
    let snapshot = ClusterSnapshot { machines, units, ..ClusterSnapshot::default() };
    let placed = scheduled(&plan(&snapshot));
    let zone = |unit: &str| if placed[unit] == "m3" { "b" } else { "a" };
    assert_ne!(zone("web-1.service"), zone("web-2.service"), "the group's two units take one zone each: {placed:?}");
    let requirements = |name: &str, x_fleet: &str| unit(name, x_fleet, None).requirements.validate();
    assert_eq!(requirements("web-1.service", grouped), Ok(()));
    assert_eq!(
        requirements("db.service", grouped).map_err(|error| error.to_string()),
        Err("SpreadGroup \"web-*\" does not match the unit's own name".to_string())
    );
    assert_eq!(
        requirements("web-1.service", "SpreadGroup=web-*").map_err(|error| error.to_string()),
        Err("SpreadGroup needs SpreadBy".to_string())
    );
}

#[test]
fn spread_key_is_checked_and_not_for_global_units() {
    let file = crate::UnitFile::parse("[X-Fleet]\nSpreadBy=zone/1\n").unwrap();
    assert_eq!(
        Requirements::from_unit("a@1.service", &file).validate(),
        Err(crate::requirements::CombinationError::SpreadKey("zone/1".into()))
    );
    let file = crate::UnitFile::parse("[X-Fleet]\nSpreadBy=zone\nGlobal=true\n").unwrap();
    assert!(Requirements::from_unit("a.service", &file).validate().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    /// Placed from nothing, the instances of a template that spreads over a key differ by at
    /// most one between the key's values, whatever the machines and the strategy.
    #[test]
    fn spread_never_exceeds_a_skew_of_one(
        zones in prop::collection::vec(0u8..4, 1..10),
        instances in 0usize..30,
        bin_pack in any::<bool>(),
    ) {
        let machines: Vec<MachineState> =
            zones.iter().enumerate().map(|(n, zone)| zoned(&format!("m{n:02}"), &format!("z{zone}"))).collect();
        let units = (0..instances).map(|n| unit(&format!("web@{n}.service"), "SpreadBy=zone", None)).collect();
        let strategy = if bin_pack { PlacementStrategy::BinPack } else { PlacementStrategy::Spread };
        let snapshot = ClusterSnapshot { machines: machines.clone(), units, strategy, ..Default::default() };
        let result = plan(&snapshot);
        prop_assert!(result.unplaced.is_empty());
        let zone_of: BTreeMap<&str, &str> = machines.iter().map(|m| (m.id.as_str(), m.metadata["zone"].as_str())).collect();
        let mut counts: BTreeMap<&str, usize> = zone_of.values().map(|zone| (*zone, 0)).collect();
        for machine in scheduled(&result).values() {
            *counts.get_mut(zone_of[machine.as_str()]).unwrap() += 1;
        }
        let (least, most) = (counts.values().min().copied().unwrap_or(0), counts.values().max().copied().unwrap_or(0));
        prop_assert!(most - least <= 1, "{counts:?}");
        prop_assert!(result.spread_notes.is_empty(), "no note where the spread is even: {:?}", result.spread_notes);
    }
}

#[test]
fn instances_spread_unevenly_say_which_value_has_fewer_and_why() {
    let small = |id: &str, zone: &str| MachineState { capacity: sized(id, 1, 4).capacity, ..zoned(id, zone) };
    let big = |id: &str, zone: &str| MachineState { capacity: sized(id, 16, 4).capacity, ..zoned(id, zone) };
    let units: Vec<UnitSpec> =
        (1..=3).map(|n| unit(&format!("web@{n}.service"), "SpreadBy=zone\nMemory=2G", None)).collect();
    let snapshot =
        ClusterSnapshot { machines: vec![small("m1", "a"), big("m2", "b")], units, ..ClusterSnapshot::default() };
    let result = plan(&snapshot);
    assert_eq!(scheduled(&result).values().filter(|m| *m == "m2").count(), 3, "zone a has no room for any");
    let note = "spread unevenly: zone=a has 3 fewer of web@.service: needs 2 GiB memory; the most free is 1 GiB on m1";
    let expected: Vec<(String, String)> = (1..=3).map(|n| (format!("web@{n}.service"), note.to_string())).collect();
    assert_eq!(result.spread_notes, expected);
    assert_eq!(result.reason_texts(), expected, "the notes are the units' reasons");
    // Once zone a has room, placed units stay (no rebalancing), and the note says so.
    let placed: Vec<UnitSpec> =
        snapshot.units.iter().map(|spec| UnitSpec { scheduled_on: Some("m2".into()), ..spec.clone() }).collect();
    let roomy =
        ClusterSnapshot { machines: vec![big("m1", "a"), big("m2", "b")], units: placed, ..ClusterSnapshot::default() };
    let result = plan(&roomy);
    assert!(result.decisions.is_empty());
    assert!(
        result.spread_notes[0]
            .1
            .ends_with("zone=a has 3 fewer of web@.service: placed units are not moved to even it out")
    );
}

/// Regression (issue 68): with zone c drained, every running instance carried "spread
/// unevenly: zone=c has 3 fewer", though zone c can take none.
#[test]
fn a_drained_value_does_not_count_against_the_spread() {
    let mut c = zoned("m3", "c");
    c.drain = drained("m3", &[]).drain;
    let units: Vec<UnitSpec> = (1..=6).map(|n| unit(&format!("web@{n}.service"), "SpreadBy=zone", None)).collect();
    let snapshot =
        ClusterSnapshot { machines: vec![zoned("m1", "a"), zoned("m2", "b"), c], units, ..ClusterSnapshot::default() };
    let result = plan(&snapshot);
    assert_eq!(scheduled(&result).values().filter(|m| *m == "m3").count(), 0, "the drained zone takes none");
    assert_eq!(scheduled(&result).len(), 6);
    assert!(result.spread_notes.is_empty(), "a and b are even: {:?}", result.spread_notes);
}

fn drained(id: &str, let_go: &[&str]) -> MachineState {
    let mut drain = crate::drain::Drain::new(crate::rollout::MaxUnavailable::Count(1), 0);
    drain.released = let_go.iter().map(|unit| (unit.to_string(), 0)).collect();
    MachineState { drain: Some(drain), ..machine(id, &[]) }
}

#[test]
fn a_drained_machine_takes_no_unit_and_keeps_what_it_has_not_let_go() {
    let snapshot = ClusterSnapshot {
        machines: vec![drained("m1", &[]), machine("m2", &[])],
        units: vec![
            unit("kept.service", "", Some("m1")),
            unit("new.service", "", None),
            unit("pinned.service", "MachineID=m1", None),
        ],
        ..ClusterSnapshot::default()
    };
    let result = plan(&snapshot);
    assert_eq!(scheduled(&result), BTreeMap::from([("new.service".into(), "m2".into())]));
    assert_eq!(result.reason_texts(), [("pinned.service".to_string(), "machine m1 is draining".to_string())]);
    assert!(result.decisions.iter().all(|d| !matches!(d, Decision::Unschedule { .. })), "nothing leaves m1 unasked");
}

#[test]
fn units_let_go_move_with_their_followers_and_one_with_nowhere_to_go_stays_with_why() {
    let snapshot = ClusterSnapshot {
        machines: vec![drained("m1", &["web.service", "big.service"]), sized("m2", 4, 4)],
        units: vec![
            unit("web.service", "Memory=1G", Some("m1")),
            unit("web-log.service", "MachineOf=web.service", Some("m1")),
            unit("big.service", "Memory=8G", Some("m1")),
            unit("waiting.service", "Memory=4G", None),
        ],
        ..ClusterSnapshot::default()
    };
    let result = plan(&snapshot);
    let moved = scheduled(&result);
    assert_eq!(moved.get("web.service").map(String::as_str), Some("m2"));
    assert_eq!(moved.get("web-log.service").map(String::as_str), Some("m2"), "the follower moves with its leader");
    assert!(result.decisions.contains(&Decision::Unschedule {
        unit: "web.service".into(),
        machine: "m1".into(),
        reason: UnscheduleReason::Drained,
    }));
    assert!(!moved.contains_key("big.service"), "no room anywhere: it stays");
    assert!(
        !result.decisions.iter().any(|d| matches!(d, Decision::Unschedule { unit, .. } if unit == "big.service")),
        "a unit that cannot leave is not unscheduled"
    );
    assert_eq!(
        result.reason_texts(),
        [
            (
                "big.service".to_string(),
                "cannot leave its draining machine: needs 8 GiB memory; the most free is 4 GiB on m2".to_string()
            ),
            ("waiting.service".to_string(), "needs 4 GiB memory; the most free is 3 GiB on m2".to_string()),
        ],
        "units let go take the room first"
    );
    let m2 = result.loads.iter().find(|load| load.machine == "m2").map(|load| load.units);
    assert_eq!(m2, Some(2));
}

#[test]
fn a_retried_run_goes_back_to_a_machine_it_failed_on_only_when_no_other_takes_it() {
    let avoiding = |x_fleet: &str, avoid: &[&str]| {
        let mut spec = unit("job.service", x_fleet, None);
        let requirements =
            Requirements { avoid: avoid.iter().map(|id| id.to_string()).collect(), ..(*spec.requirements).clone() };
        spec.requirements = std::sync::Arc::new(requirements);
        spec
    };
    let machines = vec![machine("a", &[("role", "batch")]), machine("b", &[("role", "batch")]), machine("c", &[])];
    let placed = |units: Vec<UnitSpec>| {
        scheduled(&plan(&ClusterSnapshot { machines: machines.clone(), units, ..ClusterSnapshot::default() }))
    };
    // Least loaded first would be `a`; it failed there, so `b`.
    let elsewhere = placed(vec![avoiding("MachineMetadata=role=batch", &["a"])]);
    assert_eq!(elsewhere.get("job.service").map(String::as_str), Some("b"));
    // It failed on every machine its rules allow: it goes back to the first of them.
    let back = placed(vec![avoiding("MachineMetadata=role=batch", &["a", "b"])]);
    assert_eq!(back.get("job.service").map(String::as_str), Some("a"));
    assert_eq!(placed(vec![avoiding("", &["a", "b"])]).get("job.service").map(String::as_str), Some("c"));
}

#[test]
fn a_tainted_machine_takes_only_units_that_tolerate_it_and_evicts_only_with_evict() {
    let tainted = |id: &str, taints: &str| MachineState {
        taints: crate::taint::parse_taints(taints).unwrap(),
        ..machine(id, &[])
    };
    let snapshot = ClusterSnapshot {
        machines: vec![tainted("gpu1", "gpu=yes"), tainted("db1", "db:evict")],
        units: vec![
            unit("train.service", "Tolerate=gpu=yes\n", None),
            unit("web.service", "", None),
            unit("old.service", "", Some("gpu1")),
            unit("cache.service", "", Some("db1")),
            unit("pg.service", "Tolerate=db\n", Some("db1")),
        ],
        ..ClusterSnapshot::default()
    };
    let plan = plan(&snapshot);
    assert_eq!(scheduled(&plan), BTreeMap::from([("train.service".into(), "gpu1".into())]));
    // Already there: it stays beside a taint without :evict, and leaves one with it.
    let moved: Vec<&str> = plan
        .decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Unschedule { unit, .. } => Some(unit.as_str()),
            Decision::Schedule { .. } => None,
        })
        .collect();
    assert_eq!(moved, ["cache.service"]);
    let reasons: BTreeMap<String, String> =
        plan.unplaced.iter().map(|(unit, why)| (unit.clone(), why.to_string())).collect();
    assert_eq!(
        reasons["web.service"], "machine db1 has taint db:evict, which the unit does not tolerate (Tolerate=)",
        "{reasons:?}"
    );
    assert!(reasons.contains_key("cache.service"), "{reasons:?}");
}

/// A unit without rules is checked against the residents with rules only, and a unit with
/// rules against all: a resident that conflicts still keeps a plain unit away, a plain
/// resident still keeps away a unit that conflicts with it, and a placed or removed unit
/// with rules is counted where it goes and forgotten where it left.
#[test]
fn only_residents_with_rules_can_stand_in_a_plain_units_way() {
    let snapshot = ClusterSnapshot {
        machines: vec![machine("a", &[])],
        units: vec![
            unit("guard.service", "Conflicts=plain.service", None),
            unit("other.service", "", None),
            unit("plain.service", "", None),
            unit("picky.service", "Conflicts=other.service", None),
        ],
        ..ClusterSnapshot::default()
    };
    let mut working = working::Working::new(&snapshot, None);
    let index = |name: &str| working.unit_index(name).unwrap();
    let (guard, other, plain, picky) =
        (index("guard.service"), index("other.service"), index("plain.service"), index("picky.service"));
    let rank = working.ranks().next().unwrap();
    working.place(guard, rank);
    working.place(other, rank);
    assert_eq!(working.residents_related_to(plain, rank), [guard]);
    assert_eq!(working.residents_related_to(picky, rank), [guard, other]);
    assert!(candidates::able_to_run(&working, plain, rank).is_err(), "guard conflicts with plain");
    assert!(candidates::able_to_run(&working, picky, rank).is_err(), "picky conflicts with other");
    working.remove(guard, rank);
    assert!(working.residents_related_to(plain, rank).is_empty());
    assert!(candidates::able_to_run(&working, plain, rank).is_ok());
}
