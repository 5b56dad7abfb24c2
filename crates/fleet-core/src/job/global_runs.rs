//! A global unit on a calendar (`Global=true` with `Schedule=`): at each elapse every machine
//! it may run on runs it once. A global batch unit (`Global=true` with `Batch=true`) the same
//! at each start, and a machine that comes later runs the current start's run too. The engine leader claims the elapse in the unit's
//! [`JobRecord`] as for any unit on a calendar (by compare-and-swap: never twice), and
//! publishes it as a [`RunTicket`] every machine's work carries; each machine's agent starts
//! the unit once for that ticket ([`here`]), reports the run with the ticket's number, and the
//! leader counts each machine's end into the run's [`Tally`] ([`step`]).
//!
//! At most once per machine: an agent starts a ticket at most once while it runs, and never
//! the ticket it finds when it starts (an earlier fleetd may have run it). A machine that
//! comes later than [`super::runs::GRACE_MICROS`] after the elapse runs it only with
//! `Missed=once`. `Overlap=` applies per machine: a ticket that comes while the run before
//! still runs there is skipped there, or (`queue`) run once that run ended.

use serde::{Deserialize, Serialize};

use super::Job;
use super::runs::{self, GRACE_MICROS, JobRecord, RunReport, Skipped};
pub use super::tally::{MachineEnd, Tally};
use super::{Missed, Overlap};

/// The run every machine of a global unit on a calendar is to run, as its work carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTicket {
    /// The run's number in the unit's record.
    pub id: u64,
    /// The elapse it is for, or when it was started by hand (microseconds since the epoch).
    pub elapse: i64,
}

/// How many of the latest runs keep the machines they counted.
const COUNTING_RUNS: usize = 2;

/// What one step of a global unit on a calendar did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalStep {
    pub record: JobRecord,
    /// The ticket every machine's work is to carry (`None`: none, the unit is not wanted).
    pub ticket: Option<RunTicket>,
    pub skipped: Vec<Skipped>,
    pub next_due: Option<i64>,
}

/// One step of global unit `job` at `now`: the machines' ends (`reports`: machine and what it
/// reports of its run) counted into their runs, and, while `wanted`, the elapses due claimed
/// or skipped as for any unit on a calendar, the latest claimed one the ticket.
pub fn step(job: &Job, record: &JobRecord, reports: &[(&str, &RunReport)], wanted: bool, now: i64) -> GlobalStep {
    let mut record = record.clone();
    for (machine, report) in reports {
        let (Some(id), Some(outcome)) = (report.run, &report.outcome) else { continue };
        let Some(tally) = record.runs.iter_mut().find(|run| run.id == id).and_then(|run| run.tally.as_mut()) else {
            continue;
        };
        if !tally.counted.iter().any(|counted| counted == machine) {
            tally.count(machine, outcome);
        }
    }
    if !wanted {
        // A batch unit started again is owed a run.
        record.stopped_since_run |= !record.runs.is_empty();
        return GlobalStep { record, ticket: None, skipped: Vec::new(), next_due: None };
    }
    let advanced = runs::advance(job, &record, now, job.kept_runs);
    let mut record = advanced.record;
    // A run claimed now, or by hand (`fleetctl run`), is held by no one machine: every
    // machine runs it on its own.
    for run in record.runs.iter_mut().filter(|run| !run.released && run.machine.is_none()) {
        run.released = true;
        run.tally = Some(Box::default());
    }
    let counting = record.runs.len().saturating_sub(COUNTING_RUNS);
    for run in &mut record.runs[..counting] {
        if let Some(tally) = run.tally.as_mut() {
            tally.counted.clear();
        }
    }
    let ticket = record
        .runs
        .iter()
        .rev()
        .find(|run| run.tally.is_some())
        .map(|run| RunTicket { id: run.id, elapse: run.elapse.unwrap_or(run.claimed) });
    GlobalStep { record, ticket, skipped: advanced.skipped, next_due: advanced.next_due }
}

/// What one machine's agent knows of a global unit on a calendar, for [`here`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HereSeen {
    /// The ticket its work carried when this fleetd started: never run here (an earlier
    /// fleetd may have run it).
    pub baseline: Option<u64>,
    /// The latest ticket this fleetd started or skipped.
    pub last: Option<u64>,
    /// Whether the run it started last still runs.
    pub running: bool,
}

/// What a machine does about a global unit on a calendar now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Here {
    /// Start the run of this ticket.
    Start(u64),
    /// Leave the run under way running.
    Running,
    /// Nothing runs: the unit stays loaded, not started.
    Idle,
    /// This ticket is not run here (the run before still runs with `Overlap=skip`, or it
    /// came too late with `Missed=skip`): it counts as dealt with.
    Skip(u64),
}

/// What a machine does about a global unit on a calendar, given the ticket its work carries.
pub fn here(job: &Job, ticket: Option<&RunTicket>, seen: &HereSeen, now: i64) -> Here {
    let fresh =
        ticket.filter(|ticket| seen.last.is_none_or(|last| ticket.id > last) && seen.baseline != Some(ticket.id));
    if seen.running {
        return match fresh {
            Some(ticket) if job.overlap == Overlap::Skip => Here::Skip(ticket.id),
            _ => Here::Running,
        };
    }
    match fresh {
        None => Here::Idle,
        // A batch unit's start is never late: a machine that comes later runs it then.
        Some(ticket) if job.schedule.is_some() && ticket.elapse <= now - GRACE_MICROS && job.missed == Missed::Skip => {
            Here::Skip(ticket.id)
        }
        Some(ticket) => Here::Start(ticket.id),
    }
}

#[cfg(test)]
mod tests;
