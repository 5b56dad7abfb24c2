//! The sources facet of the etcd store: `sources/<name>` and `source-status/<name>`.

use async_trait::async_trait;
use std::sync::Arc;

use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdRegistry;
use super::caches::CATCH_UP;
use super::keys::KeyRange;
use super::mirror::{Entry, MirrorData};
use super::stored_rollouts::{self, Stored};
use fleet_registry::codec::{decode, encode};
use fleet_registry::{ChangeSignal, RegistryError, Result, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus};

#[async_trait]
impl SourceRegistry for EtcdRegistry {
    async fn put_source(&self, record: &SourceRecord) -> Result<()> {
        let key = self.keys().source(&record.name);
        let reply =
            self.connection().txn(Txn::new().and_then(vec![TxnOp::put(key.as_str(), encode(record), None)])).await?;
        self.sources_written(&key, &reply);
        Ok(())
    }

    /// From the watch-fed copy, once it holds this fleetd's own writes (the syncer reads them
    /// on every pass), in name order.
    async fn sources(&self) -> Result<Vec<SourceRecord>> {
        self.copied_under::<SourceRecord>(&self.keys().sources())
            .await
            .map(|records| records.into_iter().map(|(_, record)| record.as_ref().clone()).collect())
    }

    async fn remove_source(&self, name: &str) -> Result<bool> {
        let keys = self.keys();
        let (status, source) = (keys.source_status(name), keys.source(name));
        let ops = vec![TxnOp::delete(status.as_str(), None), TxnOp::delete(source.as_str(), None)];
        let reply = self.connection().txn(Txn::new().and_then(ops)).await?;
        let deleted: Vec<bool> = reply
            .op_responses()
            .iter()
            .map(|response| matches!(response, TxnOpResponse::Delete(delete) if delete.deleted() > 0))
            .collect();
        for (key, deleted) in [status, source].iter().zip(&deleted) {
            if *deleted {
                self.sources_written(key, &reply);
            }
        }
        Ok(deleted.get(1).copied().unwrap_or(false))
    }

    /// From the watch-fed copy, as [`SourceRegistry::sources`].
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>> {
        self.copied_under::<SourceStatus>(&self.keys().source_statuses())
            .await
            .map(|statuses| statuses.into_iter().map(|(name, status)| (name, status.as_ref().clone())).collect())
    }

    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()> {
        // A removed source keeps no status (a sync under way when it was removed).
        let present = Compare::version(self.keys().source(name), CompareOp::Greater, 0);
        let key = self.keys().source_status(name);
        let put = TxnOp::put(key.as_str(), encode(status), None);
        let reply = self.connection().txn(Txn::new().when([present]).and_then([put])).await?;
        if reply.succeeded() {
            self.sources_written(&key, &reply);
        }
        Ok(())
    }

    /// The head alone when the fixed part is stored already (every pass of a running
    /// rollout); the fixed part's missing slices first otherwise (a new rollout), then the
    /// head, on the last slice being there, deleting the slices of any other fixed part.
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        self.write_rollout(record, None).await.map(|_| ())
    }

    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool> {
        let key = self.keys().rollout(&record.name);
        let reply = self.connection().get(&key, None).await?;
        match reply.kvs().first() {
            Some(kv) if stored_rollouts::holds(kv.value(), before) => {
                self.write_rollout(record, Some(kv.mod_revision())).await
            }
            // Changed (or removed) since it was read: that change stands.
            _ => Ok(false),
        }
    }

    /// From the watch-fed copy, once it holds this fleetd's own rollout writes: a running
    /// rollout of 10,000 units is read on every pass of the driver and every `GET`, which
    /// must not each be a read of it from etcd. Each head is joined with its fixed part once
    /// per revision, and each fixed part parsed once.
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>> {
        let mirror = self.sources_copy_caught_up().await?;
        let data = mirror.synced()?;
        let prefix = self.keys().rollouts();
        let range = KeyRange::prefix(prefix.clone());
        // The copy is in key order, `rollouts/<name>`: name order; a name's slices follow it.
        let heads = data.range(&range).filter(|(key, _)| !key[prefix.len()..].contains('/'));
        Ok(heads
            .filter_map(|(key, entry)| {
                let read = entry.decoded.get_or_decode(|| self.rollout_in_copy(&data, key, &entry.value));
                read.inspect_err(|error| tracing::error!(%error, "skipping a rollout that cannot be read")).ok()
            })
            .collect())
    }

    async fn remove_rollout(&self, name: &str) -> Result<bool> {
        let keys = self.keys();
        let key = keys.rollout(name);
        let ops = vec![
            TxnOp::delete(key.as_str(), None),
            TxnOp::delete(keys.rollout_slices(name), Some(DeleteOptions::new().with_prefix())),
        ];
        let reply = self.connection().txn(Txn::new().and_then(ops)).await?;
        let deleted =
            matches!(reply.op_responses().first(), Some(TxnOpResponse::Delete(delete)) if delete.deleted() > 0);
        if deleted && let Some(header) = reply.header() {
            self.sources_mirror().expect(&key, header.revision());
        }
        Ok(deleted)
    }

    fn source_changes(&self) -> ChangeSignal {
        self.sources_mirror();
        self.inner.sources_signal.subscribe()
    }
}

impl EtcdRegistry {
    /// The copy of the sources, their statuses and the rollouts, once it holds this fleetd's
    /// own writes to them and its watch is up (waiting up to [`CATCH_UP`]).
    async fn sources_copy_caught_up(&self) -> Result<&super::mirror::Mirror> {
        let mirror = self.sources_mirror();
        if !mirror.caught_up(CATCH_UP).await {
            return Err(RegistryError::Unavailable(
                "etcd: the copy of the sources and rollouts is not up to date (its watch is behind or down)".into(),
            ));
        }
        Ok(mirror)
    }

    /// Notes this fleetd's write of `key` (answered by `reply`): the next read of the copy
    /// waits until it holds it. Only for a write that changed `key`: the copy sees no event
    /// for one that did not, and would be waited for in vain.
    fn sources_written(&self, key: &str, reply: &etcd_client::TxnResponse) {
        if let Some(header) = reply.header() {
            self.sources_mirror().expect(key, header.revision());
        }
    }

    /// The records under `prefix` in the copy, by the rest of their key (a name), in name
    /// order, each decoded once per revision; one that cannot be decoded is left out (and
    /// logged, as a listing does).
    async fn copied_under<T: serde::de::DeserializeOwned + Send + Sync + 'static>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Arc<T>)>> {
        let mirror = self.sources_copy_caught_up().await?;
        let data = mirror.synced()?;
        Ok(data
            .range(&KeyRange::prefix(prefix.to_string()))
            .filter_map(|(key, entry)| Some((key[prefix.len()..].to_string(), entry.decoded_listed::<T>(key)?)))
            .collect())
    }

    /// Writes each slice of a rollout's fixed part not in `held`, one request each.
    async fn write_rollout_slices(&self, keys: &[String], slices: &[Vec<u8>], held: &BTreeSet<String>) -> Result<()> {
        for (key, slice) in keys.iter().zip(slices) {
            if !held.contains(key) {
                self.connection()
                    .big_txn(Txn::new().and_then(vec![TxnOp::put(key.as_str(), slice.clone(), None)]))
                    .await?;
            }
        }
        Ok(())
    }

    /// Of rollout `name`'s slices in the copy: those of the fixed part `digest`, and the
    /// prefixes of any other fixed part's (left by an earlier rollout of the name, or by a
    /// write cut short).
    fn rollout_slices_held(&self, name: &str, digest: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let keys = self.keys();
        let Ok(data) = self.sources_mirror().synced() else { return Default::default() };
        let current = keys.rollout_slices_of(name, digest);
        let all = keys.rollout_slices(name);
        let (mut held, mut stale) = (BTreeSet::new(), BTreeSet::new());
        for (key, _) in data.range(&KeyRange::prefix(all.clone())) {
            if key.starts_with(&current) {
                held.insert(key.clone());
            } else if let Some((other, _)) = key[all.len()..].split_once('/') {
                stale.insert(keys.rollout_slices_of(name, other));
            }
        }
        (held, stale)
    }

    /// The rollout stored at `key` (`value`), joined with its fixed part's slices in `data`.
    fn rollout_in_copy(&self, data: &MirrorData, key: &str, value: &[u8]) -> Result<RolloutRecord> {
        let head = match decode::<Stored>(key, value)? {
            Stored::Whole(record) => return Ok(record),
            Stored::Head(head) => head,
        };
        let corrupt = |reason: String| RegistryError::Corrupt { key: key.to_string(), reason };
        let name = &key[self.keys().rollouts().len()..];
        let slices_key = self.keys().rollout_slices_of(name, &head.fixed);
        let slices_range = KeyRange::prefix(slices_key.clone());
        let slices: Vec<(&String, &Entry)> = data.range(&slices_range).collect();
        if slices.len() != head.slices {
            return Err(corrupt(format!("{} of its {} slices are stored", slices.len(), head.slices)));
        }
        let Some((_, first)) = slices.first() else { return Err(corrupt("no slice".into())) };
        // Parsed once for the life of the rollout: its slices are never rewritten.
        let fixed = first.decoded.get_or_decode(|| {
            stored_rollouts::fixed_from_slices(&slices_key, slices.iter().map(|(_, entry)| entry.value.as_slice()))
        })?;
        stored_rollouts::joined(&head, &fixed).map_err(corrupt)
    }
}

impl EtcdRegistry {
    /// Writes a rollout's slices, then its head where the last slice is; with `unchanged_since`,
    /// only while the head is still at that revision (`false` when it moved).
    async fn write_rollout(&self, record: &RolloutRecord, unchanged_since: Option<i64>) -> Result<bool> {
        let keys = self.keys();
        let key = keys.rollout(&record.name);
        let pieces = stored_rollouts::pieces(record);
        let slice_keys: Vec<String> =
            (0..pieces.slices.len()).map(|index| keys.rollout_slice(&record.name, &pieces.digest, index)).collect();
        // The slices held are read from the copy once it holds this fleetd's own last write
        // (a copy still behind it would not show the slices just written, and they would be
        // written again); a copy that does not catch up in time only costs that.
        self.sources_mirror().caught_up(CATCH_UP).await;
        let (held, stale) = self.rollout_slices_held(&record.name, &pieces.digest);
        self.write_rollout_slices(&slice_keys, &pieces.slices, &held).await?;
        // The head is written where the last slice is: a rollout removed meanwhile took its
        // slices with it, and a copy that was behind may have shown slices that are gone.
        let mut stored: Vec<Compare> =
            slice_keys.last().map(|last| Compare::version(last.as_str(), CompareOp::Greater, 0)).into_iter().collect();
        if let Some(revision) = unchanged_since {
            stored.push(Compare::mod_revision(key.as_str(), CompareOp::Equal, revision));
        }
        let mut ops = vec![TxnOp::put(key.as_str(), pieces.head.clone(), None)];
        ops.extend(stale.iter().map(|prefix| TxnOp::delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))));
        for attempt in 0..2 {
            let reply = self.connection().big_txn(Txn::new().when(stored.clone()).and_then(ops.clone())).await?;
            if reply.succeeded() {
                if let Some(header) = reply.header() {
                    self.sources_mirror().expect(&key, header.revision());
                }
                return Ok(true);
            }
            if let Some(revision) = unchanged_since {
                let now = self.connection().get(&key, None).await?;
                if now.kvs().first().map(|kv| kv.mod_revision()) != Some(revision) {
                    return Ok(false);
                }
            }
            if attempt == 0 {
                self.write_rollout_slices(&slice_keys, &pieces.slices, &BTreeSet::new()).await?;
            }
        }
        Err(RegistryError::Unavailable(format!(
            "etcd: the slices of rollout {} went while it was written (removed meanwhile?)",
            record.name
        )))
    }
}
