//! Checks of the tree itself, run as tests (`tests/architecture.rs`): every "Architecture
//! invariant:" line of ARCHITECTURE.md names tests that exist, and the rules it states of the
//! dependency graph hold. Nothing here is built into fleet.

#![forbid(unsafe_code)]
