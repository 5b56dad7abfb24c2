//! Desired state from git: fetching a source, a repository at a branch or revision and its
//! files under some paths, bounded in size ([`fetch`]). The engine leader's syncer
//! (`fleet-leader`) fetches through this and writes what the files mean.

#![forbid(unsafe_code)]

pub mod fetch;

pub use fetch::{Credentials, FetchRequest, Fetched, SourceError, fetch};
