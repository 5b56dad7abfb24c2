//! The shape of every loop that runs only on the engine leader.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_registry::RegistryError;
use tokio::sync::watch;

/// Runs `pass` every `tick` while `leads` says this fleetd leads, until `stop`; a failed pass
/// is logged (as `what`) and tried again next tick.
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
        if let Err(error) = pass().await {
            tracing::warn!(%error, "{what} failed; trying again");
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
