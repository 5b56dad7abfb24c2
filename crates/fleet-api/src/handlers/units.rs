//! `/units` and `/units/{name}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_core::access::Role;
use fleet_core::unit_name::{UnitNameInfo, validate_name};
use fleet_core::{DesiredState, UnitFile};
use std::sync::Arc;

use fleet_registry::{PageRequest, UnitView, Writer};

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::{ApiError, json_response};
use crate::query::page_token;
use crate::schema::{Unit, UnitOption, UnitPage};

/// Where a unit is shown: the original gives global units a current state of `inactive`
/// in lists only (a quirk kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    InList,
    Alone,
}

/// A stored unit as the API shows it.
pub fn to_schema(view: UnitView, shown: Shown) -> Unit {
    let current = match (view.current, shown) {
        (Some(state), _) => Some(state.to_string()),
        (None, Shown::InList) => Some(DesiredState::Inactive.to_string()),
        (None, Shown::Alone) => None,
    };
    Unit {
        current_state: current,
        desired_state: Some(view.desired.to_string()),
        machine_id: view.machine_id,
        name: view.name,
        options: view
            .file
            .into_options()
            .into_iter()
            .map(|option| UnitOption { name: option.name, section: option.section, value: option.value })
            .collect(),
        reason: view.reason,
        source: view.source,
        required_at: Vec::new(),
        // A unit at its first version reads exactly as the original's.
        version: Some(view.versions.number()).filter(|number| *number > 1),
    }
}

/// One place of what a unit requires as the API and pull agents are told it.
pub(crate) fn place_to_schema(place: fleet_core::required_places::RequiredPlace) -> crate::schema::RequiredPlace {
    crate::schema::RequiredPlace { unit: place.unit, machine_id: place.machine_id, primary_ip: place.public_ip }
}

/// The units `role` sees, a page at a time.
pub async fn list(state: &ApiState, query: &[(String, String)], role: &Role) -> Result<Response, ApiError> {
    let token = page_token(query, state.page_size.get())?;
    let (start, limit) = token.window();
    let listing = format!("units {role:?}");
    let after = state.page_cursors.after(&listing, start);
    let role = role.clone();
    let request = PageRequest { start, limit, admits: Arc::new(move |name: &str| role.sees_unit(name)), after };
    let _turn = crate::unread_answers::page_build_turn().await;
    let page = state.registry.units_page(request).await?;
    let units: Vec<Unit> = page.items.into_iter().map(|view| to_schema(view, Shown::InList)).collect();
    let (units, encoded, next) = token.page_encoded(units, page.more);
    if let (Some(_), Some(last)) = (&next, units.last()) {
        state.page_cursors.remember(&listing, start + units.len(), last.name.clone());
    }
    Ok(json_response(StatusCode::OK, &UnitPage { next_page_token: next.map(|t| t.encode()), units: encoded }))
}

pub async fn get(state: &ApiState, role: &Role, name: &str) -> Result<Response, ApiError> {
    let Some(view) = state.registry.unit(name).await? else {
        return Err(ApiError::not_found("unit does not exist"));
    };
    // A placed unit that waits for units says where they run, as its machine's file does.
    let places = match (&view.machine_id, fleet_core::dependency::waits(view.file.options())) {
        (Some(machine), true) => state.registry.required_places_of(name, machine).await?,
        _ => Vec::new(),
    };
    let mut unit = to_schema(view, Shown::Alone);
    // A scoped caller is told where only the units it sees run.
    unit.required_at = places.into_iter().filter(|place| role.sees_unit(&place.unit)).map(place_to_schema).collect();
    Ok(json_response(StatusCode::OK, &unit))
}

/// Who writes a unit: `identity` by hand, taking over a unit a source owns only with
/// `takeOver=true` (our addition; the original's clients never send it).
pub fn writer(identity: &Identity, query: &[(String, String)]) -> Result<Writer, ApiError> {
    Ok(Writer::identity(&identity.name, crate::query::flag(query, "takeOver", false)?))
}

pub async fn delete(state: &ApiState, name: &str, writer: &Writer) -> Result<Response, ApiError> {
    if state.registry.destroy_unit_as(name, writer).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("unit does not exist"))
    }
}

/// The unit file a request's options make.
pub fn file_from_options(options: Vec<UnitOption>) -> UnitFile {
    UnitFile::from_options(
        options
            .into_iter()
            .map(|option| fleet_core::UnitOption { section: option.section, name: option.name, value: option.value })
            .collect(),
    )
}

/// A unit the cluster takes ([`fleet_core::admission::admit_unit`], and a `LostAfter=` no
/// shorter than the cluster's `agent_ttl`), or a 400.
pub fn validate_options(name: &str, file: &UnitFile, agent_ttl: std::time::Duration) -> Result<(), ApiError> {
    fleet_core::admission::admit_unit(name, file).map_err(ApiError::bad_request)?;
    fleet_core::lost_after::check_against_agent_ttl(file.options(), agent_ttl).map_err(ApiError::bad_request)
}

pub(crate) fn refuse_template_activation(name: &str, desired: DesiredState) -> Result<(), ApiError> {
    if UnitNameInfo::new(name).is_template() && desired != DesiredState::Inactive {
        return Err(ApiError::bad_request(format!("cannot activate template {name:?}")));
    }
    Ok(())
}

/// A unit write's body: JSON, and an object (serde would also read a struct from an array:
/// `[]` came out as a unit without options, answered 409 instead of 400).
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("unable to decode body: expected a JSON object"));
    }
    serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("unable to decode body: {error}")))
}

/// PUT /units/{name}: create, replace (new options) or change the desired state.
pub async fn put(
    state: &ApiState,
    role: &Role,
    name: &str,
    body: &[u8],
    writer: &Writer,
) -> Result<Response, ApiError> {
    let request: Unit = json_object(body)?;
    if !request.name.is_empty() && request.name != name {
        return Err(ApiError::bad_request(format!(
            "name in URL {name:?} differs from unit name in request body {:?}",
            request.name
        )));
    }
    validate_name(name).map_err(|error| ApiError::bad_request(error.to_string()))?;
    let desired = match request.desired_state.as_deref().filter(|state| !state.is_empty()) {
        Some(text) => Some(text.parse::<DesiredState>().map_err(|error| ApiError::bad_request(error.to_string()))?),
        None => None,
    };
    let file = file_from_options(request.options);
    let existing = state.registry.unit(name).await?;
    let has_options = !file.options().is_empty();
    let replaces = match &existing {
        None => true,
        Some(view) => has_options && view.hash != file.hash(),
    };
    if replaces {
        if !has_options {
            return Err(ApiError::new(StatusCode::CONFLICT, "unit does not exist and options field empty"));
        }
        validate_options(name, &file, state.agent_ttl)?;
        super::secrets::check_named(state, role, [(name, &file)]).await?;
        super::dependency_cycles::refuse_cycles(state, [(name, &file)]).await?;
        let desired = desired.unwrap_or(DesiredState::Inactive);
        refuse_template_activation(name, desired)?;
        state.registry.put_unit_as(name, &file, desired, writer).await?;
        return Ok(StatusCode::CREATED.into_response());
    }
    let Some(desired) = desired else {
        return Err(ApiError::new(StatusCode::CONFLICT, "must provide DesiredState to update existing unit"));
    };
    refuse_template_activation(name, desired)?;
    if state.registry.set_desired_state_as(name, desired, writer).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("unit does not exist"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleet_core::access::UnitScope;
    use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, RequiredPlace, RequiredPlaces};
    use fleet_store_embedded::EmbeddedRegistry;

    use super::*;
    use crate::auth::Auth;

    /// `requiredAt` names only the units the caller sees: a scoped operator does not learn
    /// where a unit outside its scope runs.
    #[tokio::test]
    async fn a_unit_says_where_what_it_requires_runs_to_those_who_see_that() {
        let dir = tempfile::tempdir().unwrap();
        let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
        let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
        let machine = fleet_core::MachineState { id: "m1".into(), ..Default::default() };
        registry.register_machine(&machine).await.unwrap();
        let app = UnitFile::parse("[Service]\nExecStart=/bin/app\n[X-Fleet]\nRequires=db.service\n").unwrap();
        registry.put_unit("app.service", &app, DesiredState::Launched).await.unwrap();
        let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
        let placed = fleet_core::schedule::Decision::Schedule { unit: "app.service".into(), machine: "m1".into() };
        registry.apply(&lease, &[placed], &[]).await.unwrap();
        let db = RequiredPlace { unit: "db.service".into(), machine_id: "m2".into(), public_ip: "10.0.0.2".into() };
        let record = RequiredPlaces { unit: "app.service".into(), machine: "m1".into(), places: vec![db] };
        registry.record_required_places(&lease, &[record]).await.unwrap();
        let shown = async |role: &Role| {
            let response = get(&state, role, "app.service").await.unwrap();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()["requiredAt"].clone()
        };
        assert_eq!(
            shown(&Role::Viewer).await,
            serde_json::json!([{"unit": "db.service", "machineID": "m2", "primaryIP": "10.0.0.2"}])
        );
        let scoped = Role::Operator { units: UnitScope::new("app*"), secrets: None };
        assert_eq!(shown(&scoped).await, serde_json::Value::Null, "db.service is outside its scope");
    }
}
