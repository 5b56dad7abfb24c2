//! A unit's main process, whether this fleetd started it or took it over from the fleetd it
//! replaced in place (`execve` keeps the process's children, not tokio's handles on them).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::process::Child;

pub enum MainProcess {
    Spawned(Child),
    Adopted(AdoptedChild),
}

impl MainProcess {
    pub fn id(&self) -> Option<u32> {
        match self {
            Self::Spawned(child) => child.id(),
            Self::Adopted(child) => child.exited.is_none().then_some(child.pid),
        }
    }

    /// Waits for the process to end and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Self::Spawned(child) => child.wait().await,
            Self::Adopted(child) => child.wait().await,
        }
    }
}

/// A child of this process that an earlier image of it started: watched through a pidfd
/// (readable once it ended), reaped with `waitpid`.
pub struct AdoptedChild {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    exited: Option<ExitStatus>,
}

impl AdoptedChild {
    /// Takes over `pid`, which must be a child of this process.
    pub fn adopt(pid: u32) -> io::Result<Self> {
        let raw_pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if parent_of(pid)? != std::process::id() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {pid} is not a child of this fleetd"),
            ));
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        // SAFETY: the descriptor was just opened here and nothing else owns it.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd's descriptor stays open and the same until it is dropped, which
        // only the AsyncFd that owns it does.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(|error| io::Error::other(error.to_string()))?;
        Ok(Self { pid, pidfd, exited: None })
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.exited {
                return Ok(status);
            }
            if let Some(status) = self.reap()? {
                self.exited = Some(status);
                continue;
            }
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }

    /// The process's status if it ended (reaping it), `None` while it runs.
    fn reap(&self) -> io::Result<Option<ExitStatus>> {
        let mut status = 0;
        let pid = libc::pid_t::try_from(self.pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: waitpid writes the status into the integer it is given, on this stack.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        match reaped {
            0 => Ok(None),
            reaped if reaped == pid => Ok(Some(ExitStatus::from_raw(status))),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// The parent of process `pid`, read from `/proc/<pid>/stat` (after the command's closing
/// parenthesis, which the command itself cannot fake: it is the last one on the line).
pub fn parent_of(pid: u32) -> io::Result<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_command = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    after_command
        .split_whitespace()
        .nth(1)
        .and_then(|parent| parent.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cannot read the parent of process {pid}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_adopted_child_is_reaped_with_its_status() {
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", "read line; exit 7"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut adopted = MainProcess::Adopted(AdoptedChild::adopt(child.id()).unwrap());
        assert_eq!(adopted.id(), Some(child.id()));
        // Its standard input closes with the handle: the shell reads end-of-file and exits 7.
        drop(child);
        let status = adopted.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        assert_eq!(adopted.id(), None, "gone once reaped");
    }

    #[test]
    fn a_process_that_is_not_a_child_is_refused() {
        let error = AdoptedChild::adopt(1).err().expect("init is nobody's child here");
        assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
    }

    #[test]
    fn the_parent_is_read_past_a_command_with_parentheses() {
        assert_eq!(parent_of(std::process::id()).unwrap(), std::os::unix::process::parent_id());
    }
}
