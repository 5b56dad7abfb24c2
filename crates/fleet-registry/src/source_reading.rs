//! Reading a git source's content as a sync would read it, for whoever must know what a sync
//! would do without making one (`fleetctl plan source sync`): the fleetd that reads its
//! sources for its own syncs lends the same reader to its API.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use fleet_core::source::{HeldUnit, SourceContent};

use crate::{SourceRecord, UnitView};

/// A source's content at the commit its branch (or revision) points at now.
#[derive(Clone, Debug)]
pub struct ReadSource {
    pub commit: String,
    pub content: Arc<SourceContent>,
}

#[async_trait]
pub trait SourceReading: Send + Sync {
    /// Fetches `source` and reads its files, bounded as a sync bounds them; the error as a
    /// source's status would show it (never a credential).
    async fn read_source(&self, source: &SourceRecord) -> Result<ReadSource, String>;

    /// Lets go of what is held for the sources not in `kept` (removed from the cluster since
    /// they were read): a fleetd that only plans syncs, and runs no syncer that would.
    async fn forget_others(&self, kept: &BTreeSet<String>);
}

/// The cluster's units as a sync compares them with its source.
pub fn held_units<'a>(units: impl IntoIterator<Item = &'a UnitView>) -> BTreeMap<String, HeldUnit> {
    units
        .into_iter()
        .map(|unit| {
            let held =
                HeldUnit { hash: unit.hash, desired: unit.desired, source: unit.source.clone(), drift: unit.drift };
            (unit.name.clone(), held)
        })
        .collect()
}
