//! Starting one command of a unit: its own process group, a clean environment, its output
//! into the unit's log, and death with fleetd.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};

use super::cgroup::UnitCgroup;
use super::command::ExecCommand;
use super::unit_log::{LogSink, MAX_LINE_BYTES};
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
    let mut output = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        output.push(stdout.as_raw_fd());
        tokio::spawn(copy_lines(stdout, sink.clone(), ident.clone(), pid));
    }
    if let Some(stderr) = child.stderr.take() {
        output.push(stderr.as_raw_fd());
        tokio::spawn(copy_lines(stderr, sink.clone(), ident.clone(), pid));
    }
    Ok(Started { child, output, ident })
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
                tokio::spawn(copy_lines(receiver, sink.clone(), ident.to_string(), Some(pid)));
            }
            Err(error) => tracing::warn!(fd, %error, "cannot read a unit's output handed over"),
        }
    }
    copied
}

/// The read buffer of a unit's output stream until a read fills it.
const QUIET_READ_BYTES: usize = 512;
/// The read buffer of a stream that filled the quiet one.
const BUSY_READ_BYTES: usize = 16 * 1024;

/// Copies a process's output into its unit's log a line at a time; a line longer than
/// [`MAX_LINE_BYTES`] is split, so output without newlines never grows fleetd's memory.
async fn copy_lines(mut stream: impl AsyncRead + Unpin, sink: LogSink, ident: String, pid: Option<u32>) {
    let _open = sink.attach();
    let emit = |line: &[u8]| sink.line(&ident, pid, String::from_utf8_lossy(line).trim_end_matches('\r'));
    let mut pending: Vec<u8> = Vec::new();
    // Small while the stream is quiet, as most units' are: two of these per unit, held for
    // as long as it runs (16 KiB each made 3,000 units 96 MiB of fleetd, and every fork of
    // fleetd slower). A read that fills it gives the stream the large one.
    let mut buffer = vec![0u8; QUIET_READ_BYTES];
    loop {
        let read = match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let filled = read == buffer.len();
        for piece in buffer[..read].split_inclusive(|byte| *byte == b'\n') {
            let (text, ends_line) = match piece.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (piece, false),
            };
            let mut text = text;
            while pending.len() + text.len() >= MAX_LINE_BYTES {
                let take = MAX_LINE_BYTES - pending.len();
                pending.extend_from_slice(&text[..take]);
                emit(&pending);
                pending.clear();
                text = &text[take..];
            }
            pending.extend_from_slice(text);
            if ends_line {
                emit(&pending);
                pending.clear();
            }
        }
        if filled && buffer.len() < BUSY_READ_BYTES {
            buffer.resize(BUSY_READ_BYTES, 0);
        }
    }
    if !pending.is_empty() {
        emit(&pending);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::unit_log::{LogLimits, tail};

    /// Output copied through the small buffer of a quiet stream, then the large one once a read
    /// filled it, comes out as the lines it was: a line across reads is joined, one over
    /// [`MAX_LINE_BYTES`] is split, the last without a newline kept.
    #[tokio::test]
    async fn lines_come_out_whole_whatever_the_reads_that_carried_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let sink = LogSink::new(&path, "host", LogLimits { max_bytes: 1 << 30, files: 1 });
        let long = "y".repeat(QUIET_READ_BYTES * 3);
        let huge = "z".repeat(MAX_LINE_BYTES + 10);
        let output = format!("short\n{long}\n{huge}\nlast without a newline");
        copy_lines(output.as_bytes(), sink, "u".into(), Some(7)).await;
        let logged = tail(&path, 10, LogLimits::default()).unwrap();
        let said: Vec<&str> =
            logged.lines().map(|line| line.split_once("u[7]: ").map_or("", |(_, text)| text)).collect();
        let expected =
            ["short", long.as_str(), &huge[..MAX_LINE_BYTES], &huge[MAX_LINE_BYTES..], "last without a newline"];
        assert_eq!(said, expected);
    }
}
