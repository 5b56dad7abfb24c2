//! The files and directories fleet creates. Everything is private to fleetd's user unless a
//! caller says otherwise: directories 0700, files 0600, whatever umask fleetd inherited, and
//! no file is opened through a symbolic link (`O_NOFOLLOW`), so a link planted by another
//! user cannot redirect a write.

mod keeper_lock;
mod lock;

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub use keeper_lock::{HeldLock, lock_waiting};
pub use lock::{StateLock, StateLockError};

const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

/// Creates `path` and its missing parents as 0700 directories, and makes `path` itself 0700
/// if it already existed with a wider mode.
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(PRIVATE_DIR).create(path)?;
    let metadata = std::fs::symlink_metadata(path)?;
    if !metadata.is_dir() {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} is not a directory", path.display())));
    }
    if metadata.permissions().mode() & 0o777 != PRIVATE_DIR {
        std::fs::set_permissions(path, Permissions::from_mode(PRIVATE_DIR))?;
    }
    Ok(())
}

/// Opens `path` for appending, creating it 0600; refuses a symbolic link.
pub fn open_private_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(PRIVATE_FILE).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Opens `path` for reading; refuses a symbolic link.
pub fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Replaces `path` with `contents` at once: a fresh 0600 file beside it (created exclusively,
/// so never through a link), then renamed over it.
pub fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let temporary = path.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(PRIVATE_FILE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Makes `path` 0600 if it exists with a wider mode (files an older fleetd created).
pub fn make_private(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_file() && metadata.permissions().mode() & 0o077 != 0 => {
            std::fs::set_permissions(path, Permissions::from_mode(PRIVATE_FILE))
        }
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_files_are_private_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b");
        create_private_dir(&state).unwrap();
        assert_eq!((mode(&dir.path().join("a")), mode(&state)), (0o700, 0o700));
        std::fs::set_permissions(&state, Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&state).unwrap();
        assert_eq!(mode(&state), 0o700, "an existing directory is narrowed");
        let log = state.join("u.log");
        open_private_append(&log).unwrap().write_all(b"x").unwrap();
        assert_eq!(mode(&log), 0o600);
        write_private(&state.join("lease"), b"42").unwrap();
        assert_eq!((mode(&state.join("lease")), std::fs::read(state.join("lease")).unwrap()), (0o600, b"42".to_vec()));
        std::fs::set_permissions(&log, Permissions::from_mode(0o644)).unwrap();
        make_private(&log).unwrap();
        assert_eq!(mode(&log), 0o600);
    }

    /// Regression: a log file opened through a symlink planted by another user appended to
    /// the file it pointed at.
    #[test]
    fn planted_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("root-only");
        std::fs::write(&target, "secret\n").unwrap();
        let planted = dir.path().join("u.log");
        symlink(&target, &planted).unwrap();
        assert!(open_private_append(&planted).is_err());
        assert!(open_no_follow(&planted).is_err());
        write_private(&planted, b"replaced").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret\n", "the link's target is untouched");
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "replaced", "the link itself was replaced");
    }
}
