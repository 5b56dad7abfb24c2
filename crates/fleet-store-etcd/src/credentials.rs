//! The credentials facet of the etcd store: `tokens/<name>`, read straight from etcd so a
//! revocation on one fleetd is seen by every other on its next read.

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use serde::de::DeserializeOwned;

use super::connection::MAX_TXN_OPS;
use super::join_batches::JoinRequest;
use super::records::one;
use super::registration_uses::{UseCounters, listed_tokens};
use super::{EtcdRegistry, session};
use fleet_registry::codec::{decode_listed, encode};
use fleet_registry::{
    CredentialRegistry, JoinRefused, MachineIdentity, RegistrationRecord, RegistryError, Result, RevokedMachine,
    SecretRecord, TokenRecord,
};

impl EtcdRegistry {
    /// Writes `value` at `key` unless the key exists (optionally under `lease`); `false` then.
    async fn put_new(&self, key: &str, value: Vec<u8>, lease: Option<i64>) -> Result<bool> {
        let options = lease.map(|lease| PutOptions::new().with_lease(lease));
        let txn = Txn::new()
            .when(vec![Compare::version(key, CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key, value, options)]);
        Ok(self.connection().txn(txn).await?.succeeded())
    }

    /// Every record under `prefix` (undecodable ones skipped and logged), in name order.
    pub(super) async fn list_named<T: DeserializeOwned>(
        &self,
        prefix: &str,
        name: impl Fn(&T) -> &str,
    ) -> Result<Vec<T>> {
        let reply = self.connection().get(prefix, Some(GetOptions::new().with_prefix())).await?;
        let mut records: Vec<T> = reply
            .kvs()
            .iter()
            .filter_map(|kv| decode_listed::<T>(&String::from_utf8_lossy(kv.key()), kv.value()))
            .collect();
        records.sort_by(|a, b| name(a).cmp(name(b)));
        Ok(records)
    }

    /// Every record under `prefix` with the rest of its key after the prefix (undecodable ones
    /// skipped and logged), in key order.
    pub(super) async fn list_keyed<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(String, T)>> {
        let reply = self.connection().get(prefix, Some(GetOptions::new().with_prefix())).await?;
        Ok(reply
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let record = decode_listed::<T>(&key, kv.value())?;
                Some((key.strip_prefix(prefix)?.to_string(), record))
            })
            .collect())
    }

    /// Writes the identities put at the same time, in one request; a machine given twice keeps
    /// the later (one transaction writes a key once).
    async fn write_identities(&self, changes: Vec<(String, Vec<u8>)>) -> Result<Vec<()>> {
        let count = changes.len();
        let latest: BTreeMap<String, Option<Vec<u8>>> =
            changes.into_iter().map(|(key, value)| (key, Some(value))).collect();
        let changes: Vec<(String, Option<Vec<u8>>)> = latest.into_iter().collect();
        self.connection().write(&changes, 0).await?;
        Ok(vec![(); count])
    }

    /// Deletes `key`; `false` when it did not exist.
    pub(super) async fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.delete_key_at(key).await?.is_some())
    }

    /// Deletes `key`: the revision of the delete, or `None` when it did not exist.
    pub(super) async fn delete_key_at(&self, key: &str) -> Result<Option<i64>> {
        let reply = self.connection().txn(Txn::new().and_then(vec![TxnOp::delete(key, None)])).await?;
        let deleted = reply.op_responses().into_iter().any(|response| match response {
            etcd_client::TxnOpResponse::Delete(delete) => delete.deleted() > 0,
            _ => false,
        });
        Ok(reply.header().map(|header| header.revision()).filter(|_| deleted))
    }
}

#[async_trait]
impl CredentialRegistry for EtcdRegistry {
    async fn put_secret(&self, record: &SecretRecord, previous: Option<u64>) -> Result<bool> {
        let key = self.keys().secret(&record.name);
        let reply = self.connection().get(key.as_str(), None).await?;
        let stored = reply.kvs().first();
        let stored_version =
            stored.and_then(|kv| decode_listed::<SecretRecord>(&key, kv.value())).map(|stored| stored.version);
        if stored_version != previous {
            return Ok(false);
        }
        // Written only over what was read: a value set meanwhile is not overwritten.
        let unchanged = match stored {
            Some(kv) => Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision()),
            None => Compare::version(key.as_str(), CompareOp::Equal, 0),
        };
        let txn = Txn::new().when(vec![unchanged]).and_then(vec![TxnOp::put(key.as_str(), encode(record), None)]);
        Ok(self.connection().txn(txn).await?.succeeded())
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.list_named(&self.keys().secrets(), |record: &SecretRecord| &record.name).await
    }

    async fn secret(&self, name: &str) -> Result<Option<SecretRecord>> {
        let key = self.keys().secret(name);
        let reply = self.connection().get(key.as_str(), None).await?;
        Ok(reply.kvs().first().and_then(|kv| decode_listed::<SecretRecord>(&key, kv.value())))
    }

    async fn remove_secret(&self, name: &str) -> Result<bool> {
        self.delete_key(&self.keys().secret(name)).await
    }

    async fn set_secret_pins(&self, name: &str, pins: &fleet_core::secrets::SecretPins) -> Result<bool> {
        self.set_pins(name, pins).await
    }

    async fn create_token(&self, record: &TokenRecord) -> Result<bool> {
        self.put_new(&self.keys().token(&record.name), encode(record), None).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.list_named(&self.keys().tokens(), |record: &TokenRecord| &record.name).await
    }

    async fn revoke_token(&self, name: &str) -> Result<bool> {
        self.delete_key(&self.keys().token(name)).await
    }

    async fn create_registration(&self, record: &RegistrationRecord) -> Result<bool> {
        // etcd itself drops the token when it expires: a lease that ends then.
        let lease = match record.expires {
            Some(expires) => {
                let ttl = Duration::from_secs(expires.saturating_sub(record.created).max(1));
                Some(session::grant(self.connection(), ttl).await?)
            }
            None => None,
        };
        let created = self.put_new(&self.keys().registration(&record.name), encode(record), lease).await?;
        if let (false, Some(lease)) = (created, lease) {
            session::revoke(self.connection(), lease).await?;
        }
        Ok(created)
    }

    async fn registrations(&self) -> Result<Vec<RegistrationRecord>> {
        // Each with its uses counted on it and, without a use limit, apart: read together.
        let keys = self.keys();
        let uses_prefix = keys.all_registration_uses();
        let gets = vec![
            TxnOp::get(keys.registrations(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(uses_prefix.as_str(), Some(GetOptions::new().with_prefix())),
        ];
        let (_, replies) = self.connection().small_read(gets).await?;
        let [registrations, counters] = replies.as_slice() else {
            return Err(RegistryError::Unavailable("etcd: a listing of tokens came back short".into()));
        };
        let counters = UseCounters::read(&uses_prefix, counters.kvs());
        let mut records: Vec<RegistrationRecord> =
            listed_tokens(registrations.kvs(), &counters).into_iter().map(|(_, record)| record).collect();
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    async fn revoke_registration(&self, name: &str) -> Result<bool> {
        // Its counters of uses go with it.
        let keys = self.keys();
        let counters = Some(DeleteOptions::new().with_prefix());
        let txn = Txn::new().and_then(vec![
            TxnOp::delete(keys.registration(name), None),
            TxnOp::delete(keys.registration_uses(name), counters),
        ]);
        let reply = self.connection().txn(txn).await?;
        Ok(
            matches!(reply.op_responses().first(), Some(etcd_client::TxnOpResponse::Delete(delete)) if delete.deleted() > 0),
        )
    }

    async fn revoke_machine(&self, revoked: &RevokedMachine) -> Result<()> {
        let keys = self.keys();
        let states = keys.state(&revoked.id, "");
        let txn = Txn::new().and_then(vec![
            TxnOp::put(keys.revoked(&revoked.id), encode(revoked), None),
            TxnOp::delete(keys.machine(&revoked.id), None),
            TxnOp::delete(states, Some(DeleteOptions::new().with_prefix())),
        ]);
        self.connection().txn(txn).await.map(drop)
    }

    async fn revoked_machines(&self) -> Result<Vec<RevokedMachine>> {
        self.list_named(&self.keys().all_revoked(), |revoked: &RevokedMachine| &revoked.id).await
    }

    async fn join_machine(
        &self,
        sha256: &str,
        now: u64,
        machine_id: &str,
        key_sha256: &str,
    ) -> Result<std::result::Result<(RegistrationRecord, MachineIdentity), JoinRefused>> {
        let request = JoinRequest {
            token_sha256: sha256.to_string(),
            now,
            machine_id: machine_id.to_string(),
            key_sha256: key_sha256.to_string(),
        };
        self.join(request).await
    }

    async fn machine_identity(&self, machine_id: &str) -> Result<Option<MachineIdentity>> {
        let key = self.keys().identity(machine_id);
        let reply = self.connection().get(&key, None).await?;
        Ok(one::<MachineIdentity>(&key, &reply).0)
    }

    async fn put_machine_identity(&self, identity: &MachineIdentity) -> Result<()> {
        // Pull agents arriving together each record their public IP here on their first
        // announcement: their identities go in one write (a lone put when alone, never a
        // one-operation transaction: see `Connection::write`); no lease.
        let change = (self.keys().identity(&identity.id), encode(identity));
        let write = |changes: Vec<(String, Vec<u8>)>| {
            let registry = self.clone();
            async move { registry.write_identities(changes).await }
        };
        self.inner.identity_batches.write(change, 1, MAX_TXN_OPS, write).await
    }

    async fn forget_machine(&self, machine_id: &str) -> Result<bool> {
        let keys = self.keys();
        let (identity_key, revoked_key) = (keys.identity(machine_id), keys.revoked(machine_id));
        for _ in 0..REDEEM_ATTEMPTS {
            let reply = self.connection().get(&revoked_key, None).await?;
            let (Some(mut revoked), revision) = one::<RevokedMachine>(&revoked_key, &reply) else {
                return Ok(false);
            };
            revoked.forgotten = true;
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(revoked_key.as_str(), CompareOp::Equal, revision)])
                .and_then(vec![
                    TxnOp::put(revoked_key.as_str(), encode(&revoked), None),
                    TxnOp::delete(identity_key.as_str(), None),
                ]);
            if self.connection().txn(txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(RegistryError::Unavailable("etcd: the machine's revocation kept changing; try again".into()))
    }
}

/// How often a redemption that lost a race with another is tried again.
const REDEEM_ATTEMPTS: usize = 100;
