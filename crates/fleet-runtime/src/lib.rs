//! The one runtime every reconciler of fleetd runs on (the engine, the agent, the source
//! syncer, the rollout driver, the sweep of silent pull agents): a pass, then a wait for
//! whichever comes first of a trigger (a change signal) or the moment the pass asked to be
//! run again, a settling time to gather a burst, and the next pass. A failed pass is logged
//! (a failure repeated on every wake once a minute) and retried after the one backoff. Every reconciler stops the same way: when fleetd's
//! [`Lifecycle`] leaves `Running`. What runs on the engine leader only runs through
//! [`while_leading`].

#![forbid(unsafe_code)]

mod failure_log;
mod leading;
mod lifecycle;
mod reconciler;
pub mod slow;
mod triggers;
pub mod wall_clock;

pub use leading::{LeaderPass, while_leading};
pub use lifecycle::Lifecycle;
pub use reconciler::{Next, Reconciler, Retry, run};
pub use triggers::{TriggerId, Triggers};
