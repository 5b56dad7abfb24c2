//! The runs of a unit on a calendar or of a batch unit: which elapses of its calendar the engine
//! leader claims for a run, which it skips and why, when a batch unit's start or a failed run's
//! retry is owed a run, and what it keeps of them. One [`JobRecord`] per unit, replaced whole
//! by compare-and-swap: [`advance`] only ever moves the record's cursor forward and claims only
//! elapses after it, so two leaders (or one leader whose write's answer was lost, trying
//! again from what it reads back) never both claim one elapse. That is the at-most-once rule;
//! the at-least-once rule is that every elapse after the schedule began is claimed, queued or
//! recorded as skipped with its reason. A retry (`Retries=`) is a further attempt at the same
//! elapse, claimed only once the attempt before it failed (ended with a status or a signal: a
//! run whose machine was lost is never retried, since whether it ran is not known).

use serde::{Deserialize, Serialize};

pub use super::outcome::Outcome;
use super::tally::Tally;
use super::{Job, Missed, Overlap};
use crate::calendar::MIN_INTERVAL_MICROS;

/// An elapse seen at most this late is on time; later, it was missed (`Missed=` decides).
pub const GRACE_MICROS: i64 = 60_000_000;
/// How many runs a unit keeps by default (the oldest finished ones go first).
pub const DEFAULT_KEPT_RUNS: usize = 20;
/// How many of the last lines of a run's log are kept with its end.
pub const LOG_LINES: usize = 20;
/// At most this many bytes of them (the last ones).
pub const LOG_BYTES: usize = 2048;
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
    /// The unit was stopped since its last run: a batch unit's next start is owed a run.
    #[serde(default)]
    pub stopped_since_run: bool,
    /// A run started by hand waits for the run before it, ended, to be let go of.
    #[serde(default)]
    pub owed_by_hand: bool,
}

/// One run of a unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub id: u64,
    /// The elapse it runs for; `None`: not for an elapse (a batch unit's start, or `fleetctl
    /// run`).
    pub elapse: Option<i64>,
    /// 1 for a first run, one more for each retry of it.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The machines the attempts before this one failed on: it goes to one of them only when
    /// no other machine takes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
    /// When it was claimed.
    pub claimed: i64,
    /// The machine it was given to, once placed.
    pub machine: Option<String>,
    pub started: Option<i64>,
    pub ended: Option<i64>,
    /// How it ended; `None` until it did.
    pub outcome: Option<Outcome>,
    /// Whether its machine has let the unit go (or is gone): until then the run holds the
    /// unit, and no other run of it starts.
    #[serde(default)]
    pub released: bool,
    /// The last lines of its log when it ended, as its machine read them ([`log_tail`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// For a global unit's run, which every machine runs: how it ended on each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Box<Tally>>,
}

fn first_attempt() -> u32 {
    1
}

impl Run {
    /// The machines its next attempt is to avoid once it failed: those its attempts before
    /// it failed on, and its own.
    pub fn avoided_after_failure(&self) -> Vec<String> {
        let mut avoid = self.avoid.clone();
        avoid.extend(self.machine.clone());
        avoid.sort_unstable();
        avoid.dedup();
        avoid
    }

    /// Whether it still holds its unit: not ended, or ended and not let go of yet.
    pub fn is_active(&self) -> bool {
        !self.released
    }
}

/// What a machine reports of the run of a unit that runs to completion: when its agent
/// started it (its clock, microseconds since the epoch) and, once the unit manager shows the
/// run's own end (not a start still queued), when and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    pub started: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The last lines of the unit's log once it ended ([`log_tail`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// The number of the run, where the machine knows it (a global unit's ticket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u64>,
}

/// The last [`LOG_LINES`] lines of `text`, and of those the last [`LOG_BYTES`] bytes (cut at a
/// character's start); `None` when nothing is left.
pub fn log_tail(text: &str) -> Option<String> {
    let text = text.trim_end();
    let from_line = text.rmatch_indices('\n').nth(LOG_LINES - 1).map_or(0, |(at, _)| at + 1);
    let mut from = from_line.max(text.len().saturating_sub(LOG_BYTES));
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let tail = &text[from..];
    (!tail.is_empty()).then(|| tail.to_string())
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

impl SkipReason {
    /// One word for it, as metrics label it: `missed`, `overlap` or `too_soon`.
    pub fn word(self) -> &'static str {
        match self {
            SkipReason::Missed => "missed",
            SkipReason::Overlap => "overlap",
            SkipReason::TooSoon => "too_soon",
        }
    }
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
    /// When the next step is due: the next elapse, or a failed run's retry (`None`: nothing
    /// is due on the clock).
    pub next_due: Option<i64>,
}

impl JobRecord {
    /// The record of a schedule first seen at `now`: nothing before it is owed.
    pub fn new(now: i64) -> Self {
        Self {
            cursor: now,
            next_id: 1,
            runs: Vec::new(),
            queued: None,
            skips: Vec::new(),
            stopped_since_run: false,
            owed_by_hand: false,
        }
    }

    pub fn active_run(&self) -> Option<&Run> {
        self.runs.iter().rev().find(|run| run.is_active())
    }

    fn claim(&mut self, elapse: Option<i64>, now: i64) -> Run {
        self.claim_attempt(elapse, now, 1, Vec::new())
    }

    fn claim_attempt(&mut self, elapse: Option<i64>, now: i64, attempt: u32, avoid: Vec<String>) -> Run {
        let run = Run {
            id: self.next_id,
            elapse,
            attempt,
            avoid,
            claimed: now,
            machine: None,
            started: None,
            ended: None,
            outcome: None,
            released: false,
            log: None,
            tally: None,
        };
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
    pub(crate) fn bound(&mut self, kept: usize) {
        while self.runs.len() > kept.max(1) {
            match self.runs.iter().position(|run| !run.is_active()) {
                Some(oldest) => {
                    self.runs.remove(oldest);
                }
                None => break,
            }
        }
    }

    /// When the latest run, failed, is owed a retry by `job`, and the attempt that retry is:
    /// `None` while a run is active, when it did not fail, or when its retries are spent.
    pub fn retry_due(&self, job: &Job) -> Option<(i64, u32)> {
        let latest = self.runs.last().filter(|run| !run.is_active())?;
        let (Some(Outcome::Failed { .. }), Some(ended)) = (&latest.outcome, latest.ended) else { return None };
        if latest.attempt > job.retries {
            return None;
        }
        let wait = i64::try_from(job.retry_delay_before(latest.attempt).as_micros()).unwrap_or(i64::MAX);
        Some((ended.saturating_add(wait), latest.attempt + 1))
    }

    /// The elapse of the latest run that had one.
    fn last_run_elapse(&self) -> Option<i64> {
        self.runs.iter().rev().find_map(|run| run.elapse)
    }
}

/// One step of `job` at `now` from `record`, for a unit whose desired state asks for its runs:
/// a failed run's retry starts once its delay passed; a queued elapse starts once no run is
/// active; a batch unit without a schedule runs once per start; the elapses due since the
/// cursor are claimed or skipped by the unit's rules (the latest one runs if it is on time, or
/// late with `Missed=once`; the others are skipped); the cursor moves to the latest elapse due.
pub fn advance(job: &Job, record: &JobRecord, now: i64, kept: usize) -> Advance {
    let mut record = record.clone();
    let mut claimed = None;
    let mut skipped = Vec::new();
    let mut retry_at = None;
    // A unit stopped and started again begins afresh: the retries of its last run are dropped.
    let restarted = std::mem::take(&mut record.stopped_since_run);
    if record.owed_by_hand && record.active_run().is_none() {
        record.owed_by_hand = false;
        claimed = Some(record.claim(None, now));
    } else if let Some((due, attempt)) = record.retry_due(job).filter(|_| !restarted) {
        if due <= now {
            let (elapse, avoid) =
                record.runs.last().map(|run| (run.elapse, run.avoided_after_failure())).unwrap_or_default();
            claimed = Some(record.claim_attempt(elapse, now, attempt, avoid));
        } else {
            retry_at = Some(due);
        }
    }
    if claimed.is_none()
        && record.active_run().is_none()
        && let Some(elapse) = record.queued.take()
    {
        claimed = Some(record.claim(Some(elapse), now));
    }
    let owed_a_start = job.batch && job.schedule.is_none() && (record.runs.is_empty() || restarted);
    if owed_a_start && claimed.is_none() && record.active_run().is_none() {
        claimed = Some(record.claim(None, now));
    }
    let Some(spec) = &job.schedule else {
        record.bound(kept);
        return Advance { record, claimed, skipped, next_due: retry_at };
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
    let next_due = earliest(next_elapse, retry_at);
    Advance { record, claimed, skipped, next_due }
}

/// The earlier of two times either of which may be absent: when the next of two things is due.
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What the machines say of a unit whose record this is, for [`observe`].
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// Whether its desired state still asks for its runs (`launched`).
    pub wanted: bool,
    /// What the machine of the active run reports of the unit, if it reports it.
    pub report: Option<&'a crate::UnitState>,
    /// Whether the machine of the active run is still in the cluster.
    pub machine_present: bool,
}

/// The record once what the machines say of the active run is taken in: it began when its
/// machine reports a run of it; it ended when that report says so; its machine gone, it was
/// lost (not run again: whether it ran is not known); the unit no longer wanted, it was
/// stopped. It is let go of ([`Run::released`]) once its machine no longer reports the unit
/// after it ended (or is gone), so that the next run never meets the last one's report.
pub fn observe(record: &JobRecord, seen: Seen<'_>, now: i64) -> JobRecord {
    let mut record = record.clone();
    if !seen.wanted && record.active_run().is_none() && !record.runs.is_empty() {
        record.stopped_since_run = true;
    }
    if !seen.wanted {
        // A run started by hand and still owed is dropped with the stop, as a running one is
        // stopped.
        record.owed_by_hand = false;
    }
    let Some(run) = record.runs.iter_mut().rev().find(|run| run.is_active()) else { return record };
    let end = |run: &mut Run, outcome: Outcome, at: i64| {
        if run.outcome.is_none() {
            run.outcome = Some(outcome);
            run.ended = Some(at);
        }
    };
    let Some(machine) = run.machine.clone() else {
        // Not placed yet: nothing ran, nothing to let go of.
        if !seen.wanted {
            end(run, Outcome::Stopped, now);
            run.released = true;
        }
        return record;
    };
    if !seen.machine_present {
        end(run, Outcome::Lost { why: format!("machine {machine} was lost") }, now);
        run.released = true;
        return record;
    }
    match seen.report.and_then(|state| state.run.as_ref()) {
        Some(report) => {
            run.started.get_or_insert(report.started);
            if let Some(outcome) = &report.outcome {
                if run.outcome.is_none() {
                    run.log = report.log.as_deref().and_then(log_tail);
                }
                end(run, outcome.clone(), report.ended.unwrap_or(now));
            }
        }
        None if seen.report.is_none() && (run.started.is_some() || run.outcome.is_some()) => {
            end(run, Outcome::Lost { why: format!("machine {machine} let it go before it reported an end") }, now);
            run.released = true;
        }
        None => {}
    }
    if !seen.wanted {
        end(run, Outcome::Stopped, now);
    }
    record
}

/// Whether the active run's unit is wanted on its machine now: placed and not ended. An ended
/// run's unit is taken off (its machine then lets it go), and a unit without an active run is
/// not placed at all.
pub fn runs_now(record: &JobRecord) -> Option<RunPlace<'_>> {
    let run = record.active_run()?;
    if run.outcome.is_some() {
        return None;
    }
    Some(match &run.machine {
        Some(machine) => RunPlace::On(machine),
        None => RunPlace::Anywhere,
    })
}

/// Where the active run of a unit is to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunPlace<'a> {
    /// Claimed, not placed yet: where the planner puts it (then recorded before it is written).
    Anywhere,
    /// On the machine recorded for it, and nowhere else.
    On(&'a str),
}

/// The record with the active run given to `machine` (the planner placed it there): written
/// before the placement, so that a run is only ever placed once.
pub fn placed(record: &JobRecord, machine: &str) -> Option<JobRecord> {
    let mut record = record.clone();
    let run = record.runs.iter_mut().rev().find(|run| run.is_active() && run.machine.is_none())?;
    run.machine = Some(machine.to_string());
    Some(record)
}

/// The elapse just before `elapse`, searching from `from` (an elapse itself).
fn before(spec: &crate::calendar::CalendarSpec, elapse: i64, from: i64) -> i64 {
    spec.last_at_or_before(elapse - 1, from - 1).unwrap_or(from)
}

/// A run started by hand now (`fleetctl run`): claimed at once, or, while the run before it
/// has ended but its machine has not let the unit go yet, owed (claimed by the engine's next
/// step once it has). Refused while a run still runs, as an elapse would be skipped.
pub fn dispatch(record: &JobRecord, now: i64, kept: usize) -> Result<Dispatched, DispatchError> {
    let mut record = record.clone();
    match record.active_run() {
        Some(active) if active.outcome.is_none() => return Err(DispatchError::Active(active.id)),
        Some(_) if record.owed_by_hand => return Err(DispatchError::Owed(record.next_id)),
        Some(_) => {
            record.owed_by_hand = true;
            let id = record.next_id;
            return Ok(Dispatched { record, id, claimed: false });
        }
        None => {}
    }
    let run = record.claim(None, now);
    record.bound(kept);
    Ok(Dispatched { record, id: run.id, claimed: true })
}

/// What [`dispatch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched {
    /// The record to store (by compare-and-swap over the one read).
    pub record: JobRecord,
    /// The number the run has, or will have once claimed.
    pub id: u64,
    /// Whether it was claimed at once (else it is owed).
    pub claimed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    #[error("run {0} is still running")]
    Active(u64),
    #[error("run {0} was started by hand already and waits for the run before it to be let go of")]
    Owed(u64),
}

#[cfg(test)]
mod tests;
