//! What a write guarded by a plan's index (`?ifUnchanged=INDEX`) checks where it is made: each
//! unit it writes must be, inside the store's write, as the plan saw it (its content, desired
//! state and machine, or absent). The API checks the whole cluster's index just before the
//! write; this makes the part that matters most atomic: a unit the command writes is never
//! written over a change made since the plan (Nomad's check-index, per unit).

use std::collections::HashMap;

use fleet_core::{DesiredState, UnitHash};

use crate::{UnitRecord, UnitView};

/// The units as the plan with index `index` saw them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanGuard {
    pub index: u64,
    units: HashMap<String, Seen>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    hash: UnitHash,
    desired: DesiredState,
    machine: Option<String>,
}

impl PlanGuard {
    /// The guard of plan `index`, made over `units` (the cluster the index was checked on).
    pub fn of(index: u64, units: &[UnitView]) -> Self {
        let units = units
            .iter()
            .map(|unit| {
                let seen = Seen { hash: unit.hash, desired: unit.desired, machine: unit.machine_id.clone() };
                (unit.name.clone(), seen)
            })
            .collect();
        Self { index, units }
    }

    /// Whether `unit`, whose record is `record` on `machine` now (no record: no such unit),
    /// is as the plan saw it.
    pub fn holds(&self, unit: &str, record: Option<&UnitRecord>, machine: Option<&str>) -> bool {
        match (self.units.get(unit), record) {
            (None, None) => true,
            (Some(seen), Some(record)) => {
                seen.hash == record.hash && seen.desired == record.desired && seen.machine.as_deref() == machine
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::UnitFile;

    fn view(name: &str, exec: &str, machine: Option<&str>) -> UnitView {
        let file = UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("a unit file");
        let record = record(exec, DesiredState::Launched);
        UnitView::from_records(name, record, file, machine.map(str::to_string), None, None)
    }

    fn record(exec: &str, desired: DesiredState) -> UnitRecord {
        let file = UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("a unit file");
        UnitRecord::by_hand(file.hash(), desired)
    }

    #[test]
    fn a_unit_holds_only_with_the_content_desired_state_and_machine_the_plan_saw() {
        let guard = PlanGuard::of(1, &[view("a.service", "/bin/a", Some("m1"))]);
        let a = record("/bin/a", DesiredState::Launched);
        assert!(guard.holds("a.service", Some(&a), Some("m1")));
        assert!(!guard.holds("a.service", Some(&a), Some("m2")), "moved");
        assert!(!guard.holds("a.service", Some(&a), None), "unplaced");
        assert!(!guard.holds("a.service", Some(&record("/bin/b", DesiredState::Launched)), Some("m1")), "new content");
        assert!(!guard.holds("a.service", Some(&record("/bin/a", DesiredState::Loaded)), Some("m1")), "stopped");
        assert!(!guard.holds("a.service", None, None), "destroyed");
        assert!(guard.holds("b.service", None, None), "absent then and now");
        assert!(!guard.holds("b.service", Some(&a), None), "made since");
    }
}
