//! Building the planner's [`ClusterSnapshot`] from what a store lists: units by name and body
//! hash only. Requirements are parsed once per body and kept for as long as the body is listed.

use std::collections::HashMap;
use std::sync::Arc;

use super::{ClusterSnapshot, UnitSpec};
use crate::machine::MachineState;
use crate::requirements::Requirements;
use crate::state::DesiredState;
use crate::unit_file::UnitFile;
use crate::unit_file::UnitHash;

/// A unit as a store lists it for the engine, placed or not (`machine_id`): no body, only its
/// hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotUnit {
    pub name: String,
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub machine_id: Option<String>,
}

/// Parsed `[X-Fleet]` requirements by unit name, with the body hash they were parsed from (a
/// body never changes under its hash, so an entry goes stale only when the unit gets another
/// body; it goes when the unit is no longer listed with it). Looked up by name: a pass over
/// 100,000 units allocates nothing for the lookups.
#[derive(Debug, Default)]
pub struct RequirementsCache {
    by_unit: HashMap<String, (UnitHash, Arc<Requirements>)>,
}

impl RequirementsCache {
    fn known(&self, unit: &SnapshotUnit) -> Option<&Arc<Requirements>> {
        self.by_unit
            .get(unit.name.as_str())
            .filter(|(hash, _)| *hash == unit.hash)
            .map(|(_, requirements)| requirements)
    }

    /// The body hashes among `units` whose requirements are not known yet, each once.
    pub fn missing(&self, units: &[SnapshotUnit]) -> Vec<UnitHash> {
        let mut missing: Vec<UnitHash> =
            units.iter().filter(|unit| self.known(unit).is_none()).map(|unit| unit.hash).collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// Parses and keeps the requirements of every unit in `units` whose body is in `bodies`.
    pub fn learn(&mut self, units: &[SnapshotUnit], bodies: &HashMap<UnitHash, UnitFile>) {
        for unit in units {
            if self.known(unit).is_none()
                && let Some(file) = bodies.get(&unit.hash)
            {
                let requirements = Arc::new(Requirements::from_unit(&unit.name, file));
                self.by_unit.insert(unit.name.clone(), (unit.hash, requirements));
            }
        }
    }

    /// The planner's snapshot: every listed unit whose requirements are known (a unit whose
    /// body the store could not return is left out, so it is neither placed nor moved), and
    /// entries for units no longer listed are forgotten.
    pub fn cluster_snapshot(&mut self, machines: Vec<MachineState>, units: Vec<SnapshotUnit>) -> ClusterSnapshot {
        let mut kept = HashMap::with_capacity(self.by_unit.len());
        let units = units
            .into_iter()
            .filter_map(|unit| {
                let (name, (hash, requirements)) = self.by_unit.remove_entry(unit.name.as_str())?;
                if hash != unit.hash {
                    return None;
                }
                kept.insert(name, (hash, requirements.clone()));
                Some(UnitSpec { name: unit.name, desired: unit.desired, requirements, scheduled_on: unit.machine_id })
            })
            .collect();
        self.by_unit = kept;
        ClusterSnapshot { machines, units, ..ClusterSnapshot::default() }
    }

    /// Takes the new contents of `changed` (units whose content alone changed:
    /// [`contents_alone_changed`]) when each keeps the rules it was placed by, so that the plan
    /// of the cluster is the one before; `false`, taking nothing, when one's requirements
    /// changed, were not known, or its new body is not in `bodies`.
    pub fn take_same_requirements(&mut self, changed: &[&SnapshotUnit], bodies: &HashMap<UnitHash, UnitFile>) -> bool {
        let mut kept = Vec::with_capacity(changed.len());
        for unit in changed {
            let Some((_, before)) = self.by_unit.get(unit.name.as_str()) else { return false };
            let Some(file) = bodies.get(&unit.hash) else { return false };
            if !Requirements::from_unit(&unit.name, file).places_alike(before) {
                return false;
            }
            kept.push((unit, before.clone()));
        }
        for (unit, requirements) in kept {
            self.by_unit.insert(unit.name.clone(), (unit.hash, requirements));
        }
        true
    }

    /// How many units' requirements are kept.
    pub fn len(&self) -> usize {
        self.by_unit.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_unit.is_empty()
    }
}

/// The units of `current` whose content alone changed since `previous`, or `None` when
/// anything else did (a unit added, removed, moved or given another desired state; the
/// lists are in the store's order, name order).
pub fn contents_alone_changed<'a>(
    previous: &[SnapshotUnit],
    current: &'a [SnapshotUnit],
) -> Option<Vec<&'a SnapshotUnit>> {
    if previous.len() != current.len() {
        return None;
    }
    let mut changed = Vec::new();
    for (before, now) in previous.iter().zip(current) {
        if before.name != now.name || before.desired != now.desired || before.machine_id != now.machine_id {
            return None;
        }
        if before.hash != now.hash {
            changed.push(now);
        }
    }
    Some(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, body: &str, machine: Option<&str>) -> (SnapshotUnit, UnitFile) {
        let file = UnitFile::parse(body).expect("test unit parses");
        let unit = SnapshotUnit {
            name: name.to_string(),
            hash: file.hash(),
            desired: DesiredState::Launched,
            machine_id: machine.map(str::to_string),
        };
        (unit, file)
    }

    #[test]
    fn requirements_are_parsed_once_per_body_and_forgotten_with_the_unit() {
        let (web, web_file) = listed("web.service", "[X-Fleet]\nConflicts=web*\n", Some("m1"));
        let (db, db_file) = listed("db.service", "[X-Fleet]\nGlobal=true\n", None);
        let mut cache = RequirementsCache::default();
        let units = vec![web.clone(), db.clone()];
        assert_eq!(cache.missing(&units).len(), 2);

        let bodies = HashMap::from([(web.hash, web_file), (db.hash, db_file)]);
        cache.learn(&units, &bodies);
        assert!(cache.missing(&units).is_empty());

        let snapshot = cache.cluster_snapshot(Vec::new(), units);
        assert_eq!(snapshot.units.len(), 2);
        assert_eq!(snapshot.units[0].requirements.conflicts, vec!["web*".to_string()]);
        assert_eq!(snapshot.units[0].scheduled_on.as_deref(), Some("m1"));
        assert!(snapshot.units[1].requirements.global);

        let snapshot = cache.cluster_snapshot(Vec::new(), vec![db]);
        assert_eq!(snapshot.units.len(), 1);
        assert_eq!(cache.len(), 1, "web's requirements go with web");
    }

    #[test]
    fn a_unit_whose_body_is_missing_is_left_out_of_the_plan() {
        let (web, _) = listed("web.service", "[Service]\nExecStart=/bin/true\n", None);
        let mut cache = RequirementsCache::default();
        cache.learn(std::slice::from_ref(&web), &HashMap::new());
        assert_eq!(cache.missing(std::slice::from_ref(&web)), vec![web.hash]);
        assert!(cache.cluster_snapshot(Vec::new(), vec![web]).units.is_empty());
    }

    #[test]
    fn a_changed_body_is_parsed_again() {
        let (old, old_file) = listed("web.service", "[X-Fleet]\nMachineID=a\n", None);
        let (new, _) = listed("web.service", "[X-Fleet]\nMachineID=b\n", None);
        let mut cache = RequirementsCache::default();
        cache.learn(std::slice::from_ref(&old), &HashMap::from([(old.hash, old_file)]));
        assert_eq!(cache.missing(std::slice::from_ref(&new)), vec![new.hash]);
    }

    #[test]
    fn a_change_of_contents_alone_is_told_from_any_other() {
        let (web, _) = listed("web.service", "[Service]\nExecStart=/bin/a\n", Some("m1"));
        let (db, _) = listed("db.service", "[Service]\nExecStart=/bin/a\n", None);
        let (web_b, _) = listed("web.service", "[Service]\nExecStart=/bin/b\n", Some("m1"));
        let before = vec![db.clone(), web.clone()];
        let after = [db.clone(), web_b.clone()];
        let changed = contents_alone_changed(&before, &after).expect("contents alone");
        assert_eq!(changed, vec![&web_b]);
        assert_eq!(contents_alone_changed(&before, &before), Some(Vec::new()));
        let moved = SnapshotUnit { machine_id: Some("m2".into()), ..web_b.clone() };
        let stopped = SnapshotUnit { desired: DesiredState::Inactive, ..web.clone() };
        for other in
            [vec![db.clone(), moved], vec![db.clone(), stopped], vec![db.clone()], vec![web.clone(), db.clone()]]
        {
            assert_eq!(contents_alone_changed(&before, &other), None, "{other:?}");
        }
    }

    #[test]
    fn new_contents_are_taken_only_when_every_unit_keeps_its_requirements() {
        let (web, web_file) = listed("web.service", "[Service]\nExecStart=/bin/a\n[X-Fleet]\nConflicts=web*\n", None);
        let (same, same_file) = listed("web.service", "[Service]\nExecStart=/bin/b\n[X-Fleet]\nConflicts=web*\n", None);
        let (other, other_file) = listed("web.service", "[Service]\nExecStart=/bin/c\n[X-Fleet]\nGlobal=true\n", None);
        let mut cache = RequirementsCache::default();
        cache.learn(std::slice::from_ref(&web), &HashMap::from([(web.hash, web_file)]));
        assert!(!cache.take_same_requirements(&[&same], &HashMap::new()), "its new body is needed");
        assert!(!cache.take_same_requirements(&[&other], &HashMap::from([(other.hash, other_file)])));
        assert_eq!(cache.missing(std::slice::from_ref(&other)), vec![other.hash], "nothing taken");
        assert!(cache.take_same_requirements(&[&same], &HashMap::from([(same.hash, same_file)])));
        assert!(cache.missing(std::slice::from_ref(&same)).is_empty(), "the new content is known");
        // A key only fleet knows (a health check) is no rule of placement.
        let (checked, checked_file) = listed(
            "web.service",
            "[Service]\nExecStart=/bin/b\n[X-Fleet]\nConflicts=web*\nHealthCheck=tcp://127.0.0.1:80\n",
            None,
        );
        assert!(cache.take_same_requirements(&[&checked], &HashMap::from([(checked.hash, checked_file)])));
        let (unknown, unknown_file) = listed("db.service", "[Service]\nExecStart=/bin/a\n", None);
        assert!(!cache.take_same_requirements(&[&unknown], &HashMap::from([(unknown.hash, unknown_file)])));
    }
}
