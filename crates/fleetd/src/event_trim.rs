//! Trims the cluster's events to what the configuration keeps (`events_kept`,
//! `events_kept_for`), while this fleetd's engine leads, once a minute.

use std::sync::Arc;
use std::time::Duration;

use fleet_registry::{EventLog, RegistryError};
use fleet_runtime::{LeaderPass, Next};

/// How often the events are trimmed.
const EVERY: Duration = Duration::from_secs(60);

pub struct EventTrimPass {
    log: Arc<dyn EventLog>,
    kept: usize,
    kept_for: Duration,
}

impl EventTrimPass {
    pub fn new(log: Arc<dyn EventLog>, kept: usize, kept_for: Duration) -> Self {
        Self { log, kept, kept_for }
    }
}

impl LeaderPass for EventTrimPass {
    type Error = RegistryError;
    const NAME: &'static str = "event trim";

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        let kept_for = i64::try_from(self.kept_for.as_micros()).unwrap_or(i64::MAX);
        let oldest_at = fleet_registry::micros_now().saturating_sub(kept_for);
        let trimmed = self.log.trim_events(self.kept, oldest_at).await?;
        if trimmed > 0 {
            tracing::debug!(trimmed, "events trimmed");
        }
        Ok(Next::After(EVERY))
    }
}
