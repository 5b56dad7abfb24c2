//! `POST /imports` (ours): the units of the original fleet's registry, taken over with the
//! machines they run on, so that each machine's fleetd finds them running and keeps them as
//! they run (`fleetctl import-original` reads the original's registry and sends it here).
//! Every unit is admitted as its own `PUT` would be and reported with what the import does
//! with it; one refused, and nothing is written (a dry run writes nothing either).

use std::collections::{BTreeMap, HashMap, HashSet};

use axum::http::StatusCode;
use axum::response::Response;
use fleet_core::access::Role;
use fleet_core::requirements::Requirements;
use fleet_core::{DesiredState, MachineState};
use fleet_registry::{Imported, ImportedUnit, Writer};

use super::unit_batch::{Permission, admit_one};
use super::units::json_object;
use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::{ApiError, json_response};
use crate::schema::{ImportReport, ImportRequest, ImportUnit, ImportedUnitReport, Unit, UnitOption};

/// The most units one import may carry.
pub const MOST_UNITS_PER_IMPORT: usize = 100_000;

/// What an import does with one unit: the unit to store, or why it is refused.
type Admitted = Result<ImportedUnit, String>;

pub async fn post(state: &ApiState, identity: &Identity, body: &[u8]) -> Result<Response, ApiError> {
    let role = &identity.role;
    let request: ImportRequest = json_object(body)?;
    if request.units.is_empty() {
        return Err(ApiError::bad_request("no units given"));
    }
    if request.units.len() > MOST_UNITS_PER_IMPORT {
        return Err(ApiError::bad_request(format!(
            "{} units given; at most {MOST_UNITS_PER_IMPORT} per import",
            request.units.len()
        )));
    }
    let machines: HashMap<String, MachineState> =
        state.registry.machines().await?.into_iter().map(|machine| (machine.id.clone(), machine)).collect();
    let existing: HashSet<String> = state.registry.units().await?.into_iter().map(|unit| unit.name).collect();
    let mut names = HashSet::new();
    let mut admitted = Vec::with_capacity(request.units.len());
    for (index, unit) in request.units.into_iter().enumerate() {
        let mut outcome = admit(index, &unit, &request.contents, role, &machines, state.agent_ttl);
        if let Ok(imported) = &outcome {
            if existing.contains(&imported.name) {
                outcome = Err("a unit of this name exists in fleet already".to_string());
            } else if !names.insert(imported.name.clone()) {
                outcome = Err("the import names it twice".to_string());
            } else if let Err(error) =
                super::secrets::check_named(state, role, [(imported.name.as_str(), &imported.file)]).await
            {
                outcome = Err(error.message);
            }
        }
        admitted.push((unit, outcome));
    }
    let report: Vec<ImportedUnitReport> = admitted.iter().map(|(unit, outcome)| reported(unit, outcome)).collect();
    let refused: Vec<&ImportedUnitReport> = report.iter().filter(|unit| unit.action == "refused").collect();
    if request.dry_run {
        return Ok(json_response(StatusCode::OK, &ImportReport { written: false, units: report }));
    }
    if let Some(first) = refused.first() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "nothing was imported: {} of {} units refused (unit {}: {}); a dry run reports each",
                refused.len(),
                report.len(),
                first.name,
                first.reason.as_deref().unwrap_or("refused")
            ),
        ));
    }
    let units: Vec<ImportedUnit> = admitted.into_iter().filter_map(|(_, outcome)| outcome.ok()).collect();
    match state.registry.import_units(&units, &Writer::identity(&identity.name, false)).await? {
        Imported::Written => Ok(json_response(StatusCode::OK, &ImportReport { written: true, units: report })),
        Imported::Existing(names) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("nothing was imported: units of these names exist in fleet already: {}", names.join(", ")),
        )),
    }
}

/// The `index`th unit of the request as it would be stored, checked as its own `PUT` would be
/// and against the machines that have joined.
fn admit(
    index: usize,
    unit: &ImportUnit,
    contents: &BTreeMap<String, Vec<UnitOption>>,
    role: &Role,
    machines: &HashMap<String, MachineState>,
    agent_ttl: std::time::Duration,
) -> Admitted {
    let options = match (unit.options.is_empty(), &unit.content) {
        (true, Some(key)) => {
            contents.get(key).cloned().ok_or_else(|| format!("content {key:?} is not in the request's contents"))?
        }
        (false, Some(_)) => return Err("options and content both given".to_string()),
        (_, None) => unit.options.clone(),
    };
    if options.is_empty() {
        return Err("no unit file given".to_string());
    }
    let asked =
        Unit { name: unit.name.clone(), desired_state: Some(unit.desired_state.clone()), options, ..Unit::default() };
    let change = admit_one(index, asked, role, Permission::Write, agent_ttl).map_err(|error| {
        let prefix = format!("unit {}: ", unit.name);
        error.message.strip_prefix(&prefix).map_or(error.message.clone(), str::to_string)
    })?;
    let file = change.file.ok_or("no unit file given")?;
    let requirements = Requirements::from_unit(&change.name, &file);
    let placed = change.desired != DesiredState::Inactive && !requirements.global;
    let machine = unit.machine_id.clone().filter(|_| placed);
    if let Some(id) = &machine {
        // Placed where the engine would not keep it, it would be taken off at once: stopped.
        let Some(joined) = machines.get(id) else {
            return Err(format!(
                "machine {id}, where the original runs it, has not joined fleet: start fleet's fleetd there first"
            ));
        };
        if !requirements.metadata_matches(&joined.metadata) {
            return Err(format!(
                "machine {id} lacks the metadata its MachineMetadata= asks for: give that machine's fleet.conf the \
                 original's metadata= first"
            ));
        }
        if let Some((key, taint)) = fleet_core::taint::first_untolerated(&joined.taints, &requirements.tolerate, true) {
            let taint = fleet_core::taint::Written(key, taint);
            return Err(format!(
                "machine {id} has taint {taint}, which moves off the units that do not tolerate it: untaint it or \
                 give the unit Tolerate= first"
            ));
        }
    }
    Ok(ImportedUnit { name: change.name, file, desired: change.desired, machine })
}

/// One unit of the report: what the import does with it.
fn reported(unit: &ImportUnit, outcome: &Admitted) -> ImportedUnitReport {
    let (action, reason, hash) = match outcome {
        Err(reason) => ("refused", Some(reason.clone()), None),
        Ok(imported) => {
            let action = if Requirements::from_unit(&imported.name, &imported.file).global {
                "global"
            } else if imported.machine.is_some() {
                "adopt"
            } else if imported.desired == DesiredState::Inactive {
                "store"
            } else {
                "place"
            };
            (action, None, Some(imported.file.hash().to_string()))
        }
    };
    ImportedUnitReport {
        name: unit.name.clone(),
        action: action.to_string(),
        desired_state: unit.desired_state.clone(),
        machine_id: unit.machine_id.clone(),
        hash,
        reason,
    }
}
