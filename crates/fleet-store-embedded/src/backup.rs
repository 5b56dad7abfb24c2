//! Backing the store up while fleetd serves, and checking a snapshot before it is restored.
//!
//! A snapshot is a store of its own: every table copied in one read transaction, so it holds
//! the store as of one moment, whatever is written meanwhile. Restoring is putting that file in
//! place of a stopped fleetd's `registry.redb` (`fleetd -restore`), once it is checked whole.

use std::path::Path;

use async_trait::async_trait;
use fleet_core::store_format::StoredFormat;
use fleet_registry::{RegistryError, Result, StoreBackup};
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, TableHandle, WriteTransaction,
};

use super::{EmbeddedRegistry, tables, unavailable};

/// What a snapshot holds, said before it is restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    pub units: u64,
    pub machines: u64,
    pub format: Option<StoredFormat>,
}

/// Copies every row of `table` from `from` to `to`; a table the store does not have (the
/// format's, in a store of fleet 0.1) is left out.
fn copy<K, V>(from: &ReadTransaction, to: &WriteTransaction, table: TableDefinition<K, V>) -> Result<()>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
    for<'a> V::SelfType<'a>: std::borrow::Borrow<V::SelfType<'a>>,
{
    let source = match from.open_table(table) {
        Ok(source) => source,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(error) => return Err(unavailable(error)),
    };
    let mut target = to.open_table(table).map_err(unavailable)?;
    for row in source.iter().map_err(unavailable)? {
        let (key, value) = row.map_err(unavailable)?;
        target.insert(key.value(), value.value()).map_err(unavailable)?;
    }
    Ok(())
}

#[async_trait]
impl StoreBackup for EmbeddedRegistry {
    async fn back_up(&self, to: &Path) -> Result<u64> {
        let (db, to) = (self.db.clone(), to.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let from = db.begin_read().map_err(unavailable)?;
            let snapshot = Database::create(&to).map_err(unavailable)?;
            let into = snapshot.begin_write().map_err(unavailable)?;
            for table in tables::RECORDS.into_iter().chain(tables::ADDED_RECORDS) {
                copy(&from, &into, table)?;
            }
            for table in tables::TEXTS {
                copy(&from, &into, table)?;
            }
            copy(&from, &into, tables::BODY_REFS)?;
            copy(&from, &into, tables::STORE_FORMAT)?;
            into.commit().map_err(unavailable)?;
            drop(snapshot);
            std::fs::metadata(&to).map(|file| file.len()).map_err(unavailable)
        })
        .await
        .map_err(unavailable)?
    }
}

/// Reads `path` as a snapshot to restore: a whole store, every table there and readable, its
/// format recorded. What it holds, or why it is refused.
pub fn check_snapshot(path: &Path) -> Result<SnapshotSummary> {
    let refused =
        |why: String| RegistryError::Unavailable(format!("{} is not a whole snapshot: {why}", path.display()));
    match std::fs::metadata(path) {
        Ok(file) if file.len() == 0 => return Err(refused("it is empty".into())),
        Ok(_) => {}
        Err(error) => return Err(refused(error.to_string())),
    }
    let db = Database::open(path).map_err(|error| refused(error.to_string()))?;
    let read = db.begin_read().map_err(|error| refused(error.to_string()))?;
    let names: Vec<&str> = tables::required_names().chain([tables::STORE_FORMAT.name()]).collect();
    let present: Vec<String> =
        read.list_tables().map_err(|error| refused(error.to_string()))?.map(|table| table.name().to_string()).collect();
    if let Some(missing) = names.iter().find(|name| !present.iter().any(|present| present == *name)) {
        return Err(refused(format!("it has no table {missing}")));
    }
    let count = |table: TableDefinition<&str, &[u8]>| -> Result<u64> {
        let table = read.open_table(table).map_err(|error| refused(error.to_string()))?;
        let mut rows = 0;
        for row in table.iter().map_err(|error| refused(error.to_string()))? {
            row.map_err(|error| refused(error.to_string()))?;
            rows += 1;
        }
        Ok(rows)
    };
    let units = count(tables::UNITS)?;
    let machines = count(tables::MACHINES)?;
    let format_table = read.open_table(tables::STORE_FORMAT).map_err(|error| refused(error.to_string()))?;
    let format = match format_table.get("format").map_err(|error| refused(error.to_string()))? {
        Some(bytes) => Some(tables::decode("store_format/format", bytes.value())?),
        None => None,
    };
    Ok(SnapshotSummary { units, machines, format })
}
