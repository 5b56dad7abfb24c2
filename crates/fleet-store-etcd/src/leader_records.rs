//! What the leading engine records of its own memory, for the lists and for a leader that
//! takes over: machines out of touch that units wait for (`out-of-touch/<machine>`) and
//! silent departures (`silent-departures/<unit>`). One key per item under a prefix, held in
//! the cluster's cache, replaced whole: what differs is written, under the leader key's fence.

use std::collections::BTreeMap;

use etcd_client::{Txn, TxnOp};
use fleet_registry::codec::{decode_listed, encode};
use fleet_registry::{EngineLease, RegistryError, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::EtcdRegistry;
use super::connection::MAX_TXN_OPS;
use super::keys::KeyRange;
use super::mirror::MirrorData;

/// The items under `prefix` in `data`, in key order (one that cannot be read is left out).
pub(super) fn records_in<T: DeserializeOwned>(data: &MirrorData, prefix: &str) -> Vec<T> {
    data.range(&KeyRange::prefix(prefix.to_string()))
        .filter_map(|(key, entry)| decode_listed::<T>(key, &entry.value))
        .collect()
}

impl EtcdRegistry {
    /// The items under `prefix`, as the leading engine's copy of the cluster holds them.
    pub(super) async fn leader_records<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<T>> {
        let mirror = self.engine_mirror();
        let data = mirror.listed(self.connection().timeout).await?;
        Ok(records_in(&data, prefix))
    }

    /// Replaces the items under `prefix` by `wanted` (key → item), fenced by `lease`: the keys
    /// not wanted are deleted, the items that differ written, in transactions of at most
    /// [`MAX_TXN_OPS`]; then waits for the copy to show them, which the next replacement is
    /// diffed against.
    pub(super) async fn replace_leader_records<T: Serialize>(
        &self,
        lease: &EngineLease,
        prefix: &str,
        wanted: BTreeMap<String, &T>,
    ) -> Result<()> {
        self.check_leadership(lease).await?;
        let mirror = self.engine_mirror();
        // Each write with its key: the copy is waited on for each in its own range.
        let ops: Vec<(String, TxnOp)> = {
            let data = mirror.listed(self.connection().timeout).await?;
            let range = KeyRange::prefix(prefix.to_string());
            let stored: BTreeMap<&String, &[u8]> =
                data.range(&range).map(|(key, entry)| (key, entry.value.as_slice())).collect();
            let mut ops: Vec<(String, TxnOp)> = stored
                .keys()
                .filter(|key| !wanted.contains_key(key.as_str()))
                .map(|key| (key.to_string(), TxnOp::delete(key.as_str(), None)))
                .collect();
            for (key, item) in &wanted {
                let value = encode(*item);
                if stored.get(key) != Some(&value.as_slice()) {
                    ops.push((key.clone(), TxnOp::put(key.as_str(), value, None)));
                }
            }
            ops
        };
        let fence = self.leader_fence(lease);
        let mut last_write = None;
        for batch in ops.chunks(MAX_TXN_OPS) {
            let writes: Vec<TxnOp> = batch.iter().map(|(_, op)| op.clone()).collect();
            let reply = self.connection().txn(Txn::new().when([fence.clone()]).and_then(writes)).await?;
            if !reply.succeeded() {
                *self.inner.leadership.lock().await = None;
                return Err(RegistryError::LeadershipLost);
            }
            last_write = reply.header().map(|header| header.revision());
            if let Some(revision) = last_write {
                // Awaited in the records' own range: another range's later events say nothing
                // of it (a placement written next names what this copy holds of them).
                batch.iter().for_each(|(key, _)| mirror.expect(key, revision));
            }
        }
        if let Some(revision) = last_write
            && !mirror.caught_up(super::caches::CATCH_UP).await
        {
            tracing::debug!(revision, prefix, "the engine's watch has not caught up with its own record yet");
        }
        Ok(())
    }
}
