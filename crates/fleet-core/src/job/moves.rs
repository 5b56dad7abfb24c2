//! A service that moves when it fails (`[X-Fleet] Retries=` on a unit that is neither a batch
//! unit nor on a calendar). The original fleet leaves a failed service failed where it is; with
//! `Retries=N`, the engine takes a service its machine reports `failed` off that machine, waits
//! `RetryDelay=` (doubling with each failure in a row, up to [`super::LONGEST_RETRY_DELAY`]) and
//! places it again, away from the machines it failed on whenever another machine takes it. After
//! N moves in a row it stays off every machine, and its reason says so, instead of moving
//! forever. A stay that lasted [`STEADY_MICROS`] before it failed starts the row afresh.
//!
//! The unit's [`JobRecord`] keeps its stays as runs: one per machine it was placed on, begun
//! when the engine first sees it placed there, ended when that machine reports it failed, when
//! it is placed elsewhere or nowhere (a drain, a machine lost, a stop). Unlike a batch unit's
//! run, a stay is not claimed before it is placed and is not pinned to its machine: the planner
//! moves the service as any other, and a fleetd restart takes it over as any other. A failed
//! stay is let go of once its machine no longer reports the unit, so that the next stay never
//! meets the last one's `failed`.

use super::Job;
use super::runs::{JobRecord, Outcome, Run};
use crate::UnitState;

/// A stay this long before it failed was a steady one: the failures before it are forgotten.
pub const STEADY_MICROS: i64 = 10 * 60 * 1_000_000;

/// What the engine sees of a service that moves on failure, for [`follow`].
pub struct Seen<'a> {
    /// Whether its desired state is `launched`.
    pub wanted: bool,
    /// The machine it is placed on now.
    pub placed_on: Option<&'a str>,
    /// What `machine` reports of the unit, if it reports it.
    pub report_on: &'a dyn Fn(&str) -> Option<&'a UnitState>,
    /// Whether `machine` is in the cluster.
    pub present: &'a dyn Fn(&str) -> bool,
}

/// Where the planner is to see the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// As its desired state says, anywhere.
    AsWanted,
    /// As its desired state says, away from these machines when another takes it.
    Avoiding(Vec<String>),
    /// Off every machine for now, with why (its reason as `list-unit-files` shows it).
    Off(String),
}

/// What [`follow`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    pub record: JobRecord,
    pub place: Place,
    /// When its next try is due, while it waits for one.
    pub next_due: Option<i64>,
}

/// One step of a service that moves on failure at `now`: its stay begun, ended or let go of by
/// what `seen` says, and where the planner is to see it.
pub fn follow(job: &Job, record: &JobRecord, seen: &Seen<'_>, now: i64) -> Followed {
    let mut record = record.clone();
    if !seen.wanted {
        if let Some(stay) = record.runs.iter_mut().rev().find(|run| run.is_active()) {
            end(stay, Outcome::Stopped, now);
            stay.released = true;
        }
        record.stopped_since_run |= !record.runs.is_empty();
        return Followed { record, place: Place::AsWanted, next_due: None };
    }
    if let Some(stay) = record.runs.iter_mut().rev().find(|run| run.is_active()) {
        let machine = stay.machine.clone().unwrap_or_default();
        let report = (seen.report_on)(&machine);
        if !(seen.present)(&machine) {
            end(stay, Outcome::Lost { why: format!("machine {machine} was lost") }, now);
            stay.released = true;
        } else if stay.outcome.is_some() {
            stay.released = report.is_none();
        } else if report.is_some_and(|state| state.systemd.active == "failed") {
            end(stay, Outcome::Failed { status: None, signal: None }, now);
            if now.saturating_sub(stay.claimed) >= STEADY_MICROS {
                stay.attempt = 1;
                stay.avoid.clear();
            }
        } else if seen.placed_on != Some(machine.as_str()) {
            end(stay, Outcome::Stopped, now);
            stay.released = true;
        }
    }
    let restarted = std::mem::take(&mut record.stopped_since_run);
    let next = next_stay(job, &record, restarted, now);
    if let (Some((attempt, avoid)), Some(machine)) = (next.stay, seen.placed_on)
        && record.active_run().is_none()
    {
        begin(&mut record, machine, attempt, avoid, now);
    } else if restarted {
        record.stopped_since_run = true;
    }
    record.bound(job.kept_runs);
    Followed { record, place: next.place, next_due: next.due }
}

/// What comes next for a service while no stay holds it.
struct NextStay {
    /// Where the planner is to see it.
    place: Place,
    /// When its next try is due, while it waits for one.
    due: Option<i64>,
    /// The attempt and avoided machines of its next stay, once it is placed (`None` while it
    /// may not be).
    stay: Option<(u32, Vec<String>)>,
}

impl NextStay {
    fn off(place: Place, due: Option<i64>) -> Self {
        Self { place, due, stay: None }
    }
}

/// Where the service goes while no stay holds it, when its next try is due, and what its next
/// stay is.
fn next_stay(job: &Job, record: &JobRecord, restarted: bool, now: i64) -> NextStay {
    if let Some(active) = record.active_run() {
        // Failed, not let go of yet: off its machine, the wait counted from its end.
        let waits = active.outcome.as_ref().and_then(|_| waiting(job, record, now));
        return match waits {
            Some((place, due)) => NextStay::off(place, due),
            None => NextStay::off(Place::AsWanted, None),
        };
    }
    let Some(latest) = record.runs.last().filter(|_| !restarted) else {
        return NextStay { place: Place::AsWanted, due: None, stay: Some((1, Vec::new())) };
    };
    if let Some((place, due)) = waiting(job, record, now) {
        return NextStay::off(place, due);
    }
    // After a failure it goes on away from where it failed; moved, stopped or lost, the row
    // goes on where it was.
    let (attempt, avoid) = match &latest.outcome {
        Some(Outcome::Failed { .. }) => (latest.attempt + 1, latest.avoided_after_failure()),
        _ => (latest.attempt, latest.avoid.clone()),
    };
    let place = if avoid.is_empty() { Place::AsWanted } else { Place::Avoiding(avoid.clone()) };
    NextStay { place, due: None, stay: Some((attempt, avoid)) }
}

/// While the latest stay failed and its next try is not due yet, or its retries are spent: off
/// every machine, with why, and when it is due.
fn waiting(job: &Job, record: &JobRecord, now: i64) -> Option<(Place, Option<i64>)> {
    let latest = record.runs.last()?;
    if !matches!(latest.outcome, Some(Outcome::Failed { .. })) {
        return None;
    }
    let failed = failures_text(latest);
    if latest.attempt > job.retries {
        let spent = format!("{failed}; Retries={} spent: stop and start it to try again", job.retries);
        return Some((Place::Off(spent), None));
    }
    let ended = latest.ended.unwrap_or(now);
    let wait = job.retry_delay_before(latest.attempt);
    let due = ended.saturating_add(i64::try_from(wait.as_micros()).unwrap_or(i64::MAX));
    if due <= now && !latest.is_active() {
        return None;
    }
    let at = crate::civil_time::rfc3339_of_micros(due);
    // Due already, its machine not let go of yet: that machine's report wakes the engine.
    Some((
        Place::Off(format!("{failed}; next try in {}, at {at}", crate::duration::short_span(wait))),
        Some(due).filter(|due| *due > now),
    ))
}

/// `failed on 3 machines`, or `failed 3 times on 2 machines` when some failed it twice.
fn failures_text(latest: &Run) -> String {
    let mut machines: Vec<&String> = latest.avoid.iter().chain(latest.machine.as_ref()).collect();
    machines.sort_unstable();
    machines.dedup();
    let plural = |n: usize| if n == 1 { "machine" } else { "machines" };
    if machines.len() == latest.attempt as usize {
        format!("failed on {} {}", machines.len(), plural(machines.len()))
    } else {
        format!("failed {} times on {} {}", latest.attempt, machines.len(), plural(machines.len()))
    }
}

fn end(stay: &mut Run, outcome: Outcome, at: i64) {
    if stay.outcome.is_none() {
        stay.outcome = Some(outcome);
        stay.ended = Some(at);
    }
}

fn begin(record: &mut JobRecord, machine: &str, attempt: u32, avoid: Vec<String>, now: i64) {
    record.runs.push(Run {
        id: record.next_id,
        elapse: None,
        attempt,
        avoid,
        claimed: now,
        machine: Some(machine.to_string()),
        started: Some(now),
        ended: None,
        outcome: None,
        released: false,
        log: None,
        tally: None,
    });
    record.next_id += 1;
}

#[cfg(test)]
mod tests;
