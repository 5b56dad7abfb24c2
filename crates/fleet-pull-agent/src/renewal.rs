//! Renewing the machine's certificate at two thirds of its life, as a reconciler of
//! fleet-runtime: a pass renews when the time has come and says when the next is due; a
//! failed renewal is tried again after the runtime's backoff (1 s, doubling to 5 minutes),
//! long before the certificate expires.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fleet_core::unpoisoned::Locked;
use fleet_runtime::{Lifecycle, Next, Reconciler, Retry, Triggers};
use tokio::sync::watch;

use crate::credentials::MachineCredentials;
use crate::manager::Manager;
use crate::registry::RemoteRegistry;

struct CertificateRenewal {
    manager: Arc<Manager>,
    registry: Arc<RemoteRegistry>,
    /// The credentials in use, shared with the renewal that runs after a reload: one started
    /// again renews the newest certificate, not the one fleetd started with.
    credentials: Arc<Mutex<MachineCredentials>>,
    state_dir: PathBuf,
    triggers: Triggers,
}

impl Reconciler for CertificateRenewal {
    type Error = String;
    const NAME: &'static str = "renewing the machine certificate";
    const RETRY: Retry = Retry { min: Duration::from_secs(1), max: Duration::from_secs(300) };
    /// A renewal cut short leaves the current certificate, valid a third of its life yet.
    const STOP_CUTS_PASS: bool = true;

    async fn pass(&mut self) -> Result<Next, String> {
        let current = self.credentials.locked().clone();
        let until = current.until_renewal(SystemTime::now());
        if !until.is_zero() {
            return Ok(Next::After(until));
        }
        let renewed = self.manager.renew(&current).await.map_err(|error| error.to_string())?;
        if let Err(error) = renewed.save(&self.state_dir) {
            tracing::error!(%error, "cannot keep the renewed certificate");
        }
        if let Err(error) = self.registry.use_credentials(&renewed) {
            tracing::error!(%error, "cannot use the renewed certificate");
        }
        let until = renewed.until_renewal(SystemTime::now());
        *self.credentials.locked() = renewed;
        tracing::info!("machine certificate renewed");
        Ok(Next::After(until))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}

/// Renews `credentials` through `manager` for as long as `lifecycle` is `Running`: each
/// renewed certificate is kept in `state_dir` (0600), used by `registry` from then on, and put
/// in `credentials` for the renewal started after a reload.
pub fn keep_renewing(
    manager: Arc<Manager>,
    registry: Arc<RemoteRegistry>,
    credentials: Arc<Mutex<MachineCredentials>>,
    state_dir: PathBuf,
    lifecycle: watch::Receiver<Lifecycle>,
) -> impl Future<Output = ()> + Send + 'static {
    let renewal = CertificateRenewal { manager, registry, credentials, state_dir, triggers: Triggers::none() };
    fleet_runtime::run(renewal, lifecycle)
}
