//! The credentials facet of the embedded store.

use async_trait::async_trait;
use redb::ReadableTable;

use super::tables::{self, encode, read_all};
use super::{EmbeddedRegistry, unavailable};
use crate::codec::find_registration;
use crate::{CredentialRegistry, RegistrationRecord, RegistrationRefused, Result, TokenRecord};

#[async_trait]
impl CredentialRegistry for EmbeddedRegistry {
    async fn create_token(&self, record: &TokenRecord) -> Result<bool> {
        let record = record.clone();
        self.write(move |txn, _| {
            let mut tokens = txn.open_table(tables::TOKENS).map_err(unavailable)?;
            if tokens.get(record.name.as_str()).map_err(unavailable)?.is_some() {
                return Ok(false);
            }
            tokens.insert(record.name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.read(|txn| {
            let tokens = txn.open_table(tables::TOKENS).map_err(unavailable)?;
            Ok(read_all::<TokenRecord>(&tokens)?.into_iter().map(|(_, record)| record).collect())
        })
        .await
    }

    async fn revoke_token(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(move |txn, _| {
            let mut tokens = txn.open_table(tables::TOKENS).map_err(unavailable)?;
            let removed = tokens.remove(name.as_str()).map_err(unavailable)?.is_some();
            Ok(removed)
        })
        .await
    }

    async fn create_registration(&self, record: &RegistrationRecord) -> Result<bool> {
        let record = record.clone();
        self.write(move |txn, _| {
            let mut registrations = txn.open_table(tables::REGISTRATIONS).map_err(unavailable)?;
            if registrations.get(record.name.as_str()).map_err(unavailable)?.is_some() {
                return Ok(false);
            }
            registrations.insert(record.name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn registrations(&self) -> Result<Vec<RegistrationRecord>> {
        self.read(|txn| {
            let registrations = txn.open_table(tables::REGISTRATIONS).map_err(unavailable)?;
            Ok(read_all::<RegistrationRecord>(&registrations)?.into_iter().map(|(_, record)| record).collect())
        })
        .await
    }

    async fn revoke_registration(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(move |txn, _| {
            let mut registrations = txn.open_table(tables::REGISTRATIONS).map_err(unavailable)?;
            let removed = registrations.remove(name.as_str()).map_err(unavailable)?.is_some();
            Ok(removed)
        })
        .await
    }

    async fn redeem_registration(
        &self,
        sha256: &str,
        now: u64,
    ) -> Result<std::result::Result<RegistrationRecord, RegistrationRefused>> {
        let sha256 = sha256.to_string();
        self.write(move |txn, _| {
            let mut registrations = txn.open_table(tables::REGISTRATIONS).map_err(unavailable)?;
            let records = read_all::<RegistrationRecord>(&registrations)?;
            let Some((_, mut record)) = find_registration(records, &sha256) else {
                return Ok(Err(RegistrationRefused::Unknown));
            };
            if let Err(refused) = record.usable_at(now) {
                return Ok(Err(refused));
            }
            record.uses += 1;
            registrations.insert(record.name.as_str(), encode(&record).as_slice()).map_err(unavailable)?;
            Ok(Ok(record))
        })
        .await
    }
}
