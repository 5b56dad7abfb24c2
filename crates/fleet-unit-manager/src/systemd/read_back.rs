//! The unit files fleet wrote, read back to see whether someone on the machine changed or
//! removed them. A file whose size and modification time are unchanged is not read again.

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use fleet_core::drift::FileOnMachine;
use fleet_core::{UnitFile, UnitHash};

/// A file as last read: its size, modification time and hash (`None`: it did not parse).
#[derive(Clone, Copy)]
struct Stamp {
    len: u64,
    modified: SystemTime,
    hash: Option<UnitHash>,
}

#[derive(Default)]
pub struct ReadBack(Mutex<HashMap<String, Stamp>>);

impl ReadBack {
    /// How the file at `path` (unit `name`) compares with the one of `hash` fleet wrote.
    pub fn compare(&self, name: &str, path: &Path, hash: UnitHash) -> FileOnMachine {
        let metadata = match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return FileOnMachine::Missing,
            Err(_) => return FileOnMachine::Differs,
        };
        let (len, modified) = (metadata.len(), metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        let mut stamps = self.0.locked();
        let found = match stamps.get(name).filter(|stamp| stamp.len == len && stamp.modified == modified) {
            Some(stamp) => stamp.hash,
            None => {
                let text = std::fs::read_to_string(path).ok();
                let hash = text.and_then(|text| UnitFile::parse(&text).ok()).map(|file| file.hash());
                stamps.insert(name.to_string(), Stamp { len, modified, hash });
                hash
            }
        };
        if found == Some(hash) { FileOnMachine::Same } else { FileOnMachine::Differs }
    }

    pub fn forget(&self, name: &str) {
        self.0.locked().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_and_removals_are_seen() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("a.service");
        let file = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1\n").expect("a unit file");
        std::fs::write(&path, file.serialize()).expect("write");
        let read_back = ReadBack::default();
        assert_eq!(read_back.compare("a.service", &path, file.hash()), FileOnMachine::Same);
        assert_eq!(read_back.compare("a.service", &path, file.hash()), FileOnMachine::Same, "from the stamp");
        std::fs::write(&path, "[Service]\nExecStart=/bin/sleep 22\n").expect("write");
        assert_eq!(read_back.compare("a.service", &path, file.hash()), FileOnMachine::Differs);
        std::fs::write(&path, "not a unit file\n").expect("write");
        assert_eq!(read_back.compare("a.service", &path, file.hash()), FileOnMachine::Differs);
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(read_back.compare("a.service", &path, file.hash()), FileOnMachine::Missing);
    }
}
