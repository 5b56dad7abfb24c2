//! Desired state from git, at the edges: fetching a source ([`fetch`]) and the engine
//! leader's loop that syncs every source ([`syncer`]). What the files mean and what a sync
//! writes are `fleet_core::source`'s pure functions.

#![forbid(unsafe_code)]

pub mod fetch;
pub mod syncer;

pub use fetch::{Credentials, FetchRequest, Fetched, SourceError, fetch};
pub use syncer::{SourceSyncer, SyncerConfig};
