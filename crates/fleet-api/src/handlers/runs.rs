//! `/units/{name}/runs` (our addition): the calendar of a unit that runs on one, when it next
//! elapses, and what became of its elapses (its job record).

use axum::http::StatusCode;
use axum::response::Response;

use fleet_core::civil_time::rfc3339_of_micros;
use fleet_core::job::runs::{JobRecord, Outcome, Run};

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{SkippedElapses, UnitRun, UnitRuns};

pub async fn get(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let Some(unit) = state.registry.unit(name).await? else {
        return Err(ApiError::not_found("unit does not exist"));
    };
    let job = fleet_core::job::job_of(name, unit.file.options()).ok().flatten();
    let schedule = job.as_ref().and_then(|job| job.schedule.as_ref());
    let now = now_micros();
    let record = state.registry.job_record(name).await?;
    let mut runs = UnitRuns {
        name: name.to_string(),
        schedule: schedule.map(ToString::to_string),
        next_elapse: schedule.and_then(|spec| spec.next_after(now)).map(rfc3339_of_micros),
        ..UnitRuns::default()
    };
    if let Some(record) = record {
        fill(&mut runs, &record);
    }
    Ok(json_response(StatusCode::OK, &runs))
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
        (Some(outcome), _) => outcome.word(),
        (None, Some(_)) => "running",
        (None, None) => "waiting",
    };
    let (status, signal, why) = match &run.outcome {
        Some(Outcome::Failed { status, signal }) => (*status, signal.clone(), None),
        Some(Outcome::Lost { why }) => (None, None, Some(why.clone())),
        _ => (None, None, None),
    };
    UnitRun {
        id: run.id,
        elapse: run.elapse.map(rfc3339_of_micros),
        claimed: rfc3339_of_micros(run.claimed),
        machine_id: run.machine.clone(),
        started: run.started.map(rfc3339_of_micros),
        ended: run.ended.map(rfc3339_of_micros),
        state: state.to_string(),
        status,
        signal,
        why,
    }
}

fn now_micros() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}
