//! The running units that wait for units a plan takes down or moves (`[X-Fleet] Requires=`,
//! `After=`), with what they then do: a plan that stops `db.service` says that `app.service`
//! is taken off after its `RequiresGrace=`, or keeps running; one that drains `db.service`'s
//! machine says `app.service` restarts once `db.service` is up elsewhere. What they do is
//! `fleet_core::dependency::affected::affected`; this reads how the units they name stand.

use std::collections::{BTreeSet, HashMap};

use fleet_core::DesiredState;
use fleet_core::dependency::affected::{Going, affected};
use fleet_core::dependency::{Dependencies, dependencies_of, standing_of, waits};
use fleet_core::glob::Glob;
use fleet_registry::UnitView;

use crate::api_state::ApiState;
use crate::error::ApiError;
use crate::schema::PlannedUnit;

/// Notes on `planned` each running unit of `units` that waits for a unit the plan takes down or
/// moves: on its row when it has one, on a new `affected` row otherwise.
pub(super) async fn note_affected_dependents(
    state: &ApiState,
    units: &[UnitView],
    planned: &mut Vec<PlannedUnit>,
) -> Result<(), ApiError> {
    let going: HashMap<&str, Going> =
        planned.iter().filter_map(|unit| Some((unit.name.as_str(), going_of(unit)?))).collect();
    if going.is_empty() {
        return Ok(());
    }
    let rows: HashMap<&str, &PlannedUnit> = planned.iter().map(|unit| (unit.name.as_str(), unit)).collect();
    let parsed: Vec<(&UnitView, Dependencies)> = units
        .iter()
        .filter(|unit| unit.machine_id.is_some() && unit.desired == DesiredState::Launched)
        .filter(|unit| !going.contains_key(unit.name.as_str()) && waits(unit.file.options()))
        .filter(|unit| rows.get(unit.name.as_str()).is_none_or(|row| row.desired_state.as_deref() == Some("launched")))
        .filter_map(|unit| Some((unit, dependencies_of(&unit.name, unit.file.options()).ok()?)))
        .collect();
    if parsed.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = units.iter().map(|unit| unit.name.as_str()).collect();
    let named: BTreeSet<String> = parsed
        .iter()
        .flat_map(|(_, dependencies)| &dependencies.items)
        .filter_map(|item| Glob::new(&item.pattern))
        .flat_map(|glob| names.iter().filter(move |name| glob.matches(name)))
        .map(|name| name.to_string())
        .collect();
    let states = state.registry.states_of_units(&named).await?;
    let standing = units
        .iter()
        .filter(|unit| named.contains(&unit.name))
        .map(|unit| (unit.name.as_str(), standing_of(unit.machine_id.as_deref(), Some(unit.hash), &unit.name, &states)))
        .collect();
    let dependents: Vec<(&str, &Dependencies)> =
        parsed.iter().map(|(unit, dependencies)| (unit.name.as_str(), dependencies)).collect();
    let lines = affected(&dependents, &going, &names, &standing);
    let views: HashMap<&str, &UnitView> = units.iter().map(|unit| (unit.name.as_str(), unit)).collect();
    let positions: HashMap<String, usize> =
        planned.iter().enumerate().map(|(index, unit)| (unit.name.clone(), index)).collect();
    for (name, line) in lines {
        match positions.get(&name) {
            Some(&index) => planned[index].on_required = Some(line),
            None => {
                let Some(view) = views.get(name.as_str()) else { continue };
                planned.push(affected_row(view, line));
            }
        }
    }
    Ok(())
}

/// What the plan does to the unit of `row`, as a unit waiting for it sees it.
fn going_of(row: &PlannedUnit) -> Option<Going> {
    let running_before = row.desired_state_before.as_deref() == Some("launched") && row.machine_before.is_some();
    if !running_before {
        return None;
    }
    match (&row.machine_before, &row.machine) {
        _ if row.action == "destroy" || row.desired_state.as_deref() != Some("launched") => Some(Going::Down),
        (_, None) => Some(Going::Down),
        (Some(before), Some(after)) if before != after => Some(Going::Moved { to: after.clone() }),
        _ => None,
    }
}

/// The row of a unit the change does nothing to itself but touches through what it waits for.
fn affected_row(view: &UnitView, line: String) -> PlannedUnit {
    PlannedUnit {
        name: view.name.clone(),
        action: "affected".to_string(),
        hash_before: Some(view.hash.to_string()),
        hash: Some(view.hash.to_string()),
        desired_state_before: Some(view.desired.to_string()),
        desired_state: Some(view.desired.to_string()),
        machine_before: view.machine_id.clone(),
        machine: view.machine_id.clone(),
        on_required: Some(line),
        version_before: Some(view.versions.number()),
        version: Some(view.versions.number()),
        ..PlannedUnit::default()
    }
}
