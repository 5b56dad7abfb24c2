//! `POST /plans` (our addition): what a command's unit writes would do, before they are made.
//! The request is admitted as the writes themselves would be (a malformed unit, or one naming
//! a secret the caller may not name, gets the error the command would get), but the caller
//! needs only to see the units it plans. The engine's planner then runs over the cluster as
//! the store holds it, with and without the change ([`fleet_core::schedule::preview`]), and
//! nothing is written.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use fleet_core::access::Role;
use fleet_core::requirements::Requirements;
use fleet_core::schedule::preview::{PreviewChange, PreviewedUnit, preview};
use fleet_core::schedule::{ClusterSnapshot, UnitSpec};
use fleet_core::unit_name::validate_name;
use fleet_registry::{UnitChange, UnitView};

use super::unit_batch::{Asked, admitted, may};
use super::units::json_object;
use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{Plan, PlanRequest, PlannedUnit};

/// The most units one plan may name: a plan of every unit of a large submission at once.
pub const MOST_UNITS_PER_PLAN: usize = 20_000;

pub async fn post(state: &ApiState, role: &Role, body: &[u8]) -> Result<Response, ApiError> {
    let request: PlanRequest = json_object(body)?;
    if request.units.is_empty() && request.destroy.is_empty() {
        return Err(ApiError::bad_request("no units given"));
    }
    if request.units.len() + request.destroy.len() > MOST_UNITS_PER_PLAN {
        return Err(ApiError::bad_request(format!(
            "{} units given; at most {MOST_UNITS_PER_PLAN} per plan",
            request.units.len() + request.destroy.len()
        )));
    }
    let changes = admitted(request.units, role, Asked::Plan, MOST_UNITS_PER_PLAN)?;
    for name in &request.destroy {
        validate_name(name).map_err(|error| ApiError::bad_request(format!("unit {name}: {error}")))?;
        may(role, name, Asked::Plan)?;
        if changes.iter().any(|change| change.name == *name) {
            return Err(ApiError::bad_request(format!("unit {name} is given twice")));
        }
    }
    let files = changes.iter().filter_map(|change| Some((change.name.as_str(), change.file.as_ref()?)));
    super::secrets::check_named(state, role, files).await?;
    // The index is read before the cluster: a write in between makes it stale, never newer
    // than what was planned.
    let index = state.registry.revision().await?.unwrap_or(0);
    let (units, machines) = (state.registry.units().await?, state.registry.machines().await?);
    let strategy = state.placement_strategy;
    let destroy = request.destroy;
    let planned = tokio::task::spawn_blocking(move || planned(units, machines, strategy, &changes, &destroy))
        .await
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the plan could not be made"))?;
    Ok(json_response(StatusCode::OK, &Plan { index, units: planned }))
}

/// The plan of `changes` and `destroy` over the cluster of `units` on `machines`.
fn planned(
    units: Vec<UnitView>,
    machines: Vec<fleet_core::MachineState>,
    strategy: fleet_core::schedule::PlacementStrategy,
    changes: &[UnitChange],
    destroy: &[String],
) -> Vec<PlannedUnit> {
    let specs = units
        .iter()
        .map(|unit| UnitSpec {
            name: unit.name.clone(),
            desired: unit.desired,
            requirements: Arc::new(Requirements::from_unit(&unit.name, &unit.file)),
            scheduled_on: unit.machine_id.clone(),
        })
        .collect();
    let cluster = ClusterSnapshot { machines, units: specs, strategy };
    let previewed: Vec<PreviewChange> = changes
        .iter()
        .map(|change| PreviewChange::Set {
            name: change.name.clone(),
            desired: change.desired,
            requirements: change.file.as_ref().map(|file| Arc::new(Requirements::from_unit(&change.name, file))),
        })
        .chain(destroy.iter().map(|name| PreviewChange::Destroy { name: name.clone() }))
        .collect();
    let preview = preview(&cluster, &previewed);
    let standing: HashMap<&str, &UnitView> = units.iter().map(|unit| (unit.name.as_str(), unit)).collect();
    let asked: HashMap<&str, &UnitChange> = changes.iter().map(|change| (change.name.as_str(), change)).collect();
    preview.units.into_iter().map(|unit| planned_unit(unit, &standing, &asked)).collect()
}

/// One previewed unit as the answer shows it.
fn planned_unit(
    unit: PreviewedUnit,
    standing: &HashMap<&str, &UnitView>,
    asked: &HashMap<&str, &UnitChange>,
) -> PlannedUnit {
    let now = standing.get(unit.name.as_str());
    let change = asked.get(unit.name.as_str());
    let hash_before = now.map(|view| view.hash.to_string());
    let new_hash = change.and_then(|change| change.file.as_ref()).map(|file| file.hash().to_string());
    let action = match (now, change) {
        (None, None) if unit.changed => "missing",
        (_, None) if unit.changed => "destroy",
        (_, None) => "moved",
        (None, Some(change)) if change.file.is_some() => "create",
        (None, Some(_)) => "missing",
        (Some(_), Some(_)) if new_hash.is_some() && new_hash != hash_before => "change",
        (Some(view), Some(change)) if view.desired != change.desired => "set",
        (Some(_), Some(_)) => "unchanged",
    };
    let desired_after = match (action, change) {
        ("destroy" | "missing", _) => None,
        (_, Some(change)) => Some(change.desired.to_string()),
        (_, None) => now.map(|view| view.desired.to_string()),
    };
    PlannedUnit {
        action: action.to_string(),
        hash: match action {
            "destroy" | "missing" => None,
            _ => new_hash.or_else(|| hash_before.clone()),
        },
        hash_before,
        desired_state_before: now.map(|view| view.desired.to_string()),
        desired_state: desired_after,
        machine_before: unit.before,
        machine: unit.after,
        waiting: unit.waiting,
        name: unit.name,
    }
}
