//! The pull agent: a machine that reaches the cluster only through its managers' HTTPS API
//! (the "remote" store of ARCHITECTURE.md, [`RemoteRegistry`]). It joins the
//! cluster once with a registration token, for a certificate of its own that the cluster's
//! agent CA signs over a key pair the agent made itself, keeps that certificate and key on
//! disk (0600), and renews it well before it expires. The token is not kept.

#![forbid(unsafe_code)]

mod change_stream;
mod credentials;
mod disk_copy;
mod following;
mod jitter;
mod joining;
mod journal_inbox;
mod kept_work;
mod leaving;
mod manager;
mod registry;
mod renewal;
mod tls;
mod waiting_asks;

pub use credentials::{CredentialsError, MachineCredentials, credentials_path};
pub use disk_copy::DiskCopy;
pub use following::{follow_changes, start};
pub use joining::{JoinError, join};
pub use manager::{DEFAULT_IDLE_HEARTBEAT, Manager, ManagerError};
pub use registry::RemoteRegistry;
pub use renewal::keep_renewing;
