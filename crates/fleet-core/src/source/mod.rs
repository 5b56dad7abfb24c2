//! Desired state from git, sans I/O: what a source's files say ([`content`], with its
//! [`desired_file`]), what a sync must write ([`sync_plan`]) and when a reverted commit halts
//! it ([`halt`]).

pub mod cadence;
pub mod checks;
pub mod content;
pub mod desired_file;
pub mod halt;
pub mod sync_plan;

pub use content::{FileProblem, SourceContent, WantedUnit, read_source};
pub use desired_file::DESIRED_FILE;
pub use sync_plan::{HeldUnit, OwnedElsewhere, SyncChange, SyncPlan, SyncRules, plan_sync};

/// The rollout that new content for a source's running units goes out in.
pub fn rollout_of(source: &str) -> String {
    format!("source-{source}")
}
