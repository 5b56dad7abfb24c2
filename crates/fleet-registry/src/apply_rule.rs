//! The apply rule: does an engine's decision still hold when it is written? One pure
//! function for every store. A plan becomes one write per unit ([`unit_writes`]), and each
//! write carries the conditions under which it may happen ([`UnitWrite::conditions`]); a
//! store checks those conditions against what it holds at the moment of writing (etcd: as
//! compares in the same transaction; embedded: inside its write transaction) and writes the
//! unit's part only when all hold. A unit whose conditions fail is skipped, the rest of the
//! plan goes on, and the engine plans again from fresh data.
//!
//! The rule (the stricter of the two the stores had):
//! - a unit that moves (leaves or lands) must be unchanged since the engine read it;
//! - a unit that leaves a machine must still be placed there, and when it leaves because
//!   the machine went away, that machine must still be gone;
//! - a unit that only lands must be placed nowhere;
//! - a reason is written only for a unit that exists (clearing one needs no condition).

use std::collections::BTreeMap;

use fleet_core::schedule::{Decision, UnscheduleReason};

/// One unit's part of a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitWrite {
    pub unit: String,
    pub leaves: Option<Leaving>,
    pub lands_on: Option<String>,
    pub reason: ReasonWrite,
}

/// The machine a unit leaves, and whether it leaves because that machine is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaving {
    pub machine: String,
    pub machine_gone: bool,
}

/// What happens to the unit's recorded reason for being unplaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ReasonWrite {
    #[default]
    Keep,
    Clear,
    Set(String),
}

/// What must still hold in the store for a unit's write to happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The unit's record is the one the engine planned from.
    UnitUnchanged,
    /// The unit exists.
    UnitExists,
    /// The unit is placed on this machine.
    PlacedOn(String),
    /// The unit is placed nowhere.
    Unplaced,
    /// This machine is not present.
    MachineAbsent(String),
}

impl UnitWrite {
    /// The apply rule for this write.
    pub fn conditions(&self) -> Vec<Condition> {
        let mut conditions = Vec::new();
        if self.leaves.is_some() || self.lands_on.is_some() {
            conditions.push(Condition::UnitUnchanged);
            match &self.leaves {
                Some(leaving) => {
                    conditions.push(Condition::PlacedOn(leaving.machine.clone()));
                    if leaving.machine_gone {
                        conditions.push(Condition::MachineAbsent(leaving.machine.clone()));
                    }
                }
                None => conditions.push(Condition::Unplaced),
            }
        } else if matches!(self.reason, ReasonWrite::Set(_)) {
            conditions.push(Condition::UnitExists);
        }
        conditions
    }

    /// The machine whose work this write changes: where the unit lands, else where it leaves.
    pub fn machine(&self) -> Option<&str> {
        self.lands_on.as_deref().or(self.leaves.as_ref().map(|leaving| leaving.machine.as_str()))
    }

    /// Whether this write changes anything at all.
    pub fn is_empty(&self) -> bool {
        self.leaves.is_none() && self.lands_on.is_none() && self.reason == ReasonWrite::Keep
    }
}

/// A plan's writes, one per unit in name order: its decisions, and its unplaced reasons
/// against the reasons the store holds now (`stored_reasons`: unit → text).
pub fn unit_writes<'a>(
    decisions: &[Decision],
    unplaced: &[(String, String)],
    stored_reasons: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<UnitWrite> {
    let mut writes: BTreeMap<String, UnitWrite> = BTreeMap::new();
    for decision in decisions {
        match decision {
            Decision::Schedule { unit, machine } => {
                write_for(&mut writes, unit).lands_on = Some(machine.clone());
            }
            Decision::Unschedule { unit, machine, reason } => {
                let machine_gone = *reason == UnscheduleReason::MachineWentAway;
                write_for(&mut writes, unit).leaves = Some(Leaving { machine: machine.clone(), machine_gone });
            }
        }
    }
    let wanted: BTreeMap<&str, &str> = unplaced.iter().map(|(unit, reason)| (unit.as_str(), reason.as_str())).collect();
    let stored: BTreeMap<&str, &str> = stored_reasons.into_iter().collect();
    for unit in stored.keys().filter(|unit| !wanted.contains_key(*unit)) {
        write_for(&mut writes, unit).reason = ReasonWrite::Clear;
    }
    for (unit, reason) in &wanted {
        if stored.get(unit) != Some(reason) {
            write_for(&mut writes, unit).reason = ReasonWrite::Set((*reason).to_string());
        }
    }
    writes.into_values().filter(|write| !write.is_empty()).collect()
}

/// `writes` grouped by the machine whose work each changes (then by unit), so that a store
/// writing them a chunk at a time hands each machine its share of a plan in as few writes
/// as it can: one agent wakes once for many units, not once per unit. The order changes
/// nothing else: a plan's writes are independent of each other.
pub fn grouped_by_machine(mut writes: Vec<UnitWrite>) -> Vec<UnitWrite> {
    writes.sort_by(|a, b| (a.machine(), a.unit.as_str()).cmp(&(b.machine(), b.unit.as_str())));
    writes
}

fn write_for<'w>(writes: &'w mut BTreeMap<String, UnitWrite>, unit: &str) -> &'w mut UnitWrite {
    writes.entry(unit.to_string()).or_insert_with(|| UnitWrite { unit: unit.to_string(), ..UnitWrite::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(unit: &str, machine: &str) -> Decision {
        Decision::Schedule { unit: unit.into(), machine: machine.into() }
    }

    fn unschedule(unit: &str, machine: &str, reason: UnscheduleReason) -> Decision {
        Decision::Unschedule { unit: unit.into(), machine: machine.into(), reason }
    }

    #[test]
    fn writes_are_grouped_by_the_machine_whose_work_they_change() {
        let decisions = [
            schedule("a", "m2"),
            schedule("b", "m1"),
            unschedule("c", "m2", UnscheduleReason::MachineWentAway),
            schedule("c", "m1"),
            unschedule("d", "m2", UnscheduleReason::TargetStateInactive),
            schedule("e", "m2"),
        ];
        let unplaced = [("f".to_string(), "no machine".to_string())];
        let writes = grouped_by_machine(unit_writes(&decisions, &unplaced, []));
        let order: Vec<(&str, Option<&str>)> =
            writes.iter().map(|write| (write.unit.as_str(), write.machine())).collect();
        assert_eq!(
            order,
            [
                ("f", None),
                ("b", Some("m1")),
                ("c", Some("m1")),
                ("a", Some("m2")),
                ("d", Some("m2")),
                ("e", Some("m2"))
            ]
        );
    }

    #[test]
    fn a_plan_becomes_one_write_per_unit_with_its_conditions() {
        let decisions = [
            unschedule("moved.service", "m1", UnscheduleReason::MachineWentAway),
            schedule("moved.service", "m2"),
            schedule("new.service", "m3"),
            unschedule("stopped.service", "m1", UnscheduleReason::TargetStateInactive),
        ];
        let unplaced = [("stuck.service".to_string(), "no machines".to_string())];
        let stored = [("old.service", "gone now"), ("same.service", "still"), ("moved.service", "was stuck")];
        let writes = unit_writes(&decisions, &[unplaced[0].clone(), ("same.service".into(), "still".into())], stored);
        let by_unit: BTreeMap<&str, &UnitWrite> = writes.iter().map(|write| (write.unit.as_str(), write)).collect();
        assert_eq!(
            by_unit.keys().copied().collect::<Vec<_>>(),
            ["moved.service", "new.service", "old.service", "stopped.service", "stuck.service"]
        );
        let moved = by_unit["moved.service"];
        assert_eq!(moved.lands_on.as_deref(), Some("m2"));
        assert_eq!(moved.reason, ReasonWrite::Clear);
        assert_eq!(
            moved.conditions(),
            [Condition::UnitUnchanged, Condition::PlacedOn("m1".into()), Condition::MachineAbsent("m1".into())]
        );
        assert_eq!(by_unit["new.service"].conditions(), [Condition::UnitUnchanged, Condition::Unplaced]);
        assert_eq!(
            by_unit["stopped.service"].conditions(),
            [Condition::UnitUnchanged, Condition::PlacedOn("m1".into())]
        );
        assert_eq!(by_unit["stuck.service"].reason, ReasonWrite::Set("no machines".into()));
        assert_eq!(by_unit["stuck.service"].conditions(), [Condition::UnitExists]);
        assert_eq!(by_unit["old.service"].reason, ReasonWrite::Clear);
        assert!(by_unit["old.service"].conditions().is_empty(), "a reason is cleared unconditionally");
    }
}
