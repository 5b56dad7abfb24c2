//! The commands, grouped by what they do.

pub mod backup;
pub mod create;
pub mod events;
pub mod file_facts;
pub mod history;
pub mod import_original;
pub mod inspect;
pub mod lifecycle;
pub mod list;
pub mod machine;
pub mod plan;
pub mod registration_token;
pub mod remote;
pub mod rollout;
pub mod runs;
pub mod secret;
pub mod source;
pub mod token;
