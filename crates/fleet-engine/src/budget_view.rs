//! What the engine reads to count the disruption budgets its evictions and preemptions take
//! from (`fleet_registry::BudgetView`), and only when a plan may take from them.

use std::collections::{BTreeSet, HashMap};

use fleet_core::UnitHash;
use fleet_core::schedule::{ClusterSnapshot, SnapshotUnit};
use fleet_registry::{BudgetView, BudgetedUnit, EngineRegistry, RegistryError};

/// What the disruption budgets are counted from, when a plan may take from them: some unit
/// has a budget, and preemption is on or a machine has a taint that evicts. `None` otherwise
/// (nothing is read).
pub(crate) async fn read(
    registry: &dyn EngineRegistry,
    cluster: &ClusterSnapshot,
    listed: &[SnapshotUnit],
) -> Result<Option<BudgetView>, RegistryError> {
    let evicting = cluster.machines.iter().any(|machine| machine.taints.values().any(|taint| taint.evict));
    if !(cluster.preemption || evicting) {
        return Ok(None);
    }
    let budgeted: Vec<&fleet_core::schedule::UnitSpec> =
        cluster.units.iter().filter(|unit| unit.requirements.disruption_budget.is_some()).collect();
    if budgeted.is_empty() {
        return Ok(None);
    }
    let hashes: HashMap<&str, UnitHash> = listed.iter().map(|unit| (unit.name.as_str(), unit.hash)).collect();
    let units: Vec<BudgetedUnit> = budgeted
        .iter()
        .filter_map(|unit| {
            let hash = *hashes.get(unit.name.as_str())?;
            BudgetedUnit::of(&unit.name, hash, unit.desired, unit.scheduled_on.as_deref(), &unit.requirements)
        })
        .collect();
    let names: BTreeSet<String> = units.iter().map(|unit| unit.name.clone()).collect();
    Ok(Some(BudgetView {
        states: registry.reported_states(&names).await?,
        drains: BudgetView::drains_of(&cluster.machines),
        rollouts: Vec::new(),
        machines: cluster.machines.clone(),
        units,
    }))
}
