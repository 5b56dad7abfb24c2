//! `/sources`, `/sources/{name}` and `/sources/{name}/sync`: git sources (our addition).
//! Reading takes [`fleet_core::access::Action::ReadSources`], everything else
//! `ManageSources` (administrators), which the router checks before any of these run.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_core::drift::DriftPolicy;
use fleet_core::rollout::check_wait;
use fleet_core::source::checks::{
    INTERVAL_SECONDS, PATHS_MAX, check_credentials_name, check_path, check_reference, check_repo, check_source_name,
};
use fleet_registry::{DEFAULT_DEADLINE_SECONDS, SourceRecord, SourceStatus, Writer};

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::error::{ApiError, json_response};
use crate::schema::{Source, SourceList, SourceOutOfSync, SourceStatus as StatusSchema};

/// The interval of a source that names none.
pub const DEFAULT_INTERVAL_SECONDS: u64 = 15;

fn to_schema(record: SourceRecord, status: Option<SourceStatus>) -> Source {
    let status = status.map(|status| StatusSchema {
        current: status.generation == record.generation,
        commit: status.commit,
        attempted_at: status.attempted_at,
        synced_at: status.synced_at,
        error: status.error,
        problems: status.problems,
        owned_elsewhere: status.owned_elsewhere,
        out_of_sync: status
            .out_of_sync
            .into_iter()
            .map(|entry| SourceOutOfSync { unit: entry.unit, why: entry.why, wanted: entry.wanted })
            .collect(),
        units: status.units,
        changes: status.changes,
        halted: status.halted,
    });
    Source {
        name: record.name,
        repo: record.repo,
        branch: record.branch,
        revision: record.revision,
        paths: record.paths,
        interval_seconds: Some(record.interval_seconds),
        credentials: record.credentials_file,
        paused: record.paused,
        keep_removed: record.keep_removed,
        take_over: record.take_over,
        webhook_secret: record.webhook_secret,
        max_unavailable: record.max_unavailable,
        min_ready_seconds: Some(record.min_ready_seconds),
        deadline_seconds: Some(record.deadline_seconds),
        canary: record.gates.canary.map(|canary| canary.to_string()),
        bake_seconds: record.gates.bake,
        auto_revert: record.gates.auto_revert,
        drift: Some(record.drift.to_string()),
        status,
    }
}

async fn statuses(state: &ApiState) -> Result<BTreeMap<String, SourceStatus>, ApiError> {
    Ok(state.registry.source_statuses().await?.into_iter().collect())
}

pub(crate) async fn find(state: &ApiState, name: &str) -> Result<SourceRecord, ApiError> {
    named(state.registry.sources().await?, name)
}

/// The source called `name` among `sources`, or 404.
pub(crate) fn named(sources: Vec<SourceRecord>, name: &str) -> Result<SourceRecord, ApiError> {
    sources.into_iter().find(|record| record.name == name).ok_or_else(|| ApiError::not_found("source does not exist"))
}

pub async fn list(state: &ApiState) -> Result<Response, ApiError> {
    let mut statuses = statuses(state).await?;
    let sources = state
        .registry
        .sources()
        .await?
        .into_iter()
        .map(|record| {
            let status = statuses.remove(&record.name);
            to_schema(record, status)
        })
        .collect();
    Ok(json_response(StatusCode::OK, &SourceList { sources }))
}

pub async fn get(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let record = find(state, name).await?;
    let status = statuses(state).await?.remove(name);
    Ok(json_response(StatusCode::OK, &to_schema(record, status)))
}

/// Checks a source as it arrives; the record it makes (generation 0).
fn checked(name: &str, request: Source) -> Result<SourceRecord, ApiError> {
    let bad = ApiError::bad_request;
    check_source_name(name).map_err(bad)?;
    if !request.name.is_empty() && request.name != name {
        return Err(bad(format!("name in URL {name:?} differs from source name in request body {:?}", request.name)));
    }
    check_repo(&request.repo).map_err(bad)?;
    if request.branch.is_some() && request.revision.is_some() {
        return Err(bad("give a branch or a revision, not both".into()));
    }
    if let Some(branch) = &request.branch {
        check_reference("branch", branch).map_err(bad)?;
    }
    if let Some(revision) = &request.revision {
        check_reference("revision", revision).map_err(bad)?;
    }
    if request.paths.len() > PATHS_MAX {
        return Err(bad(format!("at most {PATHS_MAX} paths")));
    }
    for path in &request.paths {
        check_path(path).map_err(bad)?;
    }
    let interval_seconds = request.interval_seconds.unwrap_or(DEFAULT_INTERVAL_SECONDS);
    if !INTERVAL_SECONDS.contains(&interval_seconds) {
        return Err(bad(format!(
            "invalid intervalSeconds: between {} and {}",
            INTERVAL_SECONDS.start(),
            INTERVAL_SECONDS.end()
        )));
    }
    for file in request.credentials.iter().chain(&request.webhook_secret) {
        check_credentials_name(file).map_err(bad)?;
    }
    if let Some(max) = &request.max_unavailable {
        fleet_core::rollout::MaxUnavailable::parse(max).map_err(bad)?;
    }
    let gates = fleet_core::rollout::Gates::parse(request.canary.as_deref(), request.bake_seconds, request.auto_revert)
        .map_err(bad)?;
    let drift = match request.drift.as_deref() {
        Some(policy) => DriftPolicy::parse(policy).map_err(bad)?,
        None => DriftPolicy::Correct,
    };
    let min_ready_seconds = check_wait("minReadySeconds", request.min_ready_seconds.unwrap_or(10)).map_err(bad)?;
    let deadline_seconds =
        check_wait("deadlineSeconds", request.deadline_seconds.unwrap_or(DEFAULT_DEADLINE_SECONDS)).map_err(bad)?;
    if request.status.is_some() {
        return Err(bad("status is the sync's to write".into()));
    }
    Ok(SourceRecord {
        name: name.to_string(),
        repo: request.repo,
        branch: request.branch,
        revision: request.revision,
        paths: request.paths,
        interval_seconds,
        credentials_file: request.credentials,
        paused: request.paused,
        keep_removed: request.keep_removed,
        take_over: request.take_over,
        webhook_secret: request.webhook_secret,
        max_unavailable: request.max_unavailable,
        min_ready_seconds,
        deadline_seconds,
        gates,
        drift,
        generation: 0,
        forced: 0,
    })
}

/// PUT /sources/{name}: creates (201) or replaces (204) a source; either way the syncing
/// engine syncs it at once.
pub async fn put(state: &ApiState, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let request: Source =
        serde_json::from_slice(body).map_err(|error| ApiError::bad_request(format!("invalid source: {error}")))?;
    let mut record = checked(name, request)?;
    let existing = state.registry.sources().await?.into_iter().find(|old| old.name == name);
    record.generation = existing.as_ref().map_or(1, |old| old.generation + 1);
    // A source replaced stays halted on a reverted commit: only a new commit or a forced sync
    // rolls it out again.
    record.forced = existing.as_ref().map_or(0, |old| old.forced);
    state.registry.put_source(&record).await?;
    Ok(if existing.is_some() { StatusCode::NO_CONTENT } else { StatusCode::CREATED }.into_response())
}

/// POST /sources/{name}/sync: asks the syncing engine to sync now; with `force=true` a
/// commit the source halted on (its rollout reverted itself) is rolled out once more.
pub async fn sync(state: &ApiState, name: &str, query: &[(String, String)]) -> Result<Response, ApiError> {
    let force = crate::query::flag(query, "force", false)?;
    let mut record = find(state, name).await?;
    record.generation += 1;
    record.forced += u64::from(force);
    state.registry.put_source(&record).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// DELETE /sources/{name}: removes a source and destroys the units it owns, or with
/// `keepUnits=true` leaves them running as units made by hand.
pub async fn delete(
    state: &ApiState,
    identity: &Identity,
    name: &str,
    query: &[(String, String)],
) -> Result<Response, ApiError> {
    let keep_units = crate::query::flag(query, "keepUnits", false)?;
    find(state, name).await?;
    // The record goes first: from then on the source's writes are refused by the store
    // (a sync under way included), so nothing recreates what is destroyed next.
    state.registry.remove_source(name).await?;
    let released = Writer::identity(&identity.name, true);
    for unit in state.registry.units().await?.into_iter().filter(|unit| unit.source.as_deref() == Some(name)) {
        if keep_units {
            state.registry.set_desired_state_as(&unit.name, unit.desired, &released).await?;
        } else {
            state.registry.destroy_unit_as(&unit.name, &released).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// POST /sources/{name}/webhook: a git forge announces a push; the router verified the
/// body's signature with the source's shared secret. The source is synced at once.
pub async fn webhook(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let mut record = find(state, name).await?;
    record.generation += 1;
    state.registry.put_source(&record).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}
