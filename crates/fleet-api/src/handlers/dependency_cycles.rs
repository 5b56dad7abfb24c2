//! A write that would make units wait for each other in a circle (`[X-Fleet] Requires=` and
//! `After=`, directly or through patterns) is refused, naming the circle: none of them could
//! ever start.

use std::collections::BTreeMap;

use fleet_core::UnitFile;
use fleet_core::dependency::{AFTER_KEY, Dependencies, REQUIRES_KEY, dependencies_of, find_cycle};
use fleet_core::unit_file::X_FLEET;
use fleet_registry::PageRequest;

use crate::ApiState;
use crate::error::ApiError;

/// Refuses the units `written` (name and new file) when, laid over the cluster's units, they
/// close a circle of dependencies. Reads the cluster's units only when one written has any.
pub async fn refuse_cycles<'a>(
    state: &ApiState,
    written: impl IntoIterator<Item = (&'a str, &'a UnitFile)>,
) -> Result<(), ApiError> {
    let written: Vec<(&str, Dependencies)> = written
        .into_iter()
        .map(|(name, file)| (name, dependencies_of(name, file.options()).unwrap_or_default()))
        .collect();
    // A unit with no dependencies is in no circle: only a write that adds some may close one.
    if written.iter().all(|(_, dependencies)| dependencies.is_empty()) {
        return Ok(());
    }
    let units = state.registry.units_page(PageRequest::everything()).await?.items;
    let mut graph: BTreeMap<String, Dependencies> = units
        .iter()
        .filter(|unit| {
            unit.file
                .options()
                .iter()
                .any(|option| option.section == X_FLEET && (option.name == REQUIRES_KEY || option.name == AFTER_KEY))
        })
        .map(|unit| (unit.name.clone(), dependencies_of(&unit.name, unit.file.options()).unwrap_or_default()))
        .collect();
    for (name, dependencies) in written {
        graph.insert(name.to_string(), dependencies);
    }
    match find_cycle(&graph) {
        Some(cycle) => Err(ApiError::bad_request(format!(
            "[X-Fleet] {REQUIRES_KEY}= and {AFTER_KEY}= would have units wait for each other in a circle: {}",
            cycle.join(" → ")
        ))),
        None => Ok(()),
    }
}
