//! `fleetd -restore FILE`: puts a snapshot (`fleetctl backup`) in place of a stopped fleetd's
//! embedded store. The file is checked whole first, nothing is touched while fleetd runs (its
//! state lock is held), and the store it replaces is kept beside it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use fleetd::config::Config;

/// What was restored, said to the operator.
pub struct Restored {
    pub summary: fleet_store_embedded::SnapshotSummary,
    pub store: PathBuf,
    /// Where the store it replaced was kept, if there was one.
    pub kept: Option<PathBuf>,
}

pub fn run(config: &Config, snapshot: &Path) -> anyhow::Result<Restored> {
    if !config.etcd_servers.is_empty() {
        bail!(
            "this fleetd keeps its store in etcd: restore etcd with etcdctl snapshot restore (README: Backing up), not with fleetd"
        );
    }
    let summary = fleet_store_embedded::check_snapshot(snapshot)?;
    fleet_fs::create_private_dir(&config.state_dir)
        .with_context(|| format!("creating state_dir {}", config.state_dir.display()))?;
    let _lock = fleet_fs::StateLock::acquire(&config.state_dir).context("restoring only into a stopped fleetd")?;
    let bytes = std::fs::read(snapshot).with_context(|| format!("reading {}", snapshot.display()))?;
    let store = config.state_dir.join("registry.redb");
    let kept = config.state_dir.join("registry.redb.before-restore");
    let kept = match std::fs::rename(&store, &kept) {
        Ok(()) => Some(kept),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error).with_context(|| format!("keeping {} aside", store.display())),
    };
    fleet_fs::write_private(&store, &bytes).with_context(|| format!("writing {}", store.display()))?;
    Ok(Restored { summary, store, kept })
}
