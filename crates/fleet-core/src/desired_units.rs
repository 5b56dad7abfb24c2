//! What a machine should hold: the units scheduled to it and the global units it takes, each
//! at the content wanted, or, while that content's body could not be read yet, at the
//! content the machine already holds (a store outage never stops or changes a running unit).

use std::collections::{BTreeMap, HashMap};

use crate::agent_plan::{DesiredUnit, GlobalUnit, LoadedUnit, add_global_units};
use crate::machine::MachineState;
use crate::requirements::Requirements;
use crate::state::DesiredState;
use crate::unit_file::{UnitFile, UnitHash};

/// A unit the store gives a machine (scheduled to it, or global), as its agent read it.
pub struct Assigned<'a> {
    pub name: &'a str,
    pub wanted: DesiredUnit,
}

/// The units `machine` should hold, from what the store gives it, the bodies its agent has
/// read, and what it holds (`loaded`). With `bodies_unread` (a read of new bodies failed), a
/// unit whose wanted body is missing keeps the content held; one not held waits.
pub fn desired_units(
    machine: &MachineState,
    scheduled: &[Assigned<'_>],
    globals: &[Assigned<'_>],
    bodies: &HashMap<UnitHash, UnitFile>,
    loaded: &BTreeMap<String, LoadedUnit>,
    bodies_unread: bool,
) -> BTreeMap<String, DesiredUnit> {
    let held = |name: &str, wanted: &DesiredUnit| {
        let held = loaded.get(name).filter(|_| bodies_unread)?;
        Some(DesiredUnit { hash: held.hash, ..wanted.clone() })
    };
    let globals: Vec<&Assigned<'_>> =
        globals.iter().filter(|unit| unit.wanted.state != DesiredState::Inactive).collect();
    // The scheduled units' rules matter only to decide which global units may join them:
    // without a global unit (most passes) they are not parsed.
    let any_global = !globals.is_empty();
    let mut desired = BTreeMap::new();
    let mut requirements = BTreeMap::new();
    for unit in scheduled {
        let readable = bodies.contains_key(&unit.wanted.hash).then(|| unit.wanted.clone());
        let Some(chosen) = readable.or_else(|| held(unit.name, &unit.wanted)) else { continue };
        if any_global && let Some(file) = bodies.get(&chosen.hash) {
            requirements.insert(unit.name.to_string(), Requirements::from_unit(unit.name, file));
        }
        desired.insert(unit.name.to_string(), chosen);
    }
    let mut readable = Vec::new();
    let mut kept = Vec::new();
    for unit in globals {
        match bodies.get(&unit.wanted.hash) {
            Some(file) => readable.push((unit, Requirements::from_unit(unit.name, file))),
            None => kept.extend(held(unit.name, &unit.wanted).map(|held| (unit.name, held))),
        }
    }
    let global_units: Vec<GlobalUnit<'_>> = readable
        .iter()
        .map(|(unit, requirements)| GlobalUnit { name: unit.name, desired: unit.wanted.clone(), requirements })
        .collect();
    add_global_units(machine, &mut desired, &requirements, &global_units);
    for (name, held) in kept {
        desired.entry(name.to_string()).or_insert(held);
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drift::DriftPolicy;

    fn body(exec: &str) -> UnitFile {
        UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("a unit file")
    }

    fn wanted(file: &UnitFile) -> DesiredUnit {
        DesiredUnit {
            hash: file.hash(),
            state: DesiredState::Launched,
            drift: DriftPolicy::default(),
            secrets: Default::default(),
            places: Default::default(),
        }
    }

    #[test]
    fn a_unit_gets_its_wanted_content_or_keeps_the_held_one_while_the_new_is_unread() {
        let machine = MachineState { id: "m".into(), ..Default::default() };
        let (old, new) = (body("/bin/old"), body("/bin/new"));
        let loaded = BTreeMap::from([(
            "a.service".to_string(),
            LoadedUnit { hash: old.hash(), launched: true, secrets: None, places: None },
        )]);
        let scheduled = [
            Assigned { name: "a.service", wanted: wanted(&new) },
            Assigned { name: "b.service", wanted: wanted(&new) },
        ];
        let read = HashMap::from([(new.hash(), new.clone())]);
        let desired = desired_units(&machine, &scheduled, &[], &read, &loaded, false);
        assert_eq!(desired["a.service"].hash, new.hash(), "the wanted content, read");
        assert_eq!(desired["b.service"].hash, new.hash());
        let unread = desired_units(&machine, &scheduled, &[], &HashMap::new(), &loaded, true);
        assert_eq!(unread["a.service"].hash, old.hash(), "held while the new body is unread");
        assert!(!unread.contains_key("b.service"), "nothing held: it waits for its body");
        let gone = desired_units(&machine, &scheduled, &[], &HashMap::new(), &loaded, false);
        assert!(gone.is_empty(), "a body the store no longer has is not replaced by the held one");
    }

    #[test]
    fn a_held_global_unit_keeps_its_content_while_the_new_is_unread() {
        let machine = MachineState { id: "m".into(), ..Default::default() };
        let (old, new) = (body("/bin/old"), body("/bin/new"));
        let loaded = BTreeMap::from([(
            "g.service".to_string(),
            LoadedUnit { hash: old.hash(), launched: true, secrets: None, places: None },
        )]);
        let globals = [Assigned { name: "g.service", wanted: wanted(&new) }];
        let desired = desired_units(&machine, &[], &globals, &HashMap::new(), &loaded, true);
        assert_eq!(desired["g.service"].hash, old.hash());
        let inactive =
            [Assigned { name: "g.service", wanted: DesiredUnit { state: DesiredState::Inactive, ..wanted(&new) } }];
        assert!(desired_units(&machine, &[], &inactive, &HashMap::new(), &loaded, true).is_empty());
    }
}
