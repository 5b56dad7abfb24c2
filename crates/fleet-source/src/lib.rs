//! Desired state at the edges: fetching a git source ([`fetch`]), and the engine leader's
//! loops that sync every source ([`syncer`]), step every rollout ([`rollouts`]) and every
//! drain ([`drains`]). What the files mean, what a sync writes and what a rollout or a drain
//! does next are `fleet_core`'s pure functions (`source`, `rollout`, `drain`).

#![forbid(unsafe_code)]

pub mod drains;
pub mod fetch;
pub mod leader_store;
pub mod rollouts;
pub mod syncer;

pub use drains::DrainDriver;
pub use fetch::{Credentials, FetchRequest, Fetched, SourceError, fetch};
pub use leader_store::LeaderStore;
pub use rollouts::RolloutDriver;
pub use syncer::{SourceSyncer, SyncerConfig};

/// Seconds since the Unix epoch, as sources and rollouts record their times.
pub(crate) fn now() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
