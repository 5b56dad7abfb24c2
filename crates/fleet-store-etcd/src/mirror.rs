//! A local copy of some key ranges, fed by one watch stream: listed once at a revision, then
//! kept current by events. A broken stream is resumed from the last revision each range has
//! seen; a range whose revision was compacted away is relisted. Readers wait on a change
//! signal and read the copy, so waking up costs no etcd request.

use fleet_core::Backoff;
use fleet_core::unpoisoned::{Locked, ReadWriteLocked};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, TxnOp, WatchOptions, WatchResponse};
use tokio::sync::watch;

use super::connection::Connection;
use super::keys::KeyRange;
use fleet_registry::codec::{decode, decode_listed};
use fleet_registry::{ChangeSignal, RegistryError, Result};
use serde::de::DeserializeOwned;

mod decoded;
use decoded::Decoded;

/// One key's value and revisions, as etcd last reported them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key hangs on (0: none).
    pub lease: i64,
    /// The value decoded, once a reader asked for it.
    pub decoded: Decoded,
}

impl Entry {
    pub fn new(value: Vec<u8>, create_revision: i64, mod_revision: i64, lease: i64) -> Self {
        Self { value, create_revision, mod_revision, lease, decoded: Decoded::default() }
    }

    /// The value decoded as `T`, parsed on the first read of this revision only (`key`
    /// names it in the error when it does not decode).
    pub fn decoded<T: DeserializeOwned + Send + Sync + 'static>(&self, key: &str) -> Result<Arc<T>> {
        self.decoded.get_or_decode(|| decode::<T>(key, &self.value))
    }

    /// [`Entry::decoded`] for a record of a listing: one that does not decode is logged and
    /// left out (`codec::decode_listed`).
    pub fn decoded_listed<T: DeserializeOwned + Send + Sync + 'static>(&self, key: &str) -> Option<Arc<T>> {
        self.decoded.get_or_decode(|| decode_listed::<T>(key, &self.value).ok_or(())).ok()
    }
}

/// The counter every copy's generations are drawn from.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// A generation no copy in this process had before.
fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1
}

#[derive(Debug, Default)]
pub struct MirrorData {
    pub entries: BTreeMap<String, Entry>,
    /// The highest revision applied.
    pub revision: i64,
    /// Per range (in the order given), the revision up to which its events are all applied:
    /// ranges are watched apart, so one may be ahead of another. A broken watch resumes each
    /// range from here.
    pub seen: Vec<i64>,
    /// The revision of the last listing: a watch that outlived it (a listing asked for while
    /// the stream runs) still delivers the events up to it, which the listing holds already.
    pub listed: i64,
    /// Moves on every change, so equal generations mean equal contents. Drawn from one
    /// counter for every copy in the process ([`next_generation`]): a cache released and
    /// started again never repeats a count a reader planned from.
    pub generation: u64,
    /// Whether the copy was listed at least once.
    pub synced: bool,
    /// How many listings it was made from (the first and each asked for since).
    pub listings: u64,
    /// Whether its watch stream is up now (else the copy may be missing recent changes).
    pub streaming: bool,
}

impl MirrorData {
    /// Whether every range has applied everything up to `revision`: one range being there
    /// says nothing of another's, which may wait on a slower watcher.
    pub fn current_since(&self, revision: i64) -> bool {
        self.synced && self.seen.iter().all(|seen| *seen >= revision)
    }

    pub fn range<'a>(&'a self, range: &'a KeyRange) -> impl Iterator<Item = (&'a String, &'a Entry)> + 'a {
        self.entries.range(range.start.clone()..).take_while(move |(key, _)| range.contains(key))
    }
}

/// What changed in a copy, for an observer: one key, or everything (a fresh listing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed<'a> {
    Key(&'a str),
    /// A key written again with the value it held: only its revision or its lease moved (a
    /// machine's presence taken over by a restarted manager, say).
    Rewritten(&'a str),
    Everything,
}

/// Told of every change a copy applies, after it applied it.
pub type Observer = Arc<dyn Fn(Changed<'_>) + Send + Sync>;

pub struct Mirror {
    data: Arc<RwLock<MirrorData>>,
    /// Moves when what the copy holds changed (readers wake on it; several copies may share it).
    changes: watch::Sender<u64>,
    /// Moves on every change of the copy's state, held or not (its watch came up, a range's
    /// revision moved): what this copy's own waits wake on. The agents woken by `changes`
    /// are not woken for nothing when a watch comes up.
    moved: watch::Sender<u64>,
    task: tokio::task::AbortHandle,
    ranges: Vec<KeyRange>,
    /// Per range, the revision of the last change this process made in it and waits to see.
    expected: std::sync::Mutex<Vec<i64>>,
    /// Asks the feeder for a fresh listing (requests made meanwhile come to one).
    relist: Arc<tokio::sync::Notify>,
    /// For a copy listed only once wanted ([`Mirror::when_read`]): lets its first listing go.
    wanted: Option<Arc<tokio::sync::Notify>>,
    /// What a reader derived from the whole copy, with the generation it was derived at.
    derived: std::sync::Mutex<Option<(u64, Derived)>>,
}

/// A value derived from a whole copy ([`Mirror::derived`]).
type Derived = Arc<dyn std::any::Any + Send + Sync>;

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest wait between attempts to reach etcd again: after a partition heals, a machine
/// learns what moved (and stops it) within about this (the chaos run's reaction allowance is
/// 3 s; at 5 s the 30-minute run saw machines react late).
const RETRY_MAX: Duration = Duration::from_secs(2);
/// The least time between two listings asked for with [`Mirror::relist`].
const RELIST_SPACING: Duration = Duration::from_millis(500);

/// Why a watch stream ended.
enum StreamEnd {
    /// The connection broke: resume from the revisions seen.
    Broken(RegistryError),
    /// A range's start revision was compacted away: list again.
    Compacted,
}

impl Mirror {
    /// Starts listing and watching `ranges`; the copy fills in the background.
    pub fn start(connection: Connection, ranges: Vec<KeyRange>) -> Self {
        Self::observed(connection, ranges, None)
    }

    /// As [`Mirror::start`], telling `observer` of every change.
    pub fn observed(connection: Connection, ranges: Vec<KeyRange>, observer: Option<Observer>) -> Self {
        Self::begin(connection, ranges, observer, watch::channel(0).0, false)
    }

    /// As [`Mirror::start`], but listed first when it is first read or asked to list: a
    /// machine's copy made as its agent starts is listed after the machine registered, once
    /// (listed before, it had to be listed again to be current since the registration).
    pub fn when_read(connection: Connection, ranges: Vec<KeyRange>) -> Self {
        Self::begin(connection, ranges, None, watch::channel(0).0, true)
    }

    /// As [`Mirror::start`], moving `changes` on every change: copies given the same sender
    /// wake the same readers.
    pub fn signalling(connection: Connection, ranges: Vec<KeyRange>, changes: watch::Sender<u64>) -> Self {
        Self::begin(connection, ranges, None, changes, false)
    }

    /// As [`Mirror::signalling`], telling `observer` of every change too.
    pub fn signalling_observed(
        connection: Connection,
        ranges: Vec<KeyRange>,
        changes: watch::Sender<u64>,
        observer: Observer,
    ) -> Self {
        Self::begin(connection, ranges, Some(observer), changes, false)
    }

    fn begin(
        connection: Connection,
        ranges: Vec<KeyRange>,
        observer: Option<Observer>,
        changes: watch::Sender<u64>,
        deferred: bool,
    ) -> Self {
        let data = Arc::new(RwLock::new(MirrorData::default()));
        let expected = std::sync::Mutex::new(vec![0; ranges.len()]);
        let relist = Arc::new(tokio::sync::Notify::new());
        let wanted = deferred.then(|| Arc::new(tokio::sync::Notify::new()));
        let moved = watch::channel(0).0;
        let feeder = Feeder {
            connection,
            ranges: ranges.clone(),
            data: data.clone(),
            changes: changes.clone(),
            moved: moved.clone(),
            observer,
            relist: relist.clone(),
            wanted: wanted.clone(),
        };
        let task = tokio::spawn(feeder.run()).abort_handle();
        Self { data, changes, moved, task, ranges, expected, relist, wanted, derived: std::sync::Mutex::new(None) }
    }

    /// Lets a copy listed only once wanted list (a stored permit: once is enough).
    fn want(&self) {
        if let Some(wanted) = &self.wanted {
            wanted.notify_one();
        }
    }

    /// Has the copy listed afresh, soon: every range is then current as of a revision read
    /// after this call, whether or not its watcher has had an event since. For a reader that
    /// must not act on anything older than a write it just made, when it cannot know which
    /// range that write shows up in first (see [`MirrorData::current_since`]).
    pub fn relist(&self) {
        self.want();
        self.relist.notify_one();
    }

    /// What `compute` derives from the whole copy (`data`, read from it), kept for the copy's
    /// generation: computed again after a change, and gone with the copy. One value per copy.
    pub fn derived<T: Send + Sync + 'static>(
        &self,
        data: &MirrorData,
        compute: impl FnOnce(&MirrorData) -> T,
    ) -> Arc<T> {
        let mut derived = self.derived.locked();
        if let Some((generation, value)) = derived.as_ref()
            && *generation == data.generation
            && let Ok(value) = value.clone().downcast::<T>()
        {
            return value;
        }
        let value = Arc::new(compute(data));
        *derived = Some((data.generation, value.clone()));
        value
    }

    /// Wakes the copy's readers though it did not change: what they may read of it did.
    pub fn poke(&self) {
        bump(&[&self.changes, &self.moved]);
    }

    pub fn read(&self) -> RwLockReadGuard<'_, MirrorData> {
        self.want();
        self.data.read_locked()
    }

    /// The copy, or `Unavailable` before the first listing.
    pub fn synced(&self) -> Result<RwLockReadGuard<'_, MirrorData>> {
        let data = self.read();
        if data.synced { Ok(data) } else { Err(RegistryError::NotListedYet) }
    }

    pub fn changes(&self) -> ChangeSignal {
        self.changes.subscribe()
    }

    /// The revision up to which `data` (this copy's) holds every event of the range `key`
    /// falls in; `None` when no range of the copy holds it.
    pub fn seen_through(&self, data: &MirrorData, key: &str) -> Option<i64> {
        data.seen.get(self.range_of(key)?).copied()
    }

    /// The index of the range `key` falls in, if any.
    fn range_of(&self, key: &str) -> Option<usize> {
        self.ranges.iter().position(|range| range.contains(key))
    }

    /// Waits until `done` holds of the copy or `limit` passes; `true` if it holds.
    async fn wait_until(&self, limit: Duration, done: impl Fn(&MirrorData) -> bool) -> bool {
        let mut changes = self.moved.subscribe();
        let waited = async {
            while !done(&self.read()) {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, waited).await.is_ok() && done(&self.read())
    }

    /// The copy, once listed, waiting at most `limit` for its first listing; `Unavailable`
    /// when it is not listed by then.
    pub async fn listed(&self, limit: Duration) -> Result<RwLockReadGuard<'_, MirrorData>> {
        self.wait_until(limit, |data| data.synced).await;
        self.synced()
    }

    /// Waits until the copy has applied `revision` in some range or `limit` passes; `true` if
    /// it has. Other ranges may still be behind it: see [`Mirror::caught_up`].
    pub async fn wait_for(&self, revision: i64, limit: Duration) -> bool {
        self.wait_until(limit, |data| data.revision >= revision).await
    }

    /// Notes that this process changed `key` at `revision` (a put, or a delete that deleted):
    /// [`Mirror::caught_up`] then waits for the event. Keys outside the ranges are
    /// ignored. Only changes that make an event may be noted, or the wait cannot end.
    pub fn expect(&self, key: &str, revision: i64) {
        if let Some(index) = self.range_of(key) {
            let mut expected = self.expected.locked();
            expected[index] = expected[index].max(revision);
        }
    }

    /// Waits until every range has applied the changes noted with [`Mirror::expect`], the copy
    /// is listed and its watch is up (it holds this process's writes and will see others' as
    /// they come), or `limit` passes; `true` if so. Each range is waited on by its own
    /// revision: etcd orders a watcher's events, not one watcher's against another's.
    pub async fn caught_up(&self, limit: Duration) -> bool {
        let expected = self.expected.locked().clone();
        self.wait_until(limit, |data| {
            data.synced && data.streaming && data.seen.iter().zip(&expected).all(|(seen, expected)| seen >= expected)
        })
        .await
    }
}

/// A listing asked for with [`Mirror::relist`] and taken from its signal, not made yet: a
/// stream that ends first asks again, so the next one makes it. (A machine registering again
/// as its connection comes back asks just before its broken stream ends; lost, the ranges
/// with no event since would stay behind the registration until etcd's next progress notice,
/// minutes later, and the machine's work could not be read meanwhile.)
struct PendingRelist<'a> {
    asked: bool,
    notify: &'a tokio::sync::Notify,
}

impl Drop for PendingRelist<'_> {
    fn drop(&mut self) {
        if self.asked {
            self.notify.notify_one();
        }
    }
}

struct Feeder {
    connection: Connection,
    ranges: Vec<KeyRange>,
    data: Arc<RwLock<MirrorData>>,
    changes: watch::Sender<u64>,
    moved: watch::Sender<u64>,
    observer: Option<Observer>,
    relist: Arc<tokio::sync::Notify>,
    wanted: Option<Arc<tokio::sync::Notify>>,
}

/// Moves each of `signals` on.
fn bump(signals: &[&watch::Sender<u64>]) {
    signals.iter().for_each(|signal| signal.send_modify(|generation| *generation += 1));
}

impl Feeder {
    /// Wakes the copy's readers and its own waits: what it holds changed (or was listed).
    fn held_changed(&self) {
        bump(&[&self.changes, &self.moved]);
    }

    async fn run(self) {
        if let Some(wanted) = &self.wanted {
            wanted.notified().await;
        }
        // A listing asked for before the first one starts is that one: its revision is read
        // after the ask.
        tokio::select! {
            biased;
            () = self.relist.notified() => {}
            () = std::future::ready(()) => {}
        }
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            // The listing sets every range's revision; the watches resume from those.
            let next_relist = match self.list_spaced().await {
                Ok(next_relist) => next_relist,
                Err(error) => {
                    tracing::debug!(%error, "listing for the watch cache failed; retrying");
                    tokio::time::sleep(retry.next_delay()).await;
                    continue;
                }
            };
            retry.reset();
            loop {
                let started = tokio::time::Instant::now();
                let end = self.follow(next_relist).await;
                self.data.write_locked().streaming = false;
                match end {
                    StreamEnd::Compacted => break,
                    StreamEnd::Broken(error) => {
                        if started.elapsed() > RETRY_MAX * 2 {
                            retry.reset();
                        }
                        tracing::debug!(%error, "watch stream broke; resuming");
                        tokio::time::sleep(retry.next_delay()).await;
                    }
                }
            }
        }
    }

    /// Lists afresh; says when the next listing asked for may be made. Relists asked for in a
    /// row (many machines registering again at once, each asking) leave the copy following
    /// its watch at least half the time.
    async fn list_spaced(&self) -> Result<tokio::time::Instant> {
        let listing = tokio::time::Instant::now();
        self.list().await?;
        Ok(tokio::time::Instant::now() + listing.elapsed().max(RELIST_SPACING))
    }

    /// Replaces the copy with a fresh listing; returns its revision.
    async fn list(&self) -> Result<i64> {
        let gets = self
            .ranges
            .iter()
            .map(|range| TxnOp::get(range.start.as_str(), Some(GetOptions::new().with_range(range.end.clone()))))
            .collect();
        let (revision, replies) = self.connection.read(gets).await?;
        let mut entries = BTreeMap::new();
        for reply in replies {
            for kv in reply.kvs() {
                entries.insert(
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    Entry::new(kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.lease()),
                );
            }
        }
        {
            let mut data = self.data.write_locked();
            let changed = !data.synced || data.entries != entries;
            data.entries = entries;
            data.revision = data.revision.max(revision);
            data.seen = vec![revision; self.ranges.len()];
            data.listed = revision;
            data.synced = true;
            data.listings += 1;
            if changed {
                data.generation = next_generation();
            }
        }
        self.held_changed();
        if let Some(observer) = &self.observer {
            observer(Changed::Everything);
        }
        Ok(revision)
    }

    /// Watches every range from the revision its events are applied up to, until the stream
    /// ends. A listing asked for meanwhile ([`Mirror::relist`]) is made beside the watches,
    /// not before `next_relist` and then at most once per [`RELIST_SPACING`] (or per
    /// listing's time): the watches go on, and what they deliver up to the listing's revision
    /// is skipped. etcd then keeps its watchers, where a new stream made it create them again
    /// and catch each up from an old revision.
    async fn follow(&self, mut next_relist: tokio::time::Instant) -> StreamEnd {
        let resume = self.data.read_locked().seen.clone();
        let connection = &self.connection;
        let options = |index: usize| {
            WatchOptions::new()
                .with_range(self.ranges[index].end.clone())
                .with_start_revision(resume[index] + 1)
                .with_progress_notify()
        };
        let mut watch_client = connection.watch_client();
        let mut stream = match connection
            .within(
                "watch",
                connection.timeout * 5,
                watch_client.watch(self.ranges[0].start.as_str(), Some(options(0))),
            )
            .await
        {
            Ok(stream) => stream,
            Err(error) => return StreamEnd::Broken(error),
        };
        for index in 1..self.ranges.len() {
            if let Err(error) = stream.watch(self.ranges[index].start.as_str(), Some(options(index))).await {
                return StreamEnd::Broken(RegistryError::Unavailable(error.to_string()));
            }
        }
        self.data.write_locked().streaming = true;
        // Waits for the watch to be up (`Mirror::caught_up`) look again; readers of what it
        // holds are not woken: nothing they read changed.
        bump(&[&self.moved]);
        // Watch IDs come back in the order the watches were asked for.
        let mut range_of_watch: BTreeMap<i64, usize> = BTreeMap::new();
        let mut relist = PendingRelist { asked: false, notify: &self.relist };
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = self.relist.notified(), if !relist.asked => {
                    relist.asked = true;
                    continue;
                }
                () = tokio::time::sleep_until(next_relist), if relist.asked => {
                    next_relist = match self.list_spaced().await {
                        Ok(next_relist) => next_relist,
                        Err(error) => return StreamEnd::Broken(error),
                    };
                    relist.asked = false;
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return StreamEnd::Broken(RegistryError::Unavailable("etcd closed the watch".into())),
                Err(error) => return StreamEnd::Broken(RegistryError::Unavailable(error.to_string())),
            };
            if response.created() {
                let next = range_of_watch.len();
                range_of_watch.insert(response.watch_id(), next);
            }
            if response.compact_revision() > 0 {
                tracing::info!(compacted = response.compact_revision(), "watch start revision compacted; relisting");
                // The listing that follows is the one asked for too.
                relist.asked = false;
                return StreamEnd::Compacted;
            }
            if response.canceled() {
                return StreamEnd::Broken(RegistryError::Unavailable(format!(
                    "etcd cancelled the watch: {}",
                    response.cancel_reason()
                )));
            }
            let Some(&index) = range_of_watch.get(&response.watch_id()) else {
                continue;
            };
            self.apply(&response, index);
        }
    }

    /// Applies one watch response of range `index`: its events, or a progress notice (every
    /// event up to its revision was delivered).
    fn apply(&self, response: &WatchResponse, index: usize) {
        let events = response.events();
        let mut data = self.data.write_locked();
        if events.is_empty() {
            if !response.created()
                && let Some(header) = response.header()
                && let Some(seen) = data.seen.get_mut(index)
            {
                *seen = (*seen).max(header.revision());
                drop(data);
                self.held_changed();
            }
            return;
        }
        let mut changed = Vec::with_capacity(events.len());
        for event in events {
            let Some(kv) = event.kv() else { continue };
            // Held already by a listing made while this watch ran.
            if kv.mod_revision() <= data.listed {
                continue;
            }
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if self.observer.is_some() {
                let rewritten = event.event_type() == EventType::Put
                    && data.entries.get(&key).is_some_and(|held| held.value == kv.value());
                changed.push((key.clone(), rewritten));
            }
            match event.event_type() {
                EventType::Put => {
                    let entry = Entry::new(kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.lease());
                    data.entries.insert(key, entry);
                }
                EventType::Delete => {
                    data.entries.remove(&key);
                }
            }
            data.revision = data.revision.max(kv.mod_revision());
            if let Some(seen) = data.seen.get_mut(index) {
                *seen = (*seen).max(kv.mod_revision());
            }
        }
        data.generation = next_generation();
        drop(data);
        self.held_changed();
        if let Some(observer) = &self.observer {
            for (key, rewritten) in &changed {
                observer(if *rewritten { Changed::Rewritten(key) } else { Changed::Key(key) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use etcd_client::GetOptions;
    use fleet_testkit::EtcdServer;

    use super::*;
    use crate::EtcdOptions;

    async fn connect(etcd: &EtcdServer) -> Connection {
        let options = EtcdOptions {
            endpoints: vec![etcd.endpoint()],
            request_timeout: Duration::from_secs(2),
            ..EtcdOptions::default()
        };
        Connection::connect(&options).await.unwrap()
    }

    /// A value derived from the whole copy is computed once per generation and again after
    /// a change.
    #[tokio::test]
    async fn a_derived_value_is_computed_once_per_generation() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mut kv = connection.kv();
        kv.put("/d/a", "1", None).await.unwrap();
        let mirror = Mirror::start(connection, vec![KeyRange::prefix("/d/".into())]);
        let computed = std::sync::atomic::AtomicUsize::new(0);
        let count = |data: &MirrorData| {
            computed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            data.entries.len()
        };
        let first = *mirror.derived(&mirror.listed(Duration::from_secs(10)).await.unwrap(), count);
        let again = *mirror.derived(&mirror.read(), count);
        assert_eq!((first, again, computed.load(std::sync::atomic::Ordering::SeqCst)), (1, 1, 1));
        let written = kv.put("/d/b", "2", None).await.unwrap().header().unwrap().revision();
        assert!(mirror.wait_for(written, Duration::from_secs(10)).await);
        assert_eq!(*mirror.derived(&mirror.read(), count), 2, "derived again after the change");
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// An observer is told which writes changed a key's value and which wrote it again as it
    /// was.
    #[tokio::test]
    async fn an_observer_tells_a_value_written_again_from_a_changed_one() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mut kv = connection.kv();
        kv.put("/o/key", "1", None).await.unwrap();
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer: Observer = {
            let told = told.clone();
            Arc::new(move |changed| {
                let note = match changed {
                    Changed::Key(key) => format!("changed {key}"),
                    Changed::Rewritten(key) => format!("rewritten {key}"),
                    Changed::Everything => "everything".to_string(),
                };
                told.lock().unwrap().push(note);
            })
        };
        let mirror = Mirror::observed(connection, vec![KeyRange::prefix("/o/".into())], Some(observer));
        drop(mirror.listed(Duration::from_secs(10)).await.unwrap());
        for value in ["1", "2", "2"] {
            let written = kv.put("/o/key", value, None).await.unwrap().header().unwrap().revision();
            assert!(mirror.wait_for(written, Duration::from_secs(10)).await);
        }
        let deleted = kv.delete("/o/key", None).await.unwrap().header().unwrap().revision();
        assert!(mirror.wait_for(deleted, Duration::from_secs(10)).await);
        assert_eq!(
            *told.lock().unwrap(),
            ["everything", "rewritten /o/key", "changed /o/key", "rewritten /o/key", "changed /o/key"]
        );
    }

    #[tokio::test]
    async fn a_compacted_resume_revision_ends_the_stream_for_a_relist() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mut kv = connection.kv();
        for value in ["1", "2", "3"] {
            kv.put("/m/key", value, None).await.unwrap();
        }
        let latest = kv.get("/m/", Some(GetOptions::new().with_prefix())).await.unwrap().header().unwrap().revision();
        connection.client().compact(latest, None).await.unwrap();
        let feeder = Feeder {
            connection,
            ranges: vec![KeyRange::prefix("/m/".into())],
            data: Arc::new(RwLock::new(MirrorData::default())),
            changes: watch::channel(0).0,
            moved: watch::channel(0).0,
            observer: None,
            relist: Arc::new(tokio::sync::Notify::new()),
            wanted: None,
        };
        feeder.data.write().unwrap().seen = vec![1];
        let ended =
            tokio::time::timeout(Duration::from_secs(10), feeder.follow(tokio::time::Instant::now())).await.unwrap();
        assert!(matches!(ended, StreamEnd::Compacted));
        // A relist then brings the copy to the latest value.
        assert_eq!(feeder.list().await.unwrap(), latest);
        assert_eq!(feeder.data.read().unwrap().entries["/m/key"].value, b"3".to_vec());
    }

    /// The chaos run's seed 1820719916: a machine registered again while its stream to etcd
    /// was broken, the relist it asked for was lost with the stream, and its work could not
    /// be read for the rest of the run.
    #[tokio::test]
    async fn a_relist_asked_for_is_still_asked_for_after_the_stream_breaks() {
        let mut etcd = EtcdServer::start();
        let feeder = Feeder {
            connection: connect(&etcd).await,
            ranges: vec![KeyRange::prefix("/a/".into()), KeyRange::prefix("/b/".into())],
            data: Arc::new(RwLock::new(MirrorData::default())),
            changes: watch::channel(0).0,
            moved: watch::channel(0).0,
            observer: None,
            relist: Arc::new(tokio::sync::Notify::new()),
            wanted: None,
        };
        feeder.list().await.unwrap();
        let mut changes = feeder.moved.subscribe();
        // Not due for an hour: the stream breaks before the listing is made.
        let following = feeder.follow(tokio::time::Instant::now() + Duration::from_secs(3600));
        let breaking = async {
            while !feeder.data.read().unwrap().streaming {
                changes.changed().await.unwrap();
            }
            feeder.relist.notify_one();
            // The follower takes the signal (it waits for nothing else), then etcd goes.
            tokio::task::yield_now().await;
            etcd.kill();
        };
        let (ended, ()) = tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(following, breaking) })
            .await
            .expect("the stream ends once etcd is gone");
        assert!(matches!(ended, StreamEnd::Broken(_)));
        tokio::time::timeout(Duration::from_secs(10), feeder.relist.notified())
            .await
            .expect("the listing is still asked for");
    }

    #[tokio::test]
    async fn a_relist_brings_a_range_without_events_up_to_date() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mirror =
            Mirror::start(connection.clone(), vec![KeyRange::prefix("/a/".into()), KeyRange::prefix("/b/".into())]);
        let mut changes = mirror.changes();
        while mirror.synced().is_err() {
            changes.changed().await.unwrap();
        }
        let written = connection.kv().put("/a/key", "1", None).await.unwrap().header().unwrap().revision();
        assert!(mirror.wait_for(written, Duration::from_secs(10)).await);
        // The second range had no event since the listing: it is current only up to that.
        assert!(!mirror.read().current_since(written));
        mirror.relist();
        let relisted = async {
            while !mirror.read().current_since(written) {
                changes.changed().await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(10), relisted).await.expect("every range current after a relist");
        assert_eq!(mirror.read().entries["/a/key"].value, b"1".to_vec());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_started_while_keys_change_ends_equal_to_etcd() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mut kv = connection.kv();
        for index in 0..50 {
            kv.put(format!("/m/old{index}"), "old", None).await.unwrap();
        }
        // Writes go on while the copy lists and starts watching: some land before its
        // listing, some between it and the watchers, some after. Each key changes once, so
        // a change the copy misses shows at the end.
        let writer = {
            let mut kv = kv.clone();
            tokio::spawn(async move {
                let mut last = 0;
                for round in 0..200 {
                    let reply = if round % 4 == 0 {
                        kv.delete(format!("/m/old{}", round / 4), None).await.unwrap().header().unwrap().revision()
                    } else {
                        kv.put(format!("/m/new{round}"), "new", None).await.unwrap().header().unwrap().revision()
                    };
                    last = last.max(reply);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                last
            })
        };
        let mirror = Mirror::start(connection.clone(), vec![KeyRange::prefix("/m/".into())]);
        let last = writer.await.unwrap();
        assert!(mirror.wait_for(last, Duration::from_secs(10)).await, "the copy follows every write");
        let listed = kv.get("/m/", Some(GetOptions::new().with_prefix())).await.unwrap();
        let etcd_holds: BTreeMap<String, Vec<u8>> =
            listed.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.value().to_vec())).collect();
        let copy_holds: BTreeMap<String, Vec<u8>> =
            mirror.read().entries.iter().map(|(key, entry)| (key.clone(), entry.value.clone())).collect();
        assert_eq!(copy_holds, etcd_holds);
    }

    /// How many watch streams etcd has opened so far, by its own count.
    async fn watch_streams_opened(etcd: &EtcdServer) -> u64 {
        let address = etcd.endpoint().trim_start_matches("http://").to_string();
        let text = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut text = String::new();
            stream.read_to_string(&mut text).unwrap();
            text
        })
        .await
        .unwrap();
        let line = text
            .lines()
            .find(|line| line.starts_with("grpc_server_started_total") && line.contains("grpc_method=\"Watch\""))
            .expect("etcd counts the watch streams it opened");
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
    }

    #[tokio::test]
    async fn a_relist_keeps_the_watch_and_loses_no_change_around_it() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let mirror = Mirror::start(connection.clone(), vec![KeyRange::prefix("/m/".into())]);
        let mut kv = connection.kv();
        let first = kv.put("/m/a", "1", None).await.unwrap().header().unwrap().revision();
        assert!(mirror.wait_for(first, Duration::from_secs(10)).await);
        let opened = watch_streams_opened(&etcd).await;
        // Written just before the listing: the listing holds it, and the watch delivers it
        // too; it is applied once either way.
        let before = kv.put("/m/b", "2", None).await.unwrap().header().unwrap().revision();
        mirror.relist();
        let mut changes = mirror.changes();
        let listed = async {
            while mirror.read().listed < before {
                changes.changed().await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(10), listed).await.expect("the relist is made");
        kv.put("/m/c", "3", None).await.unwrap();
        let last = kv.delete("/m/a", None).await.unwrap().header().unwrap().revision();
        assert!(mirror.wait_for(last, Duration::from_secs(10)).await, "changes after the relist arrive");
        let keys: Vec<String> = mirror.read().entries.keys().cloned().collect();
        assert_eq!(keys, ["/m/b", "/m/c"]);
        assert_eq!(mirror.read().entries["/m/b"].value, b"2".to_vec());
        assert_eq!(watch_streams_opened(&etcd).await, opened, "the relist opened no watch stream");
    }

    /// Its watch coming up after the listing changes nothing a reader reads: an agent woken
    /// by it made a pass for nothing (and the contract's "a schedule change wakes only its
    /// machine" failed under load, the other machine's watch coming up late).
    #[tokio::test]
    async fn a_watch_coming_up_wakes_no_reader() {
        let etcd = EtcdServer::start();
        let mirror = Mirror::start(connect(&etcd).await, vec![KeyRange::prefix("/w/".into())]);
        let mut changes = mirror.changes();
        drop(mirror.listed(Duration::from_secs(10)).await.unwrap());
        changes.mark_unchanged();
        assert!(mirror.caught_up(Duration::from_secs(10)).await, "the watch comes up");
        assert!(!changes.has_changed().unwrap(), "the watch coming up woke a reader");
        etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap().put("/w/key", "1", None).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), changes.changed()).await.unwrap().unwrap();
    }
}

#[cfg(test)]
mod expected_tests {
    use std::time::Duration;

    use super::*;

    /// A copy of two ranges whose first range has applied revision 7 and whose second is
    /// still at 4, as happens when etcd delivers one watcher's events before another's.
    fn copy_with_a_range_behind() -> Mirror {
        let data = MirrorData { revision: 7, seen: vec![7, 4], synced: true, streaming: true, ..MirrorData::default() };
        Mirror {
            data: Arc::new(RwLock::new(data)),
            changes: watch::channel(0).0,
            moved: watch::channel(0).0,
            task: tokio::spawn(async {}).abort_handle(),
            ranges: vec![KeyRange::prefix("/a/".into()), KeyRange::prefix("/b/".into())],
            expected: std::sync::Mutex::new(vec![0, 0]),
            relist: Arc::new(tokio::sync::Notify::new()),
            wanted: None,
            derived: std::sync::Mutex::new(None),
        }
    }

    #[tokio::test]
    async fn a_write_is_awaited_in_the_range_it_changed_not_the_newest() {
        let mirror = copy_with_a_range_behind();
        // The write at 7 changed a key of the second range: the first being at 7 is not enough.
        mirror.expect("/b/unit", 7);
        mirror.expect("/elsewhere/key", 99);
        assert!(mirror.wait_for(7, Duration::ZERO).await, "the newest revision seen is 7");
        assert!(!mirror.caught_up(Duration::from_millis(50)).await);
        let waiting = mirror.caught_up(Duration::from_secs(5));
        let delivered = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            mirror.data.write().unwrap().seen[1] = 7;
            mirror.moved.send_modify(|generation| *generation += 1);
        };
        let (caught_up, ()) = tokio::join!(waiting, delivered);
        assert!(caught_up, "the range's own event ends the wait");
    }

    #[tokio::test]
    async fn a_copy_not_yet_listed_is_not_current() {
        let mirror = copy_with_a_range_behind();
        mirror.data.write().unwrap().synced = false;
        assert!(!mirror.caught_up(Duration::from_millis(20)).await);
    }

    #[tokio::test]
    async fn a_copy_whose_watch_is_down_is_not_current() {
        let mirror = copy_with_a_range_behind();
        mirror.data.write().unwrap().seen[1] = 7;
        assert!(mirror.caught_up(Duration::ZERO).await, "listed, watching, every range at 7");
        mirror.data.write().unwrap().streaming = false;
        assert!(!mirror.caught_up(Duration::from_millis(20)).await);
    }
}
