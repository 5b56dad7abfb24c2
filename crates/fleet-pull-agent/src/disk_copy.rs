//! The pull agent's copy of its desired state on disk (0600 files in a 0700 directory): the
//! last work the manager sent and the bodies of its units, so that it keeps its units running
//! through an outage of its manager, and brings them back up if it restarts during one.

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use fleet_api_schema::{AgentUnitBody, AgentWork};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub struct DiskCopy {
    dir: PathBuf,
    /// The work last kept, so an unchanged one is not written again on every reconcile.
    kept: std::sync::Mutex<Option<AgentWork>>,
}

impl DiskCopy {
    /// The copy kept in `dir` (created 0700 if missing).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fleet_fs::create_private_dir(dir)?;
        fleet_fs::create_private_dir(&dir.join("bodies"))?;
        Ok(Self { dir: dir.to_path_buf(), kept: std::sync::Mutex::new(None) })
    }

    fn body_path(&self, hash: &str) -> Option<PathBuf> {
        // Hashes are hex: anything else never names a file.
        (hash.len() == 40 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| self.dir.join("bodies").join(format!("{hash}.json")))
    }

    fn write<T: Serialize>(path: &Path, value: &T) {
        let written = serde_json::to_vec(value)
            .map_err(std::io::Error::other)
            .and_then(|bytes| fleet_fs::write_private(path, &bytes));
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "cannot keep the copy of the desired state");
        }
    }

    fn read<T: DeserializeOwned>(path: &Path) -> Option<T> {
        let bytes = std::fs::read(path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Some(value),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "the kept copy is unreadable; ignoring it");
                None
            }
        }
    }

    pub fn save_work(&self, work: &AgentWork) {
        let mut kept = self.kept.locked();
        if kept.as_ref() == Some(work) {
            return;
        }
        *kept = Some(work.clone());
        drop(kept);
        Self::write(&self.dir.join("work.json"), work);
        // Bodies of units no longer held go.
        let held: BTreeSet<String> =
            work.scheduled.iter().chain(&work.globals).map(|unit| format!("{}.json", unit.hash)).collect();
        if let Ok(entries) = std::fs::read_dir(self.dir.join("bodies")) {
            for entry in entries.flatten() {
                if !held.contains(&entry.file_name().to_string_lossy().into_owned()) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }

    pub fn work(&self) -> Option<AgentWork> {
        Self::read(&self.dir.join("work.json"))
    }

    pub fn save_body(&self, hash: &str, body: &AgentUnitBody) {
        if let Some(path) = self.body_path(hash) {
            Self::write(&path, body);
        }
    }

    pub fn body(&self, hash: &str) -> Option<AgentUnitBody> {
        Self::read(&self.body_path(hash)?)
    }
}

#[cfg(test)]
mod tests {
    use fleet_api_schema::{AgentUnit, UnitOption};

    use super::*;

    #[test]
    fn work_and_bodies_are_kept_private_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let copy = DiskCopy::open(&dir.path().join("copy")).unwrap();
        assert!(copy.work().is_none());
        let hash = "a".repeat(40);
        let unit = AgentUnit {
            name: "a.service".into(),
            hash: hash.clone(),
            desired_state: "launched".into(),
            ..AgentUnit::default()
        };
        let work = AgentWork { machine: None, scheduled: vec![unit], globals: vec![] };
        let body = AgentUnitBody {
            options: vec![UnitOption {
                section: "Service".into(),
                name: "ExecStart".into(),
                value: "/bin/true".into(),
            }],
        };
        copy.save_body(&hash, &body);
        copy.save_body("../../etc/passwd", &body);
        copy.save_work(&work);
        assert_eq!(copy.work(), Some(work));
        assert_eq!(copy.body(&hash), Some(body.clone()));
        let mode = |path: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
        };
        assert_eq!(mode(&dir.path().join("copy")), 0o700);
        assert_eq!(mode(&dir.path().join("copy/work.json")), 0o600);
        copy.save_work(&AgentWork::default());
        assert!(copy.body(&hash).is_none(), "a body no unit holds goes");
    }

    #[test]
    fn unchanged_work_is_not_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let copy = DiskCopy::open(dir.path()).unwrap();
        copy.save_work(&AgentWork::default());
        std::fs::write(dir.path().join("work.json"), "marker").unwrap();
        copy.save_work(&AgentWork::default());
        assert_eq!(std::fs::read_to_string(dir.path().join("work.json")).unwrap(), "marker", "rewritten unchanged");
        let unit = AgentUnit {
            name: "b.service".into(),
            hash: "b".repeat(40),
            desired_state: "loaded".into(),
            ..AgentUnit::default()
        };
        copy.save_work(&AgentWork { machine: None, scheduled: vec![unit], globals: vec![] });
        assert!(copy.work().is_some_and(|work| work.scheduled.len() == 1), "a change is written");
    }
}
