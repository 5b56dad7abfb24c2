//! How often fleetd's reconcilers act: the periods and the settling time that the etcd or
//! embedded fleetd (`run.rs`) and the pull agent (`pull.rs`) give them.

use std::time::Duration;

/// The agent's fallback reconcile period (the original's fixed 5 s).
pub const AGENT_RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// The agent's fallback reconcile period on a pull agent: its changes arrive by long poll,
/// and the open poll itself keeps it present, so the fallback is only a safety net. (Each is
/// a request to the manager: 333 a second from ten thousand idle agents. Five minutes was
/// tried: an agent whose first announcement failed then waited that long to try again.)
pub const PULL_RECONCILE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a burst of changes may settle before a reconcile acts on it.
pub const DEBOUNCE: Duration = Duration::from_millis(10);
