//! What a native supervisor hands to the fleetd that replaces it in place for an upgrade.
//!
//! `execve` keeps the process: its PID, its children (the units' processes, which the
//! spawning thread forked and which so keep their parent-death signal unfired) and every
//! descriptor not marked close-on-exec. It keeps no memory: what the next image needs to
//! supervise the units as they run is written here first, into a 0600 file in the state
//! directory, and read back by the next image, which takes it only when it carries the
//! nonce that image was started with (a file left by a crash is never mistaken for one).

use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use fleet_core::{UnitHash, UnitOption};
use serde::{Deserialize, Serialize};

use super::main_process::MainProcess;

/// A runner's unit as it parked: its processes left as they run.
pub enum ParkedProcess {
    /// A main process waited on (`Type=simple`, `exec`, `notify`, `idle`), with the read ends
    /// of the pipes its output comes through and what its log lines are called.
    Main { main: Box<MainProcess>, output: Vec<RawFd>, ident: String },
    /// A forking service's daemon, known by its starter's process group and its PID file.
    Forking { pgid: u32, main_pid: Option<u32> },
    /// A oneshot service that remains active once its commands ended.
    Exited,
}

impl ParkedProcess {
    fn handed(&self) -> Option<HandedProcess> {
        Some(match self {
            Self::Main { main, output, ident } => {
                HandedProcess::Main { pid: main.id()?, output: output.clone(), ident: ident.clone() }
            }
            Self::Forking { pgid, main_pid } => HandedProcess::Forking { pgid: *pgid, main_pid: *main_pid },
            Self::Exited => HandedProcess::Exited,
        })
    }
}

/// [`ParkedProcess`] as written down.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandedProcess {
    Main { pid: u32, output: Vec<RawFd>, ident: String },
    Forking { pgid: u32, main_pid: Option<u32> },
    Exited,
}

/// One unit handed over: the file it was loaded from, its state, its processes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedUnit {
    pub name: String,
    pub options: Vec<UnitOption>,
    pub hash: UnitHash,
    pub active: String,
    pub sub: String,
    pub process: HandedProcess,
}

/// Everything handed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    pub nonce: String,
    /// fleetd's PID, which `execve` keeps.
    pub pid: u32,
    /// fleetd's ends of the pipes to its keeper: the lines it writes, the acknowledgements.
    pub keeper: Option<(RawFd, RawFd)>,
    pub units: Vec<HandedUnit>,
}

impl Handover {
    /// The handover of `parked` units (name, options, hash, state, process); a main process
    /// already reaped is left out (the next image finds the unit stopped and starts it).
    pub fn of<'a>(
        nonce: &str,
        keeper: Option<(RawFd, RawFd)>,
        parked: impl IntoIterator<Item = (&'a str, Vec<UnitOption>, UnitHash, (String, String), &'a ParkedProcess)>,
    ) -> Self {
        let units = parked
            .into_iter()
            .filter_map(|(name, options, hash, (active, sub), process)| {
                Some(HandedUnit { name: name.to_string(), options, hash, active, sub, process: process.handed()? })
            })
            .collect();
        Self { nonce: nonce.to_string(), pid: std::process::id(), keeper, units }
    }

    /// Every descriptor the next image must inherit.
    pub fn descriptors(&self) -> Vec<RawFd> {
        let keeper = self.keeper.iter().flat_map(|(input, acknowledgements)| [*input, *acknowledgements]);
        let outputs = self.units.iter().flat_map(|unit| match &unit.process {
            HandedProcess::Main { output, .. } => output.clone(),
            _ => Vec::new(),
        });
        keeper.chain(outputs).collect()
    }

    /// Reads `text` as a handover for this process started with `nonce`: one written for
    /// another nonce or another process is none.
    pub fn read(text: &str, nonce: &str) -> Result<Self, String> {
        let handover: Self =
            serde_json::from_str(text).map_err(|error| format!("cannot read the handover: {error}"))?;
        if handover.nonce != nonce {
            return Err("the handover was written for another fleetd".into());
        }
        if handover.pid != std::process::id() {
            return Err(format!("the handover was written by process {}, not this one", handover.pid));
        }
        Ok(handover)
    }

    pub fn write(&self, state_dir: &Path) -> io::Result<()> {
        let text = serde_json::to_vec(self).map_err(io::Error::other)?;
        fleet_fs::write_private(&handover_path(state_dir), &text)
    }

    /// Takes the handover the previous image wrote for `nonce` (removing the file); `None`
    /// when there is none for it.
    pub fn take(state_dir: &Path, nonce: &str) -> Option<Self> {
        let path = handover_path(state_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the units handed over");
                return None;
            }
        };
        discard(state_dir);
        match Self::read(&text, nonce) {
            Ok(handover) => Some(handover),
            Err(error) => {
                tracing::warn!(path = %path.display(), "{error}: its units are not taken over");
                None
            }
        }
    }
}

/// Removes a handover that is not to be taken (the exec failed, or it was read).
pub fn discard(state_dir: &Path) {
    let _ = std::fs::remove_file(handover_path(state_dir));
}

fn handover_path(state_dir: &Path) -> PathBuf {
    state_dir.join("native").join("handover.json")
}

/// Whether `fd` is open and the read end of a pipe: what a handed-over output or keeper
/// acknowledgement descriptor must still be.
pub fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: a zeroed stat is a valid value of this plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the stat it is given, on this stack; a closed fd fails.
    let examined = unsafe { libc::fstat(fd, &mut stat) } == 0;
    examined && stat.st_mode & libc::S_IFMT == libc::S_IFIFO
}

/// Lets `fd` pass through `execve`.
pub fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number changes only that descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(nonce: &str, pid: u32) -> Handover {
        Handover {
            nonce: nonce.into(),
            pid,
            keeper: Some((7, 8)),
            units: vec![HandedUnit {
                name: "web.service".into(),
                options: vec![UnitOption::new("Service", "ExecStart", "/bin/sleep 1")],
                hash: UnitHash([0; 20]),
                active: "active".into(),
                sub: "running".into(),
                process: HandedProcess::Main { pid: 42, output: vec![11, 12], ident: "sleep".into() },
            }],
        }
    }

    #[test]
    fn a_handover_is_read_back_whole_by_the_process_it_was_written_for() {
        let handover = sample("n1", std::process::id());
        let text = serde_json::to_string(&handover).unwrap();
        assert_eq!(Handover::read(&text, "n1").unwrap(), handover);
        assert_eq!(handover.descriptors(), vec![7, 8, 11, 12]);
    }

    #[test]
    fn a_handover_for_another_nonce_or_process_is_refused() {
        let text = serde_json::to_string(&sample("n1", std::process::id())).unwrap();
        assert!(Handover::read(&text, "n2").unwrap_err().contains("another fleetd"));
        let other = serde_json::to_string(&sample("n1", std::process::id() + 1)).unwrap();
        assert!(Handover::read(&other, "n1").unwrap_err().contains("not this one"));
        assert!(Handover::read("{", "n1").unwrap_err().contains("cannot read"));
    }

    #[test]
    fn a_handover_file_is_private_and_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("native")).unwrap();
        let handover = sample("n1", std::process::id());
        handover.write(dir.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("native/handover.json")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Handover::take(dir.path(), "n1"), Some(handover));
        assert_eq!(Handover::take(dir.path(), "n1"), None, "removed once taken");
    }

    #[test]
    fn only_pipes_pass_for_handed_pipes() {
        let (read, _write) = std::io::pipe().unwrap();
        assert!(is_pipe(std::os::fd::AsRawFd::as_raw_fd(&read)));
        let file = tempfile::tempfile().unwrap();
        assert!(!is_pipe(std::os::fd::AsRawFd::as_raw_fd(&file)));
        assert!(!is_pipe(-1));
    }
}
