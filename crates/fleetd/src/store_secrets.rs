//! How a member of the store (etcd or embedded) has the values of the secrets its units name:
//! read sealed from the store, opened with the cluster's secrets key this member holds.

use std::sync::Arc;

use async_trait::async_trait;
use fleet_api::secret_keys::SecretKeys;
use fleet_core::secrets::SecretPins;
use fleet_registry::{ApiRegistry, DeliveredSecret, UnitSecrets};

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
        pins: &SecretPins,
    ) -> Result<Vec<DeliveredSecret>, String> {
        let keys = self.keys.get()?;
        fleet_api::secret_keys::open_for_unit(self.registry.as_ref(), &keys, pins, names)
            .await
            .map_err(|(name, why)| format!("secret {name}: {why}"))
    }
}
