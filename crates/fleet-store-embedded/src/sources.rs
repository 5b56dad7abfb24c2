//! The sources facet of the embedded store.

use std::sync::Arc;

use async_trait::async_trait;
use redb::ReadableTable;

use super::tables::{self, read_all};
use super::{EmbeddedRegistry, unavailable};
use fleet_registry::{ChangeSignal, Result, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus};

#[async_trait]
impl SourceRegistry for EmbeddedRegistry {
    async fn put_source(&self, record: &SourceRecord) -> Result<()> {
        self.put_named(tables::SOURCES, &record.name, record.clone()).await
    }

    async fn sources(&self) -> Result<Vec<SourceRecord>> {
        self.list_all(tables::SOURCES).await
    }

    async fn remove_source(&self, name: &str) -> Result<bool> {
        self.remove_named(tables::SOURCE_STATUSES, name).await?;
        self.remove_named(tables::SOURCES, name).await
    }

    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>> {
        self.read(|txn| {
            let rows = txn.open_table(tables::SOURCE_STATUSES).map_err(unavailable)?;
            read_all::<SourceStatus>(&rows)
        })
        .await
    }

    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()> {
        let (name, status) = (name.to_string(), status.clone());
        self.write(move |txn, touched| {
            // A removed source keeps no status (a sync under way when it was removed).
            if !super::api::source_exists(txn, &name)? {
                return Ok(());
            }
            let mut rows = txn.open_table(tables::SOURCE_STATUSES).map_err(unavailable)?;
            rows.insert(name.as_str(), tables::encode(&status).as_slice()).map_err(unavailable)?;
            touched.sources = true;
            Ok(())
        })
        .await
    }

    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        self.put_named(tables::ROLLOUTS, &record.name, record.clone()).await
    }

    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool> {
        let (record, before) = (record.clone(), before.clone());
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::ROLLOUTS).map_err(unavailable)?;
            let key = record.name.as_str();
            let stored: Option<RolloutRecord> = match table.get(key).map_err(unavailable)? {
                Some(bytes) => Some(tables::decode(&format!("rollouts/{key}"), bytes.value())?),
                None => None,
            };
            if stored.as_ref() != Some(&before) {
                return Ok(false);
            }
            table.insert(key, tables::encode(&record).as_slice()).map_err(unavailable)?;
            touched.sources = true;
            Ok(true)
        })
        .await
    }

    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>> {
        Ok(self.list_all(tables::ROLLOUTS).await?.into_iter().map(Arc::new).collect())
    }

    async fn remove_rollout(&self, name: &str) -> Result<bool> {
        self.remove_named(tables::ROLLOUTS, name).await
    }

    fn source_changes(&self) -> ChangeSignal {
        self.signals.sources.subscribe()
    }
}
