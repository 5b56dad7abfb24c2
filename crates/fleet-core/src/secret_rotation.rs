//! A secret's new value reaching the units that name it, sans I/O. By default in waves: every
//! unit is first held on the version it runs (pinned), then the new version is stored, and a
//! rollout moves the running units to it one wave at a time, with the rollout's budget,
//! health gates and auto-revert (`crate::rollout`); a unit that does not run is simply moved.
//! With `in_place` (`secret set --no-restart`) every unit is moved at once and its machine
//! writes the new credential where the unit reads it without restarting it.
//!
//! The older versions units are still pinned to are kept with the secret, so that a unit not
//! reached yet, or taken back by an undo, still has its value.

use std::collections::{BTreeMap, BTreeSet};

use crate::rollout::{RolloutUnit, Step};
use crate::secrets::{SecretPins, version_identity};

/// A unit that names the secret, as the rotation needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamingUnit {
    pub name: String,
    pub pins: SecretPins,
    /// Wanted running (a restart is what moves it).
    pub running: bool,
}

/// What storing version `new` of a secret does to the units that name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RotationPlan {
    /// Pins written before the new version is stored: each unit held on the version it runs.
    pub hold: Vec<(String, SecretPins)>,
    /// The older versions the secret keeps for units pinned to them.
    pub kept: BTreeSet<u64>,
    /// Pins written once the new version is stored: the units moved at once.
    pub moved: Vec<(String, SecretPins)>,
    /// The running units a rollout moves, in the order given, each from the version it runs.
    pub rolled: Vec<RolloutUnit>,
    /// Every version the rollout moves units from or to.
    pub versions: Vec<u64>,
}

/// `pins` with `secret` at `version`; a move that restarts unless `in_place`.
pub fn pinned(pins: &SecretPins, secret: &str, version: u64, in_place: bool) -> SecretPins {
    let mut versions = pins.versions.clone();
    versions.insert(secret.to_string(), version);
    SecretPins { versions, in_place }
}

/// The plan for storing version `new` of `secret`, whose newest is `current` (`None`: it is
/// new), over `units` (those that name it).
pub fn plan_rotation(
    secret: &str,
    current: Option<u64>,
    new: u64,
    units: &[NamingUnit],
    in_place: bool,
) -> RotationPlan {
    let mut plan = RotationPlan::default();
    let mut from_versions: BTreeMap<&str, u64> = BTreeMap::new();
    for unit in units {
        // The version it runs: its pin, else the newest until now.
        let Some(from) = unit.pins.versions.get(secret).copied().or(current) else { continue };
        from_versions.insert(&unit.name, from);
        if from != new {
            plan.kept.insert(from);
        }
        if !in_place && unit.running && !unit.pins.versions.contains_key(secret) {
            plan.hold.push((unit.name.clone(), pinned(&unit.pins, secret, from, false)));
        }
    }
    for unit in units {
        let from = from_versions.get(unit.name.as_str()).copied();
        if in_place || !unit.running || from.is_none() {
            plan.moved.push((unit.name.clone(), pinned(&unit.pins, secret, new, in_place)));
        } else if let Some(from) = from {
            plan.rolled.push(RolloutUnit {
                name: unit.name.clone(),
                from: version_identity(secret, from),
                to: version_identity(secret, new),
                step: if from == new { Step::Done } else { Step::Waiting },
            });
        }
    }
    if in_place {
        // Every unit moves at once: nothing stays on an older version.
        plan.kept.clear();
    }
    let mut versions: BTreeSet<u64> = plan.kept.clone();
    versions.insert(new);
    plan.versions = versions.into_iter().collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, pinned_to: Option<u64>, running: bool) -> NamingUnit {
        let versions = pinned_to.map(|version| BTreeMap::from([("db".to_string(), version)])).unwrap_or_default();
        NamingUnit { name: name.into(), pins: SecretPins { versions, in_place: false }, running }
    }

    fn pin(version: u64, in_place: bool) -> SecretPins {
        SecretPins { versions: BTreeMap::from([("db".to_string(), version)]), in_place }
    }

    #[test]
    fn running_units_are_held_where_they_are_and_rolled_to_the_new_version() {
        let units = [unit("a", None, true), unit("b", Some(2), true), unit("idle", None, false)];
        let plan = plan_rotation("db", Some(3), 4, &units, false);
        assert_eq!(plan.hold, vec![("a".to_string(), pin(3, false))], "b is pinned already; idle does not run");
        assert_eq!(plan.kept, BTreeSet::from([2, 3]));
        assert_eq!(plan.moved, vec![("idle".to_string(), pin(4, false))], "what does not run just moves");
        let rolled: Vec<(&str, Option<u64>, Step)> = plan
            .rolled
            .iter()
            .map(|unit| {
                let from = [2, 3].into_iter().find(|&version| version_identity("db", version) == unit.from);
                assert_eq!(unit.to, version_identity("db", 4));
                (unit.name.as_str(), from, unit.step.clone())
            })
            .collect();
        assert_eq!(rolled, vec![("a", Some(3), Step::Waiting), ("b", Some(2), Step::Waiting)]);
        assert_eq!(plan.versions, vec![2, 3, 4]);
    }

    #[test]
    fn in_place_moves_every_unit_at_once_and_keeps_nothing_older() {
        let units = [unit("a", None, true), unit("b", Some(2), true)];
        let plan = plan_rotation("db", Some(3), 4, &units, true);
        assert!(plan.hold.is_empty() && plan.rolled.is_empty() && plan.kept.is_empty());
        assert_eq!(plan.moved, vec![("a".to_string(), pin(4, true)), ("b".to_string(), pin(4, true))]);
    }

    #[test]
    fn a_first_value_moves_whatever_names_it() {
        let plan = plan_rotation("db", None, 1, &[unit("a", None, true)], false);
        assert_eq!(plan.moved, vec![("a".to_string(), pin(1, false))]);
        assert!(plan.rolled.is_empty() && plan.kept.is_empty());
    }
}
