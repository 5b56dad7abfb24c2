//! The copy of the cluster the leading engine reads. The API's copy holds every range the
//! engine's does (and the states and bodies besides): while it runs, the engine reads it, so a
//! fleetd that leads and serves lists keeps one copy and one watch of the units and placements,
//! not two. Otherwise the engine keeps a copy of its own ranges: when the API lets its copy go
//! for idleness, the engine lists its own and reads the API's until that one is listed (a
//! leader does not hold every state for ever after one list), and the API takes back the copy
//! the engine still reads rather than listing the cluster again. The leadership gone, the
//! engine lets go of both.

use fleet_core::unpoisoned::Locked;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};

use tokio::sync::watch;

use super::EtcdRegistry;
use super::keys::{KeyRange, Keys};
use super::mirror::{self, Mirror};

/// The engine's ranges, units first ([`super::ENGINE_UNITS_RANGE`]): the API's copy begins
/// with them too, so a range's place is the same in either copy.
pub(super) fn engine_ranges(keys: &Keys) -> Vec<KeyRange> {
    vec![
        KeyRange::prefix(keys.units()),
        KeyRange::prefix(keys.placements()),
        KeyRange::prefix(keys.reasons()),
        KeyRange::prefix(keys.machines()),
        KeyRange::prefix(keys.all_metadata()),
        KeyRange::prefix(keys.all_drains()),
    ]
}

/// For the API's copy: moves `engine_signal` on a change in the engine's ranges while the
/// engine reads that copy (`reading`). States, which change most, and bodies wake no engine;
/// nor does anything while the engine does not lead.
pub(super) fn engine_waker(
    keys: &Keys,
    reading: Arc<AtomicBool>,
    engine_signal: watch::Sender<u64>,
) -> mirror::Observer {
    let ranges = engine_ranges(keys);
    Arc::new(move |changed| {
        let wakes = match changed {
            mirror::Changed::Everything => true,
            mirror::Changed::Key(key) => ranges.iter().any(|range| range.contains(key)),
        };
        if wakes && reading.load(Ordering::SeqCst) {
            engine_signal.send_modify(|moves| *moves = moves.wrapping_add(1));
        }
    })
}

/// The copies the engine holds.
#[derive(Default)]
pub(super) struct EngineCopies {
    /// The copy it reads now.
    reading: Option<Arc<Mirror>>,
    /// A copy of its own ranges, listing, to read once it is listed (the API let go of the
    /// copy the engine reads).
    listing: Option<Arc<Mirror>>,
}

impl EtcdRegistry {
    fn engine_copies(&self) -> MutexGuard<'_, EngineCopies> {
        self.inner.engine_mirror.locked()
    }

    fn own_engine_copy(&self) -> Arc<Mirror> {
        let ranges = engine_ranges(self.keys());
        Arc::new(Mirror::signalling(self.connection().clone(), ranges, self.inner.engine_signal.clone()))
    }

    /// The copy the engine reads while it leads: the API's once that one is listed, else one
    /// of its own, started on first use (the leadership taken) and kept until
    /// [`EtcdRegistry::drop_engine_mirror`].
    pub(super) fn engine_mirror(&self) -> Arc<Mirror> {
        // Asked before the engine's slot is locked: the API locks its slot, then this one.
        let api_copy = self.api_copy_listed();
        let reads_api_copy = &self.inner.engine_reads_api_copy;
        let mut copies = self.engine_copies();
        if let Some(api_copy) = api_copy {
            copies.listing = None;
            if !copies.reading.as_ref().is_some_and(|copy| Arc::ptr_eq(copy, &api_copy)) {
                reads_api_copy.store(true, Ordering::SeqCst);
                // The engine's own copy, if it had one, goes with its watch.
                copies.reading = Some(api_copy.clone());
                tracing::debug!("the engine reads the API's copy of the cluster");
            }
            return api_copy;
        }
        if let Some(reading) = copies.reading.clone()
            && reads_api_copy.load(Ordering::SeqCst)
        {
            // The API let its copy go: the engine reads it until its own is listed.
            let own = copies.listing.get_or_insert_with(|| self.own_engine_copy()).clone();
            if !own.read().synced {
                return reading;
            }
            reads_api_copy.store(false, Ordering::SeqCst);
            copies.listing = None;
            copies.reading = Some(own.clone());
            tracing::debug!("the engine reads a copy of its own ranges again");
            return own;
        }
        copies.reading.get_or_insert_with(|| self.own_engine_copy()).clone()
    }

    /// The API's copy the engine reads, if it reads one: the API takes it back after letting
    /// it go for idleness, rather than listing the cluster again beside it.
    pub(super) fn api_copy_the_engine_reads(&self) -> Option<Arc<Mirror>> {
        let copies = self.engine_copies();
        if self.inner.engine_reads_api_copy.load(Ordering::SeqCst) { copies.reading.clone() } else { None }
    }

    /// Gives the engine's copies back (the leadership is gone): a standby holds nothing that
    /// grows with the cluster, and etcd streams it nothing but the leader key (and what its
    /// API's copy asks while lists use it).
    pub(super) fn drop_engine_mirror(&self) {
        let dropped = {
            let mut copies = self.engine_copies();
            self.inner.engine_reads_api_copy.store(false, Ordering::SeqCst);
            copies.listing = None;
            copies.reading.take()
        };
        if dropped.is_some() {
            let mut records = self.inner.engine_records.locked();
            records.by_key.clear();
            records.contents.clear();
        }
    }

    /// The copy this engine reads now, if it holds one.
    #[cfg(test)]
    pub(super) fn engine_copy(&self) -> Option<Arc<Mirror>> {
        self.engine_copies().reading.clone()
    }

    /// Whether this engine holds a copy of the cluster now.
    #[cfg(test)]
    pub(super) fn engine_copy_running(&self) -> bool {
        self.engine_copy().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API copy's observer wakes the engine for a change in the engine's ranges, only
    /// while the engine reads that copy; states and bodies never.
    #[test]
    fn the_api_copy_wakes_the_engine_only_for_its_ranges_and_only_while_it_reads_that_copy() {
        let keys = Keys::new("/p/");
        let reading = Arc::new(AtomicBool::new(false));
        let (signal, mut woken) = watch::channel(0u64);
        let observer = engine_waker(&keys, reading.clone(), signal);
        let unit = keys.unit("a.service");
        observer(mirror::Changed::Key(&unit));
        observer(mirror::Changed::Everything);
        assert!(!woken.has_changed().unwrap(), "no engine reads the copy: nothing wakes it");
        reading.store(true, Ordering::SeqCst);
        for key in [keys.state("m1", "a.service"), keys.body("abc")] {
            observer(mirror::Changed::Key(&key));
            assert!(!woken.has_changed().unwrap(), "{key} wakes no engine");
        }
        for key in [
            unit,
            keys.placement("a.service"),
            keys.reason("a.service"),
            keys.machine("m1"),
            keys.metadata("m1"),
            keys.drain("m1"),
        ] {
            observer(mirror::Changed::Key(&key));
            assert!(woken.has_changed().unwrap(), "{key} wakes the engine");
            woken.mark_unchanged();
        }
        observer(mirror::Changed::Everything);
        assert!(woken.has_changed().unwrap(), "a fresh listing wakes the engine");
    }
}
