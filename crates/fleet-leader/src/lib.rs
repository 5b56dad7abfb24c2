//! The engine leader's drivers beyond placement: the loops that sync every git source
//! ([`syncer`]), step every rollout ([`rollouts`]) and every drain ([`drains`]), each on
//! fleet-runtime while this fleetd leads, and the one store facet they use
//! ([`leader_store`]). What a sync writes and what a rollout or a drain does next are
//! `fleet_core`'s pure functions (`source`, `rollout`, `drain`); fetching a source is
//! `fleet_source`'s.

#![forbid(unsafe_code)]

pub mod budget_view;
pub mod drains;
pub mod leader_store;
pub mod rollouts;
pub mod source_reader;
pub mod syncer;

pub use drains::DrainDriver;
pub use fleet_registry::DisruptionLedger;
pub use leader_store::LeaderStore;
pub use rollouts::RolloutDriver;
pub use source_reader::{ReaderConfig, SourceReader};
pub use syncer::{SourceSyncer, SyncerConfig};

/// Seconds since the Unix epoch, as sources and rollouts record their times.
pub(crate) fn now() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
