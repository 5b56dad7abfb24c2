//! What this fleetd lets askers relay of other machines' journals
//! (`fleet_core::journal_relay`): each asker's allowance, and how many relays run here at once.
//! A relay asked past either is refused before anything is asked of the store or an agent.

use fleet_core::unpoisoned::Locked;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use fleet_core::access::Role;
use fleet_core::journal_relay::{Allowances, MOST_IN_FLIGHT_HERE};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::auth::Identity;
use crate::error::ApiError;

pub struct JournalLimits {
    origin: Instant,
    allowances: Mutex<Allowances>,
    in_flight: Arc<Semaphore>,
}

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            allowances: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(MOST_IN_FLIGHT_HERE)),
        }
    }
}

impl JournalLimits {
    /// Admits one relayed journal for `identity`: a permit held while it is relayed, or why
    /// not (429 past the asker's allowance, 503 while this fleetd relays its most). An
    /// administrator has no allowance to spend (it may write anything to the store anyway),
    /// but waits its turn like everyone.
    pub fn admit(&self, identity: &Identity) -> Result<OwnedSemaphorePermit, ApiError> {
        let permit = self.in_flight.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "this fleetd relays {MOST_IN_FLIGHT_HERE} journals of other machines already; try again shortly"
                ),
            )
        })?;
        if identity.role != Role::Admin {
            let now = self.origin.elapsed();
            let mut allowances = self.allowances.locked();
            allowances.take(&identity.name, now).map_err(|wait| {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "too many journals of other machines asked: {} a minute at most; try again in {} s",
                        fleet_core::journal_relay::ASKS_A_MINUTE,
                        wait.as_secs().max(1)
                    ),
                )
            })?;
        }
        Ok(permit)
    }
}

#[cfg(test)]
mod tests {
    use fleet_core::journal_relay::ASKS_AT_ONCE;

    use super::*;
    use crate::auth::Via;

    fn identity(name: &str, role: Role) -> Identity {
        Identity { name: name.into(), role, via: Via::Token, key_sha256: None }
    }

    #[tokio::test(start_paused = true)]
    async fn an_asker_past_its_allowance_is_told_to_wait_and_an_administrator_only_waits_its_turn() {
        let limits = JournalLimits::default();
        let viewer = identity("token:peeker", Role::Viewer);
        for _ in 0..ASKS_AT_ONCE {
            drop(limits.admit(&viewer).expect("within the allowance"));
        }
        let refused = limits.admit(&viewer).expect_err("past the allowance");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.message.contains("too many journals"), "{}", refused.message);
        let admin = identity("unix:uid=0", Role::Admin);
        let held: Vec<_> =
            (0..MOST_IN_FLIGHT_HERE).map(|_| limits.admit(&admin).expect("no allowance spent")).collect();
        let busy = limits.admit(&admin).expect_err("every relay of this fleetd is in flight");
        assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
        drop(held);
        assert!(limits.admit(&admin).is_ok());
        tokio::time::advance(std::time::Duration::from_secs(60)).await;
        assert!(limits.admit(&viewer).is_ok(), "the allowance refills");
    }
}
