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
            let record = self
                .registry
                .secret(name)
                .await
                .map_err(|error| format!("reading secret {name}: {error}"))?
                .ok_or_else(|| format!("secret {name} does not exist"))?;
            let opened = fleet_secrets::open(&keys, name, record.version, &record.sealed)
                .map_err(|error| format!("secret {name}: {error}"))?;
            values.push((name.clone(), opened.expose().to_vec()));
        }
        Ok(values)
    }
}
