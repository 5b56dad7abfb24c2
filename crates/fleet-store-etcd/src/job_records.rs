//! Job records (`jobs/<unit>`) and run tickets (`run-tickets/<unit>`), read from the cluster's
//! cache, which holds both, once it holds this fleetd's own writes of them: an engine pass over
//! 10,000 units on a calendar and the web view's refresh cost etcd nothing.
//!
//! A record is written on a compare of the revision it was read at. When a compare loses
//! (another fleetd wrote the record, or this one's cache had not shown that write yet), the
//! next read that feeds a write goes to etcd itself: a reader never tries the same stale
//! version twice, and the write that lost is retried over what etcd holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnResponse};
use fleet_core::job::global_runs::RunTicket;
use fleet_core::job::runs::JobRecord;
use fleet_registry::codec::{decode, decode_listed, encode};
use fleet_registry::{Result, StoredJob};
use serde::de::DeserializeOwned;

use super::EtcdRegistry;
use super::caches::{CATCH_UP, Cache};
use super::keys::KeyRange;
use super::mirror::Mirror;

/// Whether a read feeds a compare-and-swap of the job records it reads (the engine's pass),
/// and so goes to etcd after a lost compare; or not (the web view's, and run tickets, which the
/// leader writes without such a compare), and so leaves that turn to the next that does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadFor {
    Writing,
    Showing,
}

/// A record's version as the registry counts it: its key's mod revision.
fn version_of(mod_revision: i64) -> u64 {
    u64::try_from(mod_revision).unwrap_or(0)
}

impl EtcdRegistry {
    /// Every job record, from `cache` (the cluster's).
    pub(super) async fn stored_jobs(&self, cache: &Mirror, read_for: ReadFor) -> Result<Vec<StoredJob>> {
        let listed = self.records_under::<JobRecord>(cache, self.keys().jobs(), read_for).await?;
        Ok(listed
            .into_iter()
            .map(|(unit, record, version)| StoredJob { unit, record: Arc::unwrap_or_clone(record), version })
            .collect())
    }

    /// `unit`'s job record, for a run started by hand and for its runs shown: from the
    /// cluster's cache when it runs and holds this fleetd's writes (never started for it: one
    /// record is not worth a watch of the cluster), else, or after a lost compare, from etcd.
    pub(super) async fn stored_job(&self, unit: &str) -> Result<Option<StoredJob>> {
        let key = self.keys().job(unit);
        let lost = self.inner.job_compare_lost.swap(false, Ordering::SeqCst);
        let cache = self.api_copy_if_up(&Cache::Cluster).filter(|_| !lost);
        if let Some(cache) = cache
            && cache.caught_up(CATCH_UP).await
        {
            let data = cache.synced()?;
            let Some(entry) = data.entries.get(&key) else { return Ok(None) };
            let record = Arc::unwrap_or_clone(entry.decoded::<JobRecord>(&key)?);
            return Ok(Some(StoredJob { unit: unit.to_string(), record, version: version_of(entry.mod_revision) }));
        }
        let reply = self.connection().get(&key, None).await?;
        let Some(kv) = reply.kvs().first() else { return Ok(None) };
        let record = decode(&key, kv.value())?;
        Ok(Some(StoredJob { unit: unit.to_string(), record, version: version_of(kv.mod_revision()) }))
    }

    /// Every run ticket, from `cache` (the cluster's).
    pub(super) async fn stored_tickets(&self, cache: &Mirror) -> Result<BTreeMap<String, RunTicket>> {
        let listed = self.records_under::<RunTicket>(cache, self.keys().run_tickets(), ReadFor::Showing).await?;
        Ok(listed.into_iter().map(|(unit, ticket, _)| (unit, *ticket)).collect())
    }

    /// The records under `prefix`, one per unit (named by the rest of its key), with their
    /// revisions: from `cache` once it holds this fleetd's writes, each decoded once per
    /// revision; from etcd when the cache cannot say it does, or, for a read that feeds a
    /// write, when a compare on such a record lost since the last one.
    async fn records_under<T: DeserializeOwned + Send + Sync + 'static>(
        &self,
        cache: &Mirror,
        prefix: String,
        read_for: ReadFor,
    ) -> Result<Vec<(String, Arc<T>, u64)>> {
        let lost = read_for == ReadFor::Writing && self.inner.job_compare_lost.swap(false, Ordering::SeqCst);
        if lost || !cache.caught_up(CATCH_UP).await {
            return self.records_in_etcd(prefix).await;
        }
        let data = cache.synced()?;
        Ok(data
            .range(&KeyRange::prefix(prefix.clone()))
            .filter_map(|(key, entry)| {
                let unit = key.strip_prefix(prefix.as_str())?.to_string();
                Some((unit, entry.decoded_listed::<T>(key)?, version_of(entry.mod_revision)))
            })
            .collect())
    }

    /// [`EtcdRegistry::records_under`] read from etcd itself; an unreadable record is left
    /// out (and logged).
    async fn records_in_etcd<T: DeserializeOwned>(&self, prefix: String) -> Result<Vec<(String, Arc<T>, u64)>> {
        let reply = self.connection().get(&prefix, Some(GetOptions::new().with_prefix())).await?;
        Ok(reply
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?;
                let unit = key.strip_prefix(prefix.as_str())?.to_string();
                Some((unit, Arc::new(decode_listed::<T>(key, kv.value())?), version_of(kv.mod_revision())))
            })
            .collect())
    }

    /// The write of `unit`'s job record (`None`: its removal) over `version` (0: absent), as
    /// one transaction that compares the record's own revision.
    pub(super) fn job_write(&self, unit: &str, record: Option<&JobRecord>, version: u64) -> (String, Txn) {
        let key = self.keys().job(unit);
        let unchanged = match version {
            0 => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            version => {
                Compare::mod_revision(key.as_str(), CompareOp::Equal, i64::try_from(version).unwrap_or(i64::MAX))
            }
        };
        let write = match record {
            Some(record) => TxnOp::put(key.as_str(), encode(record), None),
            None => TxnOp::delete(key.as_str(), None),
        };
        (key.clone(), Txn::new().when([unchanged]).and_then([write]))
    }

    /// Notes how the [`EtcdRegistry::job_write`] of `key` went (`answer`: its transaction's
    /// answer, inside one written at `revision`); whether it wrote. A write is waited for by the
    /// next read of the cache; a compare that lost sends the next read that feeds a write to
    /// etcd.
    pub(super) fn job_written(&self, key: &str, revision: Option<i64>, answer: &TxnResponse) -> bool {
        if !answer.succeeded() {
            self.inner.job_compare_lost.store(true, Ordering::SeqCst);
            return false;
        }
        if let Some(revision) = revision {
            self.api_wrote_at(revision, &[key.to_string()], &answer.op_responses());
        }
        true
    }
}
