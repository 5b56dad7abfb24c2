//! The shape of every loop that runs only on the engine leader.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_registry::RegistryError;
use tokio::sync::watch;

/// Runs `pass` every `tick` while `leads` says this fleetd leads, until `stop` (which also
/// cuts a pass short); a failed pass is logged (as `what`) and tried again next tick.
pub async fn while_leading<F, Fut>(
    mut leads: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
    tick: Duration,
    what: &str,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), RegistryError>>,
{
    loop {
        tokio::select! {
            _ = leads.wait_for(|leads| *leads) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        // A pass in progress does not hold up a shutdown (its store calls may wait out their
        // timeouts when the store is gone): its writes are idempotent, the next leader's
        // pass completes what it left.
        tokio::select! {
            result = pass() => {
                if let Err(error) = result {
                    tracing::warn!(%error, "{what} failed; trying again");
                }
            }
            _ = stop.wait_for(|stop| *stop) => return,
        }
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
