use proptest::prelude::*;

use super::*;
use crate::schedule::tests::{arbitrary_snapshot, machine, unit};
use crate::schedule::{Decision, plan};

/// One change between two plans, as a store would show it.
#[derive(Clone, Debug)]
enum Change {
    /// A unit without rules (`kind`: none, a region, a machine ID, a template; `named_by_a_rule`:
    /// its name is one other units' rules match).
    AddFree {
        kind: u8,
        on: Option<u8>,
        launched: bool,
        named_by_a_rule: bool,
        /// What it reserves: nothing, memory, CPU or both.
        reserves: u8,
    },
    /// A unit with a `Conflicts=` rule.
    AddRuled {
        group: u8,
    },
    Remove(usize),
    SetDesired(usize, u8),
    /// Placed by someone other than the engine (or a decision the store skipped).
    HandPlace(usize, Option<u8>),
    MachineGone(usize),
    MachineJoins(u8),
    /// A machine's drain starts, lets a unit go, or ends.
    Drain(usize, usize, u8),
    /// A machine is tainted (`t=1`, `t=1:evict`) or untainted.
    Taint(usize, u8),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => (0u8..4, prop::option::of(0u8..12), any::<bool>(), prop::bool::weighted(0.1), 0u8..4)
            .prop_map(|(kind, on, launched, named_by_a_rule, reserves)| {
                Change::AddFree { kind, on, launched, named_by_a_rule, reserves }
            }),
        1 => (0u8..4).prop_map(|group| Change::AddRuled { group }),
        3 => (0usize..64).prop_map(Change::Remove),
        2 => (0usize..64, 0u8..3).prop_map(|(index, desired)| Change::SetDesired(index, desired)),
        1 => (0usize..64, prop::option::of(0u8..12)).prop_map(|(index, on)| Change::HandPlace(index, on)),
        1 => (0usize..8).prop_map(Change::MachineGone),
        1 => (0u8..12).prop_map(Change::MachineJoins),
        1 => (0usize..8, 0usize..64, 0u8..3).prop_map(|(machine, unit, step)| Change::Drain(machine, unit, step)),
        1 => (0usize..8, 0u8..3).prop_map(|(machine, taint)| Change::Taint(machine, taint)),
    ]
}

fn apply_change(snapshot: &mut ClusterSnapshot, change: &Change, serial: usize) {
    let units = snapshot.units.len();
    match change {
        Change::AddFree { kind, on, launched, named_by_a_rule, reserves } => {
            let name =
                if *named_by_a_rule { format!("g0@free{serial}.service") } else { format!("free{serial}.service") };
            let x_fleet = match kind {
                1 => "MachineMetadata=region=r1".to_string(),
                2 => format!("MachineID=m{:02}", on.unwrap_or(3)),
                _ => String::new(),
            };
            let reservation = match reserves {
                1 => "\nMemory=1G",
                2 => "\nCPU=1",
                3 => "\nMemory=1G\nCPU=1",
                _ => "",
            };
            // Some below the default priority, some above: with preemption on, either may
            // take or give room.
            let priority = ["", "\nPriority=10", "\nPriority=900"][serial % 3];
            let x_fleet = format!("{x_fleet}{reservation}{priority}");
            let name = if *kind == 3 { format!("tmpl{serial}@.service") } else { name };
            let mut spec = unit(&name, &x_fleet, on.map(|id| format!("m{id:02}")).as_deref());
            if !launched {
                spec.desired = DesiredState::Loaded;
            }
            snapshot.units.push(spec);
        }
        Change::AddRuled { group } => {
            snapshot.units.push(unit(
                &format!("g{group}@ruled{serial}.service"),
                &format!("Conflicts=g{group}@*.service"),
                None,
            ));
        }
        Change::Remove(index) if units > 0 => {
            snapshot.units.remove(index % units);
        }
        Change::SetDesired(index, desired) if units > 0 => {
            snapshot.units[index % units].desired = match desired {
                0 => DesiredState::Inactive,
                1 => DesiredState::Loaded,
                _ => DesiredState::Launched,
            };
        }
        Change::HandPlace(index, on) if units > 0 => {
            snapshot.units[index % units].scheduled_on = on.map(|id| format!("m{id:02}"));
        }
        Change::MachineGone(index) if !snapshot.machines.is_empty() => {
            let count = snapshot.machines.len();
            snapshot.machines.remove(index % count);
        }
        Change::Drain(machine, unit, step) if !snapshot.machines.is_empty() => {
            let count = snapshot.machines.len();
            let machine = &mut snapshot.machines[machine % count];
            let name = snapshot.units.get(unit % units.max(1)).map(|spec| spec.name.clone());
            match (step, &mut machine.drain) {
                (0, _) => machine.drain = None,
                (1, Some(drain)) => drain.released.extend(name.map(|name| (name, 0))),
                _ => machine.drain = Some(crate::drain::Drain::new(crate::rollout::MaxUnavailable::Count(1), 0)),
            }
        }
        Change::Taint(machine, taint) if !snapshot.machines.is_empty() => {
            let count = snapshot.machines.len();
            let taints = ["", "t=1", "t=1:evict"][usize::from(*taint) % 3];
            snapshot.machines[machine % count].taints = crate::taint::parse_taints(taints).expect("a test's taints");
        }
        Change::MachineJoins(id) => {
            let id = format!("m{id:02}");
            if !snapshot.machines.iter().any(|m| m.id == id) {
                snapshot.machines.push(machine(&id, &[("region", "r1")]));
            }
        }
        _ => {}
    }
}

/// The snapshot after `plan`'s decisions are written, but those `skipped` marks (a store
/// skips a decision whose unit changed meanwhile).
fn written(mut snapshot: ClusterSnapshot, plan: &Plan, skipped: &[bool]) -> ClusterSnapshot {
    for (position, decision) in plan.decisions.iter().enumerate() {
        if skipped.get(position).copied().unwrap_or(false) {
            continue;
        }
        let (name, machine) = match decision {
            Decision::Schedule { unit, machine } => (unit, Some(machine.clone())),
            Decision::Unschedule { unit, .. } => (unit, None),
        };
        if let Some(spec) = snapshot.units.iter_mut().find(|spec| spec.name == *name) {
            spec.scheduled_on = machine;
        }
    }
    snapshot
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    #[test]
    fn the_incremental_plan_equals_the_full_plan(
        first in arbitrary_snapshot(),
        preemption in any::<bool>(),
        rounds in prop::collection::vec(
            (prop::collection::vec(prop::bool::weighted(0.1), 0..40), prop::collection::vec(change(), 0..6)),
            1..5,
        ),
    ) {
        let mut planner = IncrementalPlanner::default();
        let mut snapshot = ClusterSnapshot { preemption, ..first };
        let mut serial = 0;
        for (skipped, changes) in rounds {
            let (incremental, _) = planner.plan(&snapshot);
            let full = plan(&snapshot);
            prop_assert_eq!(&incremental, &full);
            snapshot = written(snapshot, &full, &skipped);
            for change in &changes {
                serial += 1;
                apply_change(&mut snapshot, change, serial);
            }
        }
        let (incremental, _) = planner.plan(&snapshot);
        prop_assert_eq!(incremental, plan(&snapshot));
    }
}

/// A settled cluster of free units with a few waiting for a machine that is not there.
fn settled_cluster() -> ClusterSnapshot {
    let machines =
        (0..6).map(|id| machine(&format!("m{id:02}"), &[("region", if id < 3 { "r1" } else { "r2" })])).collect();
    let mut units: Vec<UnitSpec> = (0..30).map(|n| unit(&format!("web@{n}.service"), "", None)).collect();
    units.push(unit("db.service", "Conflicts=web@*.service", None));
    units.push(unit("pinned.service", "MachineID=m99", None));
    units.push(unit("far.service", "MachineMetadata=region=r9", None));
    ClusterSnapshot { machines, units, ..ClusterSnapshot::default() }
}

#[test]
fn a_burst_of_free_units_plans_only_them_and_the_waiting() {
    let mut planner = IncrementalPlanner::default();
    let snapshot = settled_cluster();
    let (first, scope) = planner.plan(&snapshot);
    assert_eq!(scope, PlanScope::Full);
    let mut snapshot = written(snapshot, &first, &[]);
    assert_eq!(planner.plan(&snapshot), (plan(&snapshot), PlanScope::Changed(2)), "nothing changed: only the waiting");

    for n in 0..5 {
        snapshot.units.push(unit(&format!("api@{n}.service"), "MachineMetadata=region=r2", None));
    }
    let (burst, scope) = planner.plan(&snapshot);
    assert_eq!(scope, PlanScope::Changed(7), "five new units and the two waiting");
    assert_eq!(burst, plan(&snapshot));
    assert_eq!(burst.decisions.len(), 5);
    let snapshot = written(snapshot, &burst, &[]);

    // A unit with a rule, or one a rule names, needs the whole cluster planned.
    let mut ruled = snapshot.clone();
    ruled.units.push(unit("cache.service", "Conflicts=api@*.service", None));
    assert_eq!(planner.plan(&ruled).1, PlanScope::Full);
    assert_eq!(planner.plan(&written(ruled.clone(), &plan(&ruled), &[])).1, PlanScope::Changed(2));
    let mut named = written(ruled.clone(), &plan(&ruled), &[]);
    named.units.push(unit("web@99.service", "", None));
    assert_eq!(planner.plan(&named), (plan(&named), PlanScope::Full), "db's Conflicts= names it");

    // So does a free unit leaving that another unit's rule names (a follower's leader).
    let mut led =
        ClusterSnapshot { machines: named.machines.clone(), units: named.units.clone(), ..ClusterSnapshot::default() };
    led.units.push(unit("leader.service", "", None));
    led.units.push(unit("follower.service", "MachineOf=leader.service", None));
    let mut planner = IncrementalPlanner::default();
    let settled = written(led.clone(), &planner.plan(&led).0, &[]);
    let mut without_leader = settled.clone();
    without_leader.units.retain(|spec| spec.name != "leader.service");
    assert_eq!(planner.plan(&without_leader), (plan(&without_leader), PlanScope::Full), "the follower must leave");

    // A machine that goes needs the whole cluster planned.
    let mut smaller = written(named.clone(), &plan(&named), &[]);
    smaller.machines.pop();
    assert_eq!(planner.plan(&smaller), (plan(&smaller), PlanScope::Full));
}

/// With preemption on: a machine with room for two units of 1 GiB holds the two of `placed`
/// (each `[X-Fleet]` after `Memory=1G`), settled; then `new` (likewise) comes. Its plan by
/// the incremental planner, how it was made, and the snapshot it was made of.
fn one_more_on_a_full_machine(placed: [(&str, &str); 2], new: (&str, &str)) -> (Plan, PlanScope, ClusterSnapshot) {
    let full_machine = crate::MachineState {
        capacity: Some(crate::resources::Resources { memory: 2 << 30, cpu_millis: 2000 }),
        ..machine("m00", &[])
    };
    let one = |(name, x_fleet): (&str, &str)| unit(name, &format!("Memory=1G\n{x_fleet}"), None);
    let units = placed.into_iter().map(one).collect();
    let snapshot = ClusterSnapshot { machines: vec![full_machine], units, preemption: true, ..Default::default() };
    let mut planner = IncrementalPlanner::default();
    let mut snapshot = written(snapshot.clone(), &planner.plan(&snapshot).0, &[]);
    snapshot.units.push(one(new));
    let (planned, scope) = planner.plan(&snapshot);
    (planned, scope, snapshot)
}

/// With preemption on, a unit that would wait may take the room of a unit outside the change:
/// the plan is the full one.
#[test]
fn a_unit_that_waits_with_preemption_on_gets_the_full_plan() {
    let (planned, scope, snapshot) = one_more_on_a_full_machine(
        [("low@1.service", "Priority=10"), ("low@2.service", "")],
        ("high.service", "Priority=900"),
    );
    assert_eq!(planned, plan(&snapshot));
    assert_eq!(scope, PlanScope::Full);
    assert!(
        planned.decisions.iter().any(|d| matches!(d, Decision::Unschedule { unit, .. } if unit == "low@1.service"))
    );
}

/// With preemption on but every unit of one priority, a unit that waits preempts nothing: the
/// pass still plans only what changed.
#[test]
fn a_unit_that_waits_among_equals_keeps_the_plan_incremental() {
    let (planned, scope, snapshot) =
        one_more_on_a_full_machine([("a@1.service", ""), ("a@2.service", "")], ("a@3.service", ""));
    assert_eq!(planned, plan(&snapshot));
    assert_eq!(scope, PlanScope::Changed(1));
    assert_eq!(planned.unplaced.len(), 1);
}
