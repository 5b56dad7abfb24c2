//! A scheduled unit's runs: which elapses of its calendar the engine leader claims for a run,
//! which it skips and why, and what it keeps of them. One [`JobRecord`] per unit, replaced whole
//! by compare-and-swap: [`advance`] only ever moves the record's cursor forward and claims only
//! elapses after it, so two leaders (or one leader whose write's answer was lost, trying
//! again from what it reads back) never both claim one elapse. That is the at-most-once rule;
//! the at-least-once rule is that every elapse after the schedule began is claimed, queued or
//! recorded as skipped with its reason.

use serde::{Deserialize, Serialize};

use super::{Job, Missed, Overlap};
use crate::calendar::MIN_INTERVAL_MICROS;

/// An elapse seen at most this late is on time; later, it was missed (`Missed=` decides).
pub const GRACE_MICROS: i64 = 60_000_000;
/// How many runs a unit keeps by default (the oldest finished ones go first).
pub const DEFAULT_KEPT_RUNS: usize = 20;
/// How many ranges of skipped elapses a record keeps.
const KEPT_SKIPS: usize = 10;

/// What fleet keeps of one unit's schedule and runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The latest elapse dealt with (claimed, queued or skipped), in microseconds since the
    /// epoch: elapses at or before it are never claimed again. Starts where the schedule was
    /// first seen, so that nothing before is owed.
    pub cursor: i64,
    /// The number the next run gets.
    pub next_id: u64,
    /// Oldest first; finished ones beyond the bound are dropped, active ones never.
    pub runs: Vec<Run>,
    /// An elapse waiting for the active run to end (`Overlap=queue`; at most one waits).
    pub queued: Option<i64>,
    /// The latest ranges of skipped elapses, oldest first.
    pub skips: Vec<Skipped>,
}

/// One run of a unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub id: u64,
    /// The elapse it runs for; `None`: started by hand (`fleetctl run`).
    pub elapse: Option<i64>,
    /// When it was claimed.
    pub claimed: i64,
    /// The machine it was given to, once placed.
    pub machine: Option<String>,
    pub started: Option<i64>,
    pub ended: Option<i64>,
    /// `None` while it is active.
    pub outcome: Option<Outcome>,
}

impl Run {
    pub fn is_active(&self) -> bool {
        self.outcome.is_none()
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Succeeded,
    /// Exited with a status other than 0, or was killed by a signal.
    Failed {
        status: Option<i32>,
        signal: Option<String>,
    },
    /// Its machine was lost before it reported an end: whether it ran is not known, and it is
    /// not run again for the same elapse.
    Lost {
        why: String,
    },
}

/// A range of elapses skipped for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub first: i64,
    pub last: i64,
    pub why: SkipReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SkipReason {
    /// No leader saw them in time and `Missed=skip` (or a later one ran instead).
    Missed,
    /// The last run still ran (`Overlap=skip`, or a queued elapse replaced by a newer one).
    Overlap,
    /// Closer to the run before than fleet runs a unit ([`MIN_INTERVAL_MICROS`]).
    TooSoon,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::Missed => "missed: no engine leader saw it in time",
            SkipReason::Overlap => "the run before was still running",
            SkipReason::TooSoon => "too soon after the run before",
        })
    }
}

/// What one step of a schedule did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The record to store (by compare-and-swap over the one read).
    pub record: JobRecord,
    /// The run claimed by this step, if one was.
    pub claimed: Option<Run>,
    /// The ranges this step skipped.
    pub skipped: Vec<Skipped>,
    /// When the next elapse is due (`None`: never again).
    pub next_elapse: Option<i64>,
}

impl JobRecord {
    /// The record of a schedule first seen at `now`: nothing before it is owed.
    pub fn new(now: i64) -> Self {
        Self { cursor: now, next_id: 1, runs: Vec::new(), queued: None, skips: Vec::new() }
    }

    pub fn active_run(&self) -> Option<&Run> {
        self.runs.iter().rev().find(|run| run.is_active())
    }

    fn claim(&mut self, elapse: Option<i64>, now: i64) -> Run {
        let run =
            Run { id: self.next_id, elapse, claimed: now, machine: None, started: None, ended: None, outcome: None };
        self.next_id += 1;
        self.runs.push(run.clone());
        run
    }

    fn skip(&mut self, skipped: &mut Vec<Skipped>, first: i64, last: i64, why: SkipReason) {
        let range = Skipped { first, last, why };
        skipped.push(range.clone());
        self.skips.push(range);
        let excess = self.skips.len().saturating_sub(KEPT_SKIPS);
        self.skips.drain(..excess);
    }

    /// Drops the oldest finished runs beyond `kept`.
    fn bound(&mut self, kept: usize) {
        while self.runs.len() > kept.max(1) {
            match self.runs.iter().position(|run| !run.is_active()) {
                Some(oldest) => {
                    self.runs.remove(oldest);
                }
                None => break,
            }
        }
    }

    /// The elapse of the latest run that had one.
    fn last_run_elapse(&self) -> Option<i64> {
        self.runs.iter().rev().find_map(|run| run.elapse)
    }
}

/// One step of `job`'s schedule at `now` from `record`: a queued elapse starts once no run is
/// active; the elapses due since the cursor are claimed or skipped by the unit's rules (the
/// latest one runs if it is on time, or late with `Missed=once`; the others are skipped); the
/// cursor moves to the latest elapse due. A unit without a schedule only has its runs bounded.
pub fn advance(job: &Job, record: &JobRecord, now: i64, kept: usize) -> Advance {
    let mut record = record.clone();
    let mut claimed = None;
    let mut skipped = Vec::new();
    if record.active_run().is_none()
        && let Some(elapse) = record.queued.take()
    {
        claimed = Some(record.claim(Some(elapse), now));
    }
    let Some(spec) = &job.schedule else {
        record.bound(kept);
        return Advance { record, claimed, skipped, next_elapse: None };
    };
    if let Some(first) = spec.next_after(record.cursor).filter(|first| *first <= now) {
        let last = spec.last_at_or_before(now, record.cursor).unwrap_or(first);
        record.cursor = last;
        let on_time = last > now - GRACE_MICROS;
        let runs_now = on_time || job.missed == Missed::Once;
        if first < last {
            record.skip(&mut skipped, first, before(spec, last, first), SkipReason::Missed);
        }
        if !runs_now {
            record.skip(&mut skipped, last, last, SkipReason::Missed);
        } else if record.last_run_elapse().is_some_and(|previous| last - previous < MIN_INTERVAL_MICROS) {
            record.skip(&mut skipped, last, last, SkipReason::TooSoon);
        } else if record.active_run().is_some() || claimed.is_some() {
            match job.overlap {
                Overlap::Skip => record.skip(&mut skipped, last, last, SkipReason::Overlap),
                Overlap::Queue => {
                    if let Some(replaced) = record.queued.replace(last) {
                        record.skip(&mut skipped, replaced, replaced, SkipReason::Overlap);
                    }
                }
            }
        } else {
            claimed = Some(record.claim(Some(last), now));
        }
    }
    record.bound(kept);
    let next_elapse = spec.next_after(record.cursor.max(now));
    Advance { record, claimed, skipped, next_elapse }
}

/// The elapse just before `elapse`, searching from `from` (an elapse itself).
fn before(spec: &crate::calendar::CalendarSpec, elapse: i64, from: i64) -> i64 {
    spec.last_at_or_before(elapse - 1, from - 1).unwrap_or(from)
}

/// A run started by hand now (`fleetctl run`): refused while one is active, as an elapse
/// would be skipped.
pub fn dispatch(record: &JobRecord, now: i64, kept: usize) -> Result<(JobRecord, Run), DispatchError> {
    if let Some(active) = record.active_run() {
        return Err(DispatchError::Active(active.id));
    }
    let mut record = record.clone();
    let run = record.claim(None, now);
    record.bound(kept);
    Ok((record, run))
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    #[error("run {0} is still running")]
    Active(u64),
}

#[cfg(test)]
mod tests;
