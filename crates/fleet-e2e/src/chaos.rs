//! The chaos run: for a set time, faults drawn from a seed (kill -9 and restart of fleetds,
//! SIGSTOP/SIGCONT, a machine cut off from etcd, an etcd member killed or partitioned from the
//! others) while units are started, replaced and destroyed; a sampler reads what really runs
//! on every machine (their processes) and records every breach of fleet's guarantees:
//!
//! - every acknowledged unit ends up running once, and every acknowledged destroy ends it;
//! - no unit runs on two machines longer than [`Chaos::double_run_window`] for the longest
//!   fault the machines really went through (a fault ends when the run gets to end it, which
//!   may be later than planned);
//! - the two units that conflict never run on one machine longer than that window;
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

use crate::cluster::AGENT_TTL_SECONDS;
use crate::lab_etcd::LabEtcd;
use crate::lab_fleet::{LabMember, lab_member, running_sleepers, sleeper_file};
use crate::netlab::NetLab;
pub use crate::seeded::Seeded;

/// The longest a fault lasts.
const LONGEST_FAULT: Duration = Duration::from_secs(8);
/// What a machine takes, once it reaches etcd again, to stop what moved (measured well under).
const REACTION: Duration = Duration::from_secs(3);
/// How often the sampler looks at the machines.
const SAMPLE: Duration = Duration::from_millis(200);
/// How long the cluster has to settle once the faults stop.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// The sleepers that conflict with each other (`Conflicts=`), started first.
const CONFLICTING: [usize; 2] = [9000, 9001];

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
    /// The longest a fault really lasted (a fault ends when the run gets to end it).
    pub longest_fault: Duration,
    pub settled_after: Option<Duration>,
    /// Why operations were refused (the first line of fleetctl's error), with counts.
    pub refusals: BTreeMap<String, usize>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}", self.seed)?;
        writeln!(f, "  faults injected: {:?}", self.faults)?;
        writeln!(f, "  operations acknowledged: {:?}", self.operations)?;
        writeln!(f, "  longest double run: {:?}", self.longest_double_run)?;
        writeln!(f, "  longest fault as the machines saw it: {:?}", self.longest_fault)?;
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
        Ok(())
    }
}

/// What the sampler saw.
#[derive(Default)]
struct Observed {
    /// Units on two machines or more, since when.
    doubled: BTreeMap<usize, Instant>,
    /// The conflicting pair on one machine, since when.
    together: Option<Instant>,
    longest_double_run: Duration,
    violations: Vec<String>,
    /// The longest any fault really lasted so far.
    longest_fault: Duration,
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
    /// The longest a unit may run on two machines: a machine that cannot reach etcd keeps its
    /// units (an outage stops nothing) while the others run them once its lease expired, until
    /// it reaches etcd again and reacts.
    pub fn double_run_window() -> Duration {
        Self::window_for(LONGEST_FAULT)
    }

    /// The window for faults that lasted up to `fault`.
    fn window_for(fault: Duration) -> Duration {
        fault.saturating_sub(Duration::from_secs(AGENT_TTL_SECONDS)) + REACTION
    }

    /// A lab of a three-member etcd and `machines` fleetds.
    pub fn start(machines: usize, seed: u64) -> Self {
        let net = NetLab::create();
        let etcd = LabEtcd::start(&net, 3);
        let endpoints = etcd.endpoints();
        let members = (0..machines).map(|index| lab_member(&net, index, &endpoints, &[])).collect();
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
        let observed = self.observed.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (observed, stop) = (observed.clone(), stop.clone());
            std::thread::spawn(move || sample(&state_dirs, &observed, &stop))
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
        self.report.longest_fault = observed.longest_fault;
        self.report.violations.extend(observed.violations);
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
                let file = sleeper_file(self.scratch.path(), unit, version, "");
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
                FaultKind::KillFleetd => self.members[fault.target].fleetd.launch(),
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
                self.members[index].fleetd.launch();
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
        let wrong: Vec<String> = self
            .live
            .keys()
            .filter(|unit| count(unit) != 1)
            .map(|unit| format!("sleeper-{unit} runs {} times", count(unit)))
            .chain(
                self.destroyed
                    .iter()
                    .filter(|unit| count(unit) != 0)
                    .map(|unit| format!("destroyed sleeper-{unit} runs")),
            )
            .collect();
        format!("not settled {SETTLE_LIMIT:?} after the last fault: {}", wrong.join(", "))
    }
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

/// The sampler: what runs where, every [`SAMPLE`], until `stop`.
fn sample(state_dirs: &[PathBuf], observed: &Mutex<Observed>, stop: &AtomicBool) {
    let mut window = Chaos::double_run_window();
    while !stop.load(Ordering::SeqCst) {
        let running: Vec<BTreeSet<usize>> = state_dirs.iter().map(|dir| running_sleepers(dir)).collect();
        let now = Instant::now();
        let Ok(mut seen) = observed.lock() else { return };
        window = window.max(Chaos::window_for(seen.longest_fault));
        let mut machines_of: BTreeMap<usize, usize> = BTreeMap::new();
        for on in &running {
            for unit in on {
                *machines_of.entry(*unit).or_default() += 1;
            }
        }
        let doubled: BTreeSet<usize> =
            machines_of.iter().filter(|(_, count)| **count > 1).map(|(unit, _)| *unit).collect();
        let ended: Vec<usize> = seen.doubled.keys().copied().filter(|unit| !doubled.contains(unit)).collect();
        for unit in ended {
            if let Some(since) = seen.doubled.remove(&unit) {
                let lasted = now - since;
                seen.longest_double_run = seen.longest_double_run.max(lasted);
                if lasted > window {
                    seen.violations
                        .push(format!("sleeper-{unit} ran on two machines for {lasted:?} (window {window:?})"));
                }
            }
        }
        for unit in doubled {
            seen.doubled.entry(unit).or_insert(now);
        }
        let together = running.iter().any(|on| CONFLICTING.iter().all(|unit| on.contains(unit)));
        match (together, seen.together) {
            (true, None) => seen.together = Some(now),
            (false, Some(since)) => {
                seen.together = None;
                if now - since > window {
                    seen.violations.push(format!("the conflicting units ran together for {:?}", now - since));
                }
            }
            _ => {}
        }
        drop(seen);
        std::thread::sleep(SAMPLE);
    }
    // Whatever is still doubled at the end counts from its start.
    if let Ok(mut seen) = observed.lock() {
        let now = Instant::now();
        let still: Vec<(usize, Instant)> = seen.doubled.iter().map(|(unit, since)| (*unit, *since)).collect();
        for (unit, since) in still {
            if now - since > window {
                seen.violations.push(format!("sleeper-{unit} still ran on two machines after {:?}", now - since));
            }
        }
    }
}
