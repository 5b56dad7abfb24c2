//! The embedded store: one redb file under `state_dir`, the single-machine default.
//!
//! Every write is one redb transaction, so a crash leaves either all of a change or none
//! of it. Readers are told of changes through watch channels: the engine on any change to
//! units or machines, each machine only on changes to its own work.

#![forbid(unsafe_code)]

mod agent;
mod backup;
pub use backup::{SnapshotSummary, check_snapshot};
mod api;
mod credentials;
mod engine;
mod events;
mod format;
mod job_records;
mod sources;
mod tables;

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadTransaction, ReadableDatabase, WriteTransaction};
use tokio::sync::watch;

use fleet_registry::{ChangeSignal, RegistryError, Result};

pub(crate) fn unavailable(error: impl std::fmt::Display) -> RegistryError {
    RegistryError::unavailable("embedded store", error)
}

/// Who must hear of a write.
#[derive(Default)]
pub(crate) struct Touched {
    engine: bool,
    /// A source, a source's status or a rollout.
    sources: bool,
    all_machines: bool,
    machines: Vec<String>,
}

impl Touched {
    fn engine() -> Self {
        Self { engine: true, ..Self::default() }
    }
}

struct Signals {
    engine: watch::Sender<u64>,
    sources: watch::Sender<u64>,
    machines: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Write transactions committed since the store was opened (its revision).
    writes: std::sync::atomic::AtomicU64,
    /// Moves on every write.
    any_write: watch::Sender<u64>,
    /// Moves when events are appended (never with [`Signals::any_write`]: an event is no
    /// change to the cluster).
    events: watch::Sender<u64>,
}

/// Creates the tables a store lacks (all of them in a new store), in one write; a store that
/// has them all is not written to, so that a fleetd that then finds it of a format it cannot
/// run on leaves it as it was.
fn create_missing_tables(db: &Database) -> Result<()> {
    use redb::{ReadableDatabase, TableHandle};
    let present: Vec<String> = db
        .begin_read()
        .map_err(unavailable)?
        .list_tables()
        .map_err(unavailable)?
        .map(|table| table.name().to_string())
        .collect();
    let has = |name: &str| present.iter().any(|present| present == name);
    if tables::opened_names().all(has) {
        return Ok(());
    }
    let txn = db.begin_write().map_err(unavailable)?;
    for table in tables::RECORDS.into_iter().chain(tables::ADDED_RECORDS) {
        txn.open_table(table).map_err(unavailable)?;
    }
    for table in tables::TEXTS {
        txn.open_table(table).map_err(unavailable)?;
    }
    txn.open_table(tables::BODY_REFS).map_err(unavailable)?;
    txn.commit().map_err(unavailable)
}

#[derive(Clone)]
pub struct EmbeddedRegistry {
    db: Arc<Database>,
    signals: Arc<Signals>,
    /// The machine whose engine last took the leadership and has not given it back: one
    /// fleetd holds the store, so leadership is only ever its own (kept in memory).
    leader: Arc<Mutex<Option<String>>>,
    /// How many past versions a unit keeps (`ApiRegistry::keep_versions`).
    versions_kept: Arc<std::sync::atomic::AtomicUsize>,
}

impl EmbeddedRegistry {
    /// Opens (or creates) the store at `path`.
    ///
    /// A file that is there but is not a whole store (empty, truncated, something else) is
    /// refused, never started over: on a single machine an empty store would stop every unit.
    pub fn open(path: &Path) -> Result<Self> {
        let refused = |problem: String| {
            RegistryError::Unavailable(format!(
                "embedded store {} {problem}; restore it from a backup, or move it aside to start with an empty store",
                path.display()
            ))
        };
        let db = match std::fs::metadata(path) {
            Ok(file) if file.len() == 0 => return Err(refused("is empty (0 bytes), not a whole store".into())),
            Ok(_) => Database::open(path).map_err(|error| refused(format!("cannot be read ({error})")))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Database::create(path).map_err(|error| {
                RegistryError::Unavailable(format!("cannot create embedded store {}: {error}", path.display()))
            })?,
            Err(error) => {
                return Err(RegistryError::Unavailable(format!(
                    "cannot open embedded store {}: {error}",
                    path.display()
                )));
            }
        };
        create_missing_tables(&db)?;
        let signals = Signals {
            engine: watch::channel(0).0,
            sources: watch::channel(0).0,
            machines: Mutex::new(HashMap::new()),
            writes: std::sync::atomic::AtomicU64::new(0),
            any_write: watch::channel(0).0,
            events: watch::channel(0).0,
        };
        let versions_kept = Arc::new(std::sync::atomic::AtomicUsize::new(fleet_core::unit_history::DEFAULT_KEPT));
        Ok(Self { db: Arc::new(db), signals: Arc::new(signals), leader: Arc::default(), versions_kept })
    }

    /// Writes something that is not a unit record as `name`'s record (for the contract test
    /// of unreadable records).
    #[cfg(test)]
    pub(crate) fn corrupt_unit_record(&self, name: &str) {
        let txn = self.db.begin_write().expect("write");
        txn.open_table(tables::UNITS).expect("units").insert(name, b"{not json".as_slice()).expect("insert");
        txn.commit().expect("commit");
    }

    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T> + Send + 'static,
    {
        let db = self.db.clone();
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || work(&db.begin_read().map_err(unavailable)?))
            .await
            .map_err(unavailable)
            .and_then(|result| result);
        fleet_metrics::metrics().store.observe("embedded", "read", started.elapsed(), result.is_err());
        result
    }

    /// Runs `work` in one write transaction, commits it, then tells whoever it touched.
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&WriteTransaction, &mut Touched) -> Result<T> + Send + 'static,
    {
        let db = self.db.clone();
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(unavailable)?;
            let mut touched = Touched::default();
            let value = work(&txn, &mut touched)?;
            txn.commit().map_err(unavailable)?;
            Ok::<_, RegistryError>((value, touched))
        })
        .await
        .map_err(unavailable)
        .and_then(|result| result);
        let failed = result
            .as_ref()
            .is_err_and(|error| !matches!(error, RegistryError::Owned { .. } | RegistryError::ChangedSincePlan { .. }));
        fleet_metrics::metrics().store.observe("embedded", "write", started.elapsed(), failed);
        let (value, touched) = result?;
        self.signals.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.notify(&touched);
        Ok(value)
    }

    fn notify(&self, touched: &Touched) {
        let bump = |sender: &watch::Sender<u64>| sender.send_modify(|revision| *revision += 1);
        bump(&self.signals.any_write);
        if touched.engine {
            bump(&self.signals.engine);
        }
        if touched.sources {
            bump(&self.signals.sources);
        }
        let machines = self.signals.machines.locked();
        if touched.all_machines {
            machines.values().for_each(bump);
        } else {
            touched.machines.iter().filter_map(|id| machines.get(id)).for_each(bump);
        }
    }

    /// How many write transactions were committed (what `ApiRegistry::revision` answers).
    pub(crate) fn writes(&self) -> u64 {
        self.signals.writes.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn machine_signal(&self, machine_id: &str) -> ChangeSignal {
        let mut machines = self.signals.machines.locked();
        machines.entry(machine_id.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod contract_tests;
