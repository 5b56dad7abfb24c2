//! The units a plan leaves waiting for units (`[X-Fleet] Requires=`, `After=`), as the engine
//! would: a unit not placed now whose dependencies are not met as the cluster stands stays
//! unplaced, saying what it waits for. What counts as met is
//! `fleet_core::dependency::waiting_for` over how each unit it names stands now; a unit the plan
//! creates or changes runs no such content yet.

use std::collections::{BTreeSet, HashMap};

use fleet_core::dependency::{Dependencies, Standing, dependencies_of, standing_of, waiting_for};
use fleet_core::glob::Glob;
use fleet_core::{DesiredState, UnitHash};
use fleet_registry::{UnitChange, UnitView};

use crate::api_state::ApiState;
use crate::error::ApiError;

/// One unit as the cluster would hold it once the plan's writes are made.
struct After {
    hash: Option<UnitHash>,
    desired: DesiredState,
    placed_on: Option<String>,
}

/// Each unit the plan would leave waiting for units, with why.
pub(super) async fn dependency_waits(
    state: &ApiState,
    units: &[UnitView],
    changes: &[UnitChange],
    destroy: &[String],
) -> Result<HashMap<String, String>, ApiError> {
    let mut after: HashMap<&str, After> = units
        .iter()
        .map(|unit| {
            let held = After { hash: Some(unit.hash), desired: unit.desired, placed_on: unit.machine_id.clone() };
            (unit.name.as_str(), held)
        })
        .collect();
    let mut files: HashMap<&str, &fleet_core::UnitFile> =
        units.iter().map(|unit| (unit.name.as_str(), &unit.file)).collect();
    for change in changes {
        let held =
            after.entry(change.name.as_str()).or_insert(After { hash: None, desired: change.desired, placed_on: None });
        held.desired = change.desired;
        if let Some(file) = &change.file {
            held.hash = Some(file.hash());
            files.insert(change.name.as_str(), file);
        }
    }
    for name in destroy {
        after.remove(name.as_str());
    }
    // The units that would wait: not placed, wanted running, with dependencies.
    let dependents: Vec<(&str, Dependencies)> = after
        .iter()
        .filter(|(_, unit)| unit.placed_on.is_none() && unit.desired != DesiredState::Inactive)
        .filter_map(|(name, _)| {
            let dependencies = dependencies_of(name, files.get(name)?.options()).ok()?;
            (!dependencies.is_empty()).then_some((*name, dependencies))
        })
        .collect();
    if dependents.is_empty() {
        return Ok(HashMap::new());
    }
    let names: Vec<&str> = after.keys().copied().collect();
    let mut matched: HashMap<&str, Vec<&str>> = HashMap::new();
    for (_, dependencies) in &dependents {
        for item in &dependencies.items {
            if matched.contains_key(item.pattern.as_str()) {
                continue;
            }
            let Some(glob) = Glob::new(&item.pattern) else { continue };
            let found = names.iter().copied().filter(|name| glob.matches(name)).collect();
            matched.insert(item.pattern.as_str(), found);
        }
    }
    let named: BTreeSet<String> = matched.values().flatten().map(|name| name.to_string()).collect();
    let states = state.registry.states_of_units(&named).await?;
    let standing: HashMap<&str, Standing> = matched
        .values()
        .flatten()
        .filter_map(|name| {
            let unit = after.get(name)?;
            Some((*name, standing_of(unit.placed_on.as_deref(), unit.hash, name, &states)))
        })
        .collect();
    let waits = dependents
        .iter()
        .filter_map(|(name, dependencies)| {
            let why = waiting_for(dependencies, |item| {
                let found = matched.get(item.pattern.as_str()).map_or(&[][..], Vec::as_slice);
                found.iter().filter_map(|other| Some((*other, standing.get(other)?))).collect()
            })?;
            Some((name.to_string(), why))
        })
        .collect();
    Ok(waits)
}
