//! The credentials facet of the embedded store.

use async_trait::async_trait;
use redb::ReadableTable;

use super::tables::{self, encode, read_all};
use super::{EmbeddedRegistry, unavailable};
use crate::{CredentialRegistry, Result, TokenRecord};

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
}
