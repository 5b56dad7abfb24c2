//! The sources facet of the etcd store: `sources/<name>` and `source-status/<name>`.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::EtcdRegistry;
use super::keys::KeyRange;
use fleet_registry::codec::encode;
use fleet_registry::{ChangeSignal, RegistryError, Result, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus};

/// How long a read of the rollouts waits for the copy to hold this fleetd's last write.
const CATCH_UP: Duration = Duration::from_secs(2);

#[async_trait]
impl SourceRegistry for EtcdRegistry {
    async fn put_source(&self, record: &SourceRecord) -> Result<()> {
        let txn = Txn::new().and_then(vec![TxnOp::put(self.keys().source(&record.name), encode(record), None)]);
        self.connection().txn(txn).await?;
        Ok(())
    }

    async fn sources(&self) -> Result<Vec<SourceRecord>> {
        self.list_named(&self.keys().sources(), |record: &SourceRecord| &record.name).await
    }

    async fn remove_source(&self, name: &str) -> Result<bool> {
        self.delete_key(&self.keys().source_status(name)).await?;
        self.delete_key(&self.keys().source(name)).await
    }

    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>> {
        self.list_keyed(&self.keys().source_statuses()).await
    }

    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()> {
        // A removed source keeps no status (a sync under way when it was removed).
        let present = Compare::version(self.keys().source(name), CompareOp::Greater, 0);
        let put = TxnOp::put(self.keys().source_status(name), encode(status), None);
        self.connection().txn(Txn::new().when([present]).and_then([put])).await?;
        Ok(())
    }

    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        let key = self.keys().rollout(&record.name);
        let txn = Txn::new().and_then(vec![TxnOp::put(key.as_str(), encode(record), None)]);
        let reply = self.connection().big_txn(txn).await?;
        if let Some(header) = reply.header() {
            self.sources_mirror().expect(&key, header.revision());
        }
        Ok(())
    }

    /// From the watch-fed copy, once it holds this fleetd's own rollout writes: a running
    /// rollout of 10,000 units is a record of a megabyte, read on every pass of the driver and
    /// every `GET`, which must not each be a read of it from etcd.
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>> {
        let mirror = self.sources_mirror();
        if !mirror.caught_up(CATCH_UP).await {
            return Err(RegistryError::Unavailable(
                "etcd: the copy of the rollouts is not up to date (its watch is behind or down)".into(),
            ));
        }
        let data = mirror.synced()?;
        let range = KeyRange::prefix(self.keys().rollouts());
        // Each record is parsed once per revision and shared by every reader. The copy is in
        // key order, `rollouts/<name>`: name order.
        Ok(data.range(&range).filter_map(|(key, entry)| entry.decoded_listed::<RolloutRecord>(key)).collect())
    }

    async fn remove_rollout(&self, name: &str) -> Result<bool> {
        let key = self.keys().rollout(name);
        let deleted = self.delete_key_at(&key).await?;
        if let Some(revision) = deleted {
            self.sources_mirror().expect(&key, revision);
        }
        Ok(deleted.is_some())
    }

    fn source_changes(&self) -> ChangeSignal {
        self.sources_mirror();
        self.inner.sources_signal.subscribe()
    }
}
