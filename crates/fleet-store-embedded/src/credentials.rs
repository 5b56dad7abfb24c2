//! The credentials facet of the embedded store.

use async_trait::async_trait;
use fleet_core::secrets::SecretPins;
use redb::{ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::tables::{self, encode, read_all};
use super::{EmbeddedRegistry, Touched, unavailable};
use fleet_registry::codec::find_registration;
use fleet_registry::machine_identity::admit_join;
use fleet_registry::{
    CredentialRegistry, JoinRefused, MachineIdentity, RegistrationRecord, RegistrationRefused, Result, RevokedMachine,
    SecretRecord, TokenRecord,
};

/// The record named `name` of a table of JSON records, if any (one that cannot be read is
/// reported and taken as none).
fn read_one<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    name: &str,
) -> Result<Option<T>> {
    let row = table.get(name).map_err(unavailable)?;
    Ok(row.and_then(|row| fleet_registry::codec::decode_listed(name, row.value())))
}

/// A table of JSON records by name.
pub(super) type NamedTable = TableDefinition<'static, &'static str, &'static [u8]>;

impl EmbeddedRegistry {
    /// Stores `record` under `name` unless the name is taken; `false` then.
    async fn insert_new<T: Serialize + Send + 'static>(
        &self,
        table: NamedTable,
        name: &str,
        record: T,
    ) -> Result<bool> {
        let name = name.to_string();
        self.write(move |txn, _| {
            let mut rows = txn.open_table(table).map_err(unavailable)?;
            if rows.get(name.as_str()).map_err(unavailable)?.is_some() {
                return Ok(false);
            }
            rows.insert(name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    /// Stores `record` under `name`, replacing what was there.
    pub(super) async fn put_named<T: Serialize + Send + 'static>(
        &self,
        table: NamedTable,
        name: &str,
        record: T,
    ) -> Result<()> {
        let name = name.to_string();
        self.write(move |txn, touched| {
            let mut rows = txn.open_table(table).map_err(unavailable)?;
            rows.insert(name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            touched.sources |= super::tables::holds_sources(table);
            Ok(())
        })
        .await
    }

    /// Every record of `table`, in name order.
    pub(super) async fn list_all<T: DeserializeOwned + Send + 'static>(&self, table: NamedTable) -> Result<Vec<T>> {
        self.read(move |txn| {
            let rows = txn.open_table(table).map_err(unavailable)?;
            Ok(read_all::<T>(&rows)?.into_iter().map(|(_, record)| record).collect())
        })
        .await
    }

    /// Removes the record named `name`; `false` when there was none.
    pub(super) async fn remove_named(&self, table: NamedTable, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(move |txn, touched| {
            let removed =
                txn.open_table(table).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?.is_some();
            touched.sources |= removed && super::tables::holds_sources(table);
            Ok(removed)
        })
        .await
    }
}

#[async_trait]
impl CredentialRegistry for EmbeddedRegistry {
    async fn put_secret(&self, record: &SecretRecord, previous: Option<u64>) -> Result<bool> {
        let record = record.clone();
        self.write(move |txn, _| {
            let mut rows = txn.open_table(tables::SECRETS).map_err(unavailable)?;
            let stored: Option<SecretRecord> = read_one(&rows, &record.name)?;
            if stored.map(|stored| stored.version) != previous {
                return Ok(false);
            }
            rows.insert(record.name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.list_all(tables::SECRETS).await
    }

    async fn secret(&self, name: &str) -> Result<Option<SecretRecord>> {
        let name = name.to_string();
        self.read(move |txn| {
            let rows = txn.open_table(tables::SECRETS).map_err(unavailable)?;
            read_one(&rows, &name)
        })
        .await
    }

    async fn remove_secret(&self, name: &str) -> Result<bool> {
        self.remove_named(tables::SECRETS, name).await
    }

    async fn set_secret_pins(&self, name: &str, pins: &SecretPins) -> Result<bool> {
        let (name, pins) = (name.to_string(), pins.clone());
        self.write(move |txn, touched| super::api::set_pins_in(txn, touched, &name, &pins)).await
    }

    async fn create_token(&self, record: &TokenRecord) -> Result<bool> {
        self.insert_new(tables::TOKENS, &record.name, record.clone()).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.list_all(tables::TOKENS).await
    }

    async fn revoke_token(&self, name: &str) -> Result<bool> {
        self.remove_named(tables::TOKENS, name).await
    }

    async fn create_registration(&self, record: &RegistrationRecord) -> Result<bool> {
        self.insert_new(tables::REGISTRATIONS, &record.name, record.clone()).await
    }

    async fn registrations(&self) -> Result<Vec<RegistrationRecord>> {
        self.list_all(tables::REGISTRATIONS).await
    }

    async fn revoke_registration(&self, name: &str) -> Result<bool> {
        self.remove_named(tables::REGISTRATIONS, name).await
    }

    async fn revoke_machine(&self, revoked: &RevokedMachine) -> Result<()> {
        let revoked = revoked.clone();
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::REVOKED).map_err(unavailable)?;
            table.insert(revoked.id.as_str(), encode(&revoked).as_slice()).map_err(unavailable)?;
            txn.open_table(tables::MACHINES).map_err(unavailable)?.remove(revoked.id.as_str()).map_err(unavailable)?;
            let suffix = format!("\0{}", revoked.id);
            let mut states = txn.open_table(tables::STATES).map_err(unavailable)?;
            states.retain(|key, _| !key.ends_with(&suffix)).map_err(unavailable)?;
            *touched = Touched::engine();
            Ok(())
        })
        .await
    }

    async fn revoked_machines(&self) -> Result<Vec<RevokedMachine>> {
        self.list_all(tables::REVOKED).await
    }

    async fn join_machine(
        &self,
        sha256: &str,
        now: u64,
        machine_id: &str,
        key_sha256: &str,
    ) -> Result<std::result::Result<(RegistrationRecord, MachineIdentity), JoinRefused>> {
        let (sha256, machine_id, key_sha256) = (sha256.to_string(), machine_id.to_string(), key_sha256.to_string());
        self.write(move |txn, _| {
            let mut registrations = txn.open_table(tables::REGISTRATIONS).map_err(unavailable)?;
            let records = read_all::<RegistrationRecord>(&registrations)?;
            let Some((_, mut record)) = find_registration(records, &sha256) else {
                return Ok(Err(JoinRefused::Token(RegistrationRefused::Unknown)));
            };
            let mut identities = txn.open_table(tables::IDENTITIES).map_err(unavailable)?;
            let bound = read_one::<MachineIdentity>(&identities, &machine_id)?;
            let revoked =
                read_one::<RevokedMachine>(&txn.open_table(tables::REVOKED).map_err(unavailable)?, &machine_id)?;
            let machines = txn.open_table(tables::MACHINES).map_err(unavailable)?;
            let present = machines.get(machine_id.as_str()).map_err(unavailable)?.is_some();
            let identity =
                match admit_join(&record, now, &machine_id, &key_sha256, bound.as_ref(), revoked.as_ref(), present) {
                    Ok(identity) => identity,
                    Err(refused) => return Ok(Err(refused)),
                };
            record.uses += 1;
            registrations.insert(record.name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            identities.insert(machine_id.as_str(), encode(&identity).as_slice()).map_err(unavailable)?;
            Ok(Ok((record, identity)))
        })
        .await
    }

    async fn machine_identity(&self, machine_id: &str) -> Result<Option<MachineIdentity>> {
        let machine_id = machine_id.to_string();
        self.read(move |txn| read_one(&txn.open_table(tables::IDENTITIES).map_err(unavailable)?, &machine_id)).await
    }

    async fn put_machine_identity(&self, identity: &MachineIdentity) -> Result<()> {
        self.put_named(tables::IDENTITIES, &identity.id, identity.clone()).await
    }

    async fn forget_machine(&self, machine_id: &str) -> Result<bool> {
        let machine_id = machine_id.to_string();
        self.write(move |txn, _| {
            let mut revocations = txn.open_table(tables::REVOKED).map_err(unavailable)?;
            let Some(mut revoked) = read_one::<RevokedMachine>(&revocations, &machine_id)? else {
                return Ok(false);
            };
            revoked.forgotten = true;
            revocations.insert(machine_id.as_str(), encode(&revoked).as_slice()).map_err(unavailable)?;
            txn.open_table(tables::IDENTITIES)
                .map_err(unavailable)?
                .remove(machine_id.as_str())
                .map_err(unavailable)?;
            Ok(true)
        })
        .await
    }
}
