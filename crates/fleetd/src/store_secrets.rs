//! How a member of the store (etcd or embedded) has the values of the secrets its units name:
//! read sealed from the store, opened with the cluster's secrets key this member holds.

use std::sync::Arc;

use async_trait::async_trait;
use fleet_api::secret_keys::SecretKeys;
use fleet_registry::{ApiRegistry, UnitSecrets};

pub struct StoreSecrets {
    registry: Arc<dyn ApiRegistry>,
    keys: Arc<SecretKeys>,
}

impl StoreSecrets {
    pub fn new(registry: Arc<dyn ApiRegistry>, keys: Arc<SecretKeys>) -> Self {
        Self { registry, keys }
    }
}

#[async_trait]
impl UnitSecrets for StoreSecrets {
    async fn unit_secrets(
        &self,
        _machine_id: &str,
        _unit: &str,
        names: &[String],
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let keys = self.keys.get()?;
        let mut values = Vec::with_capacity(names.len());
        for name in names {
            let opened = fleet_api::secret_keys::open_stored(self.registry.as_ref(), &keys, name)
                .await
                .map_err(|why| format!("secret {name}: {why}"))?;
            values.push((name.clone(), opened.expose().to_vec()));
        }
        Ok(values)
    }
}
