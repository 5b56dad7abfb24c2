//! One unit's life under the native supervisor, from `start` until it is stopped or gives
//! up: the start commands, the main process, restarts, and the stop sequence.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::cgroup::CgroupBase;
use super::command::{ExecCommand, Specifiers, parse_command};
use super::handover::ParkedProcess;
use super::main_process::MainProcess;
use super::output::{DRAIN_LIMIT, OutputDrain};
use super::process::{ExecContext, Started, process_alive, signal_group, signal_process};
use super::service::{Exit, KillMode, ServiceConfig, ServiceType};
use super::spawner::Spawner;
use super::unit_log::LogSink;

/// systemd's exit status for a command that could not be executed.
const EXIT_EXEC: i32 = 203;
/// More starts than this within [`START_LIMIT_INTERVAL`] and the unit fails for good.
const START_LIMIT_BURST: usize = 5;
const START_LIMIT_INTERVAL: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(200);
/// How long a stop waits for killed processes to be gone from the unit's cgroup.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// How the runner tells the world what state its unit is in.
pub trait StateSink: Send + Sync + 'static {
    fn set(&self, active: &str, sub: &str);
    /// The run ended by itself (not by a stop), with no restart to come: how.
    fn ended(&self, _outcome: fleet_core::job::runs::Outcome) {}
    /// The unit's main process, while one runs (`None` once it ended).
    fn main_pid(&self, _pid: Option<u32>) {}
}

/// How a run that ended by itself ended, in the words job records keep.
fn run_outcome(exit: Exit) -> fleet_core::job::runs::Outcome {
    use fleet_core::job::runs::Outcome;
    match exit {
        Exit::Code(0) => Outcome::Succeeded,
        Exit::Code(code) => Outcome::Failed { status: Some(code), signal: None },
        Exit::Signal(signal) => {
            Outcome::Failed { status: None, signal: Some(fleet_core::service_values::signal_name(signal)) }
        }
        Exit::Timeout => Outcome::Failed { status: None, signal: None },
    }
}

/// What the runner works with.
pub struct Runner<S: StateSink> {
    pub unit: String,
    pub description: String,
    pub config: ServiceConfig,
    pub context: ExecContext,
    pub specifiers: Specifiers,
    pub log: LogSink,
    pub state: S,
    pub stop: watch::Receiver<bool>,
    /// Set when fleetd replaces itself for an upgrade: a runner whose unit runs steadily
    /// hands its processes over as they run, and ends.
    pub park: watch::Receiver<bool>,
    /// Moves when a reload is asked for: a unit running steadily runs its `ExecReload=`.
    pub reloads: watch::Receiver<u64>,
    /// The stop of this unit's previous run, still under way: nothing starts before it ends.
    pub previous: Option<watch::Receiver<bool>>,
    /// Where the unit's cgroup goes, if the machine has a writable cgroup v2 hierarchy.
    pub cgroups: Option<CgroupBase>,
    /// The hard limits its processes run under (zero: none).
    pub limits: fleet_core::Resources,
    pub spawner: Arc<Spawner>,
}

enum Outcome {
    Ended(Exit),
    Stopped,
    Parked(ParkedProcess),
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(EXIT_EXEC),
    }
}

/// A main process's output: its pipes (for a handover), what its lines are called, and how
/// to take in what it wrote before it exited.
struct MainOutput {
    output: Vec<std::os::fd::RawFd>,
    ident: String,
    drain: OutputDrain,
}

fn describe(exit: Exit) -> String {
    match exit {
        Exit::Code(code) => format!("code=exited, status={code}"),
        Exit::Signal(signal) => format!("code=killed, signal={signal}"),
        Exit::Timeout => "timeout".to_string(),
    }
}

impl<S: StateSink> Runner<S> {
    fn say(&self, line: &str) {
        self.log.line("fleetd", None, line);
    }

    fn stop_requested(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves when a stop has been asked for.
    async fn stopped(stop: &mut watch::Receiver<bool>) {
        if stop.wait_for(|requested| *requested).await.is_err() {
            // The manager is gone: behave as if asked to stop.
        }
    }

    fn command(&self, value: &str) -> Result<ExecCommand, Exit> {
        parse_command(value, &self.specifiers, &self.context.environment).map_err(|error| {
            self.say(&format!("{}: invalid command line {value:?}: {error}", self.unit));
            Exit::Code(EXIT_EXEC)
        })
    }

    /// Resolves when fleetd asks its runners to hand their units over.
    /// Resolves when a reload has been asked for; never once the manager is gone.
    async fn reload_asked(reloads: &mut watch::Receiver<u64>) {
        if reloads.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Runs the unit's `ExecReload=` commands, `$MAINPID` naming its main process (if it has
    /// one), while it shows `reload`; then shows `sub` again. A failed command is logged; the
    /// unit runs on, as under systemd.
    async fn reload(&mut self, main_pid: Option<u32>, sub: &str) {
        self.say(&format!("Reloading {}...", self.description));
        self.state.set("reloading", "reload");
        if let Some(pid) = main_pid {
            self.context.environment.insert("MAINPID".into(), pid.to_string());
        }
        let failed = self.run_all(self.config.exec_reload.clone(), self.config.timeout_start).await;
        self.context.environment.remove("MAINPID");
        if let Some(Outcome::Ended(exit)) = failed {
            self.say(&format!("{}: Reload failed, {}", self.unit, describe(exit)));
        } else {
            self.say(&format!("Reloaded {}.", self.description));
        }
        self.state.set("active", sub);
    }

    async fn parked(park: &mut watch::Receiver<bool>) {
        if park.wait_for(|requested| *requested).await.is_err() {
            // The manager is gone: nothing will ask.
            std::future::pending::<()>().await;
        }
    }

    /// Starts one command, on the manager's spawning thread, unless a stop comes first: a
    /// start still waiting its turn there (behind a thousand others, say) is given up, as
    /// systemd's stop cancels a start job. A process started after all is killed (the
    /// spawner's answer, unread, is dropped with it).
    async fn start_process(&mut self, command: &ExecCommand) -> Result<Started, Outcome> {
        let spawned = self.spawner.spawn(command, &self.context, &self.log);
        tokio::select! {
            biased;
            () = Self::stopped(&mut self.stop) => Err(Outcome::Stopped),
            started = spawned => started.map_err(|error| {
                self.say(&format!("{}: Failed to execute {}: {error}", self.unit, command.argv[0]));
                Outcome::Ended(Exit::Code(EXIT_EXEC))
            }),
        }
    }

    /// Runs the unit until it is stopped or ends for good (an empty cgroup is removed after),
    /// or until it parks for an upgrade: then what it hands over. `resumed`: the processes of
    /// the unit as a runner parked them, to supervise as they run rather than start anew.
    pub async fn run(mut self, resumed: Option<ParkedProcess>) -> Option<ParkedProcess> {
        if let Some(mut previous) = self.previous.take() {
            tokio::select! {
                _ = previous.wait_for(|done| *done) => {}
                () = Self::stopped(&mut self.stop) => {
                    self.state.set("inactive", "dead");
                    return None;
                }
            }
        }
        if let Some(base) = &self.cgroups {
            match base.unit(&self.unit) {
                Ok(mut cgroup) => {
                    if !self.limits.is_zero()
                        && let Err(error) = cgroup.limit(&base.name(), &self.unit, self.limits)
                    {
                        tracing::warn!(unit = self.unit, %error, "cannot limit the unit's memory and CPU: it runs unlimited");
                        self.say(&format!("{}: runs without its memory and CPU limits: {error}", self.unit));
                    }
                    self.context.cgroup = Some(cgroup);
                }
                Err(error) => tracing::warn!(unit = self.unit, %error, "cannot create the unit's cgroup"),
            }
        }
        let cgroup = self.context.cgroup.clone();
        let parked = self.run_unit(resumed).await;
        if parked.is_none()
            && let Some(cgroup) = cgroup.filter(|cgroup| !cgroup.populated())
        {
            cgroup.remove();
        }
        parked
    }

    async fn run_unit(&mut self, mut resumed: Option<ParkedProcess>) -> Option<ParkedProcess> {
        let mut starts: VecDeque<Instant> = VecDeque::new();
        loop {
            let outcome = match resumed.take() {
                Some(parked) => self.resume(parked).await,
                None => {
                    let now = Instant::now();
                    starts.push_back(now);
                    while starts.front().is_some_and(|start| now.duration_since(*start) > START_LIMIT_INTERVAL) {
                        starts.pop_front();
                    }
                    if starts.len() > START_LIMIT_BURST {
                        self.say(&format!("{}: Start request repeated too quickly.", self.unit));
                        self.say(&format!("Failed to start {}.", self.description));
                        self.state.ended(fleet_core::job::runs::Outcome::Failed { status: None, signal: None });
                        self.state.set("failed", "failed");
                        return None;
                    }
                    self.log.mark_start();
                    self.say(&format!("Starting {}...", self.description));
                    self.start_once().await
                }
            };
            match outcome {
                Outcome::Parked(parked) => return Some(parked),
                Outcome::Stopped => {
                    self.say(&format!("Stopped {}.", self.description));
                    self.state.set("inactive", "dead");
                    return None;
                }
                Outcome::Ended(_) if self.stop_requested() => {
                    self.state.set("inactive", "dead");
                    return None;
                }
                Outcome::Ended(exit) if self.config.restart.restarts_after(exit) => {
                    self.state.set("activating", "auto-restart");
                    self.say(&format!("{}: Scheduled restart job, restart counter is at {}.", self.unit, starts.len()));
                    let delay = tokio::time::sleep(self.config.restart_sec);
                    tokio::select! {
                        () = delay => continue,
                        () = Self::stopped(&mut self.stop) => {
                            self.state.set("inactive", "dead");
                            return None;
                        }
                    }
                }
                Outcome::Ended(Exit::Code(0)) => {
                    self.say(&format!("{}: Deactivated successfully.", self.unit));
                    self.state.ended(run_outcome(Exit::Code(0)));
                    self.state.set("inactive", "dead");
                    return None;
                }
                Outcome::Ended(exit) => {
                    let result = if exit == Exit::Timeout { "timeout" } else { "exit-code" };
                    self.say(&format!("{}: Failed with result '{result}'.", self.unit));
                    self.state.ended(run_outcome(exit));
                    self.state.set("failed", "failed");
                    return None;
                }
            }
        }
    }

    /// One attempt: start commands, main process, and how it ended.
    async fn start_once(&mut self) -> Outcome {
        if !self.config.exec_start_pre.is_empty() {
            self.state.set("activating", "start-pre");
        }
        if let Some(outcome) = self.run_all(self.config.exec_start_pre.clone(), self.config.timeout_start).await {
            return self.after_failed_start(outcome).await;
        }
        match self.config.kind {
            ServiceType::Oneshot => self.run_oneshot().await,
            ServiceType::Forking => self.run_forking().await,
            _ => self.run_simple().await,
        }
    }

    async fn after_failed_start(&mut self, outcome: Outcome) -> Outcome {
        self.run_stop_post().await;
        outcome
    }

    /// Runs control commands in order; `Some` when one failed (and was not `-`) or a stop came.
    async fn run_all(&mut self, values: Vec<String>, timeout: Option<Duration>) -> Option<Outcome> {
        for value in values {
            let command = match self.command(&value) {
                Ok(command) => command,
                Err(exit) => return Some(Outcome::Ended(exit)),
            };
            match self.run_to_end(&command, timeout).await {
                Outcome::Ended(exit) if exit != Exit::Code(0) && !command.ignore_failure => {
                    self.say(&format!("{}: Control process exited, {}", self.unit, describe(exit)));
                    return Some(Outcome::Ended(exit));
                }
                Outcome::Ended(_) => {}
                Outcome::Stopped => return Some(Outcome::Stopped),
                Outcome::Parked(parked) => return Some(Outcome::Parked(parked)),
            }
        }
        None
    }

    /// Takes in what an exited process's pipes hold; says so in fleetd's log when that took
    /// longer than [`DRAIN_LIMIT`] (the unit goes on, its last lines perhaps missing).
    async fn drained(&self, drain: &OutputDrain, program: &str) {
        if !drain.drain().await {
            tracing::warn!(
                unit = self.unit,
                program,
                "the output of an exited process was not all read within {DRAIN_LIMIT:?}; going on without it"
            );
        }
    }

    /// Runs one command to its end, within `timeout`, unless a stop comes first.
    async fn run_to_end(&mut self, command: &ExecCommand, timeout: Option<Duration>) -> Outcome {
        let (mut child, drain) = match self.start_process(command).await {
            Ok(started) => (MainProcess::Spawned(started.child), started.drain),
            Err(outcome) => return outcome,
        };
        let pgid = child.id();
        let deadline = async {
            match timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => {
                self.drained(&drain, &command.argv[0]).await;
                if let Some(pgid) = pgid { signal_group(pgid, libc::SIGKILL) }
                Outcome::Ended(status.map_or(Exit::Code(EXIT_EXEC), exit_of))
            }
            () = deadline => {
                self.say(&format!("{}: {} timed out, killing", self.unit, command.argv[0]));
                if let Some(pgid) = pgid { signal_group(pgid, libc::SIGKILL) }
                let _ = child.wait().await;
                Outcome::Ended(Exit::Timeout)
            }
            () = Self::stopped(&mut self.stop) => {
                self.terminate(&mut child).await;
                Outcome::Stopped
            }
        }
    }

    async fn run_oneshot(&mut self) -> Outcome {
        self.state.set("activating", "start");
        if let Some(outcome) = self.run_all(self.config.exec_start.clone(), self.config.timeout_start).await {
            return self.after_failed_start(outcome).await;
        }
        if let Some(outcome) = self.run_all(self.config.exec_start_post.clone(), self.config.timeout_start).await {
            return self.after_failed_start(outcome).await;
        }
        if self.config.remain_after_exit {
            self.say(&format!("Finished {}.", self.description));
            return self.stay_exited().await;
        }
        self.run_stop_post().await;
        Outcome::Ended(Exit::Code(0))
    }

    /// A oneshot service that remains active after its commands: until it is stopped.
    async fn stay_exited(&mut self) -> Outcome {
        self.state.set("active", "exited");
        loop {
            tokio::select! {
                () = Self::stopped(&mut self.stop) => break,
                () = Self::parked(&mut self.park) => return Outcome::Parked(ParkedProcess::Exited),
                () = Self::reload_asked(&mut self.reloads) => self.reload(None, "exited").await,
            }
        }
        self.state.set("deactivating", "stop");
        // The stop asked for is what runs these: they must not be cut short by it.
        let _ = self.run_all_unstoppable(self.config.exec_stop.clone()).await;
        self.run_stop_post().await;
        Outcome::Stopped
    }

    /// Goes on with a unit's processes as a runner parked them.
    async fn resume(&mut self, parked: ParkedProcess) -> Outcome {
        match parked {
            ParkedProcess::Main { main, output, ident } => {
                let pgid = main.id();
                // Its output is copied as the earlier image handed it over, without drains.
                self.supervise_main(*main, pgid, MainOutput { output, ident, drain: OutputDrain::default() }).await
            }
            ParkedProcess::Forking { pgid, main_pid } => self.supervise_forking(pgid, main_pid).await,
            ParkedProcess::Exited => self.stay_exited().await,
        }
    }

    async fn run_simple(&mut self) -> Outcome {
        let command = match self.command(&self.config.exec_start[0].clone()) {
            Ok(command) => command,
            Err(exit) => return self.after_failed_start(Outcome::Ended(exit)).await,
        };
        let (mut main, output) = match self.start_process(&command).await {
            Ok(started) => (
                MainProcess::Spawned(started.child),
                MainOutput { output: started.output, ident: started.ident, drain: started.drain },
            ),
            Err(outcome) => return self.after_failed_start(outcome).await,
        };
        let pgid = main.id();
        if !self.config.exec_start_post.is_empty() {
            self.state.set("activating", "start-post");
            if let Some(outcome) = self.run_all(self.config.exec_start_post.clone(), self.config.timeout_start).await {
                self.terminate(&mut main).await;
                return self.after_failed_start(outcome).await;
            }
        }
        self.say(&format!("Started {}.", self.description));
        self.supervise_main(main, pgid, output).await
    }

    /// A running main process (of process group `pgid`), until it ends, is stopped, or is
    /// handed over.
    async fn supervise_main(&mut self, main: MainProcess, pgid: Option<u32>, output: MainOutput) -> Outcome {
        self.state.main_pid(main.id());
        let outcome = self.follow_main(main, pgid, output).await;
        if !matches!(outcome, Outcome::Parked(_)) {
            self.state.main_pid(None);
        }
        outcome
    }

    async fn follow_main(&mut self, mut main: MainProcess, pgid: Option<u32>, output: MainOutput) -> Outcome {
        self.state.set("active", "running");
        loop {
            tokio::select! {
                () = Self::parked(&mut self.park) => {
                    let MainOutput { output, ident, .. } = output;
                    return Outcome::Parked(ParkedProcess::Main { main: Box::new(main), output, ident });
                }
                status = main.wait() => {
                    self.drained(&output.drain, &output.ident).await;
                    let exit = status.map_or(Exit::Code(EXIT_EXEC), exit_of);
                    self.say(&format!("{}: Main process exited, {}", self.unit, describe(exit)));
                    self.state.set("deactivating", "stop");
                    let _ = self.run_all(self.config.exec_stop.clone(), self.config.timeout_stop).await;
                    if let Some(pgid) = pgid { self.kill_remaining(pgid) }
                    self.run_stop_post().await;
                    return Outcome::Ended(exit);
                }
                () = Self::stopped(&mut self.stop) => {
                    self.say(&format!("Stopping {}...", self.description));
                    self.state.set("deactivating", "stop");
                    let _ = self.run_all_unstoppable(self.config.exec_stop.clone()).await;
                    self.terminate(&mut main).await;
                    self.run_stop_post().await;
                    return Outcome::Stopped;
                }
                () = Self::reload_asked(&mut self.reloads) => self.reload(pgid, "running").await,
            }
        }
    }

    async fn run_forking(&mut self) -> Outcome {
        self.state.set("activating", "start");
        let command = match self.command(&self.config.exec_start[0].clone()) {
            Ok(command) => command,
            Err(exit) => return self.after_failed_start(Outcome::Ended(exit)).await,
        };
        let mut starter = match self.start_process(&command).await {
            Ok(started) => MainProcess::Spawned(started.child),
            Err(outcome) => return self.after_failed_start(outcome).await,
        };
        let Some(pgid) = starter.id() else {
            return self.after_failed_start(Outcome::Ended(Exit::Code(EXIT_EXEC))).await;
        };
        let timeout = self.config.timeout_start.unwrap_or(Duration::MAX);
        let status = tokio::select! {
            status = starter.wait() => status.map_or(Exit::Code(EXIT_EXEC), exit_of),
            () = tokio::time::sleep(timeout) => Exit::Timeout,
            () = Self::stopped(&mut self.stop) => {
                self.terminate(&mut starter).await;
                return Outcome::Stopped;
            }
        };
        if status != Exit::Code(0) {
            signal_group(pgid, libc::SIGKILL);
            return self.after_failed_start(Outcome::Ended(status)).await;
        }
        let main_pid = self.trusted_main_pid(pgid);
        let context = self.context.clone();
        if !main_pid.map_or_else(|| context.unit_alive(pgid), process_alive) {
            self.run_stop_post().await;
            return Outcome::Ended(Exit::Code(0));
        }
        self.say(&format!("Started {}.", self.description));
        self.supervise_forking(pgid, main_pid).await
    }

    /// A forking service's daemon, until it ends, is stopped, or is handed over.
    async fn supervise_forking(&mut self, pgid: u32, main_pid: Option<u32>) -> Outcome {
        let context = self.context.clone();
        let alive = move || main_pid.map_or_else(|| context.unit_alive(pgid), process_alive);
        self.state.main_pid(main_pid);
        self.state.set("active", "running");
        loop {
            tokio::select! {
                () = Self::parked(&mut self.park) => return Outcome::Parked(ParkedProcess::Forking { pgid, main_pid }),
                () = tokio::time::sleep(POLL) => {
                    if !alive() {
                        self.say(&format!("{}: Main process exited", self.unit));
                        self.state.main_pid(None);
                        self.kill_remaining(pgid);
                        self.run_stop_post().await;
                        return Outcome::Ended(Exit::Code(0));
                    }
                }
                () = Self::stopped(&mut self.stop) => break,
                () = Self::reload_asked(&mut self.reloads) => self.reload(main_pid, "running").await,
            }
        }
        self.say(&format!("Stopping {}...", self.description));
        self.state.set("deactivating", "stop");
        let _ = self.run_all_unstoppable(self.config.exec_stop.clone()).await;
        self.state.set("deactivating", "stop-sigterm");
        match main_pid {
            Some(pid) if self.config.kill_mode != KillMode::ControlGroup => {
                signal_process(pid, self.config.kill_signal)
            }
            _ => self.context.signal_unit(pgid, self.config.kill_signal),
        }
        // No deadline for `TimeoutStopSec=infinity` (or one too far to represent).
        let deadline = self.config.timeout_stop.and_then(|timeout| Instant::now().checked_add(timeout));
        while alive() && deadline.is_none_or(|deadline| Instant::now() < deadline) {
            tokio::time::sleep(POLL).await;
        }
        if self.config.kill_mode != KillMode::None {
            self.context.kill_unit(pgid);
            if let Some(pid) = main_pid {
                signal_process(pid, libc::SIGKILL);
            }
            self.context.unit_gone(pgid, KILL_WAIT).await;
        }
        self.state.main_pid(None);
        self.run_stop_post().await;
        Outcome::Stopped
    }

    /// What is left of the unit once its main process is gone: the main process's group,
    /// and its whole cgroup unless `KillMode=` keeps the rest.
    fn kill_remaining(&self, pgid: u32) {
        match self.config.kill_mode {
            KillMode::ControlGroup | KillMode::Mixed => self.context.kill_unit(pgid),
            KillMode::Process | KillMode::None => signal_group(pgid, libc::SIGKILL),
        }
    }

    /// The main PID a forking unit's `PIDFile=` names, if that process is the unit's own.
    /// A PID file is written by the unit: trusting any number in it would let a unit make
    /// fleetd (root) signal any process on the machine.
    fn trusted_main_pid(&self, pgid: u32) -> Option<u32> {
        let path = self.config.pid_file.as_ref()?;
        let pid = std::fs::read_to_string(path).ok()?.trim().parse::<u32>().ok()?;
        if self.context.owns(pid, pgid) {
            return Some(pid);
        }
        self.say(&format!(
            "{}: PID file {path} names process {pid}, which is not one of the unit's processes; ignoring it",
            self.unit
        ));
        None
    }

    /// Stop-time commands run to their end even though a stop is what is going on.
    async fn run_all_unstoppable(&mut self, values: Vec<String>) -> Option<Outcome> {
        let (_keep, never) = watch::channel(false);
        let real = std::mem::replace(&mut self.stop, never);
        let outcome = self.run_all(values, self.config.timeout_stop).await;
        self.stop = real;
        outcome
    }

    async fn run_stop_post(&mut self) {
        if !self.config.exec_stop_post.is_empty() {
            self.state.set("deactivating", "stop-post");
            let _ = self.run_all_unstoppable(self.config.exec_stop_post.clone()).await;
        }
    }

    /// Stops a running process as `KillMode=` and `KillSignal=` say, escalating to SIGKILL
    /// after `TimeoutStopSec=`.
    async fn terminate(&mut self, child: &mut MainProcess) {
        let Some(pid) = child.id() else { return };
        self.state.set("deactivating", "stop-sigterm");
        let signal = self.config.kill_signal;
        match self.config.kill_mode {
            KillMode::ControlGroup => {
                self.context.signal_unit(pid, signal);
                self.context.signal_unit(pid, libc::SIGCONT);
            }
            KillMode::Mixed | KillMode::Process => signal_process(pid, signal),
            KillMode::None => {}
        }
        let timeout = self.config.timeout_stop.unwrap_or(Duration::MAX);
        if tokio::time::timeout(timeout, child.wait()).await.is_err() {
            self.state.set("deactivating", "stop-sigkill");
            self.say(&format!("{}: State 'stop-sigterm' timed out. Killing.", self.unit));
            match self.config.kill_mode {
                KillMode::Process => signal_process(pid, libc::SIGKILL),
                KillMode::None => {}
                _ => self.context.kill_unit(pid),
            }
            let _ = child.wait().await;
        }
        if matches!(self.config.kill_mode, KillMode::ControlGroup | KillMode::Mixed) {
            self.context.kill_unit(pid);
            self.context.unit_gone(pid, KILL_WAIT).await;
        }
    }
}
