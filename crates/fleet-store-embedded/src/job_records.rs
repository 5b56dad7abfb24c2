//! The `jobs` table: one job record per unit whose runs fleet keeps, replaced only over the
//! version read (the engine leader's writes and `fleetctl run`'s alike).

use fleet_core::job::runs::JobRecord;
use fleet_registry::Result;
use redb::ReadableTable;

use super::tables::{self, decode, encode};
use super::unavailable;

/// Replaces `unit`'s job record by `record` (`None`: removes it) if the stored one is at
/// `version` (0: none); `false` when it is not.
pub(crate) fn replace(
    txn: &redb::WriteTransaction,
    unit: &str,
    record: Option<JobRecord>,
    version: u64,
) -> Result<bool> {
    let mut jobs = txn.open_table(tables::JOBS).map_err(unavailable)?;
    let stored = jobs
        .get(unit)
        .map_err(unavailable)?
        .and_then(|value| decode::<tables::StoredJobValue>(unit, value.value()).ok())
        .map_or(0, |stored| stored.version);
    if stored != version {
        return Ok(false);
    }
    match record {
        Some(record) => {
            let value = encode(&tables::StoredJobValue { version: version + 1, record });
            jobs.insert(unit, value.as_slice()).map_err(unavailable)?;
        }
        None => {
            jobs.remove(unit).map_err(unavailable)?;
        }
    }
    Ok(true)
}
