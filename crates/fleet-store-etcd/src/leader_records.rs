//! What the leading engine records of its own memory, for the lists and for a leader that
//! takes over: machines out of touch that units wait for (`out-of-touch/<machine>`) and
//! silent departures (`silent-departures/<unit>`). One key per item under a prefix, held in
//! the cluster's cache, replaced whole: what differs is written, under the leader key's fence.

use std::collections::BTreeMap;

use etcd_client::{Txn, TxnOp, TxnOpResponse};
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

/// Whether a write of a transaction changed its key (a put always does; a delete only when
/// the key was there), so that a watch of its range sees an event for it.
fn makes_an_event(done: &TxnOpResponse) -> bool {
    match done {
        TxnOpResponse::Delete(deleted) => deleted.deleted() > 0,
        _ => true,
    }
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
                // of it (a placement written next names what this copy holds of them). A
                // delete of a key already gone makes no event: it is not awaited.
                batch
                    .iter()
                    .zip(reply.op_responses())
                    .filter(|(_, done)| makes_an_event(done))
                    .for_each(|((key, _), _)| mirror.expect(key, revision));
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

#[cfg(test)]
mod tests {
    use etcd_client::{Txn, TxnOp};
    use fleet_testkit::EtcdServer;

    use super::makes_an_event;

    /// A replacement awaits only the writes that make an event: a delete of a key already
    /// gone (the copy held it a moment longer than etcd did) would have been waited on until
    /// the catch-up limit.
    #[tokio::test]
    async fn a_delete_of_a_key_already_gone_is_not_awaited() {
        let etcd = EtcdServer::start();
        let registry = crate::tests::registry(&etcd, std::time::Duration::from_secs(60)).await;
        let mut kv = registry.connection().kv();
        kv.put("/fleet-test/out-of-touch/here", "1", None).await.unwrap();
        let ops = vec![
            TxnOp::delete("/fleet-test/out-of-touch/gone", None),
            TxnOp::delete("/fleet-test/out-of-touch/here", None),
            TxnOp::put("/fleet-test/out-of-touch/new", "2", None),
        ];
        let reply = registry.connection().txn(Txn::new().and_then(ops)).await.unwrap();
        let events: Vec<bool> = reply.op_responses().iter().map(makes_an_event).collect();
        assert_eq!(events, [false, true, true]);
    }
}
