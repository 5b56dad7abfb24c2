//! fleetd as a library: only what is pure enough to test and fuzz from outside the binary,
//! its configuration format.

pub mod api_security;
pub mod config;
pub mod config_docs;
pub mod manual;

/// fleetd's own version (what `--version`, its logs and its announcements say).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
