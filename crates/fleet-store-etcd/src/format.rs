//! The etcd store's recorded format: one key under the prefix, written by compare-and-swap on
//! its revision, so that members starting at once agree on one record.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use fleet_core::store_format::{Migration, StoredFormat};
use fleet_registry::codec::{decode, encode};
use fleet_registry::{FormatRecord, RegistryError, Result};

use super::EtcdRegistry;

impl EtcdRegistry {
    /// The recorded format and the key's modification revision (0: no key).
    async fn format_key(&self) -> Result<(Option<StoredFormat>, i64)> {
        let key = self.keys().store_format();
        let reply = self.connection().get(&key, None).await?;
        let Some(kv) = reply.kvs().first() else { return Ok((None, 0)) };
        let stored = decode(&key, kv.value())?;
        Ok((Some(stored), kv.mod_revision()))
    }
}

#[async_trait]
impl FormatRecord for EtcdRegistry {
    async fn stored_format(&self) -> Result<Option<StoredFormat>> {
        Ok(self.format_key().await?.0)
    }

    async fn record_format(&self, expected: Option<StoredFormat>, new: StoredFormat) -> Result<bool> {
        let (stored, revision) = self.format_key().await?;
        if stored != expected {
            return Ok(false);
        }
        let key = self.keys().store_format();
        let unchanged = Compare::mod_revision(key.as_str(), CompareOp::Equal, revision);
        let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(key, encode(&new), None)]);
        Ok(self.connection().txn(txn).await?.succeeded())
    }

    async fn migrate(&self, step: &Migration) -> Result<()> {
        // Format 1 is the first: no migration exists yet. Each later one is matched here.
        Err(RegistryError::Unavailable(format!(
            "this build knows no way to migrate the etcd store to format {} ({})",
            step.to, step.name
        )))
    }
}
