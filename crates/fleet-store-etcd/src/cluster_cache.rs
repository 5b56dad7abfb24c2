//! The cluster's cache: units, placements, reasons, machines, metadata, drains, the leader's
//! records (machines out of touch, silent departures, where requirements run) and bodies, in one watch-fed copy that
//! the leading engine and the API read alike; and the states' cache beside it. The engine holds the cluster's while it leads (a standby follows the leader key
//! alone); each API read holds what it reads and lets it linger `api_copy_idle` after
//! (`caches.rs`), and so do the engine's and rollouts' occasional questions about states. A
//! fleetd that leads and serves lists keeps one copy of each, and nothing moves from one copy
//! to another. (A leader that held every state streamed 100,000 state changes it never read
//! while they launched: 10% more engine CPU in `bench-cluster 10000 100000`.)

use fleet_core::unpoisoned::Locked;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::EtcdRegistry;
use super::caches::{Cache, Held};
use super::keys::{KeyRange, Keys};
use super::mirror::{self, Mirror};

/// The ranges the engine plans from, units first ([`super::ENGINE_UNITS_RANGE`]).
fn engine_ranges(keys: &Keys) -> Vec<KeyRange> {
    vec![
        KeyRange::prefix(keys.units()),
        KeyRange::prefix(keys.placements()),
        KeyRange::prefix(keys.reasons()),
        KeyRange::prefix(keys.machines()),
        KeyRange::prefix(keys.all_metadata()),
        KeyRange::prefix(keys.all_drains()),
        KeyRange::prefix(keys.all_out_of_touch()),
        KeyRange::prefix(keys.all_silent_departures()),
        // Job records: a run started by hand wakes the engine.
        KeyRange::prefix(keys.jobs()),
    ]
}

/// Moves `engine_signal` on a change in the engine's ranges while the engine leads (`leads`).
/// States, which change most, and bodies wake no engine; nor does a key written again with
/// the value it held (a plan reads values only: 10,000 presences taken over by a restarted
/// manager had the leader plan over and over, a fifth of the machine, for nothing).
fn engine_waker(keys: &Keys, leads: Arc<AtomicBool>, engine_signal: watch::Sender<u64>) -> mirror::Observer {
    let ranges = engine_ranges(keys);
    Arc::new(move |changed| {
        let wakes = match changed {
            mirror::Changed::Everything => true,
            mirror::Changed::Key(key) => ranges.iter().any(|range| range.contains(key)),
            mirror::Changed::Rewritten(_) => false,
        };
        if wakes && leads.load(Ordering::SeqCst) {
            engine_signal.send_modify(|moves| *moves = moves.wrapping_add(1));
        }
    })
}

impl EtcdRegistry {
    fn start_cluster_cache(&self) -> Mirror {
        let keys = self.keys();
        let mut ranges = engine_ranges(keys);
        ranges.push(KeyRange::prefix(keys.bodies()));
        // The engine's own records of where requirements run and of the runs of global units
        // on a calendar: they wake no engine.
        ranges.push(KeyRange::prefix(keys.all_required_places()));
        ranges.push(KeyRange::prefix(keys.run_tickets()));
        let inner = &self.inner;
        let waker = engine_waker(keys, inner.engine_leads.clone(), inner.engine_signal.clone());
        Mirror::signalling_observed(self.connection().clone(), ranges, inner.api_signal.clone(), waker)
    }

    /// The cluster's cache as the engine reads it while it leads: held from its first use (the
    /// leadership taken) until [`EtcdRegistry::drop_engine_mirror`].
    pub(super) fn engine_mirror(&self) -> Arc<Mirror> {
        let mut held = self.inner.engine_hold.locked();
        let held = held.get_or_insert_with(|| {
            self.inner.engine_leads.store(true, Ordering::SeqCst);
            self.inner.caches.hold(Cache::Cluster, Duration::ZERO, || self.start_cluster_cache())
        });
        Arc::clone(held.shared())
    }

    /// Lets go of the engine's hold (the leadership is gone): a standby holds nothing that
    /// grows with the cluster, unless its API's lists still use the cache.
    pub(super) fn drop_engine_mirror(&self) {
        let dropped = {
            let mut held = self.inner.engine_hold.locked();
            self.inner.engine_leads.store(false, Ordering::SeqCst);
            held.take()
        };
        if dropped.is_some() {
            let mut records = self.inner.engine_records.locked();
            records.by_key.clear();
            records.contents.clear();
        }
    }

    /// The cluster's cache for an API read, started if it does not run: it stays
    /// `api_copy_idle` after the returned hold goes.
    pub(super) fn api_mirror(&self) -> Held {
        self.inner.caches.hold(Cache::Cluster, self.inner.api_copy_idle, || self.start_cluster_cache())
    }

    /// The states' cache for a read, started if it does not run: it stays `api_copy_idle`
    /// after the returned hold goes.
    pub(super) fn api_states(&self) -> Held {
        self.inner.caches.hold(Cache::States, self.inner.api_copy_idle, || {
            let ranges = vec![KeyRange::prefix(self.keys().all_states())];
            Mirror::signalling(self.connection().clone(), ranges, self.inner.api_signal.clone())
        })
    }

    /// `cache` for an API read, when it runs, is listed and its watch is up (never starts it).
    pub(super) fn api_copy_if_up(&self, cache: &Cache) -> Option<Held> {
        let held = self.inner.caches.hold_running(cache, self.inner.api_copy_idle)?;
        let up = {
            let data = held.read();
            data.synced && data.streaming
        };
        up.then_some(held)
    }

    /// The cluster's cache if it runs, without holding it.
    pub(super) fn cluster_cache_running(&self) -> Option<Arc<Mirror>> {
        self.inner.caches.running(&Cache::Cluster)
    }

    /// The states' cache if it runs, without holding it.
    pub(super) fn states_cache_running(&self) -> Option<Arc<Mirror>> {
        self.inner.caches.running(&Cache::States)
    }

    /// Whether this engine holds the cluster's cache now.
    #[cfg(test)]
    pub(super) fn engine_copy_running(&self) -> bool {
        self.inner.engine_hold.locked().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache's observer wakes the engine for a change in the engine's ranges, only while
    /// the engine leads; states, bodies and values written again as they were never.
    #[test]
    fn the_cluster_cache_wakes_the_engine_only_for_its_ranges_and_only_while_it_leads() {
        let keys = Keys::new("/p/");
        let leads = Arc::new(AtomicBool::new(false));
        let (signal, mut woken) = watch::channel(0u64);
        let observer = engine_waker(&keys, leads.clone(), signal);
        let unit = keys.unit("a.service");
        observer(mirror::Changed::Key(&unit));
        observer(mirror::Changed::Everything);
        assert!(!woken.has_changed().unwrap(), "no engine leads: nothing wakes it");
        leads.store(true, Ordering::SeqCst);
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
        observer(mirror::Changed::Rewritten(&keys.machine("m1")));
        assert!(!woken.has_changed().unwrap(), "a presence written again as it was wakes no engine");
        observer(mirror::Changed::Everything);
        assert!(woken.has_changed().unwrap(), "a fresh listing wakes the engine");
    }
}
