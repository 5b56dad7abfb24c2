//! The events the engine's decisions make: each unit placed, moved (taken off one machine
//! and placed on another in one plan) or unplaced with why; each unit whose reason for not
//! being placed is new; each machine that joined or was lost between two looks.

use std::collections::{BTreeMap, BTreeSet};

use super::{EventKind, NewEvent};
use crate::schedule::Decision;

/// The events of `decisions`, written at `at`.
pub fn placement_events(decisions: &[Decision], at: i64) -> Vec<NewEvent> {
    let taken_off: BTreeMap<&str, (&str, String)> = decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Unschedule { unit, machine, reason } => {
                Some((unit.as_str(), (machine.as_str(), reason.to_string())))
            }
            Decision::Schedule { .. } => None,
        })
        .collect();
    let placed: BTreeSet<&str> = decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Schedule { unit, .. } => Some(unit.as_str()),
            Decision::Unschedule { .. } => None,
        })
        .collect();
    let mut events = Vec::new();
    for decision in decisions {
        match decision {
            Decision::Schedule { unit, machine } => {
                let event = match taken_off.get(unit.as_str()) {
                    Some((from, why)) => {
                        NewEvent::new(at, EventKind::Moved, format!("moved from {from} to {machine}: {why}"))
                    }
                    None => NewEvent::new(at, EventKind::Placed, format!("placed on {machine}")),
                };
                events.push(event.of_unit(unit).on_machine(machine));
            }
            Decision::Unschedule { unit, machine, reason } if !placed.contains(unit.as_str()) => {
                let message = format!("taken off {machine}: {reason}");
                events.push(NewEvent::new(at, EventKind::Unplaced, message).of_unit(unit).on_machine(machine));
            }
            Decision::Unschedule { .. } => {}
        }
    }
    events
}

/// The units whose reason for not being placed (or for waiting) is new in `now`.
pub fn waiting_events(before: &[(String, String)], now: &[(String, String)], at: i64) -> Vec<NewEvent> {
    let before: BTreeMap<&str, &str> = before.iter().map(|(unit, reason)| (unit.as_str(), reason.as_str())).collect();
    now.iter()
        .filter(|(unit, reason)| before.get(unit.as_str()) != Some(&reason.as_str()))
        .map(|(unit, reason)| NewEvent::new(at, EventKind::Waiting, reason.clone()).of_unit(unit))
        .collect()
}

/// The machines that joined and those lost between two looks at the cluster (by ID, with
/// the address each is known by).
pub fn machine_events(before: &BTreeMap<String, String>, now: &BTreeMap<String, String>, at: i64) -> Vec<NewEvent> {
    let joined = now.iter().filter(|(id, _)| !before.contains_key(*id)).map(|(id, ip)| {
        let message = if ip.is_empty() { "joined".to_string() } else { format!("joined ({ip})") };
        NewEvent::new(at, EventKind::MachineJoined, message).on_machine(id)
    });
    let lost = before
        .keys()
        .filter(|id| !now.contains_key(*id))
        .map(|id| NewEvent::new(at, EventKind::MachineLost, "its presence went away").on_machine(id));
    joined.chain(lost).collect()
}
