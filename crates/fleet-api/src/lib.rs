//! The fleet HTTP API v1, wire-compatible with the original (compat.md §2, with its fixes).
//!
//! - [`schema`]: the JSON entities, shared with the client.
//! - [`pagination`]: page tokens.
//! - [`router`]: one dispatcher that maps paths and methods to handlers and every error to
//!   the original's JSON error body.
//! - [`listen`]: Unix socket, TCP and socket-activation listeners.
//! - [`serve`]: the connections on those listeners, with their limits and timeouts.

pub mod agent_presence;
pub mod auth;
mod handlers;
mod host_check;
pub mod journal_relay;
pub mod listen;
pub mod live_view;
pub mod pagination;
pub mod router;
pub use fleet_api_schema as schema;
pub mod serve;

pub use router::{ApiState, TokenLimit, router};

/// The version fleetd reports in `Server: fleetd/<version>`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
