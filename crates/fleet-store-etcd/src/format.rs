//! The etcd store's recorded format: one key under the prefix, written by compare-and-swap on
//! its revision, so that members starting at once agree on one record.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use fleet_core::Connection;
use fleet_core::store_format::{Migration, PAGED_STATES, StoredFormat};
use fleet_registry::codec::{decode, encode};
use fleet_registry::{FormatRecord, RegistryError, Result};

use super::EtcdRegistry;

impl EtcdRegistry {
    /// Whether machines write their states in pages: once the store's format lets no fleetd
    /// run that reads only per-unit states (read from the watched copy: a fleetd that has not
    /// seen the record yet writes per-unit keys, which every format reads).
    pub(crate) fn states_paged(&self) -> bool {
        let key = self.keys().store_format();
        let data = self.leader_mirror().read();
        let stored = data.entries.get(&key).and_then(|entry| decode::<StoredFormat>(&key, &entry.value).ok());
        stored.is_some_and(|stored| stored.oldest_fleetd >= PAGED_STATES)
    }

    /// On the engine leader: once every member present (a fleetd on etcd) is of a format that
    /// reads pages, records that no older fleetd may run, and the machines write their states
    /// in pages from then on. Whether it is still to be done (some member is older).
    pub(crate) async fn raise_oldest_format(&self) -> Result<bool> {
        let (stored, revision) = self.format_key().await?;
        let Some(stored) = stored.filter(|stored| stored.oldest_fleetd < PAGED_STATES) else { return Ok(false) };
        let Some(cache) = self.cluster_cache_running() else { return Ok(true) };
        let (members, seen) = {
            let data = cache.read();
            if !data.synced {
                return Ok(true);
            }
            let seen = cache.seen_in(&data, &self.keys().machines()).unwrap_or(0);
            (super::engine::machines_in(self, &data)?, seen)
        };
        let older: Vec<&str> = members
            .iter()
            .filter(|machine| machine.connection == Connection::Etcd && machine.store_format < PAGED_STATES)
            .map(|machine| machine.id.as_str())
            .collect();
        if !older.is_empty() {
            tracing::debug!(?older, "members of an older format run: unit states stay one key each");
            return Ok(true);
        }
        let raised = StoredFormat { format: stored.format.max(PAGED_STATES), oldest_fleetd: PAGED_STATES };
        let keys = self.keys();
        let key = keys.store_format();
        // No member registered (or registered again) since the copy looked: one that did may
        // be older, and is looked at on the next try.
        let unchanged = [
            Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
            Compare::mod_revision(keys.machines(), CompareOp::Less, seen.saturating_add(1)).with_prefix(),
        ];
        let record = TxnOp::put(key.as_str(), encode(&raised), None);
        if !self.connection().txn(Txn::new().when(unchanged).and_then([record])).await?.succeeded() {
            return Ok(true);
        }
        tracing::info!(
            oldest_fleetd = raised.oldest_fleetd,
            "every member reads unit states in pages: recorded that no older fleetd runs on the store"
        );
        Ok(false)
    }

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
        match step.to {
            // Pages of states: nothing to move. Machines write pages once the leader records
            // that every member reads them ([`EtcdRegistry::raise_oldest_format`]).
            PAGED_STATES => Ok(()),
            _ => Err(RegistryError::Unavailable(format!(
                "this build knows no way to migrate the etcd store to format {} ({})",
                step.to, step.name
            ))),
        }
    }
}
