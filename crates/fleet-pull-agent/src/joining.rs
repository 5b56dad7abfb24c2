//! Joining the cluster with a registration token, as a reconciler of fleet-runtime: a pass
//! asks the manager to sign the machine's certificate; one the manager cannot be reached for
//! is tried again after the runtime's backoff (500 ms doubling to 30 s, spread at random, so
//! agents started together do not all ask again in the same instant); an answer, a
//! certificate or a refusal, ends it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet_runtime::{Lifecycle, Next, Reconciler, Retry, Triggers};
use tokio::sync::watch;

use crate::credentials::{CredentialsError, MachineCredentials};
use crate::jitter::random_sample;
use crate::manager::{Manager, ManagerError};

/// Why a join ended without credentials.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("joining the cluster: {0}")]
    Refused(#[from] ManagerError),
    #[error("keeping the credentials the manager signed: {0}")]
    NotKept(#[from] CredentialsError),
}

struct Joining {
    manager: Arc<Manager>,
    token: String,
    machine_id: String,
    state_dir: PathBuf,
    /// Where what the join came to goes, once it did.
    outcome: Option<tokio::sync::oneshot::Sender<Result<MachineCredentials, JoinError>>>,
    triggers: Triggers,
}

impl Reconciler for Joining {
    type Error = ManagerError;
    const NAME: &'static str = "joining the cluster";
    const RETRY: Retry = Retry { min: Duration::from_millis(500), max: Duration::from_secs(30) };

    async fn pass(&mut self) -> Result<Next, ManagerError> {
        let outcome = match self.manager.join(&self.token, &self.machine_id).await {
            Ok((credentials, _)) => match credentials.save(&self.state_dir) {
                Ok(()) => {
                    tracing::info!(machine_id = self.machine_id, "joined the cluster through the manager");
                    Ok(credentials)
                }
                Err(error) => Err(error.into()),
            },
            Err(error @ ManagerError::Unreachable(_)) => return Err(error),
            Err(refused) => Err(refused.into()),
        };
        if let Some(sender) = self.outcome.take() {
            let _ = sender.send(outcome);
        }
        Ok(Next::Done)
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }

    fn retry_spread(&mut self) -> Option<u32> {
        Some(random_sample())
    }
}

/// Joins the cluster as `machine_id` with `token` through `manager`, keeping the signed
/// credentials in `state_dir` (0600); tried again while the manager cannot be reached, until
/// it answers. Dropping the future gives up.
pub async fn join(
    manager: Arc<Manager>,
    token: &str,
    machine_id: &str,
    state_dir: PathBuf,
) -> Result<MachineCredentials, JoinError> {
    let (sender, outcome) = tokio::sync::oneshot::channel();
    let joining = Joining {
        manager,
        token: token.to_string(),
        machine_id: machine_id.to_string(),
        state_dir,
        outcome: Some(sender),
        triggers: Triggers::none(),
    };
    // Nothing but its own end stops a join: a signal drops this future.
    let (_running, lifecycle) = watch::channel(Lifecycle::Running);
    fleet_runtime::run(joining, lifecycle).await;
    outcome.await.unwrap_or_else(|_| Err(ManagerError::Unreachable("the join ended unanswered".into()).into()))
}
