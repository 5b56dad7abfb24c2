//! The fleet HTTP API v1, wire-compatible with the original (compat.md §2, with its fixes).
//!
//! - [`schema`]: the JSON entities, shared with the client.
//! - [`pagination`]: page tokens.
//! - [`routes`]: the one route table (path, method, action needed, body, handler).
//! - [`router`]: one dispatcher that takes every request through the table, the write guard,
//!   authentication and authorization, and turns every error into the original's JSON error
//!   body.
//! - [`listen`]: Unix socket, TCP and socket-activation listeners.
//! - [`serve`]: the connections on those listeners, with their limits and timeouts.

pub mod agent_presence;
mod agent_state_events;
pub mod announce_pace;
mod api_state;
pub mod auth;
mod call;
mod encoded_bodies;
mod encoded_events;
mod error;
pub mod feed_slots;
mod handlers;
mod host_check;
pub mod journal_limits;
pub mod journal_relay;
pub mod listen;
pub mod live_view;
mod out_of_touch;
pub mod pagination;
mod query;
pub mod revocation_bell;
pub mod router;
mod routes;
pub mod secret_keys;
pub use fleet_api_schema as schema;
pub mod serve;
pub mod silent_agents;
pub mod tcp_liveness;
pub mod unread_answers;
mod upgrade;
mod write_guard;

pub use api_state::{ApiState, LocalMachine, PageSize, within_relay_bound};
pub use handlers::backup::Backup;
pub use router::router;

/// The version fleetd reports in `Server: fleetd/<version>`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
