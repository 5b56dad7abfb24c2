//! Where this fleetd finds the cluster's secrets key: a file named in the configuration, the
//! one beside the agent CA key, or (a single machine on the embedded store) one of its own in
//! its state directory, made when the first secret is set. Loaded when first needed, then
//! kept until a reload (SIGHUP) lets a rotated key file in.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use fleet_secrets::ClusterKeys;

pub struct SecretKeys {
    source: Source,
    loaded: Mutex<Option<Arc<ClusterKeys>>>,
}

enum Source {
    /// A file that must exist (made by `fleetd -make-certificates` and copied to every member).
    File(PathBuf),
    /// A single machine's own file, made when first needed.
    OwnFile(PathBuf),
    /// No key: why, for the answer to whoever sets or needs a secret.
    Missing(String),
}

impl SecretKeys {
    /// The key in `path`, which must exist when a secret is first set or opened.
    pub fn at(path: PathBuf) -> Self {
        Self { source: Source::File(path), loaded: Mutex::new(None) }
    }

    /// A single machine's own key at `path`, made there when first needed.
    pub fn own_at(path: PathBuf) -> Self {
        Self { source: Source::OwnFile(path), loaded: Mutex::new(None) }
    }

    /// No key on this fleetd, for the reason given.
    pub fn missing(why: impl Into<String>) -> Self {
        Self { source: Source::Missing(why.into()), loaded: Mutex::new(None) }
    }

    /// The keys, loaded (or made) on first use; why there are none otherwise (naming files,
    /// never a key).
    pub fn get(&self) -> Result<Arc<ClusterKeys>, String> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(keys) = loaded.as_ref() {
            return Ok(keys.clone());
        }
        let keys = match &self.source {
            Source::File(path) => ClusterKeys::load(path),
            Source::OwnFile(path) => ClusterKeys::load_or_create(path),
            Source::Missing(why) => return Err(why.clone()),
        }
        .map_err(|error| error.to_string())?;
        Ok(loaded.insert(Arc::new(keys)).clone())
    }

    /// Reads the key file again when next needed (a rotation replaced it).
    pub fn forget(&self) {
        *self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }
}

/// Why a stored secret could not be opened (never with any of its value).
#[derive(Debug)]
pub enum OpenFailure {
    Store(fleet_registry::RegistryError),
    Missing,
    Sealed(fleet_secrets::SealError),
}

impl std::fmt::Display for OpenFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(error) => write!(f, "reading it: {error}"),
            Self::Missing => f.write_str("it does not exist"),
            Self::Sealed(error) => error.fmt(f),
        }
    }
}

/// The value of secret `name` as the store holds it, opened with `keys`: what a member's agent
/// and a manager answering its pull agents both need.
pub async fn open_stored(
    registry: &dyn fleet_registry::ApiRegistry,
    keys: &ClusterKeys,
    name: &str,
) -> Result<fleet_secrets::Revealed, OpenFailure> {
    let record = registry.secret(name).await.map_err(OpenFailure::Store)?.ok_or(OpenFailure::Missing)?;
    fleet_secrets::open(keys, name, record.version, &record.sealed).map_err(OpenFailure::Sealed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_machine_makes_its_own_key_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let keys = SecretKeys::own_at(path.clone());
        assert!(!path.exists(), "made only when needed");
        let first = keys.get().unwrap();
        assert!(path.exists());
        assert_eq!(keys.get().unwrap().ids(), first.ids());
    }

    #[test]
    fn a_cluster_key_that_is_not_there_is_named() {
        let keys = SecretKeys::at("/nonexistent/secrets.key".into());
        assert!(keys.get().unwrap_err().contains("/nonexistent/secrets.key"));
        assert_eq!(SecretKeys::missing("no key here").get().unwrap_err(), "no key here");
    }
}
