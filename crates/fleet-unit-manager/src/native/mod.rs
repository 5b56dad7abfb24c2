//! The native supervisor: runs `.service` units as process groups of fleetd's own, for
//! hosts and containers without systemd as PID 1.
//!
//! Each started unit gets a [`runner::Runner`] task; states use systemd's words so the rest
//! of fleet cannot tell the managers apart. Unit processes die with fleetd (parent-death
//! signal), and a fleetd restarting after a crash kills what its predecessor left behind.

mod cgroup;
mod command;
mod handover;
mod keeper;
mod limits;
mod main_process;
mod output;
mod proc_stats;
mod process;
mod runner;
mod service;
mod spawner;
mod status_report;
mod tracking;
mod unit_log;
mod upgrade;

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::unit_name::UnitNameInfo;
use fleet_core::{SystemdState, UnitFile, UnitHash};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use keeper::{KEEPER_ARGUMENT, run_keeper};
pub use service::{ServiceConfig, ServiceError};
pub use unit_log::LogLimits;

use self::cgroup::CgroupBase;
use self::command::{Specifiers, parse_assignments, parse_environment_file};
use self::process::{ExecContext, kill_leftovers, lookup_group, lookup_user};
use self::runner::{Runner, StateSink};
use self::spawner::Spawner;
use self::unit_log::{LogSink, log_path, tail, tail_of_last};
use crate::{HeldUnit, Result, UnitManager, UnitManagerError};

pub struct NativeOptions {
    /// Where unit logs live (`<state_dir>/native/logs`).
    pub state_dir: PathBuf,
    pub machine_id: String,
    pub hostname: String,
    /// A program that runs [`run_keeper`] when given [`KEEPER_ARGUMENT`] (fleetd itself);
    /// without one, only the unit's main processes die with fleetd.
    pub keeper_program: Option<PathBuf>,
    /// How much log each unit keeps.
    pub log_limits: LogLimits,
    /// How long [`UnitManager::stop_all`] waits for units to stop before killing them.
    pub stop_all_timeout: Duration,
    /// Run units even where no cgroup v2 hierarchy holds their processes (tracked by process
    /// group and environment only, which a unit's process can leave both of).
    pub allow_without_cgroups: bool,
    /// Set when this fleetd replaced an earlier image of itself in place (`FLEETD_REEXEC`):
    /// the units that image handed over for this nonce are taken over as they run.
    pub handover_nonce: Option<String>,
    /// Where the units' credentials go (`<credentials_dir>/<unit>`, on a tmpfs).
    pub credentials_dir: PathBuf,
}

/// Why the native manager refuses to start where no cgroup v2 hierarchy is to be had.
pub const WITHOUT_CGROUPS: &str = "the native unit manager keeps each unit's processes in a cgroup v2, and none is mounted here nor can be (fleetd mounts one at /run/fleet/cgroup2 when it runs as root); set native_without_cgroups = allow to track units by process group and environment only, where a process that leaves its unit's session and clears its environment outlives the unit's stop";

struct RunningUnit {
    stop: watch::Sender<bool>,
    reload: watch::Sender<u64>,
    park: watch::Sender<bool>,
    done: JoinHandle<Option<handover::ParkedProcess>>,
}

struct Slot {
    hash: UnitHash,
    file: UnitFile,
    config: std::result::Result<ServiceConfig, String>,
    state: SystemdState,
    generation: u64,
    running: Option<RunningUnit>,
    log: LogSink,
    /// How its last run ended by itself, since its last start.
    last_end: Option<fleet_core::job::runs::Outcome>,
    /// When its active state last changed (microseconds since the epoch).
    since: i64,
    /// Its main process, while one runs.
    main_pid: Option<u32>,
}

struct Shared {
    units: Mutex<BTreeMap<String, Slot>>,
    changes: watch::Sender<u64>,
    log_dir: PathBuf,
    log_limits: LogLimits,
    marker: String,
    cgroups: Option<CgroupBase>,
    spawner: Arc<Spawner>,
    /// Stops still under way, by unit: a new run of the unit waits for its old one's.
    stopping: Mutex<BTreeMap<String, watch::Receiver<bool>>>,
    stop_all_timeout: Duration,
    /// Numbers each load and start of any unit, so that a runner of an earlier run, still
    /// stopping, never writes the state of a later one (even across an unload and a load).
    generations: std::sync::atomic::AtomicU64,
    machine_id: String,
    hostname: String,
    /// Held for its pipe: when fleetd dies the keeper reads end-of-file.
    _keeper: Option<std::process::Child>,
    /// The pipes to and from the keeper: fleetd's lines (the fence of `AtMostOnce=` units)
    /// and its acknowledgements. Taken out while a line is under way.
    keeper_pipe: tokio::sync::Mutex<Option<keeper::KeeperPipe>>,
    /// Whether there is a keeper: a fence is then checked before each start.
    has_keeper: bool,
    /// Where a handover for an upgrade is written.
    state_dir: PathBuf,
    /// The units' credentials.
    credentials: crate::credentials::CredentialDirs,
    /// The fence as the keeper holds it, checked before each start.
    fence: Mutex<crate::fence::Fence>,
}

/// A manager let go (a test's, or a fleetd's on its way out) leaves no empty cgroups behind;
/// those of units still running stay.
impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_if_empty();
        }
    }
}

impl Shared {
    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.units.locked()
    }

    fn stopping(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, watch::Receiver<bool>>> {
        self.stopping.locked()
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    fn changed(&self) {
        self.changes.send_modify(|revision| *revision += 1);
    }
}

/// A runner's handle on its unit's state; a runner from an earlier start cannot overwrite
/// the state of a later one.
struct SlotState {
    shared: Weak<Shared>,
    unit: String,
    generation: u64,
}

impl StateSink for SlotState {
    fn set(&self, active: &str, sub: &str) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        {
            let mut slots = shared.slots();
            let Some(slot) = slots.get_mut(&self.unit).filter(|slot| slot.generation == self.generation) else {
                return;
            };
            if slot.state.active != active {
                slot.since = fleet_runtime::wall_clock::now_micros();
            }
            slot.state = SystemdState::new("loaded", active, sub);
        }
        shared.changed();
    }

    fn main_pid(&self, pid: Option<u32>) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut slots = shared.slots();
        if let Some(slot) = slots.get_mut(&self.unit).filter(|slot| slot.generation == self.generation) {
            slot.main_pid = pid;
        }
    }

    fn ended(&self, outcome: fleet_core::job::runs::Outcome) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut slots = shared.slots();
        if let Some(slot) = slots.get_mut(&self.unit).filter(|slot| slot.generation == self.generation) {
            slot.last_end = Some(outcome);
        }
    }
}

pub struct NativeManager {
    shared: Arc<Shared>,
}

impl NativeManager {
    pub fn new(options: NativeOptions) -> Result<Self> {
        let log_dir = options.state_dir.join("native").join("logs");
        fleet_fs::create_private_dir(&log_dir)
            .map_err(|source| UnitManagerError::Io { context: format!("creating {}", log_dir.display()), source })?;
        let marker = supervisor_marker(&options.state_dir);
        let mut handover = options
            .handover_nonce
            .as_deref()
            .and_then(|nonce| handover::Handover::take(&options.state_dir, nonce))
            .map(upgrade::Handed::of);
        let handed_keeper = handover.as_mut().and_then(upgrade::Handed::take_keeper);
        if handed_keeper.is_none() {
            wait_for_previous_keeper(&marker);
        }
        let cgroups = CgroupBase::prepare(&marker);
        match &cgroups {
            Some(base) => {
                limits::enable_controllers(base.dir());
                tracing::info!(dir = %base.dir().display(), "each unit's processes are held in a cgroup v2 below")
            }
            None if options.allow_without_cgroups => {
                tracing::warn!("no cgroup v2: units are tracked by process group and environment only");
            }
            None => return Err(UnitManagerError::Unsupported(WITHOUT_CGROUPS.into())),
        }
        let kept = handover.as_ref().map(upgrade::Handed::names).unwrap_or_default();
        let leftovers = cgroups.as_ref().map_or(0, |base| base.kill_everything_but(&kept))
            + process::kill_leftovers_but(&marker, &kept);
        if leftovers > 0 {
            tracing::warn!(leftovers, "killed unit processes left behind by an earlier fleetd");
        }
        let mut keeper = match &options.keeper_program {
            _ if handed_keeper.is_some() => None,
            Some(program) => Some(
                keeper::spawn_keeper(program, &marker, cgroups.as_ref().map(CgroupBase::dir)).map_err(|source| {
                    UnitManagerError::Io { context: format!("starting the unit keeper {}", program.display()), source }
                })?,
            ),
            None => None,
        };
        let keeper_pipe = handed_keeper.or_else(|| keeper.as_mut().and_then(keeper::KeeperPipe::of));
        let has_keeper = keeper_pipe.is_some();
        let shared = Shared {
            _keeper: keeper,
            keeper_pipe: tokio::sync::Mutex::new(keeper_pipe),
            has_keeper,
            state_dir: options.state_dir,
            credentials: crate::credentials::CredentialDirs::new(options.credentials_dir),
            fence: Mutex::default(),
            units: Mutex::new(BTreeMap::new()),
            changes: watch::channel(0).0,
            log_dir,
            log_limits: options.log_limits,
            marker,
            cgroups,
            spawner: Arc::new(Spawner::start().map_err(|source| UnitManagerError::Io {
                context: "starting the unit spawner thread".into(),
                source,
            })?),
            stopping: Mutex::new(BTreeMap::new()),
            stop_all_timeout: options.stop_all_timeout,
            generations: std::sync::atomic::AtomicU64::new(0),
            machine_id: options.machine_id,
            hostname: options.hostname,
        };
        let manager = Self { shared: Arc::new(shared) };
        if let Some(handed) = handover {
            manager.take_over(handed);
        }
        Ok(manager)
    }

    fn specifiers(&self, unit: &str) -> Specifiers {
        let name = UnitNameInfo::new(unit);
        Specifiers {
            name: unit.to_string(),
            stem: name.stem.to_string(),
            prefix: name.prefix.to_string(),
            instance: name.instance.to_string(),
            hostname: self.shared.hostname.clone(),
            machine_id: self.shared.machine_id.clone(),
        }
    }

    /// Everything a unit's commands share, read when it starts (environment files included).
    fn context(&self, config: &ServiceConfig, specifiers: &Specifiers) -> std::result::Result<ExecContext, String> {
        let mut environment = BTreeMap::new();
        for value in &config.environment {
            parse_assignments(&specifiers.expand(value), &mut environment);
        }
        for value in &config.environment_files {
            let (optional, path) = match value.strip_prefix('-') {
                Some(path) => (true, path),
                None => (false, value.as_str()),
            };
            let path = specifiers.expand(path);
            match std::fs::read_to_string(&path) {
                Ok(text) => parse_environment_file(&text, &mut environment),
                Err(_) if optional => {}
                Err(error) => {
                    return Err(format!("Failed to load environment file {path}: {error}"));
                }
            }
        }
        let account = match &config.user {
            Some(user) => Some(
                lookup_user(&specifiers.expand(user))
                    .map_err(|error| format!("Failed to determine user credentials: {error}"))?,
            ),
            None => None,
        };
        let gid = match &config.group {
            Some(group) => Some(
                lookup_group(&specifiers.expand(group))
                    .map_err(|error| format!("Failed to determine group credentials: {error}"))?,
            ),
            None => None,
        };
        let working_directory = match &config.working_directory {
            // As systemd: a unit without WorkingDirectory= runs in `/`, never in fleetd's own.
            None => Some(PathBuf::from("/")),
            Some(value) => {
                let (optional, path) = match value.strip_prefix('-') {
                    Some(path) => (true, path),
                    None => (false, value.as_str()),
                };
                let path = match (path, &account) {
                    ("~", Some(account)) => PathBuf::from(&account.home),
                    ("~", None) => PathBuf::from("/root"),
                    (path, _) => PathBuf::from(specifiers.expand(path)),
                };
                match (path.is_dir(), optional) {
                    (true, _) => Some(path),
                    (false, true) => None,
                    (false, false) => {
                        return Err(format!(
                            "Changing to the requested working directory failed: {} does not exist",
                            path.display()
                        ));
                    }
                }
            }
        };
        Ok(ExecContext {
            environment,
            working_directory,
            account,
            gid,
            marker: self.shared.marker.clone(),
            unit: specifiers.name.clone(),
            cgroup: None,
        })
    }

    /// Starts a loaded unit's runner: from the start, or (`resumed`) going on with the
    /// processes a runner parked for an upgrade.
    fn launch(&self, name: &str, resumed: Option<handover::ParkedProcess>) -> Result<()> {
        let (config, file, log, generation) = {
            let mut slots = self.shared.slots();
            let slot = slots.get_mut(name).ok_or_else(|| UnitManagerError::NotLoaded(name.to_string()))?;
            if slot.running.as_ref().is_some_and(|running| !running.done.is_finished()) {
                return Ok(());
            }
            let config = match slot.config.clone() {
                Ok(config) => config,
                Err(reason) => {
                    // A value that reached the store anyway: the unit fails with the reason
                    // (logged when it was loaded; here, as systemd says it at a start).
                    let refused = "Unit configuration has fatal error, unit will not be started.";
                    slot.log.line("fleetd", None, &format!("{name}: {refused}"));
                    slot.state = SystemdState::new("bad-setting", "failed", "failed");
                    drop(slots);
                    self.shared.changed();
                    return Err(UnitManagerError::Refused { unit: name.to_string(), reason });
                }
            };
            slot.generation = self.shared.next_generation();
            slot.last_end = None;
            (config, slot.file.clone(), slot.log.clone(), slot.generation)
        };
        let specifiers = self.specifiers(name);
        let state = SlotState { shared: Arc::downgrade(&self.shared), unit: name.to_string(), generation };
        let context = match self.context(&config, &specifiers) {
            Ok(context) => context,
            Err(reason) => {
                log.line("fleetd", None, &format!("{name}: {reason}"));
                state.set("failed", "failed");
                return Err(UnitManagerError::Refused { unit: name.to_string(), reason });
            }
        };
        let mut context = context;
        if let Some(dir) = self.shared.credentials.of(name).filter(|dir| dir.is_dir()) {
            context.environment.insert("CREDENTIALS_DIRECTORY".into(), dir.display().to_string());
        }
        let (stop, stop_requests) = watch::channel(false);
        let (park, park_requests) = watch::channel(false);
        let (reload, reloads) = watch::channel(0);
        if resumed.is_none() {
            state.set("activating", "start");
        }
        let runner = Runner {
            unit: name.to_string(),
            description: description(name, &file, &specifiers),
            config,
            context,
            specifiers,
            log,
            state,
            stop: stop_requests,
            park: park_requests,
            reloads,
            previous: self.shared.stopping().get(name).cloned(),
            cgroups: self.shared.cgroups.clone(),
            limits: fleet_core::requirements::limits_of(file.options()),
            spawner: self.shared.spawner.clone(),
        };
        let done = tokio::spawn(runner.run(resumed));
        if let Some(slot) = self.shared.slots().get_mut(name) {
            slot.running = Some(RunningUnit { stop, reload, park, done });
        }
        Ok(())
    }

    /// Every unit's runner, taken out of its slot (for a stop of all, or a handover).
    fn take_running(&self) -> Vec<(String, RunningUnit)> {
        self.shared.slots().iter_mut().filter_map(|(name, slot)| Some((name.clone(), slot.running.take()?))).collect()
    }

    fn log_sink(&self, unit: &str) -> LogSink {
        LogSink::new(&log_path(&self.shared.log_dir, unit), &self.shared.hostname, self.shared.log_limits)
    }

    /// The last `lines` lines of a unit's log; with `written`, of its last that many bytes.
    async fn read_log(&self, name: &str, lines: usize, written: Option<u64>) -> Result<String> {
        let path = log_path(&self.shared.log_dir, name);
        let limits = self.shared.log_limits;
        tokio::task::spawn_blocking(move || match written {
            Some(written) => tail_of_last(&path, lines, limits, written),
            None => tail(&path, lines, limits),
        })
        .await
        .map_err(|error| UnitManagerError::Io {
            context: "reading unit log".into(),
            source: std::io::Error::other(error),
        })?
        .map_err(|source| UnitManagerError::Io { context: "reading unit log".into(), source })
    }

    /// Asks a unit's runner to stop and returns at once: a unit that takes long to stop
    /// (or never does) holds up nothing else. A later run of the unit waits for this stop.
    fn begin_stop(&self, name: &str, running: RunningUnit) {
        let _ = running.stop.send(true);
        let (done, stopped) = watch::channel(false);
        self.shared.stopping().insert(name.to_string(), stopped.clone());
        let shared = Arc::downgrade(&self.shared);
        let unit = name.to_string();
        tokio::spawn(async move {
            let _ = running.done.await;
            let _ = done.send(true);
            if let Some(shared) = shared.upgrade() {
                let mut stopping = shared.stopping();
                if stopping.get(&unit).is_some_and(|current| current.same_channel(&stopped)) {
                    stopping.remove(&unit);
                }
            }
        });
    }
}

/// What the unit's log lines call it: its `Description=` with its specifiers expanded, as
/// systemd's own lines have it ("Starting Hello instance 1..."), else its name.
fn description(unit: &str, file: &UnitFile, specifiers: &Specifiers) -> String {
    file.description().map_or_else(|| unit.to_string(), |description| specifiers.expand(description))
}

#[async_trait]
impl UnitManager for NativeManager {
    fn kind(&self) -> &'static str {
        "native"
    }

    async fn load(&self, name: &str, file: &UnitFile) -> Result<()> {
        self.shared.fence.locked().loaded(name, file);
        let previous = self.shared.slots().get_mut(name).and_then(|slot| slot.running.take());
        if let Some(running) = previous {
            self.begin_stop(name, running);
        }
        let log = self.log_sink(name);
        let config = match ServiceConfig::from_unit(name, file) {
            Ok((config, warnings)) => {
                for warning in warnings {
                    tracing::warn!(unit = name, "{warning}");
                    log.line("fleetd", None, &format!("{name}: {warning}"));
                }
                Ok(config)
            }
            Err(error) => {
                tracing::warn!(unit = name, "{error}");
                log.line("fleetd", None, &format!("{name}: {error}"));
                Err(error.to_string())
            }
        };
        let state = match &config {
            Ok(_) => SystemdState::new("loaded", "inactive", "dead"),
            Err(_) => SystemdState::new("bad-setting", "inactive", "dead"),
        };
        let mut slots = self.shared.slots();
        let generation = self.shared.next_generation();
        slots.insert(
            name.to_string(),
            Slot {
                hash: file.hash(),
                file: file.clone(),
                config,
                state,
                generation,
                running: None,
                log,
                last_end: None,
                since: fleet_runtime::wall_clock::now_micros(),
                main_pid: None,
            },
        );
        drop(slots);
        self.shared.changed();
        Ok(())
    }

    async fn unload(&self, name: &str) -> Result<()> {
        self.shared.fence.locked().unloaded(name);
        self.shared.credentials.remove(name);
        let running = self.shared.slots().get_mut(name).and_then(|slot| slot.running.take());
        if let Some(running) = running {
            self.begin_stop(name, running);
        }
        self.shared.slots().remove(name);
        self.shared.changed();
        Ok(())
    }

    async fn reload_unit_files(&self) -> Result<()> {
        Ok(())
    }

    async fn start(&self, name: &str) -> Result<()> {
        if self.shared.has_keeper {
            let fence = self.shared.fence.locked();
            fence.check_start(name, tokio::time::Instant::now())?;
        }
        self.launch(name, None)
    }

    async fn run_end(&self, name: &str) -> Result<Option<fleet_core::job::runs::Outcome>> {
        Ok(self.shared.slots().get(name).and_then(|slot| slot.last_end.clone()))
    }

    async fn stop(&self, name: &str) -> Result<()> {
        let running = {
            let mut slots = self.shared.slots();
            let slot = slots.get_mut(name).ok_or_else(|| UnitManagerError::NotLoaded(name.to_string()))?;
            slot.running.take()
        };
        if let Some(running) = running {
            self.begin_stop(name, running);
        }
        Ok(())
    }

    async fn reload(&self, name: &str) -> Result<()> {
        let slots = self.shared.slots();
        let slot = slots.get(name).ok_or_else(|| UnitManagerError::NotLoaded(name.to_string()))?;
        let refused = |reason: &str| UnitManagerError::Refused { unit: name.to_string(), reason: reason.to_string() };
        if slot.config.as_ref().is_ok_and(|config| config.exec_reload.is_empty()) {
            return Err(refused("it has no ExecReload="));
        }
        let running = slot.running.as_ref().filter(|running| !running.done.is_finished());
        let running = running.ok_or_else(|| refused("it is not running"))?;
        running.reload.send_modify(|asked| *asked = asked.wrapping_add(1));
        Ok(())
    }

    async fn units(&self) -> Result<BTreeMap<String, HeldUnit>> {
        Ok(self
            .shared
            .slots()
            .iter()
            .map(|(name, slot)| (name.clone(), HeldUnit { hash: slot.hash, state: slot.state.clone() }))
            .collect())
    }

    fn state_changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// A running unit's cgroup: its health checks' commands run as its processes.
    async fn check_cgroup(&self, name: &str) -> Option<crate::cgroup_procs::CgroupProcs> {
        let running = self.shared.slots().get(name).is_some_and(|slot| slot.running.is_some());
        running.then(|| self.shared.cgroups.as_ref()?.running_unit(name)).flatten()
    }

    async fn journal(&self, name: &str, lines: usize) -> Result<String> {
        self.read_log(name, lines, None).await
    }

    /// What `systemctl status` would say of the unit: its state and since when, its main
    /// process, its processes with their memory and CPU, and its log's last lines.
    async fn status(&self, name: &str) -> Result<Option<String>> {
        let facts = {
            let slots = self.shared.slots();
            let Some(slot) = slots.get(name) else { return Ok(None) };
            let specifiers = self.specifiers(name);
            status_report::StatusFacts {
                name: name.to_string(),
                description: slot.file.description().map(|text| specifiers.expand(text)),
                load: slot.state.load.clone(),
                active: slot.state.active.clone(),
                sub: slot.state.sub.clone(),
                since: Some(slot.since),
                main_pid: slot.main_pid,
                ..Default::default()
            }
        };
        let cgroup = self.shared.cgroups.as_ref().and_then(|base| {
            let dir = base.dir().join(name);
            dir.is_dir().then(|| (dir, base.path_of(name)))
        });
        let marker = self.shared.marker.clone();
        let unit = name.to_string();
        let mut facts = tokio::task::spawn_blocking(move || {
            let mut facts = facts;
            let pids = match &cgroup {
                Some((dir, _)) => proc_stats::cgroup_pids(dir),
                None => {
                    let mut pids = process::unit_marked_processes(&marker, &unit);
                    pids.sort_unstable();
                    pids
                }
            };
            facts.processes = proc_stats::command_lines(&pids);
            let live: Vec<u32> = facts.processes.iter().map(|(pid, _)| *pid).collect();
            facts.memory_bytes = proc_stats::resident_bytes(&live);
            facts.cpu_micros = match &cgroup {
                Some((dir, _)) => proc_stats::cgroup_cpu_micros(dir),
                None => proc_stats::processes_cpu_micros(&live),
            };
            facts.cgroup = cgroup.map(|(_, path)| path);
            facts
        })
        .await
        .map_err(|error| UnitManagerError::Io {
            context: "reading a unit's processes".into(),
            source: std::io::Error::other(error),
        })?;
        facts.journal = self.journal(name, 10).await?;
        Ok(Some(status_report::status_report(&facts, fleet_runtime::wall_clock::now_micros())))
    }

    /// The lines written since the run's first start, where this fleetd started it; else
    /// the log's last lines, as `journal`.
    async fn run_log(&self, name: &str, since: i64, lines: usize) -> Result<String> {
        let written = self.shared.slots().get(name).and_then(|slot| slot.log.bytes_since(since));
        self.read_log(name, lines, written).await
    }

    /// Hands the fence to the keeper, which kills the units at the deadline even if this
    /// fleetd is frozen by then; without a keeper there is no such backstop.
    async fn fence(&self, deadline: tokio::time::Instant, units: &[String]) -> Result<bool> {
        let mut held = self.shared.keeper_pipe.lock().await;
        let Some(mut pipe) = held.take() else { return Ok(false) };
        // Converted at once: a fleetd frozen after this line still hands over the same moment.
        // Rounded up: the keeper never fires before the moment fleetd counts with.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let left_ms = u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX / 2);
        let line = keeper::Fence { deadline_ms: keeper::monotonic_ms() + left_ms, units: units.to_vec() }.line();
        // The fence counts from now whatever the keeper is doing: a start checks it at once.
        self.shared.fence.locked().arm(deadline, units);
        let (pipe, sent) = tokio::task::spawn_blocking(move || {
            let sent = pipe.send(&line);
            (pipe, sent)
        })
        .await
        .map_err(|error| UnitManagerError::Io {
            context: "fencing units through the keeper".into(),
            source: std::io::Error::other(error.to_string()),
        })?;
        *held = Some(pipe);
        sent.map_err(|source| UnitManagerError::Io { context: "fencing units through the keeper".into(), source })?;
        Ok(true)
    }

    /// Writes the unit's credentials, readable by its `User=` (and `Group=`) alone; its
    /// commands find them in `$CREDENTIALS_DIRECTORY` from its next start.
    fn delivers_credentials(&self) -> bool {
        true
    }

    fn delivered_credential(&self, name: &str, credential: &str) -> Option<crate::credentials::Credential> {
        self.shared.credentials.read(name, credential)
    }

    async fn provide_credentials(
        &self,
        name: &str,
        file: &UnitFile,
        credentials: &[crate::credentials::Credential],
    ) -> Result<()> {
        let refused = |reason: String| UnitManagerError::Refused { unit: name.to_string(), reason };
        let owner = if credentials.is_empty() {
            None
        } else {
            let config = ServiceConfig::from_unit(name, file).map_err(|error| refused(error.to_string()))?.0;
            let specifiers = self.specifiers(name);
            match &config.user {
                Some(user) => {
                    let account = lookup_user(&specifiers.expand(user)).map_err(|error| refused(error.to_string()))?;
                    let gid = match &config.group {
                        Some(group) => {
                            lookup_group(&specifiers.expand(group)).map_err(|error| refused(error.to_string()))?
                        }
                        None => account.gid,
                    };
                    Some((account.uid, gid))
                }
                None => None,
            }
        };
        self.shared
            .credentials
            .write(name, credentials, owner)
            .map(drop)
            .map_err(|source| UnitManagerError::Io { context: format!("writing the credentials of {name}"), source })
    }

    /// Parks every unit's runner, hands the units over, and replaces fleetd in place.
    async fn reexec(&self, reexec: &crate::reexec::Reexec) -> std::io::Error {
        self.hand_over_and_exec(reexec).await
    }

    /// Stops every unit at once and waits for them, for `stop_all_timeout` at most; then
    /// kills whatever is left, so a unit that ignores its stop cannot hold fleetd up.
    async fn stop_all(&self) -> Result<()> {
        for (name, running) in self.take_running() {
            self.begin_stop(&name, running);
        }
        let stopping: Vec<watch::Receiver<bool>> = self.shared.stopping().values().cloned().collect();
        let all_stopped = async {
            for mut stopped in stopping {
                let _ = stopped.wait_for(|done| *done).await;
            }
        };
        if tokio::time::timeout(self.shared.stop_all_timeout, all_stopped).await.is_err() {
            tracing::warn!(timeout = ?self.shared.stop_all_timeout, "units did not stop in time; killing them");
            let killed = self.shared.cgroups.as_ref().map_or(0, CgroupBase::kill_everything)
                + kill_leftovers(&self.shared.marker);
            tracing::warn!(killed, "killed unit processes at shutdown");
        }
        if let Some(cgroups) = &self.shared.cgroups {
            cgroups.remove_if_empty();
        }
        Ok(())
    }
}

/// The longest a new fleetd waits for the keeper of a dead one to finish its killing.
const PREVIOUS_KEEPER_WAIT: Duration = Duration::from_secs(30);

/// Waits until the keeper of an earlier fleetd on this state directory has done its work and
/// gone: it kills by cgroup and marker, which would reach the units a new fleetd starts.
fn wait_for_previous_keeper(marker: &str) {
    match fleet_fs::lock_waiting(&keeper::keeper_lock_path(marker), PREVIOUS_KEEPER_WAIT) {
        Ok(Some(_released)) => {}
        Ok(None) => tracing::warn!("the keeper of an earlier fleetd is still running; starting anyway"),
        Err(error) => tracing::warn!(%error, "cannot check for the keeper of an earlier fleetd"),
    }
}

/// What marks the processes a manager for `state_dir` started.
fn supervisor_marker(state_dir: &Path) -> String {
    std::fs::canonicalize(state_dir).unwrap_or(state_dir.to_path_buf()).to_string_lossy().into_owned()
}

/// The processes a native manager for `state_dir` started and that still run.
pub fn unit_processes(state_dir: &Path) -> Vec<u32> {
    process::marked_processes(&supervisor_marker(state_dir))
}

/// Where a unit's log lives, for callers that read it without a manager.
pub fn unit_log_path(state_dir: &Path, unit: &str) -> PathBuf {
    log_path(&state_dir.join("native").join("logs"), unit)
}

#[cfg(test)]
mod tests;
