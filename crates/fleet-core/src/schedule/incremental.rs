//! Planning in proportion to what changed. The engine keeps where the last plan left the
//! cluster (each unit as planned and its machine, each machine's load, the unplaced units
//! and their reasons). When the next snapshot differs from that only in *free* units (no
//! `Conflicts=`, `Replaces=`, `MachineOf=` or `Global=` of their own, before or after the
//! change, and no other unit's rule naming them) on the same machines (same metadata, same
//! capacity, same drain, no unit a drain let go) with the same strategy and no unit noted as
//! spread unevenly, only those units and the ones still waiting are planned (with preemption
//! on, only while no unit it leaves waiting has a higher priority than a unit placed: such a
//! unit may preempt any unit),
//! against the loads (units and reservations) every other unit leaves; anything else gets the
//! full plan. Either way the result is [`super::plan`] of the whole snapshot, a property test
//! checks it.
//!
//! Why that is exact: a free unit never stands in another unit's way but by its load and its
//! reservation, the units outside the change keep their machines (nothing they depend on
//! moved, and a placed unit is never moved for room), and a free unit's placement and reason
//! depend only on the machines and their loads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::plan::plan_with;
use super::reason::UnplacedReason;
use super::working::Load;
use super::{ClusterSnapshot, PlacementStrategy, Plan, UnitSpec};
use crate::drain::Drain;
use crate::glob::Glob;
use crate::requirements::Requirements;
use crate::resources::Resources;
use crate::state::DesiredState;
use crate::unit_name::UnitNameInfo;

/// How a plan was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanScope {
    /// Every unit was planned.
    Full,
    /// Only the units that changed and the ones still waiting for a machine (how many).
    Changed(usize),
}

/// The full planner with a memory of where it left the cluster. Give it every snapshot in
/// turn; its plan for each equals [`super::plan`] of that snapshot.
#[derive(Default)]
pub struct IncrementalPlanner {
    settled: Option<Settled>,
}

/// Where the last plan left the cluster, had all its decisions been written.
struct Settled {
    /// Machines in ID order (the planner's ranks), with what the planner reads of them.
    machines: Vec<SettledMachine>,
    strategy: PlacementStrategy,
    preemption: bool,
    units: HashMap<String, SettledUnit>,
    /// Each machine's load, by rank.
    loads: Vec<Load>,
    /// The units that want to run but have no machine, with why, in the plan's order.
    unplaced: Vec<(String, UnplacedReason)>,
    /// Whether every unplaced unit is free (else any change needs the full plan: a unit
    /// with rules waiting may be unblocked by anything).
    unplaced_all_free: bool,
    /// Whether the plan noted units spread unevenly (any change may change why: full plan).
    spread_notes: bool,
    rules: RuleIndex,
}

/// A machine's ID, metadata, capacity, drain and taints.
type SettledMachine = (String, BTreeMap<String, String>, Option<Resources>, Option<Drain>, crate::taint::Taints);

/// The machines of `snapshot` as the planner ranks them.
fn settled_machines(snapshot: &ClusterSnapshot) -> Vec<SettledMachine> {
    let mut machines: Vec<SettledMachine> = snapshot
        .machines
        .iter()
        .map(|machine| {
            let taints = machine.taints.clone();
            (machine.id.clone(), machine.metadata.clone(), machine.capacity, machine.drain.clone(), taints)
        })
        .collect();
    machines.sort_by(|a, b| a.0.cmp(&b.0));
    machines.dedup_by(|a, b| a.0 == b.0);
    machines
}

struct SettledUnit {
    desired: DesiredState,
    requirements: Arc<Requirements>,
    /// Its machine's rank after the plan.
    rank: Option<usize>,
}

/// Every unit name some other unit's rules may mean: `Conflicts=` and `Replaces=` patterns,
/// and `MachineOf=` names.
#[derive(Default)]
struct RuleIndex {
    literals: HashSet<String>,
    /// Patterns by the literal text they start with: a name is matched only against the
    /// patterns whose start it shares.
    wildcards: HashMap<String, Vec<Glob>>,
}

/// The part of `pattern` before its first special character.
fn literal_start(pattern: &str) -> &str {
    pattern.find(['*', '?', '[', '\\']).map_or(pattern, |end| &pattern[..end])
}

impl RuleIndex {
    fn of(snapshot: &ClusterSnapshot) -> Self {
        let mut index = Self::default();
        let mut patterns: HashSet<&str> = HashSet::new();
        for unit in snapshot.units.iter().filter(|unit| !UnitNameInfo::new(&unit.name).is_template()) {
            let requirements = &unit.requirements;
            index.literals.extend(requirements.machine_of.iter().cloned());
            patterns.extend(requirements.conflicts.iter().chain(&requirements.replaces).map(String::as_str));
        }
        for pattern in patterns {
            if let Some(glob) = Glob::new(pattern) {
                match glob.literal() {
                    Some(name) => {
                        index.literals.insert(name);
                    }
                    None => index.wildcards.entry(literal_start(pattern).to_string()).or_default().push(glob),
                }
            }
        }
        index
    }

    fn names(&self, unit: &str) -> bool {
        self.literals.contains(unit)
            || unit.char_indices().map(|(at, _)| at).chain([unit.len()]).any(|end| {
                self.wildcards.get(&unit[..end]).is_some_and(|globs| globs.iter().any(|glob| glob.matches(unit)))
            })
    }
}

/// A unit the planner may plan on its own: no rules of its own, `SpreadBy=` included (its
/// machine depends on where the rest of its group is; a template never runs, so its rules
/// never apply).
fn without_rules(name: &str, requirements: &Requirements) -> bool {
    UnitNameInfo::new(name).is_template()
        || (!requirements.global
            && requirements.conflicts.is_empty()
            && requirements.replaces.is_empty()
            && requirements.machine_of.is_empty()
            && requirements.spread_by.is_none())
}

impl Settled {
    fn free(&self, name: &str, requirements: &Requirements) -> bool {
        without_rules(name, requirements) && !self.rules.names(name)
    }

    fn machines_match(&self, snapshot: &ClusterSnapshot) -> bool {
        let mut machines: Vec<_> = snapshot
            .machines
            .iter()
            .map(|machine| (&machine.id, &machine.metadata, machine.capacity, &machine.drain, &machine.taints))
            .collect();
        machines.sort_by(|a, b| a.0.cmp(b.0));
        machines.dedup_by(|a, b| a.0 == b.0);
        snapshot.strategy == self.strategy
            && snapshot.preemption == self.preemption
            && machines.len() == self.machines.len()
            && machines.iter().zip(&self.machines).all(|(new, old)| {
                *new.0 == old.0 && *new.1 == old.1 && new.2 == old.2 && *new.3 == old.3 && *new.4 == old.4
            })
    }

    fn unchanged(&self, unit: &UnitSpec) -> Option<bool> {
        let settled = self.units.get(&unit.name)?;
        let same_machine = match (&unit.scheduled_on, settled.rank) {
            (None, None) => true,
            (Some(machine), Some(rank)) => self.machines[rank].0 == *machine,
            _ => false,
        };
        Some(
            same_machine
                && settled.desired == unit.desired
                && (Arc::ptr_eq(&settled.requirements, &unit.requirements)
                    || settled.requirements.places_alike(&unit.requirements)),
        )
    }

    /// The plan for `snapshot` made from the units that changed since, or `None` when it
    /// needs the full plan.
    fn plan_changes(&mut self, snapshot: &ClusterSnapshot) -> Option<(Plan, usize)> {
        // A unit a drain let go waits for room like an unplaced one, though it is placed.
        let drain_waits =
            self.machines.iter().any(|machine| machine.3.as_ref().is_some_and(|d| !d.released.is_empty()));
        if !self.unplaced_all_free || self.spread_notes || drain_waits || !self.machines_match(snapshot) {
            return None;
        }
        let mut listed: HashSet<&str> = HashSet::with_capacity(snapshot.units.len());
        let mut changed: Vec<usize> = Vec::new();
        for (position, unit) in snapshot.units.iter().enumerate() {
            if !listed.insert(unit.name.as_str()) {
                return None;
            }
            if self.unchanged(unit) != Some(true) {
                if !self.free(&unit.name, &unit.requirements) {
                    return None;
                }
                changed.push(position);
            }
        }
        let removed: Vec<String> = self.units.keys().filter(|name| !listed.contains(name.as_str())).cloned().collect();
        // The units whose old selves leave the cluster as it was: their load goes. Their old
        // rules may have held others back, and another unit's rule may name them (a leader a
        // follower needs, a unit a pattern conflicts with): either way, plan everything.
        let mut baseline = self.loads.clone();
        let leaving = changed
            .iter()
            .map(|position| snapshot.units[*position].name.as_str())
            .chain(removed.iter().map(String::as_str));
        for name in leaving {
            if let Some(settled) = self.units.get(name) {
                if !self.free(name, &settled.requirements) {
                    return None;
                }
                if let Some(rank) = settled.rank {
                    let load = &mut baseline[rank];
                    load.units -= 1;
                    load.reserved = load.reserved.saturating_sub(settled.requirements.reservation);
                }
            }
        }
        let changed_names: HashSet<&str> =
            changed.iter().map(|position| snapshot.units[*position].name.as_str()).collect();
        let mut part = ClusterSnapshot {
            machines: snapshot.machines.clone(),
            units: Vec::new(),
            strategy: snapshot.strategy,
            preemption: snapshot.preemption,
            preempted: snapshot.preempted.clone(),
            budgets: snapshot.budgets.clone(),
        };
        part.units.extend(changed.iter().map(|position| snapshot.units[*position].clone()));
        part.units.extend(
            snapshot
                .units
                .iter()
                .filter(|unit| !changed_names.contains(unit.name.as_str()))
                .filter(|unit| self.unplaced.binary_search_by(|(name, _)| name.as_str().cmp(&unit.name)).is_ok())
                .cloned(),
        );
        let (plan, outcome) = plan_with(&part, Some(&baseline));
        // A unit left waiting might preempt units outside the part (one of a higher priority
        // than some unit placed): then only the full plan knows.
        if snapshot.preemption && !plan.unplaced.is_empty() && might_preempt(snapshot, &part, &plan) {
            return None;
        }
        for name in &removed {
            self.units.remove(name);
        }
        for (unit, rank) in part.units.iter().zip(&outcome.placement) {
            self.units.insert(
                unit.name.clone(),
                SettledUnit { desired: unit.desired, requirements: unit.requirements.clone(), rank: *rank },
            );
        }
        self.loads = loads_of(&plan);
        self.unplaced = sorted_by_name(&plan.unplaced);
        Some((plan, part.units.len()))
    }
}

/// Whether a unit `plan` (of `part`, a part of `snapshot`) leaves waiting has a higher priority
/// than a unit placed: the snapshot's placed units and those the plan places (more than the
/// full plan would have placed, so the answer errs towards the full plan).
fn might_preempt(snapshot: &ClusterSnapshot, part: &ClusterSnapshot, plan: &Plan) -> bool {
    let priority_in_part: HashMap<&str, u16> =
        part.units.iter().map(|unit| (unit.name.as_str(), unit.requirements.priority)).collect();
    let placed_by_plan = plan.decisions.iter().filter_map(|decision| match decision {
        super::Decision::Schedule { unit, .. } => priority_in_part.get(unit.as_str()).copied(),
        super::Decision::Unschedule { .. } => None,
    });
    let lowest = snapshot
        .units
        .iter()
        .filter(|unit| unit.scheduled_on.is_some())
        .map(|unit| unit.requirements.priority)
        .chain(placed_by_plan)
        .min();
    let highest_waiting = plan.unplaced.iter().filter_map(|(name, _)| priority_in_part.get(name.as_str())).max();
    matches!((lowest, highest_waiting), (Some(lowest), Some(waiting)) if *waiting > lowest)
}

/// Each machine's load as `plan` leaves it, by rank.
fn loads_of(plan: &Plan) -> Vec<Load> {
    plan.loads.iter().map(|load| Load { units: load.units, reserved: load.reserved }).collect()
}

fn sorted_by_name(unplaced: &[(String, UnplacedReason)]) -> Vec<(String, UnplacedReason)> {
    let mut sorted = unplaced.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
}

impl IncrementalPlanner {
    /// The plan for `snapshot` (equal to [`super::plan`] of it), and how it was made.
    pub fn plan(&mut self, snapshot: &ClusterSnapshot) -> (Plan, PlanScope) {
        if let Some(settled) = &mut self.settled
            && let Some((plan, planned)) = settled.plan_changes(snapshot)
        {
            return (plan, PlanScope::Changed(planned));
        }
        let (plan, outcome) = plan_with(snapshot, None);
        let machines = settled_machines(snapshot);
        let units = snapshot
            .units
            .iter()
            .zip(&outcome.placement)
            .map(|(unit, rank)| {
                let settled =
                    SettledUnit { desired: unit.desired, requirements: unit.requirements.clone(), rank: *rank };
                (unit.name.clone(), settled)
            })
            .collect();
        let mut settled = Settled {
            machines,
            strategy: snapshot.strategy,
            preemption: snapshot.preemption,
            units,
            loads: loads_of(&plan),
            unplaced: sorted_by_name(&plan.unplaced),
            unplaced_all_free: false,
            spread_notes: !plan.spread_notes.is_empty(),
            rules: RuleIndex::of(snapshot),
        };
        settled.unplaced_all_free = settled
            .unplaced
            .iter()
            .all(|(name, _)| settled.units.get(name).is_some_and(|unit| settled.free(name, &unit.requirements)));
        self.settled = Some(settled);
        (plan, PlanScope::Full)
    }

    /// Forgets where the last plan left the cluster: its decisions may not have been written
    /// (the next plan is a full one).
    pub fn forget(&mut self) {
        self.settled = None;
    }
}

#[cfg(test)]
mod tests;
