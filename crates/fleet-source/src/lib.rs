//! Desired state at the edges: fetching a git source ([`fetch`]), and the engine leader's
//! loops that sync every source ([`syncer`]) and step every rollout ([`rollouts`]). What the
//! files mean, what a sync writes and what a rollout does next are `fleet_core`'s pure
//! functions (`source`, `rollout`).

#![forbid(unsafe_code)]

pub mod fetch;
pub mod leader_store;
mod leading;
pub mod rollouts;
pub mod syncer;

pub use fetch::{Credentials, FetchRequest, Fetched, SourceError, fetch};
pub use leader_store::LeaderStore;
pub use rollouts::RolloutDriver;
pub use syncer::{SourceSyncer, SyncerConfig};
