//! The store's watch-fed caches: one per key range set ([`Cache`]), shared by every reader in
//! this fleetd. The leading engine and the API read the one cache of the cluster, agents their
//! machine's work, the leader's loops the sources', answerers their journal questions'.
//!
//! One rule starts and releases them all: a cache starts on its first [`Held`] and goes once
//! no one holds it and the linger of every hold let go has passed. Only the API's holds linger
//! (an operator who lists twice a minute should not have the cluster listed twice a minute);
//! the engine's and everyone else's let go at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_core::unpoisoned::Locked;
use tokio::time::Instant;

use super::mirror::Mirror;

/// How long a reader waits for a cache to hold this fleetd's own writes (and its watch to be
/// up) before it takes the cache for behind.
pub(super) const CATCH_UP: Duration = Duration::from_secs(2);

/// A key range set a cache is kept of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Cache {
    /// The leader key alone: what every engine follows.
    Leader,
    /// Sources, their statuses and rollouts.
    Sources,
    /// The journal questions under a prefix (one machine's, or every machine's on a manager).
    Questions(String),
    /// Units, placements, reasons, machines, metadata, drains and bodies: what the leading
    /// engine plans from and the API lists.
    Cluster,
    /// Every machine's unit states, which change most: for the API's lists and what the
    /// engine and rollouts ask of them now and then, not for every leader.
    States,
    /// One machine's schedule, the global units, its presence and its metadata.
    Work(String),
    /// Every machine's work, for a fleetd that serves many machines.
    AllWork,
    /// The event batches and the mark of those trimmed.
    Events,
}

/// The caches running in this fleetd (each a watch-fed [`Mirror`]; the rule does not depend
/// on what a cache is).
pub(super) struct Caches<T = Mirror> {
    slots: Slots<T>,
}

type Slots<T> = Arc<Mutex<HashMap<Cache, Slot<T>>>>;

impl<T> Default for Caches<T> {
    fn default() -> Self {
        Self { slots: Arc::default() }
    }
}

struct Slot<T> {
    mirror: Arc<T>,
    holds: usize,
    /// Not released before this, though no one holds it (a hold let go with a linger).
    kept_until: Instant,
    /// Whether a task waits to release it once `kept_until` has passed.
    release_pending: bool,
}

/// A hold on a cache: it runs at least as long as this lives.
pub(super) struct Held<T: Send + Sync + 'static = Mirror> {
    mirror: Arc<T>,
    cache: Cache,
    linger: Duration,
    slots: Slots<T>,
}

impl<T: Send + Sync + 'static> std::ops::Deref for Held<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.mirror
    }
}

impl<T: Send + Sync + 'static> Held<T> {
    /// The cache itself, shared.
    pub(super) fn shared(&self) -> &Arc<T> {
        &self.mirror
    }
}

impl<T: Send + Sync + 'static> Caches<T> {
    /// Holds `cache`, started with `start` if it does not run; let go, the hold keeps it
    /// `linger` longer.
    pub(super) fn hold(&self, cache: Cache, linger: Duration, start: impl FnOnce() -> T) -> Held<T> {
        let mut slots = self.slots.locked();
        let slot = slots.entry(cache.clone()).or_insert_with(|| Slot {
            mirror: Arc::new(start()),
            holds: 0,
            kept_until: Instant::now(),
            release_pending: false,
        });
        slot.holds += 1;
        Held { mirror: slot.mirror.clone(), cache, linger, slots: self.slots.clone() }
    }

    /// Holds `cache` if it runs (never starts it).
    pub(super) fn hold_running(&self, cache: &Cache, linger: Duration) -> Option<Held<T>> {
        let mut slots = self.slots.locked();
        let slot = slots.get_mut(cache)?;
        slot.holds += 1;
        Some(Held { mirror: slot.mirror.clone(), cache: cache.clone(), linger, slots: self.slots.clone() })
    }

    /// `cache` if it runs, without holding it.
    pub(super) fn running(&self, cache: &Cache) -> Option<Arc<T>> {
        self.slots.locked().get(cache).map(|slot| slot.mirror.clone())
    }
}

impl<T: Send + Sync + 'static> Drop for Held<T> {
    fn drop(&mut self) {
        let mut slots = self.slots.locked();
        let Some(slot) = slots.get_mut(&self.cache) else { return };
        slot.holds = slot.holds.saturating_sub(1);
        slot.kept_until = slot.kept_until.max(Instant::now() + self.linger);
        if slot.holds > 0 || slot.release_pending {
            return;
        }
        if slot.kept_until <= Instant::now() {
            slots.remove(&self.cache);
            return;
        }
        // Outside a runtime (a fleetd ending) nothing waits: the cache goes with the process.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        slot.release_pending = true;
        let (slots, cache) = (Arc::downgrade(&self.slots), self.cache.clone());
        runtime.spawn(release_when_unused(slots, cache));
    }
}

/// Releases `cache` once no one holds it and its linger has passed; a new hold meanwhile
/// ends the wait (its own letting go waits again).
async fn release_when_unused<T>(slots: std::sync::Weak<Mutex<HashMap<Cache, Slot<T>>>>, cache: Cache) {
    loop {
        let wait = {
            let Some(slots) = slots.upgrade() else { return };
            let mut slots = slots.locked();
            let Some(slot) = slots.get_mut(&cache) else { return };
            if slot.holds > 0 {
                slot.release_pending = false;
                return;
            }
            let now = Instant::now();
            if slot.kept_until <= now {
                slots.remove(&cache);
                tracing::debug!(?cache, "a cache no one used for its linger time: released");
                return;
            }
            slot.kept_until - now
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache's stand-in: the rule does not look inside.
    struct Copy;

    fn mirror() -> Copy {
        Copy
    }

    #[tokio::test]
    async fn a_cache_is_shared_while_held_and_goes_with_its_last_hold() {
        let caches = Caches::<Copy>::default();
        let first = caches.hold(Cache::Cluster, Duration::ZERO, mirror);
        let second = caches.hold(Cache::Cluster, Duration::ZERO, || panic!("one cache per range set"));
        assert!(Arc::ptr_eq(first.shared(), second.shared()));
        let other = caches.hold(Cache::Work("m1".into()), Duration::ZERO, mirror);
        assert!(!Arc::ptr_eq(first.shared(), other.shared()), "another range set has its own");
        drop(first);
        assert!(caches.running(&Cache::Cluster).is_some(), "still held");
        drop(second);
        assert!(caches.running(&Cache::Cluster).is_none(), "no hold, no linger: gone at once");
        assert!(caches.running(&Cache::Work("m1".into())).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_hold_keeps_its_cache_until_its_linger_passed_unused() {
        let caches = Caches::<Copy>::default();
        let engine = caches.hold(Cache::Cluster, Duration::ZERO, mirror);
        drop(caches.hold(Cache::Cluster, Duration::from_secs(600), || panic!("running")));
        drop(engine);
        tokio::time::sleep(Duration::from_secs(599)).await;
        let again = caches.hold(Cache::Cluster, Duration::from_secs(600), || panic!("kept for its linger"));
        tokio::time::sleep(Duration::from_secs(700)).await;
        assert!(caches.running(&Cache::Cluster).is_some(), "held: kept however long");
        drop(again);
        tokio::time::sleep(Duration::from_secs(599)).await;
        assert!(caches.running(&Cache::Cluster).is_some(), "within the linger of the last use");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(caches.running(&Cache::Cluster).is_none(), "unused for its linger: released");
        let fresh = caches.hold(Cache::Cluster, Duration::ZERO, mirror);
        drop(fresh);
        assert!(caches.running(&Cache::Cluster).is_none(), "a fresh cache follows the rule afresh");
    }
}
