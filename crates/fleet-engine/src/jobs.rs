//! The runs of units on a calendar (`[X-Fleet] Schedule=`) and of batch units (`Batch=true`),
//! as the leading engine keeps them: each pass it reads every job record, takes in what the
//! machines report of the active runs ([`fleet_core::job::runs::observe`]), claims or skips the
//! elapses due and claims the runs owed to a batch unit's start or a failed run's retry
//! ([`fleet_core::job::runs::advance`]), and writes each record that changed by
//! compare-and-swap, before the planner sees anything. The planner then sees such a unit as
//! wanted only while a run of it is active and has not ended, on the machine its run was given
//! and nowhere else; a run not yet placed is placed where the planner puts it (away from the
//! machines a retried run failed on, when it can be), and that machine is recorded, again by
//! compare-and-swap, before the placement is written. So no elapse is claimed twice and no run
//! is placed twice, across leaders and lost answers.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures_util::stream::{self, StreamExt};
use std::sync::Arc;

use fleet_core::job::Job;
mod as_planned;
mod run_metrics;
mod settled;

use as_planned::as_planned;
use run_metrics::{count_ends, count_skips};
use settled::{Settled, StepInputs};

use fleet_core::job::global_runs::{self, RunTicket};
use fleet_core::job::moves;
use fleet_core::job::runs::{self, JobRecord, RunPlace, RunReport, Seen};
use fleet_core::schedule::{ClusterSnapshot, Decision};
use fleet_core::{DesiredState, Requirements};
use fleet_registry::{EngineLease, EngineRegistry, RegistryError, StoredJob};

/// How many job record writes of one pass are under way at once.
const WRITES_AT_ONCE: usize = 64;

/// What a pass does with one unit's record.
enum Write {
    Nothing,
    Remove,
    Replace,
}

/// One unit's record as a pass read it and as it is to be.
struct Step {
    unit: String,
    record: JobRecord,
    version: u64,
    next: JobRecord,
    write: Write,
    skipped: Vec<runs::SkipReason>,
    /// Whether the machines' reports are to wake the engine while its run is active: a run of
    /// a unit on a calendar or a batch unit, placed on one machine. (A global unit's ends and
    /// a moving service's failure are seen at the next pass, within the engine's period.)
    woken_by_reports: bool,
}

/// Carries out `step`'s write; `false` when another write came first.
async fn write_step(registry: &dyn EngineRegistry, lease: &EngineLease, step: &Step) -> Result<bool, RegistryError> {
    match step.write {
        Write::Nothing => Ok(true),
        Write::Remove => registry.put_job_record(lease, &step.unit, None, step.version).await,
        Write::Replace => registry.put_job_record(lease, &step.unit, Some(&step.next), step.version).await,
    }
}

/// What the leading engine knows of scheduled units between passes.
#[derive(Debug)]
pub struct Jobs {
    /// Whether the job records are to be read: there were scheduled units or records last
    /// pass, or this is a leadership's first look.
    watching: bool,
    /// When the next elapse of any scheduled unit is due (microseconds since the epoch).
    next_due: Option<i64>,
    /// Whether a run is active: the machines' reports wake the engine while one is.
    running: bool,
    /// Units whose record another write changed under this pass: left where they are, and
    /// looked at again at once.
    contested: bool,
    /// Services that moved on failure kept off every machine for now, with why.
    off: Vec<(String, String)>,
    /// The run tickets this leadership published (read on its first pass).
    tickets: Option<BTreeMap<String, RunTicket>>,
    /// The last step that wrote nothing, while nothing it read changed since.
    settled: Settled,
}

impl Default for Jobs {
    fn default() -> Self {
        Self {
            watching: true,
            next_due: None,
            running: false,
            contested: false,
            off: Vec::new(),
            tickets: None,
            settled: Settled::default(),
        }
    }
}

/// A wall clock: microseconds since the epoch, as job records keep times.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

pub use fleet_runtime::wall_clock::now_micros;

impl Jobs {
    /// Whether this pass is to look at scheduled units (and so plan, whatever the store's
    /// revision: their runs change with the clock and the machines' reports).
    pub fn watching(&self) -> bool {
        self.watching
    }

    /// Whether a step at `now` would change nothing: the last one wrote nothing, no record
    /// and no report it read changed since, nothing it waits for is due, nothing is contested.
    /// Reads the records and the reports it follows.
    pub async fn settled(&self, registry: &dyn EngineRegistry, now: i64) -> Result<bool, RegistryError> {
        if self.contested || self.next_due.is_some_and(|due| due <= now) {
            return Ok(false);
        }
        self.settled.holds(registry).await
    }

    /// Whether a run is active.
    pub fn running(&self) -> bool {
        self.running
    }

    /// The services kept off every machine after they failed, with why (their reasons, as the
    /// store keeps them), from the last pass.
    pub fn off_reasons(&self) -> &[(String, String)] {
        &self.off
    }

    /// How long until the next elapse is due, or a contested record is to be read again.
    pub fn due_in(&self, now: i64) -> Option<std::time::Duration> {
        if self.contested {
            return Some(std::time::Duration::ZERO);
        }
        let due = self.next_due?;
        Some(std::time::Duration::from_micros(u64::try_from(due.saturating_sub(now)).unwrap_or(0)))
    }

    /// One pass over the scheduled units of `cluster` at `now`: their records brought up to
    /// date and written, and `cluster` as the planner is to see them.
    pub async fn step(
        &mut self,
        registry: &dyn EngineRegistry,
        lease: &EngineLease,
        cluster: ClusterSnapshot,
        now: i64,
    ) -> Result<ClusterSnapshot, RegistryError> {
        let scheduled: BTreeMap<String, (Arc<Requirements>, DesiredState)> = cluster
            .units
            .iter()
            .filter(|unit| unit.requirements.job.as_ref().is_some_and(Job::is_recorded))
            .map(|unit| (unit.name.clone(), (unit.requirements.clone(), unit.desired)))
            .collect();
        let placed_on: HashMap<&str, &str> = cluster
            .units
            .iter()
            .filter(|unit| scheduled.contains_key(&unit.name))
            .filter_map(|unit| Some((unit.name.as_str(), unit.scheduled_on.as_deref()?)))
            .collect();
        if scheduled.is_empty() && !self.watching {
            return Ok(cluster);
        }
        self.settled.forget();
        let stored: BTreeMap<String, StoredJob> =
            registry.job_records().await?.into_iter().map(|stored| (stored.unit.clone(), stored)).collect();
        self.watching = !scheduled.is_empty() || !stored.is_empty();
        // Global units on a calendar: every machine runs each run, and reports its end.
        let globals: BTreeSet<&str> = scheduled
            .iter()
            .filter(|(_, (requirements, _))| requirements.global)
            .map(|(name, _)| name.as_str())
            .collect();
        let active: BTreeSet<String> = stored
            .values()
            .filter(|stored| stored.record.active_run().is_some_and(|run| run.machine.is_some()))
            .map(|stored| stored.unit.clone())
            .chain(globals.iter().map(|name| name.to_string()))
            .collect();
        let reports = registry.reported_states(&active).await?;
        let reported: HashMap<(&str, &str), &fleet_core::UnitState> =
            reports.iter().map(|state| ((state.name.as_str(), state.machine_id.as_str()), &**state)).collect();
        let mut ends: HashMap<&str, Vec<(&str, &RunReport)>> = HashMap::new();
        for state in reports.iter().filter(|state| globals.contains(state.name.as_str())) {
            if let Some(run) = state.run.as_deref() {
                ends.entry(state.name.as_str()).or_default().push((state.machine_id.as_str(), run));
            }
        }
        let mut tickets: BTreeMap<String, RunTicket> = BTreeMap::new();
        let present: BTreeSet<&str> = cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
        let (mut next_due, mut running, mut contested) = (None::<i64>, false, BTreeSet::new());
        let mut current: BTreeMap<String, JobRecord> = BTreeMap::new();
        let mut places: BTreeMap<String, moves::Place> = BTreeMap::new();
        let units: BTreeSet<&String> = scheduled.keys().chain(stored.keys()).collect();
        let mut steps = Vec::with_capacity(units.len());
        for unit in units {
            let (record, version) = match stored.get(unit) {
                Some(stored) => (stored.record.clone(), stored.version),
                None => (JobRecord::new(now), 0),
            };
            let job = scheduled.get(unit).and_then(|(requirements, desired)| {
                Some((requirements.job.as_ref()?, *desired == DesiredState::Launched))
            });
            let wanted = job.is_some_and(|(_, wanted)| wanted);
            if let Some((job, _)) = job.filter(|_| globals.contains(unit.as_str())) {
                let stepped =
                    global_runs::step(job, &record, ends.get(unit.as_str()).map_or(&[], Vec::as_slice), wanted, now);
                next_due = runs::earliest(next_due, stepped.next_due);
                if let Some(ticket) = stepped.ticket {
                    if record.runs.last().map(|run| run.id) != Some(ticket.id) {
                        tracing::info!(unit, run = ticket.id, elapse = ticket.elapse, "a run of a global unit claimed");
                    }
                    tickets.insert(unit.clone(), ticket);
                }
                let skipped = stepped.skipped.iter().map(|skipped| skipped.why).collect();
                // Its first record is written at once: its cursor says since when it is owed runs.
                let write = match version {
                    0 if !wanted => Write::Nothing,
                    _ if stepped.record == record && version != 0 => Write::Nothing,
                    _ => Write::Replace,
                };
                let next = stepped.record;
                steps.push(Step { unit: unit.clone(), record, version, next, write, skipped, woken_by_reports: false });
                continue;
            }
            if let Some((job, _)) = job.filter(|(job, _)| job.moves_on_failure()) {
                let report_on = |machine: &str| reported.get(&(unit.as_str(), machine)).copied();
                let is_present = |machine: &str| present.contains(machine);
                let seen = moves::Seen {
                    wanted,
                    placed_on: placed_on.get(unit.as_str()).copied(),
                    report_on: &report_on,
                    present: &is_present,
                };
                let followed = moves::follow(job, &record, &seen, now);
                next_due = runs::earliest(next_due, followed.next_due);
                if followed.record.runs.len() > record.runs.len() {
                    tracing::info!(unit, machine = seen.placed_on, "a service that moves on failure began a stay");
                }
                if let moves::Place::Off(why) = &followed.place
                    && followed.record != record
                {
                    tracing::info!(unit, why, "a service that failed is kept off every machine for now");
                }
                places.insert(unit.clone(), followed.place);
                let write = match version {
                    0 if followed.record.runs.is_empty() => Write::Nothing,
                    _ if followed.record == record && version != 0 => Write::Nothing,
                    _ => Write::Replace,
                };
                let next = followed.record;
                let skipped = Vec::new();
                steps.push(Step { unit: unit.clone(), record, version, next, write, skipped, woken_by_reports: false });
                continue;
            }
            let machine = record.active_run().and_then(|run| run.machine.clone());
            let seen = Seen {
                wanted,
                report: machine.as_deref().and_then(|machine| reported.get(&(unit.as_str(), machine)).copied()),
                machine_present: machine.as_deref().is_none_or(|machine| present.contains(machine)),
            };
            let mut next = runs::observe(&record, seen, now);
            let mut skipped = Vec::new();
            if let Some((job, true)) = job {
                let step = runs::advance(job, &next, now, job.kept_runs);
                if let Some(run) = &step.claimed {
                    tracing::info!(unit, run = run.id, elapse = run.elapse, "run claimed");
                }
                for skipped in &step.skipped {
                    tracing::info!(unit, first = skipped.first, last = skipped.last, why = %skipped.why, "elapses skipped");
                }
                skipped = step.skipped.iter().map(|skipped| skipped.why).collect();
                next_due = runs::earliest(next_due, step.next_due);
                next = step.record;
            }
            let gone = job.is_none() && next.active_run().is_none();
            let write = match (gone, version) {
                (true, 0) => Write::Nothing,
                (true, _) => Write::Remove,
                (false, 0) if !wanted => Write::Nothing,
                (false, _) if next == record && version != 0 => Write::Nothing,
                (false, _) => Write::Replace,
            };
            steps.push(Step { unit: unit.clone(), record, version, next, write, skipped, woken_by_reports: true });
        }
        // The writes of one pass go out together (each still compared with its own version):
        // 10,000 units due at one second are 10,000 claims.
        let writes: Vec<_> = steps.iter().map(|step| Box::pin(write_step(registry, lease, step))).collect();
        let written: Vec<Result<bool, RegistryError>> = stream::iter(writes).buffered(WRITES_AT_ONCE).collect().await;
        let mut wrote = false;
        for (step, written) in steps.into_iter().zip(written) {
            wrote |= !matches!(step.write, Write::Nothing);
            if !written? {
                contested.insert(step.unit);
                continue;
            }
            // Counted once written: a pass whose write lost sees the same ends and skips again.
            count_ends(&step.record, &step.next);
            count_skips(&step.skipped);
            running |= step.woken_by_reports && step.next.active_run().is_some();
            current.insert(step.unit, step.next);
        }
        wrote |= self.publish_tickets(registry, lease, tickets, &contested).await?;
        if !wrote && contested.is_empty() {
            self.settled.note(StepInputs::of(stored.values(), reports), active);
        }
        self.next_due = next_due;
        self.running = running;
        self.contested = !contested.is_empty();
        self.off = places
            .iter()
            .filter(|(unit, _)| !contested.contains(*unit))
            .filter_map(|(unit, place)| match place {
                moves::Place::Off(why) => Some((unit.clone(), why.clone())),
                _ => None,
            })
            .collect();
        Ok(as_planned(cluster, &scheduled, &current, &places, &contested))
    }

    /// Writes the tickets of the global units on a calendar that changed (`tickets`: each
    /// one's latest run, for the units whose record this pass wrote or left as it was; a
    /// contested unit keeps the ticket it has), and removes the tickets of units that have
    /// none now. Whether it wrote any.
    async fn publish_tickets(
        &mut self,
        registry: &dyn EngineRegistry,
        lease: &EngineLease,
        mut tickets: BTreeMap<String, RunTicket>,
        contested: &BTreeSet<String>,
    ) -> Result<bool, RegistryError> {
        let published = match self.tickets.take() {
            Some(published) => published,
            None => registry.run_tickets().await?,
        };
        for unit in contested {
            tickets.remove(unit);
            if let Some(kept) = published.get(unit) {
                tickets.insert(unit.clone(), *kept);
            }
        }
        let mut wrote = false;
        for (unit, ticket) in &tickets {
            if published.get(unit) != Some(ticket) {
                registry.put_run_ticket(lease, unit, Some(ticket)).await?;
                wrote = true;
            }
        }
        for unit in published.keys().filter(|unit| !tickets.contains_key(*unit)) {
            registry.put_run_ticket(lease, unit, None).await?;
            wrote = true;
        }
        self.tickets = Some(tickets);
        Ok(wrote)
    }

    /// Of the planner's decisions, those to write once each run it placed has its machine
    /// recorded: a run whose record changed meanwhile is not placed by this pass.
    pub async fn record_placements(
        &mut self,
        registry: &dyn EngineRegistry,
        lease: &EngineLease,
        decisions: Vec<Decision>,
        cluster: &ClusterSnapshot,
    ) -> Result<Vec<Decision>, RegistryError> {
        let scheduled: BTreeSet<&str> = cluster
            .units
            .iter()
            .filter(|unit| unit.requirements.job.as_ref().is_some_and(Job::keeps_runs))
            .map(|unit| unit.name.as_str())
            .collect();
        let placing: Vec<(&str, &str)> = decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Schedule { unit, machine } if scheduled.contains(unit.as_str()) => {
                    Some((unit.as_str(), machine.as_str()))
                }
                _ => None,
            })
            .collect();
        if placing.is_empty() {
            return Ok(decisions);
        }
        let stored: BTreeMap<String, StoredJob> =
            registry.job_records().await?.into_iter().map(|stored| (stored.unit.clone(), stored)).collect();
        // Each placed run's machine recorded, the writes together as in `step`.
        let steps: Vec<(&str, &str, Step)> = placing
            .into_iter()
            .map(|(unit, machine)| {
                let stored = stored.get(unit);
                let (record, version) =
                    stored.map_or((JobRecord::new(0), 0), |stored| (stored.record.clone(), stored.version));
                let (next, write) = match runs::placed(&record, machine) {
                    Some(next) => (next, Write::Replace),
                    None => (record.clone(), Write::Nothing),
                };
                let skipped = Vec::new();
                let step =
                    Step { unit: unit.to_string(), record, version, next, write, skipped, woken_by_reports: true };
                (unit, machine, step)
            })
            .collect();
        let writes: Vec<_> = steps.iter().map(|(_, _, step)| Box::pin(write_step(registry, lease, step))).collect();
        let written: Vec<Result<bool, RegistryError>> = stream::iter(writes).buffered(WRITES_AT_ONCE).collect().await;
        let mut refused = BTreeSet::new();
        for ((unit, machine, step), written) in steps.into_iter().zip(written) {
            let written = match step.write {
                Write::Replace => written?,
                // Already placed (pinned there) or no longer claimed: nothing to record.
                Write::Nothing | Write::Remove => runs::runs_now(&step.record) == Some(RunPlace::On(machine)),
            };
            if written {
                tracing::info!(unit, machine, "run placed");
            } else {
                self.contested = true;
                refused.insert(unit.to_string());
            }
        }
        Ok(decisions
            .into_iter()
            .filter(|decision| !matches!(decision, Decision::Schedule { unit, .. } if refused.contains(unit)))
            .collect())
    }
}
