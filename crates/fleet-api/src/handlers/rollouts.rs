//! `/rollouts`, `/rollouts/{name}` and `/rollouts/{name}/{pause|resume|undo|promote}` (our
//! addition): new content for running units, in waves the engine leader drives. Reading takes
//! `ReadSources`, the rest `ManageRollouts`, checked by the router before any of these run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_core::rollout::{Gates, MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step, check_wait};
use fleet_core::source::checks::check_source_name;
use fleet_core::unit_name::UnitNameInfo;
use fleet_core::{UnitFile, UnitHash};
use fleet_registry::{PageRequest, RegistryError, RolloutRecord};

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::auth::tokens::now_unix;
use crate::error::{ApiError, json_response};
use crate::schema::{
    Rollout as RolloutSchema, RolloutCanary, RolloutList, RolloutRequest, RolloutUnit as UnitSchema, UnitOption,
};

/// The most units one rollout moves.
const UNITS_MAX: usize = 100_000;
const DEFAULT_MIN_READY: u64 = 10;
const DEFAULT_DEADLINE: u64 = 120;

/// The word the API shows for a unit's step, and why it failed.
fn step_word(step: &Step) -> (&'static str, Option<&String>) {
    match step {
        Step::Waiting => ("waiting", None),
        Step::Replacing { .. } => ("replacing", None),
        Step::Ready { .. } => ("ready", None),
        Step::Done => ("done", None),
        Step::Failed { why } => ("failed", Some(why)),
    }
}

/// The API's view of a stored rollout, made from the shared record (a `GET` while a rollout
/// of 10,000 units runs copies nothing of it first); without its units' list unless `units`.
fn to_schema(record: &RolloutRecord, units: bool) -> RolloutSchema {
    let state = record.rollout.state_word();
    let reason = match &record.rollout.state {
        RolloutState::Paused { reason } => Some(reason.clone()),
        RolloutState::Running | RolloutState::Done => None,
    };
    let mut steps: BTreeMap<String, usize> = BTreeMap::new();
    for unit in &record.rollout.units {
        *steps.entry(step_word(&unit.step).0.to_string()).or_default() += 1;
    }
    let units = record
        .rollout
        .units
        .iter()
        .filter(|_| units)
        .map(|unit| {
            let (step, why) = step_word(&unit.step);
            UnitSchema { name: unit.name.clone(), step: step.to_string(), why: why.cloned() }
        })
        .collect();
    let canary = record.rollout.canary.as_ref().map(|canary| RolloutCanary {
        count: canary.count,
        bake_seconds: canary.bake,
        done_since: canary.done_since,
        promoted: canary.promoted,
    });
    RolloutSchema {
        name: record.name.clone(),
        state: state.to_string(),
        reason,
        max_unavailable: record.rollout.max_unavailable.to_string(),
        min_ready_seconds: record.rollout.min_ready,
        units,
        steps,
        created: record.created,
        canary,
        auto_revert: record.rollout.auto_revert,
        reverted: record.rollout.reverted.clone(),
        held: record.rollout.held.clone(),
        secret: record.secret.as_ref().map(|secret| secret.name.clone()),
        secret_version: record.secret.as_ref().and_then(|secret| secret.versions.last().copied()),
    }
}

async fn find(state: &ApiState, name: &str) -> Result<Arc<RolloutRecord>, ApiError> {
    state
        .registry
        .rollouts()
        .await?
        .into_iter()
        .find(|record| record.name == name)
        .ok_or_else(|| ApiError::not_found("rollout does not exist"))
}

/// Whether the answer lists every unit (`?units=false`: the steps' counts only).
fn with_units(query: &[(String, String)]) -> Result<bool, ApiError> {
    crate::query::flag(query, "units", true)
}

pub async fn list(state: &ApiState, query: &[(String, String)]) -> Result<Response, ApiError> {
    let units = with_units(query)?;
    let rollouts = state.registry.rollouts().await?.iter().map(|record| to_schema(record, units)).collect();
    Ok(json_response(StatusCode::OK, &RolloutList { rollouts }))
}

pub async fn get(state: &ApiState, name: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
    let units = with_units(query)?;
    Ok(json_response(StatusCode::OK, &to_schema(find(state, name).await?.as_ref(), units)))
}

/// PUT /rollouts/{name}: starts a rollout of new content to existing units. Refused while
/// another rollout of that name runs or is paused.
pub async fn put(state: &ApiState, identity: &Identity, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let bad = ApiError::bad_request;
    check_source_name(name).map_err(|_| bad(format!("invalid rollout name {name:?}: use 1-63 of a-z, 0-9 and -")))?;
    let request: RolloutRequest =
        serde_json::from_slice(body).map_err(|error| bad(format!("invalid rollout: {error}")))?;
    let max_unavailable = MaxUnavailable::parse(&request.max_unavailable).map_err(bad)?;
    let gates = Gates::parse(request.canary.as_deref(), request.bake_seconds, request.auto_revert).map_err(bad)?;
    let min_ready =
        check_wait("minReadySeconds", request.min_ready_seconds.unwrap_or(DEFAULT_MIN_READY)).map_err(bad)?;
    let deadline = check_wait("deadlineSeconds", request.deadline_seconds.unwrap_or(DEFAULT_DEADLINE)).map_err(bad)?;
    let contents = new_contents(request.units, request.options, request.files)?;
    if let Some(existing) = state.registry.rollouts().await?.into_iter().find(|record| record.name == name)
        && existing.rollout.state != RolloutState::Done
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("rollout {name} is still {:?}", existing.rollout.state),
        ));
    }
    // Only the units named, from the API's copy: a rollout of 10,000 units read every unit,
    // placement, state and body from etcd.
    let named: BTreeSet<String> = contents.iter().map(|(unit, _)| unit.clone()).collect();
    let held: BTreeMap<String, fleet_registry::UnitView> = state
        .registry
        .units_page(PageRequest::named(&named))
        .await?
        .items
        .into_iter()
        .map(|unit| (unit.name.clone(), unit))
        .collect();
    let mut bodies = BTreeMap::new();
    let mut units = Vec::with_capacity(contents.len());
    // A content shared by the units in a row (one content for all, the usual request) is
    // hashed and written out once.
    let mut last: Option<(UnitFile, UnitHash)> = None;
    for (unit, file) in contents {
        if UnitNameInfo::new(&unit).is_template() {
            return Err(bad(format!("{unit} is a template: roll out its instances")));
        }
        let current = held.get(&unit).ok_or_else(|| bad(format!("unit {unit} does not exist")))?;
        if let Some(source) = &current.source {
            // Its source decides its content; it rolls out its own changes.
            return Err(RegistryError::Owned { unit, owner: Some(source.clone()) }.into());
        }
        crate::handlers::units::validate_options(&unit, &file, state.agent_ttl)?;
        bodies.entry(current.hash.to_string()).or_insert_with(|| current.file.serialize());
        let to = match &last {
            Some((same, hash)) if *same == file => *hash,
            _ => {
                let hash = file.hash();
                bodies.entry(hash.to_string()).or_insert_with(|| file.serialize());
                last = Some((file, hash));
                hash
            }
        };
        units.push(RolloutUnit { name: unit, from: current.hash, to, step: Step::Waiting });
    }
    let (canary, units) =
        gates.replacement_order(units, |unit| held.get(&unit.name).and_then(|view| view.machine_id.as_deref()));
    // What a unit requires among them goes before it (and into a canary with it).
    let units = fleet_core::rollout::dependency_order::rollout_units_required_first(units, &bodies);
    let rollout = Rollout {
        canary,
        units,
        max_unavailable,
        min_ready,
        deadline,
        state: RolloutState::Running,
        undo: false,
        auto_revert: gates.auto_revert,
        reverted: None,
        held: None,
    };
    let record = RolloutRecord {
        name: name.to_string(),
        rollout,
        bodies,
        created: now_unix(),
        source_commit: None,
        secret: None,
        started_by: Some(identity.name.clone()),
    };
    state.registry.put_rollout(&record).await?;
    Ok(json_response(StatusCode::CREATED, &to_schema(&record, true)))
}

/// The units of a rollout request with their new content: `units` sharing `options`, or
/// `files`, one content per unit.
fn new_contents(
    units: Vec<String>,
    options: Vec<UnitOption>,
    files: BTreeMap<String, Vec<UnitOption>>,
) -> Result<Vec<(String, UnitFile)>, ApiError> {
    let bad = ApiError::bad_request;
    let contents: Vec<(String, UnitFile)> = match (units.is_empty() && options.is_empty(), files.is_empty()) {
        (false, true) => {
            let unique: BTreeSet<&String> = units.iter().collect();
            if unique.len() != units.len() {
                return Err(bad("a unit is named twice".into()));
            }
            let file = crate::handlers::units::file_from_options(options);
            units.into_iter().map(|unit| (unit, file.clone())).collect()
        }
        (true, false) => files
            .into_iter()
            .map(|(unit, options)| (unit, crate::handlers::units::file_from_options(options)))
            .collect(),
        _ => return Err(bad("give units and options, or files".into())),
    };
    if contents.is_empty() || contents.len() > UNITS_MAX {
        return Err(bad(format!("a rollout names 1 to {UNITS_MAX} units")));
    }
    if let Some((unit, _)) = contents.iter().find(|(_, file)| file.options().is_empty()) {
        return Err(bad(format!("the new content of {unit} has no options")));
    }
    Ok(contents)
}

/// POST /rollouts/{name}/{pause|resume|undo|promote}.
pub async fn act(state: &ApiState, name: &str, action: &str) -> Result<Response, ApiError> {
    let mut record = RolloutRecord::clone(find(state, name).await?.as_ref());
    let now = now_unix();
    match action {
        "pause" if record.rollout.state == RolloutState::Running => {
            record.rollout.state = RolloutState::Paused { reason: "paused by hand".into() };
        }
        "resume" if matches!(record.rollout.state, RolloutState::Paused { .. }) => {
            // A unit that failed gets a new deadline: it may have been mended meanwhile.
            for unit in &mut record.rollout.units {
                if matches!(unit.step, Step::Failed { .. }) {
                    unit.step = Step::Replacing { since: now };
                }
            }
            record.rollout.state = RolloutState::Running;
        }
        "undo" => record.rollout = record.rollout.undo(),
        "promote" => match record.rollout.canary.as_mut() {
            Some(canary) if !canary.promoted && record.rollout.state != RolloutState::Done => canary.promoted = true,
            _ => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!("rollout {name} has no canary waiting to be promoted"),
                ));
            }
        },
        "pause" | "resume" => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("cannot {action} a rollout that is {:?}", record.rollout.state),
            ));
        }
        _ => return Err(ApiError::not_found("no such rollout action (pause, resume, undo, promote)")),
    }
    state.registry.put_rollout(&record).await?;
    Ok(json_response(StatusCode::OK, &to_schema(&record, true)))
}

pub async fn delete(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    if state.registry.remove_rollout(name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("rollout does not exist"))
    }
}
