//! The shape of every loop that runs only on the engine leader: a pass every tick while
//! this fleetd leads, on the one reconciler runtime.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_registry::RegistryError;
use fleet_runtime::{Lifecycle, Next, Reconciler, Triggers};
use tokio::sync::watch;

/// What runs on the engine leader only, one pass at a time.
pub trait LeaderPass: Send {
    /// Names it in the log: "`NAME` failed".
    const NAME: &'static str;
    fn pass(&mut self) -> impl Future<Output = Result<(), RegistryError>> + Send;
}

/// Runs `pass` every `tick` while `leads` says this fleetd leads, until `lifecycle` ends it.
pub async fn while_leading<P: LeaderPass>(
    pass: P,
    tick: Duration,
    leads: watch::Receiver<bool>,
    lifecycle: watch::Receiver<Lifecycle>,
) {
    let triggers = Triggers::none().with(leads.clone());
    fleet_runtime::run(WhileLeading { pass, tick, leads, triggers }, lifecycle).await;
}

struct WhileLeading<P> {
    pass: P,
    tick: Duration,
    leads: watch::Receiver<bool>,
    triggers: Triggers,
}

impl<P: LeaderPass> Reconciler for WhileLeading<P> {
    type Error = RegistryError;
    const NAME: &'static str = P::NAME;
    // A pass in progress does not hold up a shutdown (its store calls may wait out their
    // timeouts when the store is gone): its writes are idempotent, the next leader's pass
    // completes what it left.
    const STOP_CUTS_PASS: bool = true;

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        if !*self.leads.borrow() {
            return Ok(Next::OnChange);
        }
        self.pass.pass().await?;
        Ok(Next::After(self.tick))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
