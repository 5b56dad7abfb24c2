//! The keeper: a small process, started by fleetd, that outlives it only long enough to kill
//! every unit process fleetd leaves behind when it dies without a clean shutdown (SIGKILL, a
//! crash). It learns of the death by end-of-file on a pipe whose write end only fleetd holds,
//! so no signal can be missed. It finds the units by their cgroups (which nothing a unit
//! does can leave) and by the supervisor marker in their environment.
//!
//! It also holds the fence of `AtMostOnce=` units: fleetd writes `fence <ms> <unit>...` lines
//! on the same pipe, a moment of `CLOCK_MONOTONIC` by which those units must have stopped
//! (their machine's presence may have lapsed then); unless a later line moves or lifts it,
//! the keeper kills them at that moment, even when fleetd is frozen and cannot.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::cgroup::CgroupBase;
use super::handover::is_pipe;
use super::process::{kill_leftovers, kill_unit_leftovers};

/// The argument that turns the fleetd binary into a keeper.
pub const KEEPER_ARGUMENT: &str = "--native-unit-keeper";

/// Starts `program KEEPER_ARGUMENT marker` with a pipe on its standard input and one on its
/// standard output (its acknowledgements); fleetd keeps the returned child (and so the
/// pipes) for its whole life.
pub fn spawn_keeper(program: &Path, marker: &str, cgroups: Option<&Path>) -> io::Result<Child> {
    let mut command = Command::new(program);
    command.arg(KEEPER_ARGUMENT).arg(marker);
    if let Some(dir) = cgroups {
        command.arg(dir);
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C meant for fleetd must not reach the keeper.
        .process_group(0)
        .spawn()
}

/// fleetd's ends of the pipes to its keeper.
pub struct KeeperPipe {
    input: File,
    acknowledgements: io::BufReader<File>,
}

impl KeeperPipe {
    /// The pipes of a keeper [`spawn_keeper`] started.
    pub fn of(keeper: &mut Child) -> Option<Self> {
        let input = File::from(OwnedFd::from(keeper.stdin.take()?));
        let acknowledgements = File::from(OwnedFd::from(keeper.stdout.take()?));
        Some(Self { input, acknowledgements: io::BufReader::new(acknowledgements) })
    }

    /// The pipes an earlier image of this fleetd handed over (by descriptor), if both are
    /// still open pipes.
    pub fn adopt(input: RawFd, acknowledgements: RawFd) -> Option<Self> {
        if input == acknowledgements || !is_pipe(input) || !is_pipe(acknowledgements) {
            return None;
        }
        // SAFETY: both descriptors were handed over for these pipes alone, are open pipes
        // (checked just now) and distinct, and nothing else in this image owns them.
        let (input, acknowledgements) = unsafe { (File::from_raw_fd(input), File::from_raw_fd(acknowledgements)) };
        Some(Self { input, acknowledgements: io::BufReader::new(acknowledgements) })
    }

    /// The descriptors to hand over: the lines' pipe, the acknowledgements' pipe.
    pub fn descriptors(&self) -> (RawFd, RawFd) {
        (self.input.as_raw_fd(), self.acknowledgements.get_ref().as_raw_fd())
    }

    /// Hands the keeper `line` and waits until it took it in (and finished any kill an
    /// earlier deadline started). Blocking: run it off the runtime's threads.
    pub fn send(&mut self, line: &str) -> io::Result<()> {
        self.input.write_all(line.as_bytes())?;
        let mut answer = String::new();
        if io::BufRead::read_line(&mut self.acknowledgements, &mut answer)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the keeper is gone"));
        }
        Ok(())
    }
}

/// Where a keeper holds its lock: the state directory its marker names.
pub fn keeper_lock_path(marker: &str) -> std::path::PathBuf {
    Path::new(marker).join("native").join("keeper.lock")
}

/// The keeper's whole life: hold the keeper lock, wait for end-of-file, then kill what is
/// left: everything in the unit cgroups below `cgroups` (when fleetd had them), and every
/// process with the marker. A new fleetd waits for the lock, so it never starts units that
/// this keeper would then kill.
pub fn run_keeper(marker: &str, cgroups: Option<&Path>) -> usize {
    let _held = fleet_fs::lock_waiting(&keeper_lock_path(marker), Duration::from_secs(60)).ok().flatten();
    let mut buffer = [0u8; 4096];
    let mut stdin = io::stdin();
    let mut pending: Vec<u8> = Vec::new();
    let mut fence: Option<Fence> = None;
    loop {
        let wait = fence.as_ref().map(|fence| fence.deadline_ms.saturating_sub(monotonic_ms()));
        if !readable_within(wait) {
            if let Some(fence) = fence.take() {
                for unit in &fence.units {
                    kill_unit(marker, cgroups, unit);
                }
            }
            continue;
        }
        match stdin.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => pending.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(next) = std::str::from_utf8(&line).ok().and_then(Fence::parse) {
                fence = (!next.units.is_empty()).then_some(next);
            }
            // Every line is acknowledged once taken in: a kill that an earlier deadline
            // started is over by then, so fleetd starts nothing the keeper then kills.
            let mut stdout = io::stdout();
            let _ = stdout.write_all(ACKNOWLEDGED).and_then(|()| stdout.flush());
        }
        if pending.len() > MAX_LINE {
            pending.clear();
        }
    }
    let base = cgroups.map(|dir| CgroupBase::at(dir.to_path_buf()));
    let killed = base.as_ref().map_or(0, CgroupBase::kill_everything) + kill_leftovers(marker);
    // The dead fleetd's base goes too: it leaves nothing, as a clean shutdown does (a test
    // machine gathered a thousand empty ones).
    if let Some(base) = &base {
        base.remove_if_empty();
    }
    killed
}

/// What the keeper answers each line it took in.
pub const ACKNOWLEDGED: &[u8] = b"armed\n";

/// The longest line the keeper keeps reading; anything longer is dropped.
const MAX_LINE: usize = 1 << 20;

/// Units to kill at a moment of `CLOCK_MONOTONIC` (milliseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub deadline_ms: u64,
    pub units: Vec<String>,
}

impl Fence {
    /// The line fleetd writes for it.
    pub fn line(&self) -> String {
        let mut line = format!("fence {}", self.deadline_ms);
        for unit in &self.units {
            line.push(' ');
            line.push_str(unit);
        }
        line.push('\n');
        line
    }

    /// Reads a line written by [`Fence::line`]; unit names that could not name a unit are
    /// left out.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        if words.next() != Some("fence") {
            return None;
        }
        let deadline_ms = words.next()?.parse().ok()?;
        let units = words.filter(|unit| !unit.contains('/') && !unit.starts_with('.')).map(str::to_string).collect();
        Some(Self { deadline_ms, units })
    }
}

/// Now on `CLOCK_MONOTONIC`, in milliseconds: the clock fleetd and its keeper share.
pub fn monotonic_ms() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec it is given, which lives on this stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1000 + u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000_000
}

/// Whether standard input has something to read (or its end) within `wait` milliseconds
/// (`None`: however long it takes).
fn readable_within(wait: Option<u64>) -> bool {
    let timeout = wait.map_or(-1, |ms| i32::try_from(ms).unwrap_or(i32::MAX));
    let mut descriptor = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll reads and writes the one pollfd it is given, which lives on this stack.
    let ready = unsafe { libc::poll(&mut descriptor, 1, timeout) };
    // Interrupted (-1): look again; the caller recomputes the wait.
    ready != 0
}

/// Kills every process of `unit`: its cgroup where there are cgroups, and the processes
/// whose environment names it under this supervisor's marker (one whose cgroup could not be
/// made runs outside it).
fn kill_unit(marker: &str, cgroups: Option<&Path>, unit: &str) {
    if let Some(dir) = cgroups {
        CgroupBase::at(dir.to_path_buf()).kill_unit(unit);
    }
    kill_unit_leftovers(marker, unit);
}
