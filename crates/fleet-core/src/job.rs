//! The `[X-Fleet]` options of work that ends: `Schedule=` (a calendar expression, as systemd's
//! `OnCalendar=` reads it: the engine starts one run of the unit at each elapse), what happens
//! when an elapse finds the last run still running (`Overlap=`) or came while no engine leader
//! was there to see it (`Missed=`), `Batch=true` (each start of the unit is one run, taken off
//! its machine once it ended, its result kept), and how a failed run is tried again
//! (`Retries=`, `RetryDelay=`, the delay doubling up to [`LONGEST_RETRY_DELAY`]). On a service
//! (neither a batch unit nor on a calendar), `Retries=` moves it to another machine when it
//! fails, with the same doubling delay ([`moves`]).
//!
//! A `Type=oneshot` service without `Batch=` or `Schedule=` stays what it is in the original
//! fleet: it stays on its machine after its run (units that follow it with `MachineOf=` rely on
//! that), and no run of it is kept.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub mod global_runs;
pub mod moves;
pub mod outcome;
pub mod runs;
pub mod tally;

use crate::calendar::CalendarSpec;
use crate::service_values::{parse_systemd_bool, parse_timespan};
use crate::unit_file::{UnitOption, X_FLEET as SECTION, last_value};
use crate::unit_name::UnitNameInfo;

/// The keys this module reads.
pub const KEYS: &[&str] = &["Schedule", "Overlap", "Missed", "Batch", "Retries", "RetryDelay", "KeepRuns"];

pub const MOST_RETRIES: u32 = 100;
/// The most runs a unit may keep (`KeepRuns=`): its whole record is written at each change.
pub const MOST_KEPT_RUNS: usize = 100;
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(10);
const SHORTEST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// The longest a failed run waits before it is tried again, however often it failed.
pub const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// What an elapse does while the unit's last run still runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Overlap {
    /// The elapse is skipped (and recorded as skipped).
    #[default]
    Skip,
    /// The run starts once the last one has finished (one waits at most; a newer elapse
    /// takes the place of a waiting one, which is skipped).
    Queue,
}

/// What becomes of the elapses that passed while no engine leader saw them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Missed {
    /// They are recorded as skipped; the schedule goes on from the next elapse.
    #[default]
    Skip,
    /// The last of them runs once, as soon as a leader sees it.
    Once,
}

/// What a unit that runs to completion, or on a calendar, asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub schedule: Option<CalendarSpec>,
    pub overlap: Overlap,
    pub missed: Missed,
    /// `Batch=true`: each start of the unit is one run, kept, and the unit is taken off its
    /// machine once the run ended.
    pub batch: bool,
    /// How many times a failed run is tried again.
    pub retries: u32,
    /// The wait before the first retry; each further one waits twice as long.
    pub retry_delay: Duration,
    /// How many runs are kept (`KeepRuns=`; the oldest finished ones go first).
    pub kept_runs: usize,
}

impl Job {
    /// Whether the engine keeps the unit's runs (and places it only for a run).
    pub fn keeps_runs(&self) -> bool {
        self.schedule.is_some() || self.batch
    }

    /// Whether this is a service that moves when it fails (`Retries=` without `Batch=` or
    /// `Schedule=`; [`moves`]).
    pub fn moves_on_failure(&self) -> bool {
        !self.keeps_runs() && self.retries > 0
    }

    /// Whether the engine keeps a record of the unit: its runs, or a moving service's stays.
    pub fn is_recorded(&self) -> bool {
        self.keeps_runs() || self.moves_on_failure()
    }

    /// The wait before retry `attempt` (1 for the first): `RetryDelay=` doubled each time, up
    /// to [`LONGEST_RETRY_DELAY`] (or `RetryDelay=` itself, when that is longer).
    pub fn retry_delay_before(&self, attempt: u32) -> Duration {
        let cap = LONGEST_RETRY_DELAY.max(self.retry_delay);
        let doublings = attempt.saturating_sub(1).min(32);
        self.retry_delay.saturating_mul(1u32 << doublings.min(31)).min(cap)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("invalid value {value:?} for [X-Fleet] {option}: {why}")]
    Invalid { option: &'static str, value: String, why: String },
    #[error("[X-Fleet] Schedule= cannot be used on a template ({0}); give it to each instance")]
    ScheduledTemplate(String),
    #[error("[X-Fleet] {0}= needs Schedule=")]
    NeedsSchedule(&'static str),
    #[error("[X-Fleet] {0}= needs Retries=, Batch=true or Schedule=: fleet keeps and retries the runs of those only")]
    NeedsRuns(&'static str),
    #[error(
        "[X-Fleet] Retries= on a global unit: it runs on every machine it may, so it has nowhere to move, and its runs are not retried"
    )]
    GlobalMoves,
}

/// Refuses what this fleet reads but does not run: `Retries=` on a global unit (a global unit
/// on a calendar or a global batch unit runs on every machine: [`global_runs`]; it is not
/// retried, and a global service has nowhere to move). Malformed values are refused by
/// [`job_of`] first.
pub fn refuse_what_is_not_run_yet(options: &[UnitOption]) -> Result<(), JobError> {
    let global = last_value(options, SECTION, "Global")
        .is_some_and(|value| matches!(value.to_ascii_lowercase().as_str(), "true" | "yes" | "1" | "on" | "t"));
    if global && last_value(options, SECTION, "Retries").is_some() {
        return Err(JobError::GlobalMoves);
    }
    Ok(())
}

/// The job options of the unit named `unit_name`: `Ok(None)` for a unit that neither runs to
/// completion nor has a schedule (a service, as before). Every value is checked here, so a
/// unit that enters the cluster has a schedule the engine can follow.
pub fn job_of(unit_name: &str, options: &[UnitOption]) -> Result<Option<Job>, JobError> {
    let fleet = |name: &str| last_value(options, SECTION, name);
    let invalid =
        |option: &'static str, value: &str, why: String| JobError::Invalid { option, value: value.to_string(), why };
    let schedule = match fleet("Schedule") {
        None => None,
        Some(value) => {
            if UnitNameInfo::new(unit_name).is_template() {
                return Err(JobError::ScheduledTemplate(unit_name.to_string()));
            }
            let spec =
                CalendarSpec::parse(value.trim()).map_err(|error| invalid("Schedule", value, error.to_string()))?;
            spec.check_interval().map_err(|error| invalid("Schedule", value, error.to_string()))?;
            Some(spec)
        }
    };
    let choice = |option: &'static str| -> Result<Option<&str>, JobError> {
        match fleet(option) {
            Some(_) if schedule.is_none() => Err(JobError::NeedsSchedule(option)),
            other => Ok(other),
        }
    };
    let overlap = match choice("Overlap")? {
        None => Overlap::default(),
        Some(value) => value.parse().map_err(|why: String| invalid("Overlap", value, why))?,
    };
    let missed = match choice("Missed")? {
        None => Missed::default(),
        Some(value) => value.parse().map_err(|why: String| invalid("Missed", value, why))?,
    };
    let batch = match fleet("Batch") {
        None => false,
        Some(value) => parse_systemd_bool(value)
            .ok_or_else(|| invalid("Batch", value, "expected a boolean (yes or no)".to_string()))?,
    };
    let keeps_runs = batch || schedule.is_some();
    let retries =
        match fleet("Retries") {
            None => 0,
            Some(value) => value.trim().parse::<u32>().ok().filter(|n| *n <= MOST_RETRIES).ok_or_else(|| {
                invalid("Retries", value, format!("expected a whole number from 0 to {MOST_RETRIES}"))
            })?,
        };
    // On a service, `Retries=` moves it when it fails, and its stays are kept as runs.
    let kept = |option: &'static str| -> Result<Option<&str>, JobError> {
        match fleet(option) {
            Some(_) if !keeps_runs && retries == 0 => Err(JobError::NeedsRuns(option)),
            other => Ok(other),
        }
    };
    let retry_delay = match kept("RetryDelay")? {
        None => DEFAULT_RETRY_DELAY,
        Some(value) => match parse_timespan(value) {
            Ok(Some(span)) if (SHORTEST_RETRY_DELAY..=Duration::from_secs(86_400)).contains(&span) => span,
            Ok(_) => return Err(invalid("RetryDelay", value, "expected a time span from 1s to 1d".to_string())),
            Err(error) => return Err(invalid("RetryDelay", value, error.to_string())),
        },
    };
    let kept_runs = match kept("KeepRuns")? {
        None => runs::DEFAULT_KEPT_RUNS,
        Some(value) => {
            value.trim().parse::<usize>().ok().filter(|n| (1..=MOST_KEPT_RUNS).contains(n)).ok_or_else(|| {
                invalid("KeepRuns", value, format!("expected a whole number from 1 to {MOST_KEPT_RUNS}"))
            })?
        }
    };
    if !keeps_runs && retries == 0 {
        return Ok(None);
    }
    Ok(Some(Job { schedule, overlap, missed, batch, retries, retry_delay, kept_runs }))
}

impl FromStr for Overlap {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "skip" => Ok(Overlap::Skip),
            "queue" => Ok(Overlap::Queue),
            // One unit runs on one machine at a time: a second run beside the first would be a
            // second unit, so `allow` is not offered.
            _ => Err("expected skip or queue".to_string()),
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
        })
    }
}

impl FromStr for Missed {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "skip" => Ok(Missed::Skip),
            "once" => Ok(Missed::Once),
            _ => Err("expected skip or once".to_string()),
        }
    }
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Missed::Skip => "skip",
            Missed::Once => "once",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_file::UnitFile;

    fn job(name: &str, text: &str) -> Result<Option<Job>, String> {
        let file = UnitFile::parse(text).expect("a unit");
        job_of(name, file.options()).map_err(|error| error.to_string())
    }

    #[test]
    fn a_scheduled_unit_reads_its_options_and_their_defaults() {
        let read = job("backup.service", "[Service]\nType=oneshot\n[X-Fleet]\nSchedule=Mon..Fri 02:00 Europe/Berlin\n")
            .expect("valid")
            .expect("a job");
        assert_eq!(
            read.schedule.as_ref().map(ToString::to_string).as_deref(),
            Some("Mon..Fri *-*-* 02:00:00 Europe/Berlin")
        );
        assert_eq!((read.overlap, read.missed, read.batch), (Overlap::Skip, Missed::Skip, false));
        assert_eq!((read.retries, read.retry_delay, read.kept_runs), (0, DEFAULT_RETRY_DELAY, 20));
        let read = job(
            "report.service",
            "[X-Fleet]\nSchedule=hourly\nOverlap=queue\nMissed=once\nBatch=yes\nRetries=3\nRetryDelay=30s\nKeepRuns=50\n",
        )
        .expect("valid")
        .expect("a job");
        assert_eq!((read.overlap, read.missed, read.retries, read.kept_runs), (Overlap::Queue, Missed::Once, 3, 50));
        assert_eq!(read.retry_delay_before(1), Duration::from_secs(30));
        assert_eq!(read.retry_delay_before(3), Duration::from_secs(120));
        assert_eq!(read.retry_delay_before(40), LONGEST_RETRY_DELAY);
        assert_eq!(job("web.service", "[Service]\nExecStart=/bin/web\n"), Ok(None));
        assert_eq!(job("setup.service", "[Service]\nType=oneshot\nRemainAfterExit=yes\n"), Ok(None), "as the original");
        let read = job("migrate.service", "[Service]\nType=oneshot\n[X-Fleet]\nBatch=true\nRetries=2\n")
            .expect("valid")
            .expect("a job");
        assert!(read.batch && read.keeps_runs() && read.schedule.is_none() && !read.moves_on_failure());
        let read = job("web.service", "[Service]\nExecStart=/bin/web\n[X-Fleet]\nRetries=3\nRetryDelay=1m\n")
            .expect("valid")
            .expect("a service that moves");
        assert!(read.moves_on_failure() && read.is_recorded() && !read.keeps_runs());
        assert_eq!((read.retries, read.retry_delay), (3, Duration::from_secs(60)));
        let file = UnitFile::parse(
            "[X-Fleet]\nSchedule=daily\nOverlap=queue\nMissed=once\nBatch=1\nRetries=1\nRetryDelay=5s\nKeepRuns=3\n",
        )
        .expect("a unit");
        assert_eq!(crate::unknown_options::unknown_options(file.options()), vec![], "fleet knows its job keys");
    }

    #[test]
    fn global_units_take_no_runs_and_no_moves() {
        let refused = |text: &str| {
            let file = UnitFile::parse(text).expect("a unit");
            refuse_what_is_not_run_yet(file.options()).map_err(|error| error.to_string())
        };
        assert_eq!(
            refused("[X-Fleet]\nGlobal=true\nRetries=2\n"),
            Err("[X-Fleet] Retries= on a global unit: it runs on every machine it may, so it has nowhere to move, and its runs are not retried".to_string())
        );
        assert_eq!(refused("[X-Fleet]\nGlobal=true\nSchedule=daily\n"), Ok(()), "on every machine at each elapse");
        assert_eq!(refused("[X-Fleet]\nGlobal=true\nBatch=true\n"), Ok(()), "on every machine at each start");
        assert_eq!(refused("[X-Fleet]\nGlobal=true\n"), Ok(()));
        assert_eq!(refused("[X-Fleet]\nRetries=2\n"), Ok(()));
    }

    #[test]
    fn bad_job_options_are_refused_naming_the_option() {
        let error = |name: &str, text: &str| job(name, text).expect_err(text);
        assert_eq!(
            error("a.service", "[X-Fleet]\nSchedule=Mon *-*-* 25:00\n"),
            "invalid value \"Mon *-*-* 25:00\" for [X-Fleet] Schedule: the hour 25 is outside 0..23"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nSchedule=*:*:*\n"),
            "invalid value \"*:*:*\" for [X-Fleet] Schedule: it elapses 1 s after the elapse before it, more often than fleet runs a unit (every 2 s at most)"
        );
        assert_eq!(
            error("backup@.service", "[X-Fleet]\nSchedule=daily\n"),
            "[X-Fleet] Schedule= cannot be used on a template (backup@.service); give it to each instance"
        );
        assert!(job("backup@db.service", "[X-Fleet]\nSchedule=daily\n").is_ok_and(|job| job.is_some()));
        assert_eq!(error("a.service", "[X-Fleet]\nOverlap=skip\n"), "[X-Fleet] Overlap= needs Schedule=");
        assert_eq!(
            error("a.service", "[X-Fleet]\nSchedule=daily\nOverlap=allow\n"),
            "invalid value \"allow\" for [X-Fleet] Overlap: expected skip or queue"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nSchedule=daily\nMissed=all\n"),
            "invalid value \"all\" for [X-Fleet] Missed: expected skip or once"
        );
        assert_eq!(
            error("a.service", "[Service]\nType=oneshot\n[X-Fleet]\nRetryDelay=3s\n"),
            "[X-Fleet] RetryDelay= needs Retries=, Batch=true or Schedule=: fleet keeps and retries the runs of those only"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nBatch=true\nRetries=1000\n"),
            "invalid value \"1000\" for [X-Fleet] Retries: expected a whole number from 0 to 100"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nBatch=true\nRetryDelay=0\n"),
            "invalid value \"0\" for [X-Fleet] RetryDelay: expected a time span from 1s to 1d"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nBatch=true\nKeepRuns=0\n"),
            "invalid value \"0\" for [X-Fleet] KeepRuns: expected a whole number from 1 to 100"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nKeepRuns=5\n"),
            "[X-Fleet] KeepRuns= needs Retries=, Batch=true or Schedule=: fleet keeps and retries the runs of those only"
        );
        assert_eq!(
            error("a.service", "[X-Fleet]\nBatch=maybe\n"),
            "invalid value \"maybe\" for [X-Fleet] Batch: expected a boolean (yes or no)"
        );
    }
}
