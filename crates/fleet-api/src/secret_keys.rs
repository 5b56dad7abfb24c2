//! Where this fleetd finds the cluster's secrets key: a file named in the configuration, the
//! one beside the agent CA key, or (a single machine on the embedded store) one of its own in
//! its state directory, made when the first secret is set. Loaded when first needed, then
//! kept until a reload (SIGHUP) lets a rotated key file in.

use fleet_core::unpoisoned::Locked;
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
        let mut loaded = self.loaded.locked();
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
        *self.loaded.locked() = None;
    }
}

/// Why a stored secret could not be opened (never with any of its value).
#[derive(Debug)]
pub enum OpenFailure {
    Store(fleet_registry::RegistryError),
    Missing,
    /// The unit is pinned to a version the store no longer keeps.
    VersionGone(u64),
    Sealed(fleet_secrets::SealError),
}

impl std::fmt::Display for OpenFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(error) => write!(f, "reading it: {error}"),
            Self::Missing => f.write_str("it does not exist"),
            Self::VersionGone(version) => write!(f, "its version {version} is no longer kept"),
            Self::Sealed(error) => error.fmt(f),
        }
    }
}

/// The values of the secrets `names` a unit names, as the store holds them, opened with
/// `keys` at the versions the unit is pinned to (`pins`; else the newest): what a member's
/// agent and a manager answering its pull agents both need. An error names the secret.
pub async fn open_for_unit(
    registry: &dyn fleet_registry::ApiRegistry,
    keys: &ClusterKeys,
    pins: &fleet_core::secrets::SecretPins,
    names: &[String],
) -> Result<Vec<fleet_registry::DeliveredSecret>, (String, OpenFailure)> {
    let mut delivered = Vec::with_capacity(names.len());
    for name in names {
        let failed = |why: OpenFailure| (name.clone(), why);
        let record = registry.secret(name).await.map_err(|error| failed(OpenFailure::Store(error)))?;
        let record = record.ok_or_else(|| failed(OpenFailure::Missing))?;
        let version = pins.versions.get(name).copied().unwrap_or(record.version);
        let sealed = record.sealed_version(version).ok_or_else(|| failed(OpenFailure::VersionGone(version)))?;
        let opened =
            fleet_secrets::open(keys, name, version, sealed).map_err(|error| failed(OpenFailure::Sealed(error)))?;
        delivered.push(fleet_registry::DeliveredSecret {
            name: name.clone(),
            version,
            value: opened.expose().to_vec(),
        });
    }
    Ok(delivered)
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
