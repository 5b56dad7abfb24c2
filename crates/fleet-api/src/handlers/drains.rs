//! `/machines/{machine}/drain` (our addition): drain a machine (it takes no new units, and the
//! engine leader moves its units off in waves), see where its drain stands, and end it.
//! Reading takes `List`, the rest `WriteMachines`, checked by the router before any of these
//! run. A machine is named by its ID or its 8-character short ID.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_core::MachineState;
use fleet_core::access::Role;
use fleet_core::drain::{Drain, progress};
use fleet_core::machine::valid_machine_id;
use fleet_core::rollout::MaxUnavailable;
use fleet_registry::{PageRequest, drain_unit_names, drain_units};

use crate::api_state::ApiState;
use crate::auth::tokens::now_unix;
use crate::error::{ApiError, json_response};
use crate::schema::{DrainRequest, DrainingUnit, MachineDrain};

/// The live machine `requested` names (by ID or short ID), if exactly one.
async fn find(state: &ApiState, requested: &str) -> Result<Option<MachineState>, ApiError> {
    Ok(find_in(&state.registry.machines().await?, requested)?.cloned())
}

/// The machine of `machines` that `requested` names (by ID or short ID), if exactly one.
pub(super) fn find_in<'a>(machines: &'a [MachineState], requested: &str) -> Result<Option<&'a MachineState>, ApiError> {
    if !valid_machine_id(requested) {
        return Err(ApiError::bad_request(format!("invalid machine ID {requested:?}")));
    }
    if let Some(exact) = machines.iter().find(|machine| machine.id == requested) {
        return Ok(Some(exact));
    }
    let mut matching = machines.iter().filter(|machine| machine.matches_id(requested));
    match (matching.next(), matching.next()) {
        (Some(only), None) => Ok(Some(only)),
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!("machine ID {requested:?} names several machines"))),
        (None, _) => Ok(None),
    }
}

pub(super) fn not_found(requested: &str) -> ApiError {
    ApiError::not_found(format!("machine {requested:?} does not exist"))
}

/// Where the drains of `drained` machines stand, by machine: one read of the units and of the
/// states of the units they concern, for all of them.
pub(crate) async fn statuses(
    state: &ApiState,
    drained: &[(String, Drain)],
) -> Result<BTreeMap<String, MachineDrain>, ApiError> {
    if drained.is_empty() {
        return Ok(BTreeMap::new());
    }
    let units = state.registry.units_page(PageRequest::everything()).await?.items;
    let names: BTreeSet<String> =
        drained.iter().flat_map(|(machine, drain)| drain_unit_names(&units, machine, drain)).collect();
    let states = state.registry.unit_states_page(PageRequest::named(&names), None).await?.items;
    let reasons: BTreeMap<&str, &str> =
        units.iter().filter_map(|unit| Some((unit.name.as_str(), unit.reason.as_deref()?))).collect();
    let mut result = BTreeMap::new();
    for (machine, drain) in drained {
        let standing = progress(drain, machine, &drain_units(&units, &states, machine, drain));
        let moving = standing
            .moving
            .iter()
            .map(|name| DrainingUnit { name: name.clone(), reason: reasons.get(name.as_str()).map(|r| r.to_string()) })
            .collect();
        let stays = standing
            .stays
            .iter()
            .map(|(name, why)| DrainingUnit { name: name.clone(), reason: Some(why.to_string()) })
            .collect();
        let status = MachineDrain {
            state: standing.word().to_string(),
            max_unavailable: drain.max_unavailable.to_string(),
            started: drain.started,
            moved: u64::try_from(standing.moved).unwrap_or(u64::MAX),
            moving,
            left: standing.left,
            stays,
            held: drain.held.clone(),
        };
        result.insert(machine.clone(), status);
    }
    Ok(result)
}

async fn status_of(state: &ApiState, machine: &str, drain: Drain) -> Result<MachineDrain, ApiError> {
    let mut statuses = statuses(state, &[(machine.to_string(), drain)]).await?;
    statuses.remove(machine).ok_or_else(|| ApiError::not_found(format!("machine {machine:?} is not drained")))
}

/// GET: where the machine's drain stands, naming only the units `role` sees; 404 when it is
/// not drained.
pub async fn get(state: &ApiState, requested: &str, role: &Role) -> Result<Response, ApiError> {
    let machine = find(state, requested).await?.ok_or_else(|| not_found(requested))?;
    let drain = machine.drain.ok_or_else(|| ApiError::not_found(format!("machine {:?} is not drained", machine.id)))?;
    let status = status_of(state, &machine.id, drain).await?;
    Ok(json_response(StatusCode::OK, &seen_by(status, role)))
}

/// A drain's standing with only the units `role` sees named (a scoped operator sees neither
/// the names nor the reasons of other units).
pub fn seen_by(mut status: MachineDrain, role: &Role) -> MachineDrain {
    status.moving.retain(|unit| role.sees_unit(&unit.name));
    status.stays.retain(|unit| role.sees_unit(&unit.name));
    status.left.retain(|name| role.sees_unit(name));
    status.held = status.held.filter(|held| held_unit_seen(held, role));
    status
}

/// PUT: drains the machine, or changes the max-unavailable of the drain under way (which
/// keeps its progress).
pub async fn put(state: &ApiState, requested: &str, body: &[u8]) -> Result<Response, ApiError> {
    let bad = ApiError::bad_request;
    let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        serde_json::from_slice(body).map_err(|error| bad(format!("invalid drain: {error}")))?
    };
    let max_unavailable = match request.max_unavailable.as_deref() {
        Some(text) => MaxUnavailable::parse(text).map_err(bad)?,
        None => MaxUnavailable::Count(1),
    };
    let machine = find(state, requested).await?.ok_or_else(|| not_found(requested))?;
    let drain = match machine.drain {
        Some(standing) => Drain { max_unavailable, ..standing },
        None => Drain::new(max_unavailable, now_unix()),
    };
    state.registry.set_drain(&machine.id, Some(&drain)).await?;
    tracing::info!(machine = machine.id, %max_unavailable, "machine drained");
    Ok(json_response(StatusCode::OK, &status_of(state, &machine.id, drain).await?))
}

/// DELETE: ends the machine's drain (it takes units again; units that moved stay where they
/// are). A machine that is gone may have its drain ended by its full ID.
pub async fn delete(state: &ApiState, requested: &str) -> Result<Response, ApiError> {
    let id = match find(state, requested).await? {
        Some(machine) if machine.drain.is_none() => {
            return Err(ApiError::not_found(format!("machine {:?} is not drained", machine.id)));
        }
        Some(machine) => machine.id,
        None => requested.to_string(),
    };
    state.registry.set_drain(&id, None).await?;
    tracing::info!(machine = id, "machine drain ended");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Whether `role` sees the unit a hold names (it begins `web@2.service waits: …`).
pub fn held_unit_seen(held: &str, role: &Role) -> bool {
    held.split_once(" waits: ").is_some_and(|(unit, _)| role.sees_unit(unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 67): an operator limited to `web-*` was shown every unit a drain
    /// moved, left or kept, with the reasons.
    #[test]
    fn a_scoped_operator_is_shown_only_its_own_units_of_a_drain() {
        let unit = |name: &str| DrainingUnit { name: name.into(), reason: Some("why".into()) };
        let status = MachineDrain {
            moving: vec![unit("web-1.service"), unit("db.service")],
            stays: vec![unit("secret-job.service")],
            left: vec!["web-2.service".into(), "db-2.service".into()],
            held: Some("db-3.service waits: held by the disruption budget of db-*".into()),
            ..MachineDrain::default()
        };
        let scoped = Role::parse("operator", Some("web-*")).expect("a role");
        let seen = seen_by(status.clone(), &scoped);
        assert_eq!(seen.moving, vec![unit("web-1.service")]);
        assert!(seen.stays.is_empty());
        assert_eq!(seen.left, vec!["web-2.service".to_string()]);
        assert_eq!(seen.held, None, "the hold names a unit it does not see");
        assert_eq!(seen_by(status.clone(), &Role::Viewer), status, "a viewer sees every unit");
    }
}
