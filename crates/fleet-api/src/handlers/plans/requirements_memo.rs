//! The cluster's units' `[X-Fleet]` requirements as plans last read them, by unit, with the
//! content hash they were read from: a plan over 100,000 units parses only the units whose
//! content changed since the last plan, not every unit again (a content never changes under
//! its hash). Holds the units of the last plan's cluster and no others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleet_core::UnitHash;
use fleet_core::requirements::Requirements;
use fleet_core::unpoisoned::Locked;
use fleet_registry::UnitView;

#[derive(Debug, Default)]
pub struct RequirementsMemo {
    by_unit: Mutex<HashMap<String, (UnitHash, Arc<Requirements>)>>,
}

impl RequirementsMemo {
    /// The requirements of each of `units`, in order: kept ones where the content is the one
    /// read before, parsed now otherwise. What is kept afterwards is exactly `units`'.
    pub fn of(&self, units: &[UnitView]) -> Vec<Arc<Requirements>> {
        let mut kept = self.by_unit.locked();
        let mut next = HashMap::with_capacity(units.len());
        let requirements = units
            .iter()
            .map(|unit| {
                let requirements = match kept.remove(&unit.name) {
                    Some((hash, requirements)) if hash == unit.hash => requirements,
                    _ => Arc::new(Requirements::from_unit(&unit.name, &unit.file)),
                };
                next.insert(unit.name.clone(), (unit.hash, requirements.clone()));
                requirements
            })
            .collect();
        *kept = next;
        requirements
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, UnitFile};
    use fleet_registry::UnitRecord;

    fn view(name: &str, x_fleet: &str) -> UnitView {
        let file = UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{x_fleet}\n")).expect("a unit");
        let record = UnitRecord::by_hand(file.hash(), DesiredState::Launched);
        UnitView::from_records(name, record, file, None, None, None)
    }

    #[test]
    fn requirements_are_read_again_only_for_new_content_and_gone_units_are_forgotten() {
        let memo = RequirementsMemo::default();
        let first = memo.of(&[view("a.service", "MachineMetadata=disk=ssd"), view("b.service", "Global=true")]);
        assert_eq!(first[0].metadata.len(), 1);
        assert!(first[1].global);
        let again = memo.of(&[view("a.service", "MachineMetadata=disk=ssd")]);
        assert!(Arc::ptr_eq(&first[0], &again[0]), "the same content is not read again");
        assert_eq!(memo.by_unit.locked().len(), 1, "b.service is forgotten");
        let changed = memo.of(&[view("a.service", "Global=true")]);
        assert!(changed[0].global && !Arc::ptr_eq(&first[0], &changed[0]), "new content is read");
    }
}
