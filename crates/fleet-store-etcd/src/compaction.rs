//! Old revisions are dropped: etcd keeps every version of every key until compacted, and
//! fleet writes a unit state on every change of every unit. The engine leader's fleetd
//! compacts the history older than [`KEPT_HISTORY`], as Kubernetes' API servers do: each
//! chore compacts to the revision it noted one interval before, so a watch that fell behind
//! by less than that resumes, and one that fell further behind lists again (`mirror.rs`).

use fleet_core::unpoisoned::Locked;
use std::time::{Duration, Instant};

use super::EtcdRegistry;
use fleet_registry::Result;

/// How much history is kept, unless the options say otherwise.
pub const KEPT_HISTORY: Duration = Duration::from_secs(5 * 60);

/// How soon to look again while no revision could be noted (the cluster's cache is not listed
/// yet).
const NOTE_RETRY: Duration = Duration::from_secs(1);

/// The revision noted at the last pass, and when.
#[derive(Default)]
pub(super) struct Checkpoint {
    noted: std::sync::Mutex<Option<(Instant, i64)>>,
}

impl EtcdRegistry {
    /// When the next compaction is due at the latest.
    pub(super) fn compaction_due_within(&self) -> Duration {
        let noted = self.inner.checkpoint.noted.locked();
        noted.map_or(NOTE_RETRY, |(at, _)| self.inner.kept_history.saturating_sub(at.elapsed()))
    }

    /// Compacts the history older than the kept span, when a span has passed since the last
    /// compaction: returns the revision compacted to, if it did. Costs no request otherwise.
    pub(super) async fn compact_old_history(&self) -> Result<Option<i64>> {
        let kept = self.inner.kept_history;
        let current = self.engine_mirror().read().revision;
        let due = {
            let mut noted = self.inner.checkpoint.noted.locked();
            match *noted {
                None => {
                    *noted = (current > 0).then(|| (Instant::now(), current));
                    None
                }
                Some((at, revision)) if at.elapsed() >= kept => {
                    *noted = Some((Instant::now(), current));
                    Some(revision)
                }
                Some(_) => None,
            }
        };
        let Some(revision) = due else { return Ok(None) };
        let connection = self.connection();
        let mut client = connection.client();
        match connection.within("compact", connection.timeout, client.compact(revision, None)).await {
            Ok(_) => {
                tracing::info!(revision, "compacted the store's history");
                Ok(Some(revision))
            }
            // Someone (an operator's --auto-compaction, another engine) compacted further.
            Err(error) if error.to_string().contains("compacted") => Ok(None),
            Err(error) => Err(error),
        }
    }
}
