//! The state directory's lock: one fleetd per `state_dir`, taken before fleetd touches
//! anything else (unit processes, the store, the lease file).

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::keeper_lock::open_lock_file;

/// Held for fleetd's whole life; the lock goes with the process (or with this value).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error("state_dir {dir} is in use by another fleetd{holder}; refusing to start")]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock state_dir {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
}

impl StateLock {
    /// Takes the exclusive lock on `dir` (through `dir/fleetd.lock`, 0600), or says which
    /// process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, StateLockError> {
        let io_error = |source| StateLockError::Io { dir: dir.to_path_buf(), source };
        let mut file = open_lock_file(&dir.join("fleetd.lock")).map_err(io_error)?;
        // SAFETY: flock only takes a descriptor this process owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::WouldBlock {
                return Err(io_error(error));
            }
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let holder = match pid.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            return Err(StateLockError::Held { dir: dir.to_path_buf(), holder });
        }
        file.set_len(0).map_err(io_error)?;
        file.rewind().map_err(io_error)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io_error)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let refused = StateLock::acquire(dir.path()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "state_dir {} is in use by another fleetd (pid {}); refusing to start",
                dir.path().display(),
                std::process::id()
            )
        );
        drop(first);
        StateLock::acquire(dir.path()).unwrap();
    }
}
