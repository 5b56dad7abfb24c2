//! How often fleetd's reconcilers act: the periods and the settling time that the etcd or
//! embedded fleetd (`run.rs`) and the pull agent (`pull.rs`) give them.

use std::time::Duration;

/// The agent's fallback reconcile period (the original's fixed 5 s).
pub const AGENT_RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// The agent's fallback reconcile period on a pull agent: its changes arrive by long poll,
/// and the open poll itself keeps it present, so the fallback is only a safety net. Each is
/// a request to the manager: at 30 s, ten thousand idle agents sent 333 a second, over half
/// of an idle manager's CPU (docs/benchmark-history.md). A failed announcement is retried on its own
/// backoff, and an agent whose `AtMostOnce=` units need its presence renewed passes before
/// it would lapse, whatever this period.
pub const PULL_RECONCILE_INTERVAL: Duration = Duration::from_secs(300);

/// How long a burst of changes may settle before a reconcile acts on it.
pub const DEBOUNCE: Duration = Duration::from_millis(10);
