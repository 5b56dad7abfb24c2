//! A unit's credentials (the values of the secrets it names) as its processes find them:
//! one file per credential in a directory of the unit's own, `$CREDENTIALS_DIRECTORY` as
//! systemd lays it out. The directory lives on a tmpfs (`/run`), is readable by the unit's
//! user alone (0500, files 0400) and goes when the unit is unloaded.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One credential: its name in the unit's directory and its value, never printed and wiped
/// when dropped.
pub struct Credential {
    pub name: String,
    value: Vec<u8>,
}

impl Credential {
    pub fn new(name: impl Into<String>, value: Vec<u8>) -> Self {
        Self { name: name.into(), value }
    }

    pub fn value(&self) -> &[u8] {
        &self.value
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        for byte in self.value.iter_mut() {
            // SAFETY: a volatile write to a byte this Vec owns, so it is not optimised away.
            unsafe { std::ptr::write_volatile(byte, 0) };
        }
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}, {} bytes)", self.name, self.value.len())
    }
}

/// Where the units' credential directories are made: `<base>/<unit>`.
#[derive(Clone, Debug)]
pub struct CredentialDirs {
    base: PathBuf,
}

impl CredentialDirs {
    pub fn new(base: PathBuf) -> Self {
        Self { base }
    }

    /// The directory of `unit`'s credentials (whether or not it has any).
    pub fn of(&self, unit: &str) -> Option<PathBuf> {
        fleet_core::unit_name::validate_name(unit).ok()?;
        Some(self.base.join(unit))
    }

    /// Writes `credentials` as `unit`'s (replacing what it had), readable by `owner` (uid,
    /// gid; fleetd's own user when `None`) alone; none removes them. The directory, or `None`.
    pub fn write(
        &self,
        unit: &str,
        credentials: &[Credential],
        owner: Option<(u32, u32)>,
    ) -> io::Result<Option<PathBuf>> {
        let dir = self.of(unit).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a unit name"))?;
        if credentials.is_empty() {
            self.remove(unit);
            return Ok(None);
        }
        // The base may be crossed by every unit's user, listed by none.
        std::fs::DirBuilder::new().recursive(true).mode(0o711).create(&self.base)?;
        std::fs::set_permissions(&self.base, std::fs::Permissions::from_mode(0o711))?;
        let staged = self.base.join(format!(".{unit}.new"));
        let _ = std::fs::remove_dir_all(&staged);
        let written = (|| {
            std::fs::DirBuilder::new().mode(0o700).create(&staged)?;
            for credential in credentials {
                let valid = fleet_core::secrets::valid_name(&credential.name);
                if !valid {
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a credential name"));
                }
                let path = staged.join(&credential.name);
                let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(&path)?;
                file.write_all(credential.value())?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
                }
            }
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&staged, Some(uid), Some(gid))?;
            }
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o500))?;
            // New values replace the old ones while the unit runs (a rotation without a
            // restart): the old directory steps aside only for the moment between two renames.
            let old = self.base.join(format!(".{unit}.old"));
            remove_tree(&old);
            let stepped_aside = dir.exists();
            if stepped_aside {
                std::fs::rename(&dir, &old)?;
            }
            if let Err(error) = std::fs::rename(&staged, &dir) {
                // The unit keeps the credentials it had.
                if stepped_aside {
                    let _ = std::fs::rename(&old, &dir);
                }
                return Err(error);
            }
            remove_tree(&old);
            Ok(())
        })();
        if let Err(error) = written {
            remove_tree(&staged);
            return Err(error);
        }
        Ok(Some(dir))
    }

    /// The value of `unit`'s credential `name` as it was last written, if it has one (a
    /// fleetd that took a running unit over reads what the unit was given). Read by fleetd's
    /// own user, root as a rule; a file it may not read counts as none.
    pub fn read(&self, unit: &str, name: &str) -> Option<Credential> {
        if !fleet_core::secrets::valid_name(name) {
            return None;
        }
        let value = std::fs::read(self.of(unit)?.join(name)).ok()?;
        Some(Credential::new(name, value))
    }

    /// Removes `unit`'s credentials, if it has any.
    pub fn remove(&self, unit: &str) {
        if let Some(dir) = self.of(unit) {
            remove_tree(&dir);
        }
    }
}

/// Removes a credential directory whatever its mode (0500 keeps even root's `unlink` out
/// only through permissions root ignores; a non-root fleetd must open it first).
fn remove_tree(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_files_only_their_owner_reads_and_go_with_the_unit() {
        let base = tempfile::tempdir().unwrap();
        let dirs = CredentialDirs::new(base.path().join("credentials"));
        let written = dirs
            .write(
                "web.service",
                &[Credential::new("DB", b"hunter2".to_vec()), Credential::new("api", b"k".to_vec())],
                None,
            )
            .unwrap()
            .expect("a directory");
        assert_eq!(std::fs::read(written.join("DB")).unwrap(), b"hunter2");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&written), mode(&written.join("DB"))), (0o500, 0o400));
        // A new set replaces the old one whole.
        dirs.write("web.service", &[Credential::new("DB", b"new".to_vec())], None).unwrap();
        assert_eq!(std::fs::read(written.join("DB")).unwrap(), b"new");
        assert!(!written.join("api").exists());
        // Read back as delivered (a fleetd taking the unit over); what is not there is none.
        assert_eq!(dirs.read("web.service", "DB").map(|credential| credential.value().to_vec()), Some(b"new".to_vec()));
        assert!(dirs.read("web.service", "api").is_none());
        assert!(dirs.read("web.service", "../DB").is_none());
        assert!(dirs.read("../x", "DB").is_none());
        dirs.remove("web.service");
        assert!(!written.exists());
        assert_eq!(dirs.write("web.service", &[], None).unwrap(), None);
        assert!(dirs.write("../x", &[Credential::new("a", b"v".to_vec())], None).is_err());
        assert!(dirs.write("w.service", &[Credential::new("../a", b"v".to_vec())], None).is_err());
        assert!(!base.path().join("credentials/w.service").exists(), "nothing left of a refused set");
        assert_eq!(format!("{:?}", Credential::new("DB", b"hunter2".to_vec())), "Credential(DB, 7 bytes)");
    }
}
