//! The embedded store's recorded format: one row of its own table.

use async_trait::async_trait;
use fleet_core::store_format::{Migration, StoredFormat};
use fleet_registry::{FormatRecord, RegistryError, Result};
use redb::ReadableTable;

use super::{EmbeddedRegistry, tables, unavailable};

const KEY: &str = "format";

fn read(bytes: &[u8]) -> Result<StoredFormat> {
    tables::decode("store_format/format", bytes)
}

#[async_trait]
impl FormatRecord for EmbeddedRegistry {
    async fn stored_format(&self) -> Result<Option<StoredFormat>> {
        self.read(|txn| match txn.open_table(tables::STORE_FORMAT) {
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(error) => Err(unavailable(error)),
            Ok(table) => table.get(KEY).map_err(unavailable)?.map(|bytes| read(bytes.value())).transpose(),
        })
        .await
    }

    async fn record_format(&self, expected: Option<StoredFormat>, new: StoredFormat) -> Result<bool> {
        self.write(move |txn, _| {
            let mut table = txn.open_table(tables::STORE_FORMAT).map_err(unavailable)?;
            let stored = table.get(KEY).map_err(unavailable)?.map(|bytes| read(bytes.value())).transpose()?;
            if stored != expected {
                return Ok(false);
            }
            table.insert(KEY, tables::encode(&new).as_slice()).map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn migrate(&self, step: &Migration) -> Result<()> {
        // Format 1 is the first: no migration exists yet. Each later one is matched here.
        Err(RegistryError::Unavailable(format!(
            "this build knows no way to migrate the embedded store to format {} ({})",
            step.to, step.name
        )))
    }
}
