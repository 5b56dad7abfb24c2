//! What the leader's drivers read of the store to count disruption budgets from
//! (`fleet_registry::BudgetView`), from the store's watch-fed copy.

use std::collections::BTreeSet;

use fleet_registry::{BudgetView, RegistryError, UnitView, budgeted_units};

use crate::leader_store::LeaderStore;

/// Reads what the budgets are counted from, given every unit (`units`, the store's copy). With
/// no unit budgeted it reads nothing more.
pub async fn read_budget_view(store: &dyn LeaderStore, units: &[UnitView]) -> Result<BudgetView, RegistryError> {
    let budgeted = budgeted_units(units);
    if budgeted.is_empty() {
        return Ok(BudgetView::default());
    }
    let names: BTreeSet<String> = budgeted.iter().map(|unit| unit.name.clone()).collect();
    let machines = match budgeted.iter().any(|unit| unit.budget.by.is_some()) {
        true => store.machines().await?,
        false => Vec::new(),
    };
    Ok(BudgetView {
        states: store.states_of(&names).await?,
        drains: store.drains().await?,
        rollouts: store.rollouts().await?,
        machines,
        units: budgeted,
    })
}
