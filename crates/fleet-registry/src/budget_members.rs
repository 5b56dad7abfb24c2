//! The units that have a disruption budget, as [`fleet_core::disruption_budget`] counts them,
//! from what a store shows: each one's group, the value of its budget's key on its machine,
//! and whether it is down now.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};

use fleet_core::disruption_budget::{DisruptionBudget, KEY, Member};
use fleet_core::drain::Drain;
use fleet_core::health::HealthStatus;
use fleet_core::rollout::{RolloutState, Step};
use fleet_core::unit_file::{X_FLEET, last_value};
use fleet_core::{DesiredState, MachineState, Requirements, UnitHash, UnitState};

use crate::{RolloutRecord, UnitView};

/// A unit whose file states a disruption budget, as the ledger needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetedUnit {
    pub name: String,
    /// Its content now: only a report of it counts as the unit running.
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// The machine it is scheduled on.
    pub machine_id: Option<String>,
    /// Its group: its `SpreadGroup=`, else its template.
    pub group: String,
    pub budget: DisruptionBudget,
    /// What it `Requires=` (patterns): it counts as down while a drain moves one of those.
    pub requires: Vec<String>,
}

impl BudgetedUnit {
    /// The unit named `name` of content `hash` with `requirements`, if it has a budget.
    pub fn of(
        name: &str,
        hash: UnitHash,
        desired: DesiredState,
        machine_id: Option<&str>,
        requirements: &Requirements,
    ) -> Option<Self> {
        let budget = requirements.disruption_budget.clone()?;
        Some(Self {
            name: name.to_string(),
            hash,
            desired,
            machine_id: machine_id.map(str::to_string),
            group: requirements.spread_group_of(name),
            budget,
            requires: requirements
                .dependencies
                .items
                .iter()
                .filter(|item| item.kind == fleet_core::dependency::Kind::Requires)
                .map(|item| item.pattern.clone())
                .collect(),
        })
    }
}

/// The units among `units` whose file states a disruption budget (their requirements are
/// read only for those: the callers ask the machines' reports of these alone).
pub fn budgeted_units(units: &[UnitView]) -> Vec<BudgetedUnit> {
    units
        .iter()
        .filter(|unit| !unit.global && last_value(unit.file.options(), X_FLEET, KEY).is_some())
        .filter_map(|unit| {
            let requirements = Requirements::from_unit(&unit.name, &unit.file);
            BudgetedUnit::of(&unit.name, unit.hash, unit.desired, unit.machine_id.as_deref(), &requirements)
        })
        .collect()
}

/// Whether a disruption decided a moment ago has not reached what the store shows yet, and
/// the machine it takes the unit off, if it does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub down: bool,
    pub left: Option<String>,
}

/// Every budgeted unit that should run (`budgeted`) as the ledger counts it. It is down when
/// the machine it is scheduled on does not report it on its current content as it should be
/// (active and not unhealthy, when it should run), when a drain let it go or let go a unit it
/// `Requires=` (not yet arrived elsewhere), when a running rollout is replacing it, or when `pending` says a disruption decided a moment ago has not
/// reached what the store shows yet. A unit on its way between machines (scheduled nowhere)
/// counts with the value of the machine it left, as a drain or `pending` name it: it is that
/// value's unit down until it is placed.
pub fn budget_members<S: Borrow<UnitState>>(
    budgeted: &[BudgetedUnit],
    states: &[S],
    drains: &[(String, Drain)],
    rollouts: &[impl Borrow<RolloutRecord>],
    machines: &[MachineState],
    pending: impl Fn(&BudgetedUnit) -> Pending,
) -> Vec<Member> {
    let names: BTreeSet<&str> = budgeted.iter().map(|unit| unit.name.as_str()).collect();
    let mut reports: HashMap<&str, Vec<&UnitState>> = HashMap::new();
    for state in states.iter().map(Borrow::borrow).filter(|state| names.contains(state.name.as_str())) {
        reports.entry(state.name.as_str()).or_default().push(state);
    }
    let released: HashMap<&str, &str> = drains
        .iter()
        .flat_map(|(machine, drain)| drain.released.keys().map(move |unit| (unit.as_str(), machine.as_str())))
        .collect();
    let replacing: HashSet<&str> = rollouts
        .iter()
        .map(Borrow::borrow)
        .filter(|record| record.rollout.state == RolloutState::Running)
        .flat_map(|record| &record.rollout.units)
        .filter(|unit| matches!(unit.step, Step::Replacing { .. }))
        .map(|unit| unit.name.as_str())
        .collect();
    let metadata: HashMap<&str, &std::collections::BTreeMap<String, String>> =
        machines.iter().map(|machine| (machine.id.as_str(), &machine.metadata)).collect();
    budgeted
        .iter()
        .filter(|unit| unit.desired != DesiredState::Inactive)
        .map(|unit| {
            let on = unit.machine_id.as_deref();
            let runs_well = reports.get(unit.name.as_str()).into_iter().flatten().any(|state| {
                Some(state.machine_id.as_str()) == on
                    && state.hash == unit.hash
                    && (unit.desired != DesiredState::Launched
                        || (state.systemd.active == "active"
                            && state.health.as_ref().is_none_or(|report| report.status != HealthStatus::Unhealthy)))
            });
            let name = unit.name.as_str();
            let pending = pending(unit);
            let loses_a_requirement = || {
                unit.requires
                    .iter()
                    .filter_map(|pattern| fleet_core::glob::Glob::new(pattern))
                    .any(|glob| released.keys().any(|moving| *moving != name && glob.matches(moving)))
            };
            let down = !runs_well
                || released.contains_key(name)
                || replacing.contains(name)
                || pending.down
                || (!unit.requires.is_empty() && loses_a_requirement());
            let counted_on = on.or_else(|| released.get(name).copied()).or(pending.left.as_deref());
            let value = unit.budget.by.as_ref().and_then(|key| metadata.get(counted_on?)?.get(key).cloned());
            Member { name: unit.name.clone(), group: unit.group.clone(), budget: unit.budget.clone(), value, down }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budgeted unit that runs well counts as down while a drain moves a unit it `Requires=`,
    /// and not once that unit arrived (the drain no longer lists it).
    #[test]
    fn a_unit_counts_down_while_a_drain_moves_what_it_requires() {
        let file = fleet_core::UnitFile::parse(
            "[Service]\nExecStart=/bin/app\n[X-Fleet]\nRequires=db.service\nDisruptionBudget=1\n",
        )
        .expect("a unit file");
        let requirements = Requirements::from_unit("app@1.service", &file);
        let app = BudgetedUnit::of("app@1.service", file.hash(), DesiredState::Launched, Some("m2"), &requirements)
            .expect("a budget");
        assert_eq!(app.requires, ["db.service"]);
        let running = UnitState {
            run: None,
            name: "app@1.service".into(),
            machine_id: "m2".into(),
            hash: file.hash(),
            systemd: fleet_core::SystemdState::new("loaded", "active", "running"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
        };
        let mut drain = Drain::new(fleet_core::rollout::MaxUnavailable::Count(1), 1);
        drain.released.insert("db.service".into(), 1);
        let down = |drains: &[(String, Drain)]| {
            let members = budget_members(
                std::slice::from_ref(&app),
                std::slice::from_ref(&running),
                drains,
                &[] as &[RolloutRecord],
                &[],
                |_| Pending::default(),
            );
            members[0].down
        };
        assert!(down(&[("m1".to_string(), drain.clone())]), "its db is on its way");
        drain.released.clear();
        assert!(!down(&[("m1".to_string(), drain)]), "its db arrived");
    }
}
