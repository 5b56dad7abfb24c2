//! The credentials facet of the etcd store: `tokens/<name>`, read straight from etcd so a
//! revocation on one fleetd is seen by every other on its next read.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::EtcdRegistry;
use crate::codec::{decode_listed, encode};
use crate::{CredentialRegistry, Result, TokenRecord};

#[async_trait]
impl CredentialRegistry for EtcdRegistry {
    async fn create_token(&self, record: &TokenRecord) -> Result<bool> {
        let key = self.keys().token(&record.name);
        let txn = Txn::new()
            .when(vec![Compare::version(key.as_str(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.as_str(), encode(record), None)]);
        Ok(self.connection().txn(txn).await?.succeeded())
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        let reply = self.connection().get(&self.keys().tokens(), Some(GetOptions::new().with_prefix())).await?;
        let mut tokens: Vec<TokenRecord> = reply
            .kvs()
            .iter()
            .filter_map(|kv| decode_listed::<TokenRecord>(&String::from_utf8_lossy(kv.key()), kv.value()))
            .collect();
        tokens.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tokens)
    }

    async fn revoke_token(&self, name: &str) -> Result<bool> {
        let key = self.keys().token(name);
        let reply = self.connection().txn(Txn::new().and_then(vec![TxnOp::delete(key.as_str(), None)])).await?;
        let deleted = reply.op_responses().into_iter().any(|response| match response {
            etcd_client::TxnOpResponse::Delete(delete) => delete.deleted() > 0,
            _ => false,
        });
        Ok(deleted)
    }
}
