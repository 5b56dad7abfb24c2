//! What `units_directory` holds: the unit files fleet wrote there, and any another writer left
//! (the original fleet's agent used the same directory). fleet writes its files 0600 and
//! always has (every release); the original wrote them 0644. A file readable by others is
//! therefore not fleet's: fleet never stops or removes it, and takes it over, as it runs,
//! only once its schedule puts that unit on this machine.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use fleet_core::{UnitFile, UnitHash};

use super::paths::is_unit_file_name;

/// The unit files found in a units directory, by whose they are, with their hashes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    pub fleets: BTreeMap<String, UnitHash>,
    /// Left by another writer (the original's agent): not fleet's until adopted.
    pub foreign: BTreeMap<String, UnitHash>,
}

/// Whether a file of `mode` is one fleet wrote: private to its owner.
pub fn written_by_fleet(mode: u32) -> bool {
    mode & 0o077 == 0
}

/// The unit files in `directory`; unreadable or malformed files are skipped.
pub fn scan(directory: &Path) -> Scanned {
    let mut found = Scanned::default();
    let Ok(entries) = std::fs::read_dir(directory) else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_unit_file_name(&name) {
            continue;
        }
        let Ok(metadata) = entry.metadata() else { continue };
        match std::fs::read_to_string(entry.path()).map(|text| UnitFile::parse(&text)) {
            Ok(Ok(file)) if written_by_fleet(metadata.permissions().mode()) => {
                found.fleets.insert(name, file.hash());
            }
            Ok(Ok(file)) => {
                tracing::info!(unit = %name, "a unit file fleet did not write (the original fleet's?): left alone until scheduled here");
                found.foreign.insert(name, file.hash());
            }
            _ => tracing::warn!(unit = %name, "skipping an unreadable unit file in the units directory"),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_fleet_wrote_are_told_from_those_another_writer_left() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[Service]\nExecStart=/bin/sleep 1000\n";
        fleet_fs::write_private(&dir.path().join("ours.service"), text.as_bytes()).unwrap();
        let theirs = dir.path().join("theirs.service");
        std::fs::write(&theirs, text).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let scanned = scan(dir.path());
        let hash = UnitFile::parse(text).unwrap().hash();
        assert_eq!(scanned.fleets, BTreeMap::from([("ours.service".to_string(), hash)]));
        assert_eq!(scanned.foreign, BTreeMap::from([("theirs.service".to_string(), hash)]));
        assert!(written_by_fleet(0o100600) && !written_by_fleet(0o100644) && !written_by_fleet(0o100640));
    }
}
