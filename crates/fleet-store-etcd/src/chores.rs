//! The etcd store's chores, done on the engine leader's fleetd: compacting the history older
//! than it keeps (`compaction.rs`), deleting the bodies no unit refers to any more
//! (`body_collection.rs`), and until every member reads unit states in pages, looking whether
//! they all do (`format.rs`). None costs a request when it is not due.

use std::time::Duration;

use async_trait::async_trait;
use fleet_registry::{ChangeSignal, Result, StoreChores};

use super::EtcdRegistry;

/// How often the leader looks whether every member reads pages of states, while some do not.
const FORMAT_LOOK: Duration = Duration::from_secs(5);

#[async_trait]
impl StoreChores for EtcdRegistry {
    async fn do_chores(&self) -> Result<Duration> {
        let compacted = self.compact_old_history().await;
        let collected = if self.bodies_to_collect() { self.delete_unused_bodies().await.map(|_| ()) } else { Ok(()) };
        let raising = if self.states_paged() { Ok(false) } else { self.raise_oldest_format().await };
        compacted?;
        collected?;
        let due = self.compaction_due_within();
        Ok(if raising? { due.min(FORMAT_LOOK) } else { due })
    }

    fn chore_changes(&self) -> ChangeSignal {
        self.inner.chores_signal.subscribe()
    }
}
