use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::resources::Resources;
use crate::schedule::tests::{arbitrary_snapshot, global_residents, sized, unit};
use crate::schedule::{ClusterSnapshot, Decision, UnitSpec, UnplacedReason, UnscheduleReason, plan};

fn preempting(mut snapshot: ClusterSnapshot) -> ClusterSnapshot {
    snapshot.preemption = true;
    snapshot
}

/// unit → machine, as `decisions` leave `snapshot`.
fn placed_after(snapshot: &ClusterSnapshot, decisions: &[Decision]) -> BTreeMap<String, String> {
    let mut placement: BTreeMap<String, String> =
        snapshot.units.iter().filter_map(|u| Some((u.name.clone(), u.scheduled_on.clone()?))).collect();
    for decision in decisions {
        match decision {
            Decision::Schedule { unit, machine } => placement.insert(unit.clone(), machine.clone()),
            Decision::Unschedule { unit, .. } => placement.remove(unit),
        };
    }
    placement
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    /// Replayed decision by decision: each unit preempted had a lower priority than the unit
    /// that took its room, was no global unit and stood on the machine that unit went to; that
    /// unit had waited without preemption (or was itself preempted in this plan), fits there
    /// once they left, and would not have fit had any one of them stayed; and no plan preempts
    /// more than its bound.
    #[test]
    fn preemption_takes_only_lower_priorities_and_no_more_than_needed(snapshot in arbitrary_snapshot()) {
        let snapshot = preempting(snapshot);
        let result = plan(&snapshot);
        let without = plan(&ClusterSnapshot { preemption: false, ..snapshot.clone() });
        let waited: Vec<&str> = without.unplaced.iter().map(|(name, _)| name.as_str()).collect();
        let specs: BTreeMap<&str, &UnitSpec> = snapshot.units.iter().map(|u| (u.name.as_str(), u)).collect();
        let capacity: BTreeMap<&str, Option<Resources>> =
            snapshot.machines.iter().map(|m| (m.id.as_str(), m.capacity)).collect();
        let led = |name: &str| snapshot.units.iter().any(|u| u.requirements.machine_of.iter().any(|leader| leader == name));

        let mut placement: BTreeMap<String, String> =
            snapshot.units.iter().filter_map(|u| Some((u.name.clone(), u.scheduled_on.clone()?))).collect();
        let first_schedule = result.decisions.iter().position(|d| matches!(d, Decision::Schedule { .. }));
        for decision in &result.decisions[..first_schedule.unwrap_or(result.decisions.len())] {
            if let Decision::Unschedule { unit, .. } = decision {
                placement.remove(unit);
            }
        }
        let mut globals = global_residents(&snapshot, &placement);
        let reserved = |placement: &BTreeMap<String, String>, globals: &BTreeMap<String, std::collections::BTreeSet<String>>, m: &str| {
            placement
                .iter()
                .filter(|(_, on)| *on == m)
                .map(|(unit, _)| unit)
                .chain(globals.get(m).into_iter().flatten())
                .fold(Resources::ZERO, |sum, unit| sum.saturating_add(specs[unit.as_str()].requirements.reservation))
        };
        let mut total = 0;
        let mut preempted_in_this_plan: Vec<&str> = Vec::new();
        // The victims unscheduled since the last Schedule, with who took their room.
        let mut victims: Vec<(&str, &str, &Preemptor)> = Vec::new();
        for decision in &result.decisions[first_schedule.unwrap_or(result.decisions.len())..] {
            match decision {
                Decision::Unschedule { unit, machine, reason } => {
                    prop_assert_eq!(placement.remove(unit), Some(machine.clone()));
                    if let UnscheduleReason::PreemptedBy(preemptor) = reason {
                        let victim = specs[unit.as_str()];
                        prop_assert!(victim.requirements.priority < preemptor.priority, "{unit} preempted by {preemptor}");
                        prop_assert!(!victim.requirements.global);
                        prop_assert_eq!(specs[preemptor.unit.as_str()].requirements.priority, preemptor.priority);
                        victims.push((unit.as_str(), machine.as_str(), preemptor));
                        preempted_in_this_plan.push(unit.as_str());
                        total += 1;
                    }
                }
                Decision::Schedule { unit, machine } => {
                    let mine: Vec<&(&str, &str, &Preemptor)> =
                        victims.iter().filter(|(_, _, preemptor)| preemptor.unit == *unit).collect();
                    prop_assert_eq!(mine.len(), victims.len(), "victims taken for another unit than {}: {:?}", unit, result.decisions);
                    if !mine.is_empty() {
                        prop_assert!(
                            waited.contains(&unit.as_str()) || preempted_in_this_plan.contains(&unit.as_str()),
                            "{unit} preempted though it had room without"
                        );
                        prop_assert!(mine.iter().all(|(_, on, _)| on == machine), "{unit} took room on another machine");
                        let needs = specs[unit.as_str()].requirements.reservation;
                        let capacity = capacity[machine.as_str()].expect("preemption only where capacity is stated");
                        let room = capacity.saturating_sub(reserved(&placement, &globals, machine));
                        prop_assert!(needs.fits_in(room), "{unit} does not fit where it preempted");
                        if !led(unit) {
                            for (victim, _, _) in &mine {
                                let back = reserved(&placement, &globals, machine).saturating_add(specs[victim].requirements.reservation);
                                prop_assert!(!needs.fits_in(capacity.saturating_sub(back)), "{victim} left {machine} for {unit} without need");
                            }
                        }
                    }
                    victims.clear();
                    placement.insert(unit.clone(), machine.clone());
                    // A global unit it replaces leaves that machine.
                    let replaces = &specs[unit.as_str()].requirements.replaces;
                    if let Some(here) = globals.get_mut(machine.as_str()) {
                        here.retain(|global| !replaces.iter().any(|pattern| crate::glob::glob_matches(pattern, global)));
                    }
                }
            }
        }
        prop_assert!(total <= PREEMPTED_PER_PLAN);
    }
}

#[test]
fn a_unit_that_fits_nowhere_takes_the_room_of_the_fewest_lowest_units_and_they_say_why() {
    let snapshot = preempting(ClusterSnapshot {
        machines: vec![sized("m1", 4, 8), sized("m2", 4, 8)],
        units: vec![
            unit("batch@1.service", "Memory=1G\nPriority=10", Some("m1")),
            unit("batch@2.service", "Memory=1G\nPriority=10", Some("m1")),
            unit("batch@3.service", "Memory=2G\nPriority=10", Some("m1")),
            unit("api.service", "Memory=3G\nPriority=500", Some("m2")),
            unit("cache.service", "Memory=1G\nPriority=20", Some("m2")),
            unit("web@3.service", "Memory=2G\nPriority=900", None),
        ],
        ..ClusterSnapshot::default()
    });
    let result = plan(&snapshot);
    // On m1 batch@3 alone makes room (the largest of the lowest); on m2 only api would (cache
    // is too small and need not go): of two machines with one to go, the lower priority loses.
    let unscheduled: Vec<(&str, String)> = result
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Unschedule { unit, reason, .. } => Some((unit.as_str(), reason.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(unscheduled, [("batch@3.service", "preempted by web@3.service (priority 900)".to_string())]);
    assert_eq!(placed_after(&snapshot, &result.decisions)["web@3.service"], "m1");
    let reasons: BTreeMap<String, String> = result.reason_texts().into_iter().collect();
    assert_eq!(
        reasons["batch@3.service"],
        "preempted by web@3.service (priority 900): needs 2 GiB memory; the most free is 0 B on m1"
    );

    // Without preemption it waits, and nothing moves.
    let off = plan(&ClusterSnapshot { preemption: false, ..snapshot.clone() });
    assert!(off.decisions.is_empty(), "{off:?}");
    assert!(matches!(off.unplaced[0].1, UnplacedReason::NoRoom { .. }));

    // The engine remembers who took the room: a later plan says so while the unit waits.
    let mut later = snapshot.clone();
    later.units.iter_mut().for_each(|u| {
        u.scheduled_on = placed_after(&snapshot, &result.decisions).get(&u.name).cloned();
    });
    later.preempted.insert("batch@3.service".into(), Preemptor { unit: "web@3.service".into(), priority: 900 });
    let again = plan(&later);
    assert!(again.decisions.is_empty(), "{again:?}");
    assert!(again.reason_texts()[0].1.starts_with("preempted by web@3.service (priority 900): needs 2 GiB"));
}

#[test]
fn equal_priorities_global_units_and_units_on_a_calendar_are_never_preempted() {
    let snapshot = preempting(ClusterSnapshot {
        machines: vec![sized("m1", 2, 8)],
        units: vec![
            unit("peer.service", "Memory=1G\nPriority=900", Some("m1")),
            unit("agent.service", "Memory=512M\nGlobal=true\nPriority=0", None),
            unit("backup.service", "Memory=512M\nPriority=0\nSchedule=daily", Some("m1")),
            unit("web@3.service", "Memory=1G\nPriority=900", None),
        ],
        ..ClusterSnapshot::default()
    });
    let result = plan(&snapshot);
    assert!(result.decisions.is_empty(), "{result:?}");
    assert_eq!(result.unplaced.len(), 1);
}

#[test]
fn one_plan_preempts_at_most_its_bound() {
    let mut units: Vec<UnitSpec> =
        (0..40).map(|n| unit(&format!("low@{n}.service"), "Memory=1G\nPriority=1", Some("m1"))).collect();
    units.extend((0..40).map(|n| unit(&format!("high@{n}.service"), "Memory=1G\nPriority=2", None)));
    let snapshot = preempting(ClusterSnapshot { machines: vec![sized("m1", 40, 64)], units, ..Default::default() });
    let result = plan(&snapshot);
    let preempted = result
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Unschedule { reason: UnscheduleReason::PreemptedBy(_), .. }))
        .count();
    assert_eq!(preempted, PREEMPTED_PER_PLAN);
    assert_eq!(result.decisions.len(), 2 * PREEMPTED_PER_PLAN);
    assert!(result.unplaced.iter().all(|(_, reason)| {
        reason.to_string().starts_with("preempted by high@") || reason.to_string().starts_with("needs 1 GiB")
    }));
}

#[test]
fn a_unit_that_need_not_leave_stays_though_its_priority_is_lower() {
    // The lowest (1 GiB) is too small alone; the next (2 GiB) is enough alone: only it goes.
    let snapshot = preempting(ClusterSnapshot {
        machines: vec![sized("m1", 3, 8)],
        units: vec![
            unit("low.service", "Memory=1G\nPriority=10", Some("m1")),
            unit("mid.service", "Memory=2G\nPriority=20", Some("m1")),
            unit("high.service", "Memory=2G\nPriority=900", None),
        ],
        ..ClusterSnapshot::default()
    });
    let result = plan(&snapshot);
    let unscheduled: Vec<&str> = result
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Unschedule { unit, .. } => Some(unit.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(unscheduled, ["mid.service"]);
    assert_eq!(placed_after(&snapshot, &result.decisions).keys().collect::<Vec<_>>(), ["high.service", "low.service"]);
}
