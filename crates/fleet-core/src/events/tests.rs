use super::*;
use crate::health::{HealthReport, HealthStatus};
use crate::state_report::StateReport;
use crate::{SystemdState, UnitHash, UnitState};

fn state(active: &str, sub: &str, health: Option<HealthStatus>) -> UnitState {
    UnitState {
        name: "web@1.service".into(),
        machine_id: "m1".into(),
        hash: UnitHash([0; 20]),
        systemd: SystemdState::new("loaded", active, sub),
        launched: true,
        drift: None,
        health: health.map(|status| HealthReport { status, failure: String::new(), restarts: 0, given_up: false }),
        secrets: Default::default(),
        run: None,
    }
}

#[test]
fn an_index_names_its_batch_and_its_place_and_orders_as_they_do() {
    assert_eq!(index_of(7, 3), 70_003);
    assert_eq!(batch_of(70_003), 7);
    assert!(index_of(7, (PER_BATCH - 1) as usize) < index_of(8, 0));
}

#[test]
fn kinds_are_named_and_read_back_by_their_names() {
    for kind in EventKind::ALL {
        assert_eq!(EventKind::parse(kind.name()), Some(kind));
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{}\"", kind.name()));
    }
    assert_eq!(EventKind::parse("nonsense"), None);
}

#[test]
fn a_message_is_cut_to_its_bound_at_a_character() {
    let event = NewEvent::new(0, EventKind::Write, "é".repeat(LONGEST_MESSAGE));
    assert!(event.message.len() <= LONGEST_MESSAGE);
    assert!(event.message.chars().all(|c| c == 'é'));
}

#[test]
fn a_filter_admits_by_kind_unit_pattern_and_machine_prefix() {
    let event = NewEvent::new(0, EventKind::Placed, "placed").of_unit("web@1.service").on_machine("abcdef");
    let filter = |unit: Option<&str>, machine: Option<&str>, kinds: Vec<EventKind>| EventFilter {
        unit: unit.map(|pattern| Glob::new(pattern).unwrap()),
        machine: machine.map(str::to_string),
        kinds,
        from: None,
    };
    assert!(filter(None, None, vec![]).admits(&event));
    assert!(filter(Some("web@*"), Some("abc"), vec![EventKind::Placed, EventKind::Moved]).admits(&event));
    assert!(!filter(Some("db*"), None, vec![]).admits(&event));
    assert!(!filter(None, Some("abd"), vec![]).admits(&event));
    assert!(!filter(None, None, vec![EventKind::State]).admits(&event));
    let of_no_unit = NewEvent::new(0, EventKind::MachineJoined, "joined").on_machine("abcdef");
    assert!(!filter(Some("*"), None, vec![]).admits(&of_no_unit));
}

#[test]
fn a_filter_from_a_moment_admits_the_events_of_that_moment_and_later() {
    let at = |micros: i64| NewEvent::new(micros, EventKind::Placed, "placed");
    let from = EventFilter { from: Some(5_000_000), ..EventFilter::default() };
    assert!(!from.admits(&at(4_999_999)));
    assert!(from.admits(&at(5_000_000)));
    assert!(from.admits(&at(9_000_000)));
}

#[test]
fn a_scoped_operator_sees_events_of_its_units_only_and_a_machine_none() {
    let scoped = Role::parse("operator", Some("web@*")).unwrap();
    let web = NewEvent::new(0, EventKind::State, "x").of_unit("web@1.service");
    let db = NewEvent::new(0, EventKind::State, "x").of_unit("db.service");
    let machine = NewEvent::new(0, EventKind::MachineLost, "x").on_machine("m1");
    assert!(visible_to(&scoped, &web));
    assert!(!visible_to(&scoped, &db));
    assert!(!visible_to(&scoped, &machine));
    for role in [Role::Admin, Role::Viewer, Role::parse("operator", None).unwrap()] {
        assert!(visible_to(&role, &db) && visible_to(&role, &machine), "{role}");
    }
    let agent = Role::Machine { id: "m1".into() };
    assert!(!visible_to(&agent, &web) && !visible_to(&agent, &machine));
}

#[test]
fn an_event_of_several_units_is_seen_by_a_scoped_operator_that_sees_each_and_found_by_any() {
    let scoped = Role::parse("operator", Some("web@*")).unwrap();
    let own = NewEvent::new(0, EventKind::Write, "x").of_units(["web@1.service", "web@2.service"]);
    let mixed = NewEvent::new(0, EventKind::Write, "x").of_units(["web@1.service", "db.service"]);
    assert_eq!((own.unit.as_deref(), own.units.len()), (None, 2));
    assert!(visible_to(&scoped, &own));
    assert!(!visible_to(&scoped, &mixed), "it would name a unit the operator does not see");
    assert!(visible_to(&Role::Viewer, &mixed));
    assert!(!visible_to(&Role::Machine { id: "m1".into() }, &own));
    let pattern = |glob: &str| EventFilter { unit: Some(Glob::new(glob).unwrap()), ..EventFilter::default() };
    assert!(pattern("db*").admits(&mixed) && !pattern("db*").admits(&own));
    // One unit alone is the event's unit; a batch names at most MOST_UNITS_NAMED.
    let alone = NewEvent::new(0, EventKind::Write, "x").of_units(["db.service"]);
    assert_eq!((alone.unit.as_deref(), alone.units.len()), (Some("db.service"), 0));
    let names: Vec<String> = (0..MOST_UNITS_NAMED + 5).map(|n| format!("u{n}.service")).collect();
    let many = NewEvent::new(0, EventKind::Write, "x").of_units(names.iter().map(String::as_str));
    assert_eq!(many.units.len(), MOST_UNITS_NAMED);
}

#[test]
fn what_is_trimmed_is_the_older_of_too_many_and_too_old() {
    let kept = [(1, 10), (2, 20), (3, 30), (4, 40)];
    assert_eq!(to_trim(&kept, 10, 0), 0);
    assert_eq!(to_trim(&kept, 3, 0), 1);
    assert_eq!(to_trim(&kept, 3, 35), 3);
    assert_eq!(to_trim(&kept, 0, 0), 4);
}

#[test]
fn a_trim_takes_whole_batches_from_the_front_each_once_all_its_events_are_due() {
    let batches = vec![(1, vec![10, 20]), (2, vec![30]), (3, vec![40, 50])];
    assert_eq!(batches_to_trim(&batches, 10, 0), Trim::default());
    // Two too many: the first batch goes whole.
    assert_eq!(batches_to_trim(&batches, 3, 0), Trim { batches: 1, events: 2, through: Some(index_of(1, 1)) });
    // One too many: no batch is all due, none goes.
    assert_eq!(batches_to_trim(&batches, 4, 0), Trim::default());
    // By age: what was made before 35 goes.
    assert_eq!(batches_to_trim(&batches, 10, 35), Trim { batches: 2, events: 3, through: Some(index_of(2, 0)) });
    assert_eq!(batches_to_trim(&batches, 0, 0), Trim { batches: 3, events: 5, through: Some(index_of(3, 1)) });
}

#[test]
fn a_page_says_a_reader_missed_events_only_when_some_after_it_were_trimmed_and_never_to_one_from_the_start() {
    let page = EventPage { trimmed_through: 50_000, ..EventPage::default() };
    assert!(!page.missed_after(0), "from 0 is from the oldest kept");
    assert!(page.missed_after(1));
    assert!(page.missed_after(49_999));
    assert!(!page.missed_after(50_000));
    assert!(!EventPage::default().missed_after(0));
}

#[test]
fn a_state_event_is_made_when_active_or_sub_moves_and_health_when_its_verdict_does() {
    let running = state("active", "running", Some(HealthStatus::Unknown));
    let new = state_changes(None, &StateReport::Set(running.clone()), 5);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].message, "active/running (was new)");
    assert_eq!((new[0].unit.as_deref(), new[0].machine.as_deref()), (Some("web@1.service"), Some("m1")));

    let mut relaunched = running.clone();
    relaunched.launched = false;
    assert!(state_changes(Some(&running), &StateReport::Set(relaunched), 5).is_empty());

    let healthy = state("active", "running", Some(HealthStatus::Healthy));
    let events = state_changes(Some(&running), &StateReport::Set(healthy.clone()), 6);
    assert_eq!(
        events.iter().map(|e| (e.kind, e.message.as_str())).collect::<Vec<_>>(),
        [(EventKind::Health, "healthy")]
    );

    let mut failed = state("failed", "failed", Some(HealthStatus::Unhealthy));
    if let Some(health) = failed.health.as_mut() {
        health.failure = "exit 1".into();
    }
    let events = state_changes(Some(&healthy), &StateReport::Set(failed.clone()), 7);
    let shown: Vec<_> = events.iter().map(|e| (e.kind, e.message.as_str())).collect();
    assert_eq!(
        shown,
        [(EventKind::State, "failed/failed (was active/running)"), (EventKind::Health, "unhealthy: exit 1")]
    );

    let gone = state_changes(Some(&failed), &StateReport::Remove("web@1.service".into()), 8);
    assert_eq!(gone[0].message, "gone (was failed/failed)");
    assert!(state_changes(None, &StateReport::Remove("web@1.service".into()), 8).is_empty());
}

#[test]
fn decisions_are_placed_moved_and_unplaced_each_with_why() {
    use crate::schedule::{Decision, UnscheduleReason};
    let decisions = [
        Decision::Unschedule { unit: "a.service".into(), machine: "m1".into(), reason: UnscheduleReason::Drained },
        Decision::Schedule { unit: "a.service".into(), machine: "m2".into() },
        Decision::Schedule { unit: "b.service".into(), machine: "m1".into() },
        Decision::Unschedule {
            unit: "c.service".into(),
            machine: "m3".into(),
            reason: UnscheduleReason::TargetStateInactive,
        },
    ];
    let shown: Vec<_> = placement_events(&decisions, 1)
        .into_iter()
        .map(|e| (e.kind, e.unit.unwrap(), e.machine.unwrap(), e.message))
        .collect();
    let expected = [
        (EventKind::Moved, "a.service", "m2", "moved from m1 to m2: its machine is draining"),
        (EventKind::Placed, "b.service", "m1", "placed on m1"),
        (EventKind::Unplaced, "c.service", "m3", "taken off m3: target state inactive"),
    ];
    let expected: Vec<_> =
        expected.iter().map(|(k, u, m, t)| (*k, u.to_string(), m.to_string(), t.to_string())).collect();
    assert_eq!(shown, expected);
}

#[test]
fn only_a_new_reason_to_wait_is_an_event() {
    let before = [("a.service".to_string(), "no machine fits".to_string())];
    let now = [
        ("a.service".to_string(), "no machine fits".to_string()),
        ("b.service".to_string(), "waiting for db.service: inactive on m1".to_string()),
    ];
    let events = waiting_events(&before, &now, 1);
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].unit.as_deref(), events[0].message.as_str()),
        (Some("b.service"), "waiting for db.service: inactive on m1")
    );
}

#[test]
fn machines_joined_and_lost_are_told_apart() {
    use std::collections::BTreeMap;
    let before = BTreeMap::from([("m1".to_string(), "10.0.0.1".to_string()), ("m2".to_string(), String::new())]);
    let now = BTreeMap::from([("m1".to_string(), "10.0.0.1".to_string()), ("m3".to_string(), "10.0.0.3".to_string())]);
    let shown: Vec<_> =
        machine_events(&before, &now, 1).into_iter().map(|e| (e.kind, e.machine.unwrap(), e.message)).collect();
    assert_eq!(
        shown,
        [
            (EventKind::MachineJoined, "m3".to_string(), "joined (10.0.0.3)".to_string()),
            (EventKind::MachineLost, "m2".to_string(), "its presence went away".to_string()),
        ]
    );
}
