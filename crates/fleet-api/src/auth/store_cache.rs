//! A short-lived copy of records every request checks (tokens, revoked machines): read from
//! the store at most once per freshness period, so a change on any fleetd of the cluster is
//! seen by all of them within that period, and kept for a while when the store cannot be read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_registry::RegistryError;

/// How long the last read is still used while the store cannot be read.
const USABLE_WHILE_UNAVAILABLE: Duration = Duration::from_secs(60);

/// The store could not be read, and no recent copy is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unavailable;

/// The cached records of one kind.
pub struct StoreCache<T> {
    what: &'static str,
    cache: tokio::sync::Mutex<Option<(Instant, Arc<Vec<T>>)>>,
}

impl<T> StoreCache<T> {
    /// A cache of `what` (named in the warning when the store cannot be read).
    pub fn new(what: &'static str) -> Self {
        Self { what, cache: tokio::sync::Mutex::new(None) }
    }

    /// The records, read again with `read` when the last read is older than `fresh_for`. One
    /// read at a time: concurrent callers wait for it and share it.
    pub async fn get<F>(&self, fresh_for: Duration, read: F) -> Result<Arc<Vec<T>>, Unavailable>
    where
        F: AsyncFnOnce() -> Result<Vec<T>, RegistryError>,
    {
        let mut cache = self.cache.lock().await;
        if let Some((read_at, records)) = cache.as_ref()
            && read_at.elapsed() < fresh_for
        {
            return Ok(records.clone());
        }
        match read().await {
            Ok(records) => {
                let records = Arc::new(records);
                *cache = Some((Instant::now(), records.clone()));
                Ok(records)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the {} from the store", self.what);
                match cache.as_ref() {
                    Some((read_at, records)) if read_at.elapsed() < USABLE_WHILE_UNAVAILABLE => Ok(records.clone()),
                    _ => Err(Unavailable),
                }
            }
        }
    }

    /// Forgets the last read, so the next check reads the store (after a change made here).
    pub async fn forget(&self) {
        *self.cache.lock().await = None;
    }
}
