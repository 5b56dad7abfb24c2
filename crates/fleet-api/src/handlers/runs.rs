//! `/units/{name}/runs` (our addition): the calendar of a unit that runs on one, when it next
//! elapses, and what became of its elapses and runs (its job record); a POST starts a run now
//! (`fleetctl run`).

use axum::http::StatusCode;
use axum::response::Response;

use fleet_core::DesiredState;
use fleet_core::civil_time::rfc3339_of_micros;
use fleet_core::job::runs::{self, JobRecord, Outcome, Run};

use fleet_runtime::wall_clock::now_micros;

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{MachineFailure, RunMachines, SkippedElapses, UnitRun, UnitRuns};

pub async fn get(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let Some(unit) = state.registry.unit(name).await? else {
        return Err(ApiError::not_found("unit does not exist"));
    };
    let job = fleet_core::job::job_of(name, unit.file.options()).ok().flatten();
    let schedule = job.as_ref().and_then(|job| job.schedule.as_ref());
    let now = now_micros();
    let record = state.registry.job_record(name).await?.map(|stored| stored.record);
    let mut runs = UnitRuns {
        name: name.to_string(),
        schedule: schedule.map(ToString::to_string),
        next_elapse: schedule.and_then(|spec| spec.next_after(now)).map(rfc3339_of_micros),
        batch: job.as_ref().is_some_and(|job| job.batch),
        retries: job.as_ref().map_or(0, |job| job.retries),
        ..UnitRuns::default()
    };
    if let Some(record) = record {
        fill(&mut runs, &record);
        let retrying = unit.desired == DesiredState::Launched && !record.stopped_since_run;
        runs.retry_at = job
            .as_ref()
            .filter(|_| retrying)
            .and_then(|job| record.retry_due(job))
            .map(|(due, _)| rfc3339_of_micros(due));
    }
    Ok(json_response(StatusCode::OK, &runs))
}

/// How often a run started by hand is tried again when the engine's write came between its
/// read and its write.
const DISPATCH_TRIES: usize = 5;

/// Starts a run of a started unit whose runs fleet keeps, now, unless one is active: the run
/// is claimed in the unit's job record (by compare-and-swap over the version read) and placed
/// by the engine as any other.
pub async fn post(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let Some(unit) = state.registry.unit(name).await? else {
        return Err(ApiError::not_found("unit does not exist"));
    };
    let Some(job) = fleet_core::job::job_of(name, unit.file.options()).ok().flatten().filter(|job| job.keeps_runs())
    else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "unit has neither Schedule= nor Batch=true in [X-Fleet]: fleet keeps no runs of it",
        ));
    };
    if unit.desired != DesiredState::Launched {
        return Err(ApiError::new(StatusCode::CONFLICT, "unit is not started: start it first"));
    }
    for _ in 0..DISPATCH_TRIES {
        let stored = state.registry.job_record(name).await?;
        let (record, version) = match stored {
            Some(stored) => (stored.record, stored.version),
            None => (JobRecord::new(now_micros()), 0),
        };
        let now = now_micros();
        let dispatched = runs::dispatch(&record, now, job.kept_runs)
            .map_err(|error| ApiError::new(StatusCode::CONFLICT, error.to_string()))?;
        if state.registry.put_dispatched_run(name, &dispatched.record, version).await? {
            tracing::info!(unit = name, run = dispatched.id, claimed = dispatched.claimed, "run started by hand");
            let shown = dispatched.record.runs.iter().find(|run| run.id == dispatched.id).map_or_else(
                || UnitRun {
                    id: dispatched.id,
                    attempt: 1,
                    claimed: rfc3339_of_micros(now),
                    state: "waiting".to_string(),
                    ..UnitRun::default()
                },
                run,
            );
            return Ok(json_response(StatusCode::CREATED, &shown));
        }
    }
    Err(ApiError::new(StatusCode::CONFLICT, "the unit's runs changed while this one was started; try again"))
}

fn fill(runs: &mut UnitRuns, record: &JobRecord) {
    runs.queued = record.queued.map(rfc3339_of_micros);
    runs.runs = record.runs.iter().map(run).collect();
    runs.skipped = record
        .skips
        .iter()
        .map(|skipped| SkippedElapses {
            first: rfc3339_of_micros(skipped.first),
            last: rfc3339_of_micros(skipped.last),
            why: skipped.why.to_string(),
        })
        .collect();
}

fn run(run: &Run) -> UnitRun {
    let state = match (&run.outcome, run.started) {
        _ if run.tally.is_some() => "global",
        (Some(outcome), _) => outcome.word(),
        (None, Some(_)) => "running",
        (None, None) => "waiting",
    };
    let machines = run.tally.as_deref().map(|tally| RunMachines {
        succeeded: tally.succeeded,
        failed: tally.failed,
        lost: tally.lost,
        stopped: tally.stopped,
        failures: tally
            .failures
            .iter()
            .map(|end| {
                let (status, signal) = match &end.outcome {
                    Outcome::Failed { status, signal } => (*status, signal.clone()),
                    _ => (None, None),
                };
                MachineFailure {
                    machine_id: end.machine.clone(),
                    state: end.outcome.word().to_string(),
                    status,
                    signal,
                }
            })
            .collect(),
    });
    let (status, signal, why) = match &run.outcome {
        Some(Outcome::Failed { status, signal }) => (*status, signal.clone(), None),
        Some(Outcome::Lost { why }) => (None, None, Some(why.clone())),
        _ => (None, None, None),
    };
    UnitRun {
        id: run.id,
        elapse: run.elapse.map(rfc3339_of_micros),
        attempt: run.attempt,
        claimed: rfc3339_of_micros(run.claimed),
        machine_id: run.machine.clone(),
        started: run.started.map(rfc3339_of_micros),
        ended: run.ended.map(rfc3339_of_micros),
        state: state.to_string(),
        status,
        signal,
        why,
        log: run.log.clone(),
        machines,
    }
}
