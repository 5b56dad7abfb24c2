//! Before anything else touches the store: read its recorded format, and run on it, migrate it
//! (each step by its name, then the new format recorded), or stay out naming why
//! (`fleet_core::store_format` decides). A store that cannot be read yet is asked again.

use std::time::Duration;

use anyhow::Context;
use fleet_core::Backoff;
use fleet_core::store_format::{CURRENT, Decision, MIGRATIONS, decide};
use fleet_registry::{FormatRecord, RegistryError};

/// The longest wait between two readings of a store that does not answer.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Returns once the store is of a format this fleetd runs on; an error when it must stay out.
pub async fn settle(record: &dyn FormatRecord) -> anyhow::Result<()> {
    let mut retry = Backoff::new(Duration::from_millis(500), RETRY_MAX);
    loop {
        let stored = match record.stored_format().await {
            Ok(stored) => stored,
            Err(error @ RegistryError::Unavailable(_)) => {
                let wait = retry.next_delay();
                tracing::warn!(%error, retry_in = ?wait, "cannot read the store's format yet");
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(error) => return Err(error).context("reading the store's format"),
        };
        match decide(stored, CURRENT, MIGRATIONS) {
            Decision::Run => {
                let format = stored.map_or(1, |stored| stored.format);
                tracing::info!(format, fleetd_format = CURRENT, "store format");
                return Ok(());
            }
            Decision::Refuse(refusal) => return Err(refusal).context("staying out of the store"),
            Decision::Migrate { steps, then } => {
                for step in &steps {
                    tracing::info!(to = step.to, name = step.name, "migrating the store");
                    record.migrate(step).await.with_context(|| format!("migrating the store to format {}", step.to))?;
                }
                // Another fleetd may have recorded first: read it again and decide again.
                match record.record_format(stored, then).await {
                    Ok(true) => tracing::info!(format = then.format, "recorded the store's format"),
                    Ok(false) => {}
                    Err(error @ RegistryError::Unavailable(_)) => {
                        let wait = retry.next_delay();
                        tracing::warn!(%error, retry_in = ?wait, "cannot record the store's format yet");
                        tokio::time::sleep(wait).await;
                    }
                    Err(error) => return Err(error).context("recording the store's format"),
                }
            }
        }
    }
}
