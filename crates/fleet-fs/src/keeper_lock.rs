//! A lock one process holds for its whole life so that the next one can wait for it to be
//! gone: the native supervisor's keeper holds it while it may still kill unit processes, and
//! a new fleetd waits for it before it starts any.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Held until dropped (or until the process ends).
#[derive(Debug)]
pub struct HeldLock {
    _file: File,
}

/// Opens (creating it 0600, never through a link) a file that is locked, not written to.
pub(crate) fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Takes the exclusive lock on `path` (created 0600), waiting for its holder for `wait` at
/// most. `Ok(None)` when the holder kept it that long.
pub fn lock_waiting(path: &Path, wait: Duration) -> io::Result<Option<HeldLock>> {
    let file = open_lock_file(path)?;
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: flock only takes a descriptor this process owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(HeldLock { _file: file }));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::WouldBlock {
            return Err(error);
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_holder_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keeper.lock");
        let first = lock_waiting(&path, Duration::ZERO).unwrap().expect("free");
        assert!(lock_waiting(&path, Duration::from_millis(50)).unwrap().is_none(), "held");
        let waiter = std::thread::spawn({
            let path = path.clone();
            move || lock_waiting(&path, Duration::from_secs(5)).unwrap().is_some()
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(first);
        assert!(waiter.join().unwrap(), "taken once the first let go");
    }
}
