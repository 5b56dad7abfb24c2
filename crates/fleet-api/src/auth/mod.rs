//! Who is asking: the identity behind a request, from the connection it came on (a Unix
//! socket peer, a client certificate) or the credential it carries (a bearer token), and
//! the audit line every write and every refusal leaves.
//!
//! Authorization itself is [`fleet_core::access::decide`], called once per request by the
//! router.

pub mod audit;
pub(crate) mod identity;
pub mod store_cache;
pub mod tokens;
pub mod webhook;

pub use identity::{Auth, Identity, Peer, Refused, Via};
