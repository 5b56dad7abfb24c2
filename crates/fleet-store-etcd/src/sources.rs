//! The sources facet of the etcd store: `sources/<name>` and `source-status/<name>`.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::EtcdRegistry;
use fleet_registry::codec::encode;
use fleet_registry::{ChangeSignal, Result, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus};

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
        let txn = Txn::new().and_then(vec![TxnOp::put(self.keys().rollout(&record.name), encode(record), None)]);
        self.connection().txn(txn).await?;
        Ok(())
    }

    async fn rollouts(&self) -> Result<Vec<RolloutRecord>> {
        self.list_named(&self.keys().rollouts(), |record: &RolloutRecord| &record.name).await
    }

    async fn remove_rollout(&self, name: &str) -> Result<bool> {
        self.delete_key(&self.keys().rollout(name)).await
    }

    fn source_changes(&self) -> ChangeSignal {
        self.sources_mirror();
        self.inner.sources_signal.subscribe()
    }
}
