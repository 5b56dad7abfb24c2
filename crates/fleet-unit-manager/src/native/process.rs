//! Starting one command of a unit: its own process group, a clean environment, its output
//! into the unit's log, and death with fleetd.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};

use super::cgroup::UnitCgroup;
use super::command::ExecCommand;
use super::output::{OutputDrain, copy_streams};
use super::unit_log::LogSink;
pub use crate::account::{Account, lookup_group, lookup_user};

/// Set in every unit process, so that a fleetd restarting after a crash can find and stop
/// the processes its predecessor left behind.
pub const SUPERVISOR_MARKER: &str = "FLEET_NATIVE_SUPERVISOR";
/// The variable naming the unit a process belongs to, beside [`SUPERVISOR_MARKER`].
pub const UNIT_MARKER: &str = "FLEET_NATIVE_UNIT";

/// The umask and soft open-file limit a unit's processes start with, as under systemd.
const UNIT_UMASK: libc::mode_t = 0o022;
const UNIT_OPEN_FILES: libc::rlim_t = 1024;

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything a unit's commands share.
#[derive(Clone, Debug)]
pub struct ExecContext {
    pub environment: BTreeMap<String, String>,
    pub working_directory: Option<PathBuf>,
    pub account: Option<Account>,
    pub gid: Option<u32>,
    pub marker: String,
    /// The unit's name.
    pub unit: String,
    /// The unit's cgroup, where there is a writable cgroup v2 hierarchy.
    pub cgroup: Option<UnitCgroup>,
}

impl ExecContext {
    /// The environment a command starts with: systemd's basics, the unit's own variables.
    fn full_environment(&self) -> BTreeMap<String, String> {
        let mut environment = BTreeMap::from([
            ("PATH".to_string(), DEFAULT_PATH.to_string()),
            (SUPERVISOR_MARKER.to_string(), self.marker.clone()),
            (UNIT_MARKER.to_string(), self.unit.clone()),
        ]);
        if let Some(account) = &self.account {
            environment.insert("HOME".into(), account.home.clone());
            environment.insert("USER".into(), account.name.clone());
            environment.insert("LOGNAME".into(), account.name.clone());
            environment.insert("SHELL".into(), account.shell.clone());
        }
        environment.extend(self.environment.clone());
        environment
    }
}

/// A process [`spawn`] started.
pub struct Started {
    pub child: Child,
    /// The read ends of the pipes its output comes through (copied into its unit's log by
    /// tasks of their own), which a handover for an upgrade passes on.
    pub output: Vec<RawFd>,
    /// What its log lines are called: the program's file name.
    pub ident: String,
    /// Takes what the process wrote into its log, once it exited.
    pub drain: OutputDrain,
}

/// Starts `command` in a new process group whose output goes to `sink`.
pub fn spawn(command: &ExecCommand, context: &ExecContext, sink: &LogSink) -> io::Result<Started> {
    let program = &command.argv[0];
    let mut process = Command::new(program);
    process
        .args(&command.argv[1..])
        .env_clear()
        .envs(context.full_environment())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(directory) = &context.working_directory {
        process.current_dir(directory);
    }
    let uid = context.account.as_ref().map(|account| account.uid);
    let gid = context.gid.or(context.account.as_ref().map(|account| account.gid));
    let cgroup = context.cgroup.clone();
    let fleetd = std::process::id();
    // SAFETY: open, write, close, setgroups, setgid, setuid, prctl, getppid, umask, getrlimit
    // and setrlimit are async-signal-safe system calls; the closure reads only memory prepared
    // before the fork and allocates nothing.
    unsafe {
        process.pre_exec(move || {
            // Into the unit's cgroup while still root: once the unit's user, the process
            // could not move itself out of fleetd's cgroup.
            if let Some(cgroup) = &cgroup {
                cgroup.procs().join_from_child()?;
            }
            crate::cgroup_procs::become_account(uid, gid)?;
            // After the change of user, which clears the parent-death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // fleetd may have died since the fork, before the signal was asked for: then none
            // comes, and the keeper's sweep at fleetd's death may have looked before this
            // process was in its unit's cgroup or carried the marker. It must not run on
            // unseen (an `AtMostOnce=` unit would, while its machine's presence lapses).
            if u32::try_from(libc::getppid()).ok() != Some(fleetd) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            // What systemd gives a service: umask 0022 and at most 1024 open files by
            // default (fleetd itself runs with 0077 and a raised limit).
            libc::umask(UNIT_UMASK);
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur > UNIT_OPEN_FILES {
                limit.rlim_cur = UNIT_OPEN_FILES;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
            Ok(())
        });
    }
    let mut child = process.spawn()?;
    let pid = child.id();
    let ident = program.rsplit('/').next().unwrap_or(program).to_string();
    let mut streams: Vec<(Box<dyn tokio::io::AsyncRead + Unpin + Send>, RawFd)> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let fd = stdout.as_raw_fd();
        streams.push((Box::new(stdout), fd));
    }
    if let Some(stderr) = child.stderr.take() {
        let fd = stderr.as_raw_fd();
        streams.push((Box::new(stderr), fd));
    }
    let output = streams.iter().map(|(_, fd)| *fd).collect();
    let drain = copy_streams(streams, sink, &ident, pid);
    Ok(Started { child, output, ident, drain })
}

/// Copies the output a process of an earlier image of fleetd writes into `fds` (pipes that
/// image handed over) into its unit's log, as [`spawn`] does for the processes it starts.
pub fn copy_handed_output(fds: &[RawFd], sink: &LogSink, ident: &str, pid: u32) -> Vec<RawFd> {
    let mut copied = Vec::new();
    for fd in fds.iter().copied().filter(|fd| super::handover::is_pipe(*fd)) {
        // SAFETY: the descriptor was handed over for this pipe alone and nothing else in
        // this image owns it (it was checked to be a pipe just now).
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        match tokio::net::unix::pipe::Receiver::from_owned_fd(owned) {
            Ok(receiver) => {
                copied.push(fd);
                // Followed to its end: an adopted process's exit does not drain it.
                drop(copy_streams(vec![(receiver, fd)], sink, ident, Some(pid)));
            }
            Err(error) => tracing::warn!(fd, %error, "cannot read a unit's output handed over"),
        }
    }
    copied
}

/// Sends `signal` to every process in the group `pgid`.
pub fn signal_group(pgid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(-(pgid as i32), signal);
    }
}

pub fn signal_process(pid: u32, signal: i32) {
    // SAFETY: as above.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Whether any process of the group `pgid` is still alive.
pub fn group_alive(pgid: u32) -> bool {
    // SAFETY: as above; signal 0 only checks for existence.
    unsafe { libc::kill(-(pgid as i32), 0) == 0 }
}

pub fn process_alive(pid: u32) -> bool {
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Whether the environment of process `pid` carries `marker`.
pub fn marked_with(pid: u32, marker: &str) -> bool {
    let wanted = format!("{SUPERVISOR_MARKER}={marker}");
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|environ| environ.split(|byte| *byte == 0).any(|item| item == wanted.as_bytes()))
}

/// Every process (but this one) whose environment carries `marker`.
pub fn marked_processes(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let own = std::process::id();
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own && marked_with(*pid, marker))
        .collect()
}

/// The processes of `unit` whose environment carries `marker`.
pub fn unit_marked_processes(marker: &str, unit: &str) -> Vec<u32> {
    marked_processes(marker).into_iter().filter(|pid| unit_of(*pid).as_deref() == Some(unit)).collect()
}

/// Kills every process of `unit` whose environment carries `marker`; how many it found.
pub fn kill_unit_leftovers(marker: &str, unit: &str) -> usize {
    let processes = unit_marked_processes(marker, unit);
    for pid in &processes {
        signal_process(*pid, libc::SIGKILL);
    }
    processes.len()
}

/// Kills every process whose environment carries `marker`: the units a crashed fleetd left.
/// Returns how many it found.
pub fn kill_leftovers(marker: &str) -> usize {
    kill_leftovers_but(marker, &std::collections::BTreeSet::new())
}

/// [`kill_leftovers`] but for the processes of the units in `kept` (handed over to run on).
pub fn kill_leftovers_but(marker: &str, kept: &std::collections::BTreeSet<String>) -> usize {
    let leftovers: Vec<u32> = marked_processes(marker)
        .into_iter()
        .filter(|pid| unit_of(*pid).is_none_or(|unit| !kept.contains(&unit)))
        .collect();
    for pid in &leftovers {
        signal_process(*pid, libc::SIGKILL);
    }
    leftovers.len()
}

/// The unit a marked process's environment names.
fn unit_of(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{UNIT_MARKER}=");
    environ
        .split(|byte| *byte == 0)
        .find_map(|item| item.strip_prefix(prefix.as_bytes()))
        .map(|unit| String::from_utf8_lossy(unit).into_owned())
}
