//! The chaos run: for a set time, faults drawn from a seed (kill -9 and restart of fleetds,
//! SIGSTOP/SIGCONT, a machine cut off from etcd, an etcd member killed or partitioned from the
//! others) while units are started, replaced and destroyed; a sampler reads what really runs
//! on every machine (their processes) and records every breach of fleet's guarantees:
//!
//! - every acknowledged unit ends up running once, and every acknowledged destroy ends it;
//! - a unit that asked to run at most once (every third sleeper) never runs on two machines;
//! - any other unit runs on two machines only while one of them is out of touch with etcd (its
//!   lease expired, whatever mix of faults caused it, or etcd answering no one for want of
//!   a quorum or a leader; seen from etcd by [`crate::presence_log`]) and for
//!   [`Chaos::reaction`] after it is back;
//! - the two units that conflict never run on one machine but within that same allowance;
//! - no fleetd dies but the ones killed on purpose.
//!
//! A seed gives one plan of faults ([`fault_plan`]: kind, target, start and length) and one
//! stream of operation choices; what an operation meets (a refusal while etcd elects) may vary
//! from run to run, the faults do not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::member_id;
use crate::lab_etcd::LabEtcd;
use crate::lab_fleet::{LabMember, lab_member, running_sleepers, sleeper_file};
use crate::netlab::NetLab;
use crate::presence_log::PresenceLog;
pub use fleet_testkit::Seeded;

/// The longest a fault lasts.
const LONGEST_FAULT: Duration = Duration::from_secs(8);
/// What a machine takes, once it is back in touch with etcd, to stop what moved (measured
/// well under).
const REACTION: Duration = Duration::from_secs(3);
/// The checker's own lag: it samples every [`SAMPLE`] and learns of a lease expiry within
/// [`crate::presence_log`]'s poll, while the engine may move units at once.
const SAMPLING_SLACK: Duration = Duration::from_secs(1);
/// How often the sampler looks at the machines.
const SAMPLE: Duration = Duration::from_millis(200);
/// How long the cluster has to settle once the faults stop.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Where fleetd keeps its keys in etcd unless configured otherwise.
const DEFAULT_ETCD_PREFIX: &str = "/_coreos.com/fleet/";
/// The sleepers that conflict with each other (`Conflicts=`), started first.
const CONFLICTING: [usize; 2] = [9000, 9001];

/// Whether sleeper `unit` asks to run at most once (`AtMostOnce=`): every third. Such a
/// unit must never be seen on two machines, whatever the faults: no allowance.
fn at_most_once(unit: usize) -> bool {
    unit.is_multiple_of(3) && !CONFLICTING.contains(&unit)
}

const AT_MOST_ONCE: &str = "[X-Fleet]\nAtMostOnce=true\n";

#[cfg(test)]
mod tests {
    #[test]
    fn refusals_of_one_kind_count_together() {
        assert_eq!(
            super::refusal(
                "x\nError creating units: error sending request for url (http://localhost/fleet/v1/units/sleeper-47.service): operation timed out\n"
            ),
            "Error creating units: error sending request for url (http://localhost/fleet/v1/units/sleeper-N.service): operation timed out"
        );
        let mut first = super::Seeded::new(7);
        let mut second = super::Seeded::new(7);
        assert_eq!(
            (0..5).map(|_| first.below(100)).collect::<Vec<_>>(),
            (0..5).map(|_| second.below(100)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_unsettled_report_ends_with_each_fleetds_last_lines_without_the_transports() {
        let log = "one\ntwo h2::codec frame\nthree\nx DEBUG tower::buffer::worker: ready\nfour\n";
        assert_eq!(super::last_lines(log, 2), ["three", "four"]);
        assert_eq!(super::last_lines(log, 9), ["one", "three", "four"]);
    }

    #[test]
    fn episodes_are_placed_in_the_logs_by_their_wall_clock_window() {
        // As fleetd's log lines begin: `2026-11-22T19:17:22.793352Z DEBUG …`.
        assert_eq!(super::log_time(1_795_375_042), "2026-11-22T19:17:22");
        let episode =
            super::Episode { since: std::time::Instant::now(), since_wall: 100, machines: Default::default() };
        let (from, to) = episode.window(episode.since + std::time::Duration::from_millis(3_500));
        assert_eq!((from, to), (100, 104));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    KillFleetd,
    FreezeFleetd,
    CutMachine,
    KillEtcdMember,
    PartitionEtcdMember,
}

impl FaultKind {
    const ALL: [FaultKind; 5] = [
        FaultKind::KillFleetd,
        FaultKind::FreezeFleetd,
        FaultKind::CutMachine,
        FaultKind::KillEtcdMember,
        FaultKind::PartitionEtcdMember,
    ];

    fn on_etcd(self) -> bool {
        matches!(self, FaultKind::KillEtcdMember | FaultKind::PartitionEtcdMember)
    }
}

/// One fault of the plan: what, on which machine or etcd member, when (from the start of the
/// run) and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedFault {
    pub at: Duration,
    pub kind: FaultKind,
    pub target: usize,
    pub lasts: Duration,
}

/// The faults of a run, from its seed alone: one machine fault and one etcd fault at a time at
/// most (etcd keeps its quorum; a machine is never restarted while cut off).
pub fn fault_plan(seed: u64, length: Duration, machines: usize, etcd_members: usize) -> Vec<PlannedFault> {
    let mut random = Seeded::new(seed);
    let mut plan = Vec::new();
    let (mut machine_free, mut etcd_free) = (Duration::ZERO, Duration::ZERO);
    let mut at = Duration::from_secs(1);
    while at < length {
        let kind = FaultKind::ALL[random.below(FaultKind::ALL.len())];
        let target = random.below(if kind.on_etcd() { etcd_members } else { machines });
        let lasts = random.duration(Duration::from_secs(1), LONGEST_FAULT);
        let free = if kind.on_etcd() { &mut etcd_free } else { &mut machine_free };
        if random.below(3) == 0 && *free <= at {
            *free = at + lasts;
            plan.push(PlannedFault { at, kind, target, lasts });
        }
        at += random.duration(Duration::from_millis(300), Duration::from_secs(1));
    }
    plan
}

#[derive(Debug)]
struct ActiveFault {
    kind: FaultKind,
    target: usize,
    began: Instant,
    ends: Instant,
}

#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub faults: BTreeMap<String, usize>,
    pub operations: BTreeMap<String, usize>,
    pub violations: Vec<String>,
    pub longest_double_run: Duration,
    /// The longest a unit that asked to run at most once was seen on two machines (0: never).
    pub longest_double_run_at_most_once: Duration,
    /// The longest a fault really lasted (a fault ends when the run gets to end it).
    pub longest_fault: Duration,
    /// The longest a machine was out of touch with etcd (lease expired until it joined again).
    pub longest_absence: Duration,
    /// The longest no etcd member answered (no quorum or no leader).
    pub longest_silence: Duration,
    pub settled_after: Option<Duration>,
    /// What etcd and the fleetds saw of each unit that ran twice beyond any outage.
    pub trails: Vec<String>,
    /// Why operations were refused (the first line of fleetctl's error), with counts.
    pub refusals: BTreeMap<String, usize>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}", self.seed)?;
        writeln!(f, "  faults injected: {:?}", self.faults)?;
        writeln!(f, "  operations acknowledged: {:?}", self.operations)?;
        writeln!(f, "  longest double run: {:?}", self.longest_double_run)?;
        writeln!(
            f,
            "  longest double run of a unit that asked to run at most once: {:?}",
            self.longest_double_run_at_most_once
        )?;
        writeln!(f, "  longest fault as injected: {:?}", self.longest_fault)?;
        writeln!(f, "  longest a machine was out of touch with etcd: {:?}", self.longest_absence)?;
        writeln!(f, "  longest etcd answered no one: {:?}", self.longest_silence)?;
        match self.settled_after {
            Some(settled) => writeln!(f, "  settled {settled:?} after the last fault")?,
            None => writeln!(f, "  never settled")?,
        }
        for (why, count) in &self.refusals {
            writeln!(f, "  refused {count}×: {why}")?;
        }
        writeln!(f, "  invariant violations: {}", self.violations.len())?;
        for violation in &self.violations {
            writeln!(f, "    {violation}")?;
        }
        for trail in &self.trails {
            writeln!(f, "{trail}")?;
        }
        Ok(())
    }
}

/// A unit on two machines (or the conflicting pair on one), from `since`, and every machine
/// that ran it meanwhile; judged when it ends, against the outages etcd saw.
#[derive(Debug)]
struct Episode {
    since: Instant,
    /// `since` on the wall clock (seconds since the epoch), to find it in the fleetds' logs.
    since_wall: u64,
    machines: BTreeSet<usize>,
}

/// Seconds since the epoch, now.
fn wall_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// `seconds` as the fleetds' logs begin their lines (`2026-11-22T19:17:22`).
fn log_time(seconds: u64) -> String {
    fleet_core::civil_time::CivilTime::from_unix(seconds).rfc3339().trim_end_matches('Z').to_string()
}

impl Episode {
    fn starting(now: Instant) -> Self {
        Self { since: now, since_wall: wall_now(), machines: BTreeSet::new() }
    }

    /// The wall-clock window of the episode ended at `now`, in seconds since the epoch.
    fn window(&self, now: Instant) -> (u64, u64) {
        (self.since_wall, self.since_wall + (now - self.since).as_secs() + 1)
    }
}

impl Episode {
    /// A violation if the episode, ended at `now`, lasted longer than the machines' outages
    /// (and [`REACTION`] after each) account for, by more than [`SAMPLING_SLACK`].
    fn judge(&self, now: Instant, presence: &PresenceLog, ids: &[String], what: &str) -> Option<String> {
        let involved: Vec<String> = self.machines.iter().map(|index| ids[*index].clone()).collect();
        let unexcused = presence.unexcused(&involved, self.since, now, REACTION);
        (unexcused > SAMPLING_SLACK).then(|| {
            format!(
                "{what} for {:?}, {unexcused:?} of it with every machine involved in touch with etcd (and back for over {REACTION:?}); from {} on fleetds {:?}; presence readings: {}",
                now - self.since,
                log_time(self.since_wall),
                self.machines,
                presence.seen_around(&involved, self.since, now),
            )
        })
    }
}

/// An episode that ended, judged once the presence log has read etcd after its end: its
/// readings can lag by seconds, and an absence not read yet would convict an episode it
/// explains.
struct Ended {
    episode: Episode,
    at: Instant,
    what: String,
    /// The doubled unit, for its trail (`None` for the conflicting pair).
    unit: Option<usize>,
}

impl Ended {
    fn judge(self, presence: &PresenceLog, ids: &[String], seen: &mut Observed) {
        if let Some(violation) = self.episode.judge(self.at, presence, ids, &self.what) {
            seen.violations.push(violation);
            if let Some(unit) = self.unit {
                seen.doubled_units.insert(unit, self.episode.window(self.at));
            }
        }
    }
}

/// How long the sampler waits at the end for the presence log to read etcd after the last
/// episode ended.
const LAST_READING: Duration = Duration::from_secs(15);

/// What the sampler saw.
#[derive(Default)]
struct Observed {
    /// Ended episodes waiting for a later reading of etcd.
    pending: Vec<Ended>,
    /// Units on two machines or more.
    doubled: BTreeMap<usize, Episode>,
    /// The conflicting pair on one machine.
    together: Option<Episode>,
    longest_double_run: Duration,
    /// The longest an `AtMostOnce=` unit was seen on two machines (target: never).
    longest_double_run_at_most_once: Duration,
    violations: Vec<String>,
    /// The units whose double runs were violations, with the episode's wall-clock window,
    /// for their trail in the report.
    doubled_units: BTreeMap<usize, (u64, u64)>,
    /// The longest any fault really lasted so far.
    longest_fault: Duration,
    /// The longest a machine was out of touch with etcd, as etcd saw it.
    longest_absence: Duration,
    longest_silence: Duration,
}

pub struct Chaos {
    members: Vec<LabMember>,
    etcd: LabEtcd,
    net: NetLab,
    scratch: tempfile::TempDir,
    random: Seeded,
    report: Report,
    /// Units acknowledged as started (by number, with their version), and destroyed.
    live: BTreeMap<usize, u32>,
    destroyed: BTreeSet<usize>,
    /// Units whose last operation was refused: it may or may not have happened (a request
    /// that timed out may have been carried out), so nothing is expected of them.
    uncertain: BTreeSet<usize>,
    next_unit: usize,
    observed: Arc<Mutex<Observed>>,
}

impl Chaos {
    /// How long after a machine is back in touch with etcd a unit may still run on it and
    /// elsewhere: while it is out of touch (its lease expired, the others took its units over)
    /// it keeps them, since it cannot tell a partition from an outage of etcd.
    pub fn reaction() -> Duration {
        REACTION
    }

    /// A lab of a three-member etcd and `machines` fleetds.
    pub fn start(machines: usize, seed: u64) -> Self {
        let net = NetLab::create();
        let etcd = LabEtcd::start(&net, 3);
        let endpoints = etcd.endpoints();
        // Debug logs: the trail of a unit that goes wrong (see `whereabouts`).
        let members = (0..machines).map(|index| lab_member(&net, index, &endpoints, &[("verbosity", "1")])).collect();
        Self {
            members,
            etcd,
            net,
            scratch: tempfile::tempdir().expect("scratch dir"),
            // The operations' choices: a stream of their own, so that the faults are the plan's
            // whatever the operations met.
            random: Seeded::new(seed ^ 0x0bad_5eed_0bad_5eed),
            report: Report { seed, ..Report::default() },
            live: BTreeMap::new(),
            destroyed: BTreeSet::new(),
            uncertain: BTreeSet::new(),
            next_unit: 0,
            observed: Arc::new(Mutex::new(Observed::default())),
        }
    }

    /// Runs faults and operations for `length`, then heals everything and waits for the
    /// cluster to settle.
    pub fn run(mut self, length: Duration) -> Report {
        let state_dirs: Vec<PathBuf> = self.members.iter().map(|member| member.fleetd.state_dir()).collect();
        let ids: Vec<String> = (0..self.members.len()).map(member_id).collect();
        let presence = PresenceLog::start(self.etcd.client_addresses(), DEFAULT_ETCD_PREFIX, &ids);
        let observed = self.observed.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (observed, stop) = (observed.clone(), stop.clone());
            std::thread::spawn(move || sample(&state_dirs, &presence, &observed, &stop))
        };
        self.start_conflicting_pair();
        let mut plan: std::collections::VecDeque<PlannedFault> =
            fault_plan(self.report.seed, length, self.members.len(), self.etcd.members.len()).into();
        let mut active: Vec<ActiveFault> = Vec::new();
        let started = Instant::now();
        while started.elapsed() < length {
            self.end_faults(&mut active, false);
            self.check_crashes(&active);
            // The plan's faults in order, each once the one of its kind before it has ended
            // (a fault may begin late when ending another took time; it lasts as planned).
            while let Some(next) = plan.front().copied() {
                let busy = active.iter().any(|fault| fault.kind.on_etcd() == next.kind.on_etcd());
                if next.at > started.elapsed() || busy {
                    break;
                }
                plan.pop_front();
                self.begin_fault(next, &mut active);
            }
            self.operate(&active);
            std::thread::sleep(self.random.duration(Duration::from_millis(300), Duration::from_secs(1)));
        }
        self.end_faults(&mut active, true);
        self.report.settled_after = self.settle();
        if self.report.settled_after.is_none() {
            self.report.violations.push(self.unsettled());
        }
        self.check_crashes(&[]);
        stop.store(true, Ordering::SeqCst);
        let _ = sampler.join();
        let observed = observed.lock().map(|mut observed| std::mem::take(&mut *observed)).unwrap_or_default();
        self.report.longest_double_run = observed.longest_double_run;
        self.report.longest_double_run_at_most_once = observed.longest_double_run_at_most_once;
        self.report.longest_fault = observed.longest_fault;
        self.report.longest_absence = observed.longest_absence;
        self.report.longest_silence = observed.longest_silence;
        self.report.violations.extend(observed.violations);
        // The trail of each unit that ran twice beyond what an outage explains.
        let doubled: Vec<(usize, Option<(u64, u64)>)> =
            observed.doubled_units.into_iter().map(|(unit, window)| (unit, Some(window))).collect();
        self.report.trails.extend(self.whereabouts(&doubled));
        std::mem::take(&mut self.report)
    }

    fn count(map: &mut BTreeMap<String, usize>, what: &str) {
        *map.entry(what.to_string()).or_default() += 1;
    }

    /// A member that is up and not cut off, to send an operation through.
    fn healthy_member(&mut self, active: &[ActiveFault]) -> Option<usize> {
        let faulted: BTreeSet<usize> = active
            .iter()
            .filter(|fault| {
                matches!(fault.kind, FaultKind::KillFleetd | FaultKind::FreezeFleetd | FaultKind::CutMachine)
            })
            .map(|fault| fault.target)
            .collect();
        let healthy: Vec<usize> = (0..self.members.len()).filter(|index| !faulted.contains(index)).collect();
        healthy.get(self.random.below(healthy.len())).copied()
    }

    fn start_conflicting_pair(&mut self) {
        for (number, other) in [(CONFLICTING[0], CONFLICTING[1]), (CONFLICTING[1], CONFLICTING[0])] {
            let extra = format!("[X-Fleet]\nConflicts=sleeper-{other}.service\n");
            let file = sleeper_file(self.scratch.path(), number, 0, &extra);
            let ran = self.members[0].fleetd.fleetctl(&["start", "--no-block", &file]);
            assert_eq!(ran.code, 0, "starting the conflicting pair: {ran:?}");
            self.live.insert(number, 0);
        }
    }

    /// One operation through a healthy member: start a new unit, replace one, or destroy one.
    fn operate(&mut self, active: &[ActiveFault]) {
        let Some(via) = self.healthy_member(active) else { return };
        let candidates: Vec<usize> =
            self.live.keys().chain(self.uncertain.iter()).copied().filter(|unit| !CONFLICTING.contains(unit)).collect();
        let choice = if candidates.len() < 4 { 0 } else { self.random.below(10) };
        let (kind, unit, version) = match choice {
            0..=5 => {
                let unit = self.next_unit;
                self.next_unit += 1;
                ("start", unit, 0)
            }
            6..=7 => {
                let unit = candidates[self.random.below(candidates.len())];
                ("replace", unit, self.live.get(&unit).map_or(1, |version| version + 1))
            }
            _ => ("destroy", candidates[self.random.below(candidates.len())], 0),
        };
        let name = format!("sleeper-{unit}.service");
        let ran = match kind {
            "destroy" => self.members[via].fleetd.fleetctl(&["destroy", &name]),
            _ => {
                let extra = if at_most_once(unit) { AT_MOST_ONCE } else { "" };
                let file = sleeper_file(self.scratch.path(), unit, version, extra);
                self.members[via].fleetd.fleetctl(&["start", "--no-block", "--replace", &file])
            }
        };
        if ran.code != 0 {
            // Not acknowledged: nothing is expected of it, but what runs is still checked
            // for double runs. (A refused replace leaves the unit live, in either version.)
            Self::count(&mut self.report.operations, &format!("{kind} refused"));
            Self::count(&mut self.report.refusals, &refusal(&ran.stderr));
            if kind != "replace" {
                self.live.remove(&unit);
                self.destroyed.remove(&unit);
                self.uncertain.insert(unit);
            }
            return;
        }
        // A destroy that found nothing ends nothing: a start of it whose answer was lost may
        // still be carried out later (docs/guarantees.md, "A destroy is final"), so the unit
        // stays uncertain.
        if kind == "destroy" && self.uncertain.contains(&unit) && ran.stderr.contains("Units not found in registry") {
            Self::count(&mut self.report.operations, "destroy of nothing");
            return;
        }
        Self::count(&mut self.report.operations, kind);
        self.uncertain.remove(&unit);
        match kind {
            "destroy" => {
                self.live.remove(&unit);
                self.destroyed.insert(unit);
            }
            _ => {
                self.live.insert(unit, version);
            }
        }
    }

    fn begin_fault(&mut self, planned: PlannedFault, active: &mut Vec<ActiveFault>) {
        let PlannedFault { kind, target, lasts, .. } = planned;
        let began = Instant::now();
        let ends = began + lasts;
        match kind {
            FaultKind::KillFleetd => {
                self.members[target].fleetd.stop_with(libc::SIGKILL);
            }
            FaultKind::FreezeFleetd => self.members[target].fleetd.signal(libc::SIGSTOP),
            FaultKind::CutMachine => {
                let etcd_nodes: Vec<_> = self.etcd.members.iter().collect();
                self.net.isolate(&self.members[target].node, &etcd_nodes);
            }
            FaultKind::KillEtcdMember => self.etcd.kill(target),
            FaultKind::PartitionEtcdMember => {
                let node = self.etcd.members[target].clone();
                let others: Vec<_> = self.etcd.members.iter().filter(|member| **member != node).collect();
                self.net.isolate(&node, &others);
            }
        }
        Self::count(&mut self.report.faults, &format!("{kind:?}"));
        active.push(ActiveFault { kind, target, began, ends });
    }

    /// Ends the faults that are due (all of them with `all`).
    fn end_faults(&mut self, active: &mut Vec<ActiveFault>, all: bool) {
        let now = Instant::now();
        let (due, left): (Vec<ActiveFault>, Vec<ActiveFault>) =
            active.drain(..).partition(|fault| all || fault.ends <= now);
        *active = left;
        for fault in due {
            let lasted = fault.began.elapsed();
            if let Ok(mut observed) = self.observed.lock() {
                observed.longest_fault = observed.longest_fault.max(lasted);
            }
            match fault.kind {
                FaultKind::KillFleetd => self.members[fault.target].fleetd.relaunch(),
                FaultKind::FreezeFleetd => self.members[fault.target].fleetd.signal(libc::SIGCONT),
                FaultKind::CutMachine => {
                    for member in self.etcd.members.clone() {
                        self.net.heal(&self.members[fault.target].node, &member);
                    }
                }
                FaultKind::KillEtcdMember => self.etcd.restart(fault.target),
                FaultKind::PartitionEtcdMember => {
                    let node = self.etcd.members[fault.target].clone();
                    for member in self.etcd.members.clone() {
                        if member != node {
                            self.net.heal(&node, &member);
                        }
                    }
                }
            }
        }
    }

    /// A fleetd that died without being killed is a violation; it is started again.
    fn check_crashes(&mut self, active: &[ActiveFault]) {
        for index in 0..self.members.len() {
            let killed = active.iter().any(|fault| fault.kind == FaultKind::KillFleetd && fault.target == index);
            if killed {
                continue;
            }
            if let Some(status) = self.members[index].fleetd.exited_on_its_own() {
                let log = self.members[index].fleetd.log();
                let tail: String =
                    log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                self.report.violations.push(format!("fleetd {index} died on its own ({status}):\n{tail}"));
                self.members[index].fleetd.relaunch();
            }
        }
    }

    /// Waits until every live unit runs once and no destroyed one runs; how long it took.
    fn settle(&self) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < SETTLE_LIMIT {
            if self.settled() {
                return Some(started.elapsed());
            }
            std::thread::sleep(SAMPLE);
        }
        None
    }

    fn running(&self) -> Vec<BTreeSet<usize>> {
        self.members.iter().map(|member| running_sleepers(&member.fleetd.state_dir())).collect()
    }

    fn settled(&self) -> bool {
        let running = self.running();
        let count = |unit: &usize| running.iter().filter(|on| on.contains(unit)).count();
        self.live.keys().all(|unit| count(unit) == 1) && self.destroyed.iter().all(|unit| count(unit) == 0)
    }

    fn unsettled(&self) -> String {
        let running = self.running();
        let count = |unit: &usize| running.iter().filter(|on| on.contains(unit)).count();
        let runs_on = |unit: &usize| {
            let on: Vec<String> =
                (0..running.len()).filter(|index| running[*index].contains(unit)).map(|i| i.to_string()).collect();
            on.join(" and ")
        };
        let wrong: Vec<String> = self
            .live
            .keys()
            .filter(|unit| count(unit) != 1)
            .map(|unit| format!("sleeper-{unit} runs {} times", count(unit)))
            .chain(
                self.destroyed
                    .iter()
                    .filter(|unit| count(unit) != 0)
                    .map(|unit| format!("destroyed sleeper-{unit} runs on fleetd {}", runs_on(unit))),
            )
            .collect();
        // The trail of each unit that runs nowhere though acknowledged, or still runs though
        // destroyed: what etcd held of it and every line a fleetd wrote naming it.
        let astray: Vec<(usize, Option<(u64, u64)>)> = self
            .live
            .keys()
            .filter(|unit| count(unit) == 0)
            .chain(self.destroyed.iter().filter(|unit| count(unit) != 0))
            .map(|unit| (*unit, None))
            .collect();
        let mut text = format!("not settled {SETTLE_LIMIT:?} after the last fault: {}", wrong.join(", "));
        for trail in self.whereabouts(&astray) {
            text.push('\n');
            text.push_str(&trail);
        }
        // An agent that never acts on its units names none of them: what each fleetd did last
        // shows which one was stuck, and where.
        for (index, member) in self.members.iter().enumerate() {
            text.push_str(&format!("\n  fleetd {index}'s last lines:"));
            for line in last_lines(&member.fleetd.log(), LAST_LINES) {
                text.push_str(&format!("\n    fleetd {index}: {line}"));
            }
        }
        text
    }

    /// What the store went through for each of `units`, and what the fleetds said of it: the
    /// trail of a unit that was acknowledged and runs nowhere, or still runs though destroyed,
    /// or that ran twice beyond any
    /// outage. etcd's history and the logs are read once for all of them. With a window (a
    /// double run's, in seconds since the epoch) the log lines are those of the 20 s before
    /// it to 5 s after it, every line of every fleetd (not only the unit's): what the machines
    /// were doing then is the question.
    fn whereabouts(&self, units: &[(usize, Option<(u64, u64)>)]) -> Vec<String> {
        if units.is_empty() {
            return Vec::new();
        }
        let history = self.etcd.history("/", 0);
        let logs: Vec<String> = self.members.iter().map(|member| member.fleetd.log()).collect();
        // A window's logs are printed once, with the first unit of the episode.
        let mut printed: BTreeMap<(u64, u64), usize> = BTreeMap::new();
        let mut trails = Vec::with_capacity(units.len());
        for (unit, window) in units {
            let name = format!("sleeper-{unit}.service");
            let mut text = format!("  sleeper-{unit} in etcd's history:");
            for change in history.iter().filter(|change| change.key.ends_with(&format!("/{name}"))) {
                let value =
                    change.value.as_deref().map_or("(deleted)".to_string(), |value| value.chars().take(160).collect());
                text.push_str(&format!("\n    @{} {} = {value}", change.revision, change.key));
            }
            let lines: Box<dyn Fn(&str) -> bool> = match window {
                Some(window) if printed.contains_key(window) => {
                    text.push_str(&format!("\n  the fleetds' logs then: with sleeper-{} above", printed[window]));
                    trails.push(text);
                    continue;
                }
                Some((from, to)) => {
                    printed.insert((*from, *to), *unit);
                    let (first, last) = (log_time(from.saturating_sub(20)), log_time(to + 5));
                    text.push_str(&format!("\n  the fleetds' logs from {first} to {last}:"));
                    Box::new(move |line: &str| {
                        line.get(..19).is_some_and(|stamp| (first.as_str()..=last.as_str()).contains(&stamp))
                    })
                }
                None => Box::new(|line: &str| line.contains(&name)),
            };
            for (index, log) in logs.iter().enumerate() {
                // The HTTP/2 frames say nothing of what fleet did.
                for line in log.lines().filter(|line| lines(line) && says_what_fleet_did(line)) {
                    text.push_str(&format!("\n    fleetd {index}: {line}"));
                }
            }
            trails.push(text);
        }
        trails
    }
}

/// How many of each fleetd's last log lines an unsettled run's report prints.
const LAST_LINES: usize = 40;

/// Whether a log line is fleet's own and not of the transport under it: HTTP/2 frames and
/// tower's balancing of etcd's channel (a line or two for every request) say nothing of what
/// fleet did.
fn says_what_fleet_did(line: &str) -> bool {
    !line.contains(" h2::") && !line.contains(" tower::")
}

/// The last `count` lines of `log` that say what fleet did ([`says_what_fleet_did`]).
fn last_lines(log: &str, count: usize) -> Vec<&str> {
    let mut lines: Vec<&str> = log.lines().rev().filter(|line| says_what_fleet_did(line)).take(count).collect();
    lines.reverse();
    lines
}

/// fleetctl's error, with unit numbers taken out so that refusals of one kind count together.
fn refusal(stderr: &str) -> String {
    let line = stderr.lines().last().unwrap_or("");
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("sleeper-") {
        out.push_str(&rest[..at + "sleeper-".len()]);
        rest = rest[at + "sleeper-".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push('N');
    }
    out.push_str(rest);
    out
}

/// The sampler: what runs where, every [`SAMPLE`], until `stop`. A unit may run on two
/// machines while one of them is out of touch with etcd (its lease expired: the others took
/// its units over) and for [`REACTION`] after it is back; beyond that, and beyond
/// [`SAMPLING_SLACK`] for the checker's own lag, it is a violation.
fn sample(state_dirs: &[PathBuf], presence: &PresenceLog, observed: &Mutex<Observed>, stop: &AtomicBool) {
    let ids: Vec<String> = (0..state_dirs.len()).map(member_id).collect();
    let pair = "the conflicting units on one machine";
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let running: Vec<BTreeSet<usize>> = state_dirs.iter().map(|dir| running_sleepers(dir)).collect();
        let now = Instant::now();
        if stopping {
            // The last episodes end now: a reading of etcd after now judges them.
            let waiting = Instant::now();
            while waiting.elapsed() < LAST_READING && !presence.has_read_after(now) {
                std::thread::sleep(SAMPLE);
            }
        }
        let machines_of = |units: &[usize]| -> BTreeSet<usize> {
            (0..running.len()).filter(|index| units.iter().any(|unit| running[*index].contains(unit))).collect()
        };
        let Ok(mut seen) = observed.lock() else { return };
        let mut count: BTreeMap<usize, usize> = BTreeMap::new();
        for unit in running.iter().flatten() {
            *count.entry(*unit).or_default() += 1;
        }
        // At the end every episode still going is judged as it stands.
        let doubled: BTreeSet<usize> = if stopping {
            BTreeSet::new()
        } else {
            count.iter().filter(|(_, on)| **on > 1).map(|(unit, _)| *unit).collect()
        };
        let ended: Vec<usize> = seen.doubled.keys().copied().filter(|unit| !doubled.contains(unit)).collect();
        for unit in ended {
            if let Some(episode) = seen.doubled.remove(&unit) {
                seen.longest_double_run = seen.longest_double_run.max(now - episode.since);
                if at_most_once(unit) {
                    seen.longest_double_run_at_most_once =
                        seen.longest_double_run_at_most_once.max(now - episode.since);
                }
                let what = format!("sleeper-{unit} ran on two machines");
                seen.pending.push(Ended { episode, at: now, what, unit: Some(unit) });
            }
        }
        for unit in doubled {
            let machines = machines_of(&[unit]);
            if at_most_once(unit) && !seen.doubled.contains_key(&unit) {
                let wall = wall_now();
                seen.violations.push(format!(
                    "sleeper-{unit}, which asked to run at most once, runs on fleetds {machines:?} at {}",
                    log_time(wall)
                ));
                // Its trail, with every fleetd's log lines around it.
                seen.doubled_units.insert(unit, (wall, wall + 1));
            }
            let episode = seen.doubled.entry(unit).or_insert_with(|| Episode::starting(now));
            episode.machines.extend(machines);
        }
        let together = !stopping && running.iter().any(|on| CONFLICTING.iter().all(|unit| on.contains(unit)));
        if together {
            let machines = machines_of(&CONFLICTING);
            seen.together.get_or_insert_with(|| Episode::starting(now)).machines.extend(machines);
        } else if let Some(episode) = seen.together.take() {
            seen.pending.push(Ended { episode, at: now, what: pair.to_string(), unit: None });
        }
        // Judged once etcd was read after they ended (at the end, after a bounded wait).
        let (due, later): (Vec<Ended>, Vec<Ended>) = std::mem::take(&mut seen.pending)
            .into_iter()
            .partition(|ended| stopping || presence.has_read_after(ended.at));
        seen.pending = later;
        for ended in due {
            ended.judge(presence, &ids, &mut seen);
        }
        seen.longest_absence = presence.longest_absence();
        seen.longest_silence = presence.longest_silence();
        drop(seen);
        if stopping {
            return;
        }
        std::thread::sleep(SAMPLE);
    }
}
