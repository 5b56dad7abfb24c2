//! Following a manager's changes to this machine's work, as a reconciler of fleet-runtime:
//! each pass is one long poll, or one change stream from its opening to its end. A failed
//! pass is tried again after the runtime's backoff, spread at random (agents that lost their
//! manager together do not all come back in the same instant), and a stop ends a pass in
//! progress.

use std::sync::{Arc, Weak};
use std::time::Duration;

use fleet_runtime::{Lifecycle, Next, Reconciler, Retry, Triggers};
use tokio::sync::watch;

use crate::jitter::random_sample;
use crate::registry::{Following, RemoteRegistry};

/// Follows the changes of one registry's machine and moves its signal on each.
struct ChangeFollower {
    /// Only a weak reference is held between passes and while a stream lasts: the registry
    /// dropped, there is nothing left to follow.
    registry: Weak<RemoteRegistry>,
    following: Following,
    triggers: Triggers,
}

impl Reconciler for ChangeFollower {
    type Error = String;
    const NAME: &'static str = "hearing from the manager";
    const RETRY: Retry = Retry { min: Duration::from_millis(250), max: Duration::from_secs(30) };
    /// A stream lasts as long as its manager does: a stop does not wait for its end.
    const STOP_CUTS_PASS: bool = true;

    async fn pass(&mut self) -> Result<Next, String> {
        let Some(registry) = self.registry.upgrade() else { return Ok(Next::OnChange) };
        match registry.follow_once(&self.registry, &mut self.following).await {
            Ok(()) => Ok(Next::After(Duration::ZERO)),
            Err(error) => {
                self.following.after = None;
                self.following.recovering = true;
                Err(error)
            }
        }
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }

    fn retry_spread(&mut self) -> Option<u32> {
        Some(random_sample())
    }
}

/// Follows the manager's changes to `registry`'s machine, moving its change signal on each,
/// until `lifecycle` leaves `Running` (or the registry is dropped and the lifecycle ends):
/// by its change stream, or by long polls where the manager serves no stream.
pub fn follow_changes(
    registry: &Arc<RemoteRegistry>,
    lifecycle: watch::Receiver<Lifecycle>,
) -> impl Future<Output = ()> + Send + use<> {
    let follower = ChangeFollower {
        registry: Arc::downgrade(registry),
        following: Following::default(),
        triggers: Triggers::none(),
    };
    fleet_runtime::run(follower, lifecycle)
}

/// Follows the changes of a registry that has no fleetd lifecycle to stop with (a test's, a
/// benchmark's): until it is dropped. Call once the registry is shared; a second call does
/// nothing.
pub fn start(registry: &Arc<RemoteRegistry>) {
    if let Some(lifecycle) = registry.lifecycle_of_its_own() {
        tokio::spawn(follow_changes(registry, lifecycle));
    }
}
