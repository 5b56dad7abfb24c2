//! The store's chores (etcd: compacting old history, deleting the bodies no unit refers to),
//! done while this fleetd's engine leads, when the store says one may be due or when the
//! next one is.

use std::sync::Arc;

use fleet_registry::{RegistryError, StoreChores};
use fleet_runtime::{LeaderPass, Next};

pub struct StoreChoresPass {
    chores: Arc<dyn StoreChores>,
}

impl StoreChoresPass {
    pub fn new(chores: Arc<dyn StoreChores>) -> Self {
        Self { chores }
    }
}

impl LeaderPass for StoreChoresPass {
    type Error = RegistryError;
    const NAME: &'static str = "store chores";

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        self.chores.do_chores().await.map(Next::After)
    }
}
