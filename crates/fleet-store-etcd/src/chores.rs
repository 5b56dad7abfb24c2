//! The etcd store's chores, done on the engine leader's fleetd: compacting the history older
//! than it keeps (`compaction.rs`) and deleting the bodies no unit refers to any more
//! (`body_collection.rs`). Neither costs a request when it is not due.

use std::time::Duration;

use async_trait::async_trait;
use fleet_registry::{ChangeSignal, Result, StoreChores};

use super::EtcdRegistry;

#[async_trait]
impl StoreChores for EtcdRegistry {
    async fn do_chores(&self) -> Result<Duration> {
        let compacted = self.compact_old_history().await;
        let collected = if self.bodies_to_collect() { self.delete_unused_bodies().await.map(|_| ()) } else { Ok(()) };
        compacted?;
        collected?;
        Ok(self.compaction_due_within())
    }

    fn chore_changes(&self) -> ChangeSignal {
        self.inner.chores_signal.subscribe()
    }
}
