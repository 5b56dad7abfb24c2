//! The runs of units on a calendar or batch units (`Schedule=`, `Batch=true`; "scheduled
//! units" here) on this machine: a scheduled unit is started at most once per load (the engine
//! gives it to a machine for one run, and takes it off once that run ended), its run is reported with when it started and, once the unit
//! manager shows the run's own end, how it ended. A scheduled unit this agent did not load
//! itself (an earlier fleetd did, before a restart) is never started: whether its run already
//! ran is not known here, so it is reported lost, and the engine does not run that elapse again.
//! Nor is one this fleetd found given to its machine when it started (loaded by its first pass):
//! under the native supervisor a unit dies with the fleetd that ran it, so a fresh load does not
//! prove a fresh run. Nor is one this agent stopped and unloaded itself (its presence lapsed,
//! it was cut off) and finds given to it again: the run it had started is over (reported lost)
//! and is not started twice; one it had not started yet starts then.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fleet_core::agent_plan::LoadedUnit;
use fleet_core::job::Job;
use fleet_core::job::global_runs::{Here, HereSeen, RunTicket, here};
use fleet_core::job::runs::{LOG_LINES, Outcome, RunReport, log_tail};
use fleet_core::{Requirements, UnitFile, UnitHash};
use fleet_unit_manager::UnitManager;

const ADOPTED: &str = "fleetd restarted while this machine held the run; whether it ran is not known";
const SET_ASIDE: &str = "fleetd stopped it while its machine was out of touch";

#[derive(Debug, Default)]
pub struct RunBook {
    /// Units loaded here whose content runs on a calendar.
    scheduled: BTreeSet<String>,
    /// Units this agent loaded itself; the others it took over from an earlier fleetd.
    loaded_here: BTreeSet<String>,
    runs: BTreeMap<String, RunReport>,
    /// Whether a pass of this agent has done its work: loads before then are of the work this
    /// fleetd found when it started, which an earlier one may have begun running.
    caught_up: bool,
    /// Units this agent stopped and unloaded outside its work (out of touch): their runs are
    /// kept when they are loaded again.
    set_aside: BTreeSet<String>,
    /// Global units on a calendar: what this fleetd knows of their tickets
    /// ([`fleet_core::job::global_runs::here`]).
    globals: BTreeMap<String, HereSeen>,
    /// The ticket a global unit's next start is for.
    starting: BTreeMap<String, u64>,
}

/// Whether `file`, as unit `name`, has its runs kept by the engine (on a calendar, or a batch unit).
fn runs_are_kept(name: &str, file: &UnitFile) -> bool {
    Requirements::from_unit(name, file).job.is_some_and(|job| job.keeps_runs())
}

/// What a global unit on a calendar does here now ([`RunBook::global_wanted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalRunHere {
    /// A new run starts: the unit is started again, whatever ran before.
    Start,
    /// Its run goes on.
    Running,
    /// It stays loaded, not started.
    Idle,
}

/// The job of `file` as unit `name` when it is a global unit on a calendar or a global batch
/// unit: one every machine runs for each ticket.
pub fn global_job(name: &str, file: &UnitFile) -> Option<Job> {
    let requirements = Requirements::from_unit(name, file);
    requirements.job.filter(|job| requirements.global && job.keeps_runs())
}

pub use fleet_runtime::wall_clock::now_micros;

impl RunBook {
    /// `name` was loaded here with `file`: a run of it may start once.
    pub fn loaded(&mut self, name: &str, file: &UnitFile) {
        if self.caught_up {
            self.loaded_here.insert(name.to_string());
        }
        if !self.set_aside.remove(name) {
            self.runs.remove(name);
        }
        if runs_are_kept(name, file) {
            self.scheduled.insert(name.to_string());
        } else {
            self.scheduled.remove(name);
        }
    }

    /// A pass did its work: from now on, what is loaded is loaded for a run this agent saw
    /// given to its machine.
    pub fn caught_up(&mut self) {
        self.caught_up = true;
    }

    /// This agent stopped and unloaded `name` though its work still has it (out of touch): a
    /// run of it under way ended here, and is not started again when `name` comes back.
    pub fn set_aside(&mut self, name: &str, now: i64) {
        // Whether or not this agent loaded it: one it took over (reported lost) is kept as well.
        if !self.scheduled.contains(name) && !self.runs.contains_key(name) {
            return;
        }
        self.set_aside.insert(name.to_string());
        if let Some(run) = self.runs.get_mut(name).filter(|run| run.outcome.is_none()) {
            run.ended = Some(now);
            run.outcome = Some(Outcome::Lost { why: SET_ASIDE.to_string() });
        }
    }

    /// What global unit `name` on a calendar (`job`) is to do here now, given the ticket its
    /// work carries: a ticket is started once, never the one this fleetd found when it
    /// started, and `Overlap=` and `Missed=` apply here. `launched`: whether the unit was
    /// started (by this fleetd, or by the one before: that run is followed to its end).
    pub fn global_wanted(
        &mut self,
        name: &str,
        job: &Job,
        ticket: Option<&RunTicket>,
        launched: bool,
        now: i64,
    ) -> GlobalRunHere {
        if !self.caught_up && launched && !self.runs.contains_key(name) {
            // A run an earlier fleetd started: followed, not counted for any ticket.
            let report = RunReport { started: now, ended: None, outcome: None, log: None, run: None };
            self.runs.insert(name.to_string(), report);
        }
        let running = self.runs.get(name).is_some_and(|run| run.outcome.is_none());
        let seen = self.globals.entry(name.to_string()).or_default();
        if !self.caught_up {
            seen.baseline = ticket.map(|ticket| ticket.id).or(seen.baseline);
        }
        seen.running = running;
        match here(job, ticket, seen, now) {
            Here::Start(id) => {
                self.starting.insert(name.to_string(), id);
                GlobalRunHere::Start
            }
            Here::Running => GlobalRunHere::Running,
            Here::Idle => GlobalRunHere::Idle,
            Here::Skip(id) => {
                tracing::info!(unit = name, run = id, "a run of a global unit is not run here");
                seen.last = Some(id);
                if running { GlobalRunHere::Running } else { GlobalRunHere::Idle }
            }
        }
    }

    pub fn unloaded(&mut self, name: &str) {
        self.globals.remove(name);
        self.starting.remove(name);
        self.set_aside.remove(name);
        self.loaded_here.remove(name);
        self.scheduled.remove(name);
        self.runs.remove(name);
    }

    /// Whether `name` (with `file`, when known) may be started now; a scheduled unit taken
    /// over from an earlier fleetd is reported lost instead.
    pub fn may_start(&mut self, name: &str, file: Option<&UnitFile>, now: i64) -> bool {
        if self.globals.contains_key(name) {
            // Its ticket said so ([`RunBook::global_wanted`]).
            return self.starting.contains_key(name);
        }
        if !self.loaded_here.contains(name) {
            if file.is_some_and(|file| runs_are_kept(name, file)) {
                self.adopted(name, now);
                return false;
            }
            return true;
        }
        !self.scheduled.contains(name) || !self.runs.contains_key(name)
    }

    /// `name` was asked to start at `now`.
    pub fn started(&mut self, name: &str, now: i64) {
        let run = self.starting.remove(name);
        if let (Some(id), Some(seen)) = (run, self.globals.get_mut(name)) {
            seen.last = Some(id);
        }
        if self.scheduled.contains(name) {
            self.runs.insert(name.to_string(), RunReport { started: now, ended: None, outcome: None, log: None, run });
        }
    }

    /// The manager refused to start `name`: its run ended there, failed.
    pub fn refused(&mut self, name: &str, now: i64, why: &str) {
        if self.scheduled.contains(name) {
            tracing::info!(unit = name, why, "a scheduled unit's run could not start");
            let failed = Outcome::Failed { status: None, signal: None };
            self.runs.insert(
                name.to_string(),
                RunReport { started: now, ended: Some(now), outcome: Some(failed), log: None, run: None },
            );
        }
    }

    fn adopted(&mut self, name: &str, now: i64) {
        self.runs.entry(name.to_string()).or_insert_with(|| RunReport {
            started: now,
            ended: Some(now),
            outcome: Some(Outcome::Lost { why: ADOPTED.to_string() }),
            log: None,
            run: None,
        });
    }

    /// Takes in the ends of the runs under way, and reports lost the scheduled units taken over
    /// from an earlier fleetd that run (which this agent never starts, so never asks about).
    pub async fn follow(
        &mut self,
        manager: &dyn UnitManager,
        loaded: &BTreeMap<String, LoadedUnit>,
        bodies: &HashMap<UnitHash, UnitFile>,
        now: i64,
    ) {
        for (name, unit) in loaded {
            if !self.loaded_here.contains(name)
                && !self.globals.contains_key(name)
                && !self.runs.contains_key(name)
                && bodies.get(&unit.hash).is_some_and(|file| runs_are_kept(name, file))
            {
                self.adopted(name, now);
            }
        }
        for (name, run) in self.runs.iter_mut().filter(|(_, run)| run.outcome.is_none()) {
            match manager.run_end(name).await {
                Ok(Some(outcome)) => {
                    run.ended = Some(now);
                    run.outcome = Some(outcome);
                    run.log = match manager.run_log(name, run.started, LOG_LINES).await {
                        Ok(text) => log_tail(&text),
                        Err(error) => {
                            tracing::debug!(unit = name, %error, "cannot read the log of a run that ended");
                            None
                        }
                    };
                }
                Ok(None) => {}
                Err(error) => tracing::debug!(unit = name, %error, "cannot read how a run ended"),
            }
        }
    }

    pub fn report(&self, name: &str) -> Option<&RunReport> {
        self.runs.get(name)
    }
}
