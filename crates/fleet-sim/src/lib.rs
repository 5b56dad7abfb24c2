//! A deterministic simulation of fleet's protocol. The real engine and agent code
//! (`fleet-engine`, `fleet-agent`) run, one of each per simulated fleetd, over a simulated
//! store ([`world`], reached through [`store`]) and the fake unit manager, on tokio's paused
//! clock in one thread: a run takes no real time beyond the computing, and one seed gives
//! one run, the same every time. The seed chooses the faults ([`faults`]: cuts, freezes,
//! restarts, store elections, stuck watches; and writes whose answer is lost, and fleetds
//! whose clocks run fast or slow) and the operations (units started, changed, stopped,
//! destroyed); the [`judge`] checks every run: the double-run window, nothing lost,
//! convergence; with units on a calendar ([`SimConfig::scheduled`]), [`runs_judge`] checks
//! that each elapse ran at most once and every one is accounted for; with services that move
//! on failure ([`SimConfig::moving`], failing on m0), that each is recorded failed only where
//! it fails and ends running elsewhere, or off with its retries spent. A failing seed is
//! printed and replayed with `fleet-sim --seed N`.

#![forbid(unsafe_code)]

pub mod dependency_judge;
pub mod faults;
mod gate;
pub mod judge;
mod manager;
pub mod runs_judge;
pub mod store;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_engine::{Engine, EngineConfig};
use fleet_testkit::{FakeUnitManager, Seeded};
use fleet_unit_manager::UnitManager;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::faults::{Fault, FaultKind};
use crate::gate::Gate;
use crate::judge::{Judge, Sample};
use crate::manager::{Keeper, RunLog, SimManager};
use crate::store::{SharedWorld, SimStore, lock};
use crate::world::{BUDGETED_PREFIX, World};

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub machines: usize,
    pub units: usize,
    /// How long faults and operations go on.
    pub length: Duration,
    pub agent_ttl: Duration,
    /// The chance in a thousand that a write commits but its answer is lost.
    pub lost_answers: usize,
    /// Units on a calendar (`s0.service`…, every 2 s, runs of 0.3 s or 2.5 s), besides
    /// `units`: started at once and never operated on.
    pub scheduled: usize,
    /// Services that move when they fail (`f0.service`…, `Retries=3`, `RetryDelay=1s`), which
    /// fail soon after each start on m0 and run anywhere else: the settling rule sees each
    /// run on another machine in the end. Started at once and never operated on.
    pub moving: usize,
    /// Units with priorities that reserve memory (`p0.service`…, 1 GiB each, priority 900 and
    /// 10 in turn), on machines that then state a capacity: all of them fit while every machine
    /// is up, not while some are out of touch, so with `preemption = on` (set when there are
    /// any) the high ones take the room of the low ones, which come back once the machines do.
    /// Started at once and never operated on.
    pub prioritized: usize,
    /// Units that wait for a machine out of touch (`l0.service`…, `LostAfter=` three times
    /// `agent_ttl` and `never` in turn): the judge holds each to its own span. Started at once
    /// and never operated on, so the engine alone moves them.
    pub lost_after: usize,
    /// Units with priority 10 that reserve memory as the prioritized ones do, in one group with
    /// `DisruptionBudget=1` (`b@0.service`…): with the prioritized units of priority 900 they
    /// are preempted one at a time, and the judge holds every preemption to it.
    pub budgeted: usize,
    /// Pairs of a plain unit `r<k>.service`, launched a quarter into the run and then moved by
    /// machines' faults, and a unit `w<k>.service`, launched at once, that `Requires=` it
    /// (`After=` for odd `k`): the judge holds every placement of a dependent to what it
    /// requires running ([`dependency_judge`]), and the cluster settles with both running.
    pub dependent: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            machines: 4,
            units: 24,
            length: Duration::from_secs(60),
            agent_ttl: Duration::from_secs(4),
            lost_answers: 20,
            scheduled: 0,
            moving: 0,
            prioritized: 0,
            lost_after: 0,
            budgeted: 0,
            dependent: 0,
        }
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub faults: BTreeMap<&'static str, usize>,
    pub violations: Vec<String>,
    pub longest_double_run: Duration,
    /// Runs of units on a calendar claimed in all.
    pub runs_claimed: usize,
    /// Stays of services that move on failure recorded failed (each on [`FAILING_MACHINE`]).
    pub stays_failed: usize,
    /// Units the engines took off their machines for units of a higher priority.
    pub preempted: usize,
    /// Units with `LostAfter=` moved off a machine gone once their span was over.
    pub lost_after_moves: usize,
    /// Units with a disruption budget preempted (one at a time, as the judge holds them).
    pub budgeted_preempted: usize,
    /// Units that wait for units placed (each while what it requires ran).
    pub dependents_placed: usize,
    /// How long after the last fault ended the cluster settled (`None`: it did not).
    pub settled_after: Option<Duration>,
    /// A digest of everything sampled: equal for two runs of one seed.
    pub digest: u64,
    /// Every sample, as text, when asked for (to find where two runs part).
    pub trace: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {} violation(s)", self.seed, self.violations.len())?;
        writeln!(f, "  faults: {:?}", self.faults)?;
        writeln!(f, "  longest double run: {:?}", self.longest_double_run)?;
        if self.runs_claimed > 0 {
            writeln!(f, "  runs of units on a calendar claimed: {}", self.runs_claimed)?;
        }
        if self.preempted > 0 {
            writeln!(f, "  units preempted: {}", self.preempted)?;
        }
        if self.budgeted_preempted > 0 {
            writeln!(f, "  units with a disruption budget preempted: {}", self.budgeted_preempted)?;
        }
        if self.dependents_placed > 0 {
            writeln!(f, "  units that wait for units placed: {}", self.dependents_placed)?;
        }
        if self.lost_after_moves > 0 {
            writeln!(f, "  units with LostAfter= moved in their time: {}", self.lost_after_moves)?;
        }
        if self.stays_failed > 0 {
            writeln!(f, "  failures of services that move on failure: {}", self.stays_failed)?;
        }
        match self.settled_after {
            Some(after) => writeln!(f, "  settled {after:?} after the last fault")?,
            None => writeln!(f, "  never settled")?,
        }
        for violation in &self.violations {
            writeln!(f, "  {violation}")?;
        }
        Ok(())
    }
}

/// Runs one seed on a fresh single-threaded runtime with paused time.
pub fn run(seed: u64, config: &SimConfig) -> Outcome {
    run_traced(seed, config, false)
}

/// As [`run`], keeping every sample in [`Outcome::trace`].
pub fn run_traced(seed: u64, config: &SimConfig, traced: bool) -> Outcome {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("a runtime");
    runtime.block_on(simulate(seed, config.clone(), traced))
}

/// One simulated fleetd's moving parts.
struct Node {
    machine: MachineState,
    frozen: Arc<Gate>,
    units: Arc<FakeUnitManager>,
    /// The keeper of `AtMostOnce=` units: the native supervisor's process, or systemd's timer.
    keeper: Arc<Keeper>,
    /// Like the native supervisor (units and keeper die with fleetd), else like systemd
    /// (units and timer outlive it).
    native: bool,
    store: Option<SimStore>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Kept so the agent and engine run on (dropping it would stop them).
    lifecycle: Option<watch::Sender<Lifecycle>>,
    clock_rate: f64,
    starts: u64,
}

struct Cluster {
    world: SharedWorld,
    nodes: Vec<Node>,
    config: SimConfig,
    seed: u64,
    /// Every machine's starts of units on a calendar.
    runs: RunLog,
    /// When the simulation began: the engines' wall clocks count from it.
    began: Instant,
}

impl Cluster {
    fn start(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.starts += 1;
        let store = SimStore::new(
            self.world.clone(),
            node.machine.clone(),
            node.frozen.clone(),
            self.seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ node.starts,
            node.clock_rate,
            self.config.lost_answers,
        );
        let manager: Arc<dyn UnitManager> = Arc::new(SimManager::new(
            node.units.clone(),
            node.frozen.clone(),
            node.keeper.clone(),
            &node.machine.id,
            self.runs.clone(),
        ));
        let agent_config = AgentConfig {
            machine: node.machine.clone(),
            reconcile_interval: Duration::from_secs(5),
            debounce: Duration::from_millis(10),
            presence_ttl: Some(self.config.agent_ttl),
            stop_units_when_cut_off: false,
        };
        let agent = Agent::new(agent_config, Arc::new(store.clone()), manager);
        let engine_config = EngineConfig {
            machine_id: node.machine.id.clone(),
            reconcile_interval: Duration::from_millis(500),
            debounce: Duration::from_millis(10),
            agent_ttl: self.config.agent_ttl,
            strategy: Default::default(),
            preemption: self.config.prioritized > 0,
        };
        let (began, rate) = (self.began, node.clock_rate);
        let clock: fleet_engine::Clock =
            Arc::new(move || WALL_CLOCK_BEGINS + (began.elapsed().as_micros() as f64 * rate) as i64);
        let engine = Engine::new(engine_config, Arc::new(store.clone())).with_clock(clock);
        let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
        let span = tracing::info_span!("fleetd", machine = node.machine.id.as_str(), start = node.starts);
        node.tasks = vec![
            tokio::spawn(agent.run(lifecycle_watch.clone()).instrument(span.clone())),
            tokio::spawn(engine.run(lifecycle_watch).instrument(span)),
        ];
        node.lifecycle = Some(lifecycle);
        node.store = Some(store);
        let mut world = lock(&self.world);
        if world.dead.remove(&node.machine.id) {
            world.back_in_touch(&node.machine.id);
        }
    }

    /// Kills the fleetd (kill -9): its tasks end where they are, its copy of the store goes
    /// with it; its units run on under systemd, and die with it under the native supervisor
    /// (its keeper kills them), whose next fleetd starts with none.
    fn kill(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        if node.native {
            node.keeper = Arc::default();
            node.units = Arc::new(FakeUnitManager::new());
        }
        for task in node.tasks.drain(..) {
            task.abort();
        }
        if let Some(store) = node.store.take() {
            store.stop();
        }
        node.lifecycle = None;
        let mut world = lock(&self.world);
        world.copies.remove(&node.machine.id);
        world.dead.insert(node.machine.id.clone());
    }

    /// The keepers' fences, at this instant.
    fn enforce_fences(&self) {
        for node in &self.nodes {
            node.keeper.enforce(&node.units);
        }
    }

    /// The machines each of `units` runs on now.
    fn running(&self, units: &[String]) -> BTreeMap<String, BTreeSet<String>> {
        let mut running: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for name in units {
            for node in &self.nodes {
                if node.units.state(name).is_some_and(|state| state.active == "active") {
                    running.entry(name.clone()).or_default().insert(node.machine.id.clone());
                }
            }
        }
        running
    }

    async fn sample(&self) -> Sample {
        let mut running: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for node in &self.nodes {
            let held = node.units.units().await.unwrap_or_default();
            for (name, _) in held.into_iter().filter(|(_, unit)| unit.state.active == "active") {
                running.entry(name).or_default().insert(node.machine.id.clone());
            }
        }
        let world = lock(&self.world);
        Sample {
            running,
            present: world.presences.keys().cloned().collect(),
            out_of_touch: self
                .nodes
                .iter()
                .map(|node| &node.machine.id)
                .filter(|id| world.out_of_touch(id))
                .cloned()
                .collect(),
            absence_ended: world.absence_ended.clone(),
            absence_began: world.absence_began.clone(),
            leaderless: world.leaderless,
            election_ended: world.election_ended,
        }
    }

    fn begin(&mut self, fault: &Fault) {
        let machine = self.nodes[fault.target].machine.id.clone();
        match fault.kind {
            FaultKind::Cut => {
                lock(&self.world).cut.insert(machine);
            }
            FaultKind::Freeze => {
                lock(&self.world).frozen.insert(machine);
                self.nodes[fault.target].frozen.freeze();
            }
            FaultKind::Restart => self.kill(fault.target),
            FaultKind::Election => lock(&self.world).leaderless = true,
            FaultKind::WatchStall => {
                let mut world = lock(&self.world);
                if let Some(copy) = world.copies.get_mut(&machine) {
                    copy.stalled_until = Some(Instant::now() + fault.lasts);
                }
            }
        }
    }

    fn end(&mut self, fault: &Fault) {
        let machine = self.nodes[fault.target].machine.id.clone();
        match fault.kind {
            FaultKind::Cut => {
                let mut world = lock(&self.world);
                world.cut.remove(&machine);
                world.back_in_touch(&machine);
            }
            FaultKind::Freeze => {
                let mut world = lock(&self.world);
                world.frozen.remove(&machine);
                world.back_in_touch(&machine);
                drop(world);
                self.nodes[fault.target].frozen.thaw();
            }
            FaultKind::Restart => self.start(fault.target),
            FaultKind::Election => lock(&self.world).end_election(),
            FaultKind::WatchStall => {}
        }
    }
}

/// The wall clock's reading when a simulation begins: 2026-12-04 00:00:00 UTC.
const WALL_CLOCK_BEGINS: i64 = 1_796_342_400_000_000;

/// A unit on a calendar of the workload: every 2 s, its runs lasting 0.3 s (even ones) or
/// 2.5 s (odd ones: elapses meet a run still running); overlaps skipped or queued, missed
/// elapses skipped or run once, by turns.
fn scheduled_file(index: usize) -> UnitFile {
    let length = if index.is_multiple_of(2) { "0.3" } else { "2.5" };
    let overlap = if index % 4 < 2 { "skip" } else { "queue" };
    let missed = if index.is_multiple_of(3) { "once" } else { "skip" };
    UnitFile::parse(&format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sleep {length}\n\
         [X-Fleet]\nSchedule=*:*:0/2\nOverlap={overlap}\nMissed={missed}\n"
    ))
    .expect("a valid unit")
}

/// Judges the records of the services that move on failure: a stay is recorded failed only on
/// [`FAILING_MACHINE`], where they fail (a failure seen elsewhere would be a stale report taken
/// for a new one); returns how many were.
fn judge_moves(
    jobs: &BTreeMap<String, (fleet_core::job::runs::JobRecord, u64)>,
    violations: &mut Vec<String>,
) -> usize {
    let mut failed = 0;
    for (unit, (record, _)) in jobs.iter().filter(|(unit, _)| unit.starts_with('f')) {
        if std::env::var_os("SIM_DEBUG_MOVES").is_some() {
            eprintln!("{unit}: {record:?}");
        }
        for stay in &record.runs {
            if !matches!(stay.outcome, Some(fleet_core::job::runs::Outcome::Failed { .. })) {
                continue;
            }
            failed += 1;
            if stay.machine.as_deref() != Some(FAILING_MACHINE) {
                violations.push(format!("{unit}: stay {} was recorded failed on {:?}", stay.id, stay.machine));
            }
        }
    }
    failed
}

/// The machine every service that moves on failure fails on.
pub const FAILING_MACHINE: &str = "m0";
/// Their `Retries=`.
const MOVING_RETRIES: u32 = 3;

/// A service of the workload that moves when it fails: it fails soon after each start on
/// [`FAILING_MACHINE`] (the simulated manager reads `/bin/fails-on`), and runs anywhere else.
fn moving_file(index: usize) -> UnitFile {
    UnitFile::parse(&format!(
        "[Service]\nExecStart=/bin/fails-on {FAILING_MACHINE} {index}\n[X-Fleet]\nRetries={MOVING_RETRIES}\nRetryDelay=1s\n"
    ))
    .expect("a valid unit")
}

/// A unit of the workload: each has a body of its own, and a new one when replaced.
/// A unit of [`SimConfig::prioritized`]: 1 GiB, priority 900 or 10.
fn prioritized_file(index: usize) -> UnitFile {
    let priority = if index.is_multiple_of(2) { 900 } else { 10 };
    UnitFile::parse(&format!(
        "[Service]\nExecStart=/bin/prioritized {index}\n[X-Fleet]\nMemory=1G\nPriority={priority}\n"
    ))
    .expect("a prioritized unit file")
}

/// A unit of [`SimConfig::budgeted`]: 1 GiB, priority 10, in a group with a budget of 1.
fn budgeted_file() -> UnitFile {
    UnitFile::parse("[Service]\nExecStart=/bin/budgeted %i\n[X-Fleet]\nMemory=1G\nPriority=10\nDisruptionBudget=1\n")
        .expect("a budgeted unit file")
}

/// A unit of [`SimConfig::dependent`]: what `w<index>` requires (`r<index>`), or the
/// dependent itself.
fn dependent_files(index: usize) -> (UnitFile, UnitFile) {
    let required = UnitFile::parse(&format!("[Service]\nExecStart=/bin/required {index}\n")).expect("a unit file");
    let kind = if index.is_multiple_of(2) { "Requires" } else { "After" };
    let dependent =
        UnitFile::parse(&format!("[Service]\nExecStart=/bin/dependent {index}\n[X-Fleet]\n{kind}=r{index}.service\n"))
            .expect("a dependent unit file");
    (required, dependent)
}

/// The `LostAfter=` of unit `index` of [`SimConfig::lost_after`]: three times `agent_ttl`,
/// or (`None`) never, in turn.
fn lost_after_span(index: usize, agent_ttl: Duration) -> Option<Duration> {
    index.is_multiple_of(2).then_some(agent_ttl * 3)
}

/// A unit of [`SimConfig::lost_after`].
fn lost_after_file(index: usize, agent_ttl: Duration) -> UnitFile {
    let lost_after =
        lost_after_span(index, agent_ttl).map_or("never".to_string(), |span| format!("{}s", span.as_secs()));
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/lost {index}\n[X-Fleet]\nLostAfter={lost_after}\n"))
        .expect("a unit file with LostAfter=")
}

/// Each machine's capacity with [`SimConfig::prioritized`] units: room for all of them with
/// every machine up and a third to spare, not with half of them out of touch.
fn prioritized_capacity(config: &SimConfig) -> Option<fleet_core::resources::Resources> {
    (config.prioritized + config.budgeted > 0).then(|| {
        let units = (config.prioritized + config.budgeted).div_ceil(config.machines.max(1)) as u64;
        fleet_core::resources::Resources { memory: (units + units.div_ceil(3)) << 30, cpu_millis: 64_000 }
    })
}

fn unit_file(index: usize, version: usize, at_most_once: bool) -> UnitFile {
    let x_fleet = if at_most_once { "[X-Fleet]\nAtMostOnce=true\n" } else { "" };
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep {}\n{x_fleet}", 100_000 + index * 100 + version))
        .expect("a valid unit")
}

/// Whether unit `index` asks to run at most once: a third of them.
fn at_most_once(index: usize) -> bool {
    index.is_multiple_of(3)
}

/// What a client does to a unit: start it, stop it (`fleetctl stop`: loaded), unload it
/// (inactive), destroy it for good, or replace its content in place (`start --replace`).
#[derive(Clone, Copy, Debug)]
enum Operation {
    Launch,
    Load,
    Stop,
    Destroy,
    Replace,
}

fn operations(random: &mut Seeded, config: &SimConfig) -> Vec<(Duration, usize, Operation)> {
    let mut planned = Vec::new();
    let mut at = Duration::from_secs(1);
    while at < config.length {
        let operation = match random.below(10) {
            0..=3 => Operation::Launch,
            4 => Operation::Load,
            5 | 6 => Operation::Stop,
            7 => Operation::Destroy,
            _ => Operation::Replace,
        };
        planned.push((at, random.below(config.units), operation));
        at += random.duration(Duration::from_millis(100), Duration::from_secs(2));
    }
    planned
}

/// Applies a client's operation, when the store answers clients.
fn operate(
    world: &mut World,
    unit: usize,
    operation: Operation,
    versions: &mut [usize],
    destroyed: &mut BTreeSet<usize>,
) {
    if world.leaderless || destroyed.contains(&unit) {
        return;
    }
    let name = format!("u{unit}.service");
    match operation {
        Operation::Launch | Operation::Load | Operation::Stop => {
            let desired = match operation {
                Operation::Launch => DesiredState::Launched,
                Operation::Load => DesiredState::Loaded,
                _ => DesiredState::Inactive,
            };
            // A unit taken off its machine (inactive) is not started again: the engine could
            // place it elsewhere before its old machine has stopped it, a double run no fault
            // causes (see `judge`). Units are launched, loaded, replaced in place or destroyed.
            if desired == DesiredState::Launched
                && world.units.get(&name).is_some_and(|stored| stored.desired == DesiredState::Inactive)
            {
                return;
            }
            if world.units.contains_key(&name) {
                world.set_desired(&name, desired);
            } else {
                world.put_unit(&name, unit_file(unit, versions[unit], at_most_once(unit)), desired);
            }
        }
        Operation::Destroy => {
            world.destroy(&name);
            destroyed.insert(unit);
        }
        Operation::Replace => {
            versions[unit] += 1;
            let desired = world.units.get(&name).map_or(DesiredState::Launched, |stored| stored.desired);
            world.put_unit(&name, unit_file(unit, versions[unit], at_most_once(unit)), desired);
        }
    }
}

fn digest_sample(digest: &mut u64, sample: &Sample) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    digest.hash(&mut hasher);
    sample.running.hash(&mut hasher);
    sample.present.hash(&mut hasher);
    *digest = hasher.finish();
}

async fn simulate(seed: u64, config: SimConfig, traced: bool) -> Outcome {
    let mut trace = Vec::new();
    let mut random = Seeded::new(seed);
    // Half the seeds run machines like the native supervisor (what runs dies with fleetd),
    // the others like systemd (what runs outlives it); a third of the units ask to run at
    // most once, fenced by the native keeper or systemd's timer.
    let native = Seeded::new(seed ^ 0x6e61_7469_7665).below(2) == 0;
    let world = Arc::new(Mutex::new(World::new(config.agent_ttl, Duration::from_millis(2500))));
    let nodes = (0..config.machines)
        .map(|index| Node {
            machine: MachineState {
                id: format!("m{index}"),
                public_ip: format!("10.0.0.{}", index + 1),
                capacity: prioritized_capacity(&config),
                ..MachineState::default()
            },
            frozen: Arc::default(),
            units: Arc::new(FakeUnitManager::new()),
            keeper: Arc::default(),
            native,
            store: None,
            tasks: Vec::new(),
            lifecycle: None,
            // Within ±10%: the engine's hold on `AtMostOnce=` units allows a tenth.
            clock_rate: 0.9 + random.below(201) as f64 / 1000.0,
            starts: 0,
        })
        .collect();
    let plan = faults::plan(&mut random, config.length, config.machines);
    let mut faults_count: BTreeMap<&'static str, usize> = BTreeMap::new();
    for fault in &plan {
        *faults_count.entry(fault.kind.name()).or_default() += 1;
    }
    let operations = operations(&mut random, &config);
    let mut cluster = Cluster {
        world: world.clone(),
        nodes,
        config: config.clone(),
        seed,
        runs: RunLog::default(),
        began: Instant::now(),
    };
    for index in 0..config.machines {
        cluster.start(index);
    }
    {
        let mut world = lock(&world);
        for unit in 0..config.units {
            let file = unit_file(unit, 0, at_most_once(unit));
            world.put_unit(&format!("u{unit}.service"), file, DesiredState::Launched);
        }
        for unit in 0..config.scheduled {
            world.put_unit(&format!("s{unit}.service"), scheduled_file(unit), DesiredState::Launched);
        }
        for unit in 0..config.moving {
            world.put_unit(&format!("f{unit}.service"), moving_file(unit), DesiredState::Launched);
        }
        for unit in 0..config.prioritized {
            world.put_unit(&format!("p{unit}.service"), prioritized_file(unit), DesiredState::Launched);
        }
        for unit in 0..config.budgeted {
            world.put_unit(&format!("{BUDGETED_PREFIX}{unit}.service"), budgeted_file(), DesiredState::Launched);
        }
        for unit in 0..config.dependent {
            let (required, dependent) = dependent_files(unit);
            world.put_unit(&format!("w{unit}.service"), dependent, DesiredState::Launched);
            // Loaded only: launched a quarter into the run, so that its dependent waits.
            world.put_unit(&format!("r{unit}.service"), required, DesiredState::Loaded);
        }
        for unit in 0..config.lost_after {
            world.put_unit(
                &format!("l{unit}.service"),
                lost_after_file(unit, config.agent_ttl),
                DesiredState::Launched,
            );
        }
        // Copies lag their store by up to 300 ms, each its own.
        for index in 0..config.machines {
            let lag = random.duration(Duration::ZERO, Duration::from_millis(300));
            world.copies.entry(format!("m{index}")).or_default().lag = lag;
        }
    }

    // Events in time order: (when, what).
    enum Event {
        Begin(Fault),
        End(Fault),
        Operate(usize, Operation),
        /// What dependent `k` requires is launched ([`SimConfig::dependent`]).
        LaunchRequired(usize),
    }
    let mut events: Vec<(Duration, usize, Event)> = Vec::new();
    for fault in &plan {
        events.push((fault.at, events.len(), Event::Begin(*fault)));
        events.push((fault.at + fault.lasts, events.len(), Event::End(*fault)));
    }
    for (at, unit, operation) in &operations {
        events.push((*at, events.len(), Event::Operate(*unit, *operation)));
    }
    for unit in 0..config.dependent {
        let at = config.length / 4 + Duration::from_secs(unit as u64);
        events.push((at, events.len(), Event::LaunchRequired(unit)));
    }
    events.sort_by_key(|(at, order, _)| (*at, *order));
    let faults_end = events.last().map_or(Duration::ZERO, |(at, _, _)| *at);

    let start = Instant::now();
    let tick = Duration::from_millis(10);
    let sample_every = 10;
    let mut judge = Judge::default();
    let mut runs_judge = runs_judge::RunsJudge::default();
    let scheduled: BTreeSet<String> = (0..config.scheduled).map(|unit| format!("s{unit}.service")).collect();
    let mut digest = 0;
    let once_units: Vec<String> =
        (0..config.units).filter(|unit| at_most_once(*unit)).map(|unit| format!("u{unit}.service")).collect();
    let lost_after: BTreeMap<String, Option<Duration>> = (0..config.lost_after)
        .map(|unit| (format!("l{unit}.service"), lost_after_span(unit, config.agent_ttl)))
        .collect();
    let mut versions = vec![0; config.units];
    let mut destroyed = BTreeSet::new();
    let mut pending = events.into_iter().peekable();
    let mut ticks: u64 = 0;
    let mut settled_after = None;
    let mut unsettled_why = String::new();
    loop {
        let elapsed = start.elapsed();
        while let Some((at, _, _)) = pending.peek() {
            if *at > elapsed {
                break;
            }
            let Some((_, _, event)) = pending.next() else { break };
            if traced {
                match &event {
                    Event::Begin(fault) => trace.push(format!("{elapsed:?} begins: {fault:?}")),
                    Event::End(fault) => trace.push(format!("{elapsed:?} ends: {fault:?}")),
                    Event::Operate(unit, operation) => trace.push(format!("{elapsed:?} u{unit}: {operation:?}")),
                    Event::LaunchRequired(unit) => trace.push(format!("{elapsed:?} r{unit}: Launch")),
                }
            }
            match event {
                Event::Begin(fault) => cluster.begin(&fault),
                Event::End(fault) => cluster.end(&fault),
                Event::Operate(unit, operation) => {
                    operate(&mut lock(&world), unit, operation, &mut versions, &mut destroyed)
                }
                Event::LaunchRequired(unit) => {
                    lock(&world).set_desired(&format!("r{unit}.service"), DesiredState::Launched)
                }
            }
        }
        lock(&world).tick();
        cluster.enforce_fences();
        judge.look_at_most_once(Instant::now(), &cluster.running(&once_units));
        if ticks.is_multiple_of(sample_every) {
            let mut sample = cluster.sample().await;
            runs_judge.look(&lock(&world).jobs, &scheduled);
            // A unit on a calendar runs only now and then: the settling rules are not its.
            sample.running.retain(|unit, _| !scheduled.contains(unit));
            judge.look(Instant::now(), &sample);
            if !lost_after.is_empty() {
                let schedule = lock(&world).schedule.clone();
                judge.look_lost_after(Instant::now(), &sample, &schedule, &lost_after, config.agent_ttl);
            }
            digest_sample(&mut digest, &sample);
            if traced {
                let world = lock(&world);
                trace.push(format!(
                    "{:?} rev {} leases {:?} {:?} {:?} {:?}",
                    elapsed,
                    world.revision,
                    world.leases.iter().map(|(lease, at)| (lease, at.duration_since(start))).collect::<Vec<_>>(),
                    world.schedule,
                    sample.running,
                    sample.present
                ));
            }
            if elapsed >= faults_end && pending.peek().is_none() {
                let (meant, schedule) = {
                    let world = lock(&world);
                    // A service that moved on failure until its retries were spent (it failed
                    // on m0 each time: only m0 took it) is meant to stay off.
                    let spent = |name: &str| {
                        world.jobs.get(name).and_then(|(record, _)| record.runs.last()).is_some_and(|stay| {
                            matches!(stay.outcome, Some(fleet_core::job::runs::Outcome::Failed { .. }))
                                && stay.attempt > MOVING_RETRIES
                        })
                    };
                    let meant: BTreeMap<String, bool> = world
                        .units
                        .iter()
                        .filter(|(name, _)| !scheduled.contains(*name))
                        .map(|(name, unit)| (name.clone(), unit.desired == DesiredState::Launched && !spent(name)))
                        .collect();
                    (meant, world.schedule.clone())
                };
                match judge::unsettled(&sample, &meant, &schedule) {
                    None => {
                        settled_after = Some(elapsed - faults_end);
                        break;
                    }
                    Some(why) => unsettled_why = why,
                }
                if elapsed - faults_end > judge::SETTLE_LIMIT {
                    break;
                }
            }
        }
        ticks += 1;
        tokio::time::sleep(tick).await;
    }
    runs_judge.look(&lock(&world).jobs, &scheduled);
    let schedules: BTreeMap<String, fleet_core::calendar::CalendarSpec> = (0..config.scheduled)
        .filter_map(|unit| {
            let file = scheduled_file(unit);
            let name = format!("s{unit}.service");
            let job = fleet_core::Requirements::from_unit(&name, &file).job?;
            Some((name, job.schedule?))
        })
        .collect();
    let mut starts: BTreeMap<String, u64> = BTreeMap::new();
    for ((_, unit), count) in fleet_core::unpoisoned::Locked::locked(&*cluster.runs).iter() {
        *starts.entry(unit.clone()).or_default() += count;
    }
    runs_judge.judge(&schedules, &starts);
    let mut violations = judge.violations;
    violations.append(&mut runs_judge.violations);
    violations.append(&mut lock(&world).budget.violations);
    violations.append(&mut lock(&world).dependencies.violations);
    let stays_failed = judge_moves(&lock(&world).jobs, &mut violations);
    if std::env::var_os("SIM_DEBUG_MOVES").is_some() {
        for ((unit, machine), (state, rev)) in lock(&world).states.iter().filter(|((u, _), _)| u.starts_with('f')) {
            eprintln!("state {unit} on {machine}: {:?} rev {rev}", state.systemd);
        }
        eprintln!(
            "schedule {:?}",
            lock(&world).schedule.iter().filter(|(u, _)| u.starts_with('f')).collect::<Vec<_>>()
        );
    }
    if settled_after.is_none() {
        violations.push(format!("never settled after the faults: {unsettled_why}"));
    }
    for node in &cluster.nodes {
        if node.tasks.iter().any(|task| task.is_finished()) {
            violations.push(format!("a task of {}'s fleetd ended on its own", node.machine.id));
        }
    }
    for node in &mut cluster.nodes {
        for task in node.tasks.drain(..) {
            task.abort();
        }
        if let Some(store) = node.store.take() {
            store.stop();
        }
    }
    let (preempted, budgeted_preempted, dependents_placed) = {
        let world = lock(&world);
        (world.preemptions, world.budget.preempted, world.dependencies.placed)
    };
    Outcome {
        seed,
        faults: faults_count,
        violations,
        longest_double_run: judge.longest_double_run,
        runs_claimed: runs_judge.runs_claimed(),
        stays_failed,
        preempted,
        budgeted_preempted,
        dependents_placed,
        lost_after_moves: judge.lost_after_moves,
        settled_after,
        digest,
        trace,
    }
}
