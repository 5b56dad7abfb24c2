use super::*;

fn unit(name: &str, on: &str) -> DrainUnit {
    DrainUnit {
        name: name.into(),
        on: Some(on.into()),
        ready: true,
        wanted: true,
        machine_id: None,
        follows: Vec::new(),
        required_by: Vec::new(),
    }
}

fn drain(max: MaxUnavailable) -> Drain {
    Drain::new(max, 100)
}

fn names(progress: &[String]) -> Vec<&str> {
    progress.iter().map(String::as_str).collect()
}

/// The engine's part, for a test: every unit let go lands on `to`, not yet running.
fn engine_moves(drain: &Drain, units: &mut [DrainUnit], to: &str) {
    for unit in units.iter_mut().filter(|unit| drain.lets_go(&unit.name)) {
        if unit.on.as_deref() != Some(to) {
            unit.on = Some(to.into());
            unit.ready = false;
        }
    }
}

#[test]
fn units_leave_in_waves_each_waiting_for_the_last_to_run_elsewhere() {
    let mut units: Vec<DrainUnit> = ["a", "b", "c", "d", "e"].iter().map(|name| unit(name, "m1")).collect();
    let mut drain = drain(MaxUnavailable::Count(2));
    let progress = advance(&mut drain, "m1", &units, 100);
    assert_eq!(names(&progress.moving), ["a", "b"]);
    assert_eq!(names(&progress.left), ["c", "d", "e"]);
    assert_eq!(progress.word(), "draining");
    engine_moves(&drain, &mut units, "m2");
    let progress = advance(&mut drain, "m1", &units, 101);
    assert_eq!(names(&progress.moving), ["a", "b"], "not running on m2 yet: nothing more goes");
    units[0].ready = true;
    let progress = advance(&mut drain, "m1", &units, 102);
    assert_eq!((progress.moved, names(&progress.moving)), (1, vec!["b", "c"]), "a runs on m2: c may go");
    for _ in 0..4 {
        engine_moves(&drain, &mut units, "m2");
        units.iter_mut().for_each(|unit| unit.ready = true);
        advance(&mut drain, "m1", &units, 103);
    }
    let progress = progress_of(&drain, &units);
    assert_eq!((progress.moved, progress.word()), (5, "drained"));
    assert!(progress.left.is_empty() && progress.moving.is_empty());
}

fn progress_of(drain: &Drain, units: &[DrainUnit]) -> Progress {
    progress(drain, "m1", units)
}

#[test]
fn pinned_units_and_their_followers_stay_and_followers_move_with_their_leader() {
    let mut pinned = unit("pinned", "m1");
    pinned.machine_id = Some("m1".into());
    let mut follows_pinned = unit("log", "m1");
    follows_pinned.follows = vec!["pinned".into()];
    let mut follows_web = unit("sidecar", "m1");
    follows_web.follows = vec!["web".into()];
    let units = vec![pinned, follows_pinned, unit("web", "m1"), follows_web];
    let mut drain = drain(MaxUnavailable::Count(2));
    let progress = advance(&mut drain, "m1", &units, 100);
    assert_eq!(names(&progress.moving), ["sidecar", "web"], "the leader and its follower go together");
    assert_eq!(
        progress.stays,
        vec![("log".to_string(), Stays::FollowsStaying("pinned".into())), ("pinned".to_string(), Stays::Pinned)]
    );
    assert_eq!(progress.stays[1].1.to_string(), "MachineID= names this machine");
}

#[test]
fn a_unit_down_anyway_goes_first_and_costs_nothing() {
    let mut units = vec![unit("a", "m1"), unit("b", "m1"), unit("c", "m1")];
    units[2].ready = false;
    let mut drain = drain(MaxUnavailable::Count(2));
    let progress = advance(&mut drain, "m1", &units, 100);
    assert_eq!(names(&progress.moving), ["a", "c"], "c was down: one more goes, then the budget is spent");
}

#[test]
fn a_group_larger_than_the_budget_goes_alone() {
    let mut follower = unit("b", "m1");
    follower.follows = vec!["a".into()];
    let units = vec![unit("a", "m1"), follower, unit("c", "m1")];
    let mut drain = drain(MaxUnavailable::Count(1));
    let progress = advance(&mut drain, "m1", &units, 100);
    assert_eq!(names(&progress.moving), ["a", "b"]);
    assert_eq!(names(&progress.left), ["c"]);
}

#[test]
fn units_that_go_away_or_stop_count_as_gone() {
    let mut units = vec![unit("a", "m1"), unit("b", "m1")];
    let mut drain = drain(MaxUnavailable::Count(2));
    advance(&mut drain, "m1", &units, 100);
    units.remove(0);
    units[0].wanted = false;
    units[0].on = None;
    let progress = advance(&mut drain, "m1", &units, 101);
    assert_eq!((progress.moved, progress.word()), (2, "drained"));
}

#[test]
fn a_short_machine_id_pins_too_and_percentages_round_down_to_at_least_one() {
    let mut pinned = unit("p", "3d1219c7aaaabbbb");
    pinned.machine_id = Some("3d1219c7".into());
    let units: Vec<DrainUnit> = vec![pinned, unit("a", "3d1219c7aaaabbbb"), unit("b", "3d1219c7aaaabbbb")];
    let mut drain = drain(MaxUnavailable::Percent(10));
    let progress = advance(&mut drain, "3d1219c7aaaabbbb", &units, 100);
    assert_eq!(names(&progress.moving), ["a"]);
    assert_eq!(progress.stays, vec![("p".to_string(), Stays::Pinned)]);
}

proptest::proptest! {
    /// Whatever the engine does with the units let go (moves them or cannot) and however they
    /// run, a step never takes more of the drain's units down than max-unavailable allows: after
    /// it no more are unavailable than the budget, or than before it.
    #[test]
    fn never_more_than_max_unavailable_down(
        events in proptest::collection::vec((0usize..8, 0u8..4), 1..60),
        max in 1usize..4,
        count in 1usize..8,
    ) {
        let mut units: Vec<DrainUnit> = (0..count).map(|n| unit(&format!("u{n}"), "m1")).collect();
        let mut drain = drain(MaxUnavailable::Count(max));
        // Unavailable: let go and not yet running elsewhere, or still waiting and down.
        let unavailable = |drain: &Drain, units: &[DrainUnit]| {
            units
                .iter()
                .filter(|unit| drain.lets_go(&unit.name) || (unit.on.as_deref() == Some("m1") && !unit.ready))
                .count()
        };
        for (now, (which, event)) in events.iter().enumerate() {
            if let Some(unit) = units.get_mut(which % count) {
                match event {
                    // The engine moves it, if it was let go.
                    0 if drain.lets_go(&unit.name) => {
                        unit.on = Some("m2".into());
                        unit.ready = false;
                    }
                    1 => unit.ready = true,
                    2 => unit.ready = false,
                    _ => {}
                }
            }
            let before = unavailable(&drain, &units);
            advance(&mut drain, "m1", &units, now as u64);
            let after = unavailable(&drain, &units);
            proptest::prop_assert!(after <= max.max(before), "{after} unavailable after, {before} before, budget {max}");
            let moved_off = units.iter().filter(|unit| unit.on.as_deref() == Some("m2")).count();
            proptest::prop_assert!(drain.moved <= moved_off, "only units that left count as moved");
        }
    }
}

/// A unit that budgeted units require is let go within their budget: two dbs, each required
/// by one app of a group that may have one down, leave one at a time though the drain allows two.
#[test]
fn a_required_unit_is_let_go_within_the_budget_of_what_requires_it() {
    use crate::disruption_budget::{Budgets, DisruptionBudget, Member};
    let app = |n: u32| Member {
        name: format!("app@{n}.service"),
        group: "app@.service".into(),
        budget: DisruptionBudget { size: MaxUnavailable::Count(1), by: None },
        value: None,
        down: false,
    };
    let mut budgets = Budgets::new([app(1), app(2)]);
    let db =
        |n: u32| DrainUnit { required_by: vec![format!("app@{n}.service")], ..unit(&format!("db@{n}.service"), "m1") };
    let mut drain = drain(MaxUnavailable::Count(2));
    let progress = advance_within(&mut drain, "m1", &[db(1), db(2)], 1, &mut budgets);
    assert_eq!(names(&progress.moving), ["db@1.service"]);
    let held = drain.held.clone().unwrap_or_default();
    assert!(held.starts_with("db@2.service waits: ") && held.contains("app@.service"), "{held}");
    // Without a budget on what requires them, both go.
    let mut drain = self::drain(MaxUnavailable::Count(2));
    let progress = advance_within(&mut drain, "m1", &[db(1), db(2)], 1, &mut Budgets::default());
    assert_eq!(names(&progress.moving), ["db@1.service", "db@2.service"]);
}
