//! Cluster secrets at rest. A value is sealed (AES-256-GCM, from ring: the tree's one crypto
//! provider) under the cluster's secrets key, bound to its secret's name and version, so a
//! sealed value moved to another name or version does not open. The key lives in a file of
//! its own on the members (beside the agent CA key, or in a single machine's state
//! directory), never in the store: a reader of the store learns names and sizes, not values.

mod envelope;
mod key_file;
mod wipe;

pub use envelope::{Revealed, SealError, open, seal, sealed_with};
pub use key_file::{ClusterKeys, KEY_FILE_NAME, KeyFileError};
