//! The etcd v3 store, for clusters. The layout is in [`keys`]; how it avoids the original's
//! scaling problems:
//!
//! - each machine's schedule lives under its own prefix, so a schedule change wakes one agent;
//! - unit bodies are content-addressed, written with the units that set them, and collected
//!   by the leading engine once no unit has them;
//! - a machine's presence and its unit states hang on one lease: one keepalive keeps them,
//!   and they vanish together when the machine dies; states are written only on change; a
//!   manager holds every pull agent's under one lease of its own ([`agent_lease`]);
//! - engine and agents read from watch-fed copies ([`mirror`]), so waking up or the periodic
//!   fallback reconcile costs no etcd request;
//! - the engine's writes are batched transactions fenced by its leader key.

#![forbid(unsafe_code)]

mod agent;
mod agent_lease;
mod api;
mod api_copy;
mod apply_lag;
mod balanced_channel;
mod body_collection;
mod caches;
mod chores;
mod cluster_cache;
mod compaction;
mod connection;
mod credentials;
mod engine;
mod events;
mod format;
mod imports;
mod job_records;
mod join_batches;
mod journal_questions;
mod keys;
mod leader_records;
mod leadership;
mod mirror;
mod presence_batches;
mod records;
mod registration_uses;
mod session;
mod sources;
mod stored_rollouts;
mod unit_write_batches;
mod written_together;

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use caches::{Cache, Caches, Held};
use connection::Connection;
pub use connection::EtcdOptions;
use keys::{KeyRange, Keys};
use mirror::Mirror;
pub use records::Assignment;

use fleet_registry::Result;

/// How long the store's time-bound records live.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    /// A machine's presence and unit states outlive its last keepalive by this (`agent_ttl`).
    pub agent_ttl: Duration,
    /// The engine leadership outlives the leader's last renewal by this
    /// (5 × `engine_reconcile_interval`, as the original).
    pub engine_lease_ttl: Duration,
}

/// How many batch transactions of unit writes one fleetd keeps in flight. With one, etcd
/// waited between them while fleetd read the answer and planned the next (100,000 units took
/// 22.5 s to submit; with two, 18.7–21.9 s). Four made etcd fall behind until machine leases
/// expired (docs/benchmark-history.md).
const UNIT_BATCHES_IN_FLIGHT: usize = 2;

/// Where the cluster's cache keeps the units among its ranges (`seen` is per range).
const ENGINE_UNITS_RANGE: usize = 0;

/// The unit records the engine's last snapshot saw, by key, for the counts of units per
/// content; and the number of that snapshot.
#[derive(Default)]
struct SeenRecords {
    pass: u64,
    by_key: HashMap<String, SeenRecord>,
    /// How many of those records have each content, for the collection of unused bodies.
    contents: body_collection::ContentCounts,
}

/// A unit record a snapshot saw: the cluster cache's own decoded record (shared with the
/// API's reads of it, never decoded twice), at the mod revision it was seen at.
struct SeenRecord {
    mod_revision: i64,
    record: Arc<fleet_registry::UnitRecord>,
    /// The snapshot that last saw the record: one that no snapshot saw is gone.
    seen: u64,
}

#[derive(Clone)]
pub struct EtcdRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    keys: Keys,
    lease_file: Option<std::path::PathBuf>,
    agent_lease_file: Option<std::path::PathBuf>,
    lifetimes: Lifetimes,
    /// Every watch-fed cache of this fleetd, one per key range set (`caches.rs`).
    caches: Caches,
    /// The leader key's, which every engine follows from its first look.
    leader_cache: OnceLock<Held>,
    /// The sources', their statuses' and rollouts', for the change signal the engine leader's
    /// syncer and rollout driver wake on; held from first use.
    sources_cache: OnceLock<Held>,
    /// Per prefix of journal questions followed here (a machine's own, or every machine's on
    /// a manager answering for its pull agents).
    question_caches: Mutex<HashMap<String, Held>>,
    sources_signal: watch::Sender<u64>,
    /// The event log's cache, held from its first read; its changes move `events_signal`.
    events_cache: OnceLock<Held>,
    events_signal: watch::Sender<u64>,
    /// The engine's hold on the cluster's cache while it leads (`cluster_cache.rs`): a
    /// standby (every fleetd that may lead) follows the leader key only.
    engine_hold: Mutex<Option<Held>>,
    /// Whether the engine leads (holds the cluster's cache), so that its changes wake it.
    engine_leads: Arc<AtomicBool>,
    /// Moves on every change of the leader key, and of the engine's ranges while it leads.
    engine_signal: watch::Sender<u64>,
    /// The unit records the engine's last snapshot saw in the cluster's cache, by key.
    engine_records: Mutex<SeenRecords>,
    /// Moves on every change the cluster's cache sees.
    api_signal: watch::Sender<u64>,
    /// How long the cluster's cache stays after an API read.
    api_copy_idle: Duration,
    /// How much history the engine leader keeps when it compacts.
    kept_history: Duration,
    checkpoint: compaction::Checkpoint,
    /// Each machine's work, held from its agent's first look.
    work_caches: Mutex<HashMap<String, Held>>,
    /// With `serve_many_machines`: every machine's work in one cache, and a wake-up signal per
    /// machine fed by that cache's changes.
    serve_many_machines: bool,
    all_work_cache: OnceLock<Held>,
    work_signals: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
    /// Per machine: moves when etcd says its lease expired.
    lapse_signals: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Per machine: the count of lapses its agent has handled (stopped its units for).
    lapse_acks: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Per machine: the lapse signalled before a fresh presence claim, which the claim waits
    /// for the agent to have handled.
    claim_lapses: Mutex<HashMap<String, u64>>,
    sessions: Mutex<HashMap<String, Arc<session::MachineSession>>>,
    /// The one lease every pull agent's presence this fleetd holds as a manager hangs on.
    agent_lease: agent_lease::AgentLease,
    /// Joins with registration tokens waiting to be written together.
    join_batches: written_together::WrittenTogether<join_batches::JoinRequest, join_batches::JoinOutcome>,
    /// This process's writer ID: in the uses it counts of tokens without a use limit, and in
    /// the keys of the event batches it writes.
    join_writer: String,
    /// Pull agents' state reports waiting to be written together.
    state_batches: written_together::WrittenTogether<agent::StatesWrite, ()>,
    /// Machines' identities waiting to be written together (pull agents' first announcements).
    identity_batches: written_together::WrittenTogether<(String, Vec<u8>), ()>,
    /// Pull agents' presences waiting to be taken over together.
    presence_batches: written_together::WrittenTogether<fleet_core::MachineState, ()>,
    /// Per machine, the lease of a presence claim that got no answer: it may have landed, and
    /// the next attempt takes it over instead of finding the machine "in use" by itself.
    unconfirmed_claims: Mutex<HashMap<String, i64>>,
    leadership: tokio::sync::Mutex<Option<leadership::Leadership>>,
    /// At most [`UNIT_BATCHES_IN_FLIGHT`] batch transactions of unit writes in flight,
    /// however many batches the API is given: etcd that falls behind on writes lets leases
    /// expire.
    unit_batches: tokio::sync::Semaphore,
    /// How many past versions a unit keeps (`ApiRegistry::keep_versions`).
    versions_kept: std::sync::atomic::AtomicUsize,
    /// What holds those batches while etcd is far behind in applying.
    apply_lag: apply_lag::ApplyLagGate,
    /// Moves when the engine's snapshot finds bodies to collect (see [`chores`]).
    chores_signal: watch::Sender<u64>,
    /// A compare on a job record lost since the last read that feeds a write (`job_records.rs`).
    job_compare_lost: AtomicBool,
}

impl EtcdRegistry {
    /// Connects to etcd. The connection is lazy: an etcd that is down is reached when it
    /// returns (except with a user name, whose token etcd must hand out now).
    pub async fn connect(options: &EtcdOptions, lifetimes: Lifetimes) -> Result<Self> {
        let connection = Connection::connect(options).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection,
                keys: Keys::new(&options.key_prefix),
                lease_file: options.lease_file.clone(),
                agent_lease_file: options.agent_lease_file.clone(),
                lifetimes,
                caches: Caches::default(),
                leader_cache: OnceLock::new(),
                sources_cache: OnceLock::new(),
                question_caches: Mutex::new(HashMap::new()),
                sources_signal: watch::channel(0).0,
                events_cache: OnceLock::new(),
                events_signal: watch::channel(0).0,
                engine_hold: Mutex::default(),
                engine_leads: Arc::default(),
                engine_signal: watch::channel(0).0,
                engine_records: Mutex::new(SeenRecords::default()),
                api_signal: watch::channel(0).0,
                api_copy_idle: options.api_copy_idle.unwrap_or(api_copy::IDLE),
                kept_history: options.kept_history.unwrap_or(compaction::KEPT_HISTORY),
                checkpoint: compaction::Checkpoint::default(),
                work_caches: Mutex::new(HashMap::new()),
                serve_many_machines: options.serve_many_machines,
                all_work_cache: OnceLock::new(),
                work_signals: Arc::new(Mutex::new(HashMap::new())),
                lapse_signals: Mutex::new(HashMap::new()),
                lapse_acks: Mutex::new(HashMap::new()),
                claim_lapses: Mutex::new(HashMap::new()),
                sessions: Mutex::new(HashMap::new()),
                agent_lease: agent_lease::AgentLease::default(),
                join_batches: Default::default(),
                join_writer: registration_uses::new_writer(),
                state_batches: Default::default(),
                presence_batches: Default::default(),
                identity_batches: Default::default(),
                unconfirmed_claims: Mutex::new(HashMap::new()),
                leadership: tokio::sync::Mutex::new(None),
                unit_batches: tokio::sync::Semaphore::new(UNIT_BATCHES_IN_FLIGHT),
                versions_kept: std::sync::atomic::AtomicUsize::new(fleet_core::unit_history::DEFAULT_KEPT),
                apply_lag: apply_lag::ApplyLagGate::default(),
                chores_signal: watch::channel(0).0,
                job_compare_lost: AtomicBool::new(false),
            }),
        })
    }

    fn connection(&self) -> &Connection {
        &self.inner.connection
    }

    fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// Writes something that is not a unit record as `name`'s record (for the contract test
    /// of unreadable records).
    #[cfg(test)]
    pub(crate) async fn corrupt_unit_record(&self, name: &str) {
        let corrupt = etcd_client::TxnOp::put(self.keys().unit(name), "{not json", None);
        self.connection().txn(etcd_client::Txn::new().and_then([corrupt])).await.expect("a put");
    }

    /// Holds `cache` for the life of this fleetd (in `slot`), started with `start`.
    fn held_for_good<'a>(&self, slot: &'a OnceLock<Held>, cache: Cache, start: impl FnOnce() -> Mirror) -> &'a Held {
        slot.get_or_init(|| self.inner.caches.hold(cache, Duration::ZERO, start))
    }

    /// The leader key's cache, which every engine follows.
    fn leader_mirror(&self) -> &Mirror {
        self.held_for_good(&self.inner.leader_cache, Cache::Leader, || {
            let ranges = vec![KeyRange::single(self.keys().leader())];
            Mirror::signalling(self.connection().clone(), ranges, self.inner.engine_signal.clone())
        })
    }

    /// The cache of sources, their statuses and rollouts, whose changes move
    /// `sources_signal`.
    fn sources_mirror(&self) -> &Mirror {
        self.held_for_good(&self.inner.sources_cache, Cache::Sources, || {
            let keys = self.keys();
            let ranges = vec![
                KeyRange::prefix(keys.sources()),
                KeyRange::prefix(keys.source_statuses()),
                KeyRange::prefix(keys.rollouts()),
            ];
            Mirror::signalling(self.connection().clone(), ranges, self.inner.sources_signal.clone())
        })
    }

    /// The cache `machine_id`'s work is read from: one for all machines when serving many,
    /// else one of its own (its schedule, the global units, its presence and its metadata).
    fn work_mirror(&self, machine_id: &str) -> Arc<Mirror> {
        if !self.inner.serve_many_machines {
            return self.machine_mirror(machine_id);
        }
        let held = self.held_for_good(&self.inner.all_work_cache, Cache::AllWork, || {
            let keys = self.keys().clone();
            let ranges = vec![
                KeyRange::prefix(keys.all_schedules()),
                KeyRange::prefix(keys.all_required_places()),
                KeyRange::prefix(keys.globals()),
                KeyRange::prefix(keys.run_tickets()),
                KeyRange::prefix(keys.machines()),
                KeyRange::prefix(keys.all_metadata()),
            ];
            let signals = self.inner.work_signals.clone();
            let observer: mirror::Observer = Arc::new(move |changed| {
                let signals = signals.locked();
                let bump = |sender: &watch::Sender<u64>| sender.send_modify(|revision| *revision += 1);
                match changed {
                    mirror::Changed::Everything => signals.values().for_each(bump),
                    mirror::Changed::Key(key) | mirror::Changed::Rewritten(key) => match keys.work_touched_by(key) {
                        keys::WorkTouched::Machine(id) => signals.get(id).into_iter().for_each(bump),
                        keys::WorkTouched::Everyone => signals.values().for_each(bump),
                        keys::WorkTouched::Nobody => {}
                    },
                }
            });
            Mirror::observed(self.connection().clone(), ranges, Some(observer))
        });
        held.shared().clone()
    }

    /// Wakes `machine_id`'s agent without a change to its copy: what it may read changed
    /// (its presence lapsed, or it registered again).
    fn wake_agent(&self, machine_id: &str) {
        if !self.inner.serve_many_machines {
            self.machine_mirror(machine_id).poke();
            return;
        }
        let signals = self.inner.work_signals.locked();
        if let Some(signal) = signals.get(machine_id) {
            signal.send_modify(|revision| *revision += 1);
        }
    }

    /// `machine_id`'s lapse signal (see [`fleet_registry::AgentRegistry::presence_lapses`]).
    pub(crate) fn lapse_signal(&self, machine_id: &str) -> watch::Sender<u64> {
        let mut signals = self.inner.lapse_signals.locked();
        signals.entry(machine_id.to_string()).or_insert_with(|| watch::channel(0).0).clone()
    }

    /// How many of `machine_id`'s lapses its agent has handled.
    pub(crate) fn lapse_ack(&self, machine_id: &str) -> watch::Sender<u64> {
        let mut acks = self.inner.lapse_acks.locked();
        acks.entry(machine_id.to_string()).or_insert_with(|| watch::channel(0).0).clone()
    }

    /// Moves when `machine_id`'s work may have changed.
    fn work_changes(&self, machine_id: &str) -> fleet_registry::ChangeSignal {
        if !self.inner.serve_many_machines {
            return self.machine_mirror(machine_id).changes();
        }
        self.work_mirror(machine_id);
        let mut signals = self.inner.work_signals.locked();
        signals.entry(machine_id.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    fn machine_mirror(&self, machine_id: &str) -> Arc<Mirror> {
        let mut held = self.inner.work_caches.locked();
        let held = held.entry(machine_id.to_string()).or_insert_with(|| {
            self.inner.caches.hold(Cache::Work(machine_id.to_string()), Duration::ZERO, || {
                let keys = self.keys();
                let ranges = vec![
                    KeyRange::prefix(keys.schedule(machine_id)),
                    KeyRange::prefix(keys.required_places(machine_id)),
                    KeyRange::prefix(keys.globals()),
                    KeyRange::prefix(keys.run_tickets()),
                    KeyRange::single(keys.machine(machine_id)),
                    KeyRange::single(keys.metadata(machine_id)),
                ];
                // Listed once read: its agent reads it only once the machine registered.
                Mirror::when_read(self.connection().clone(), ranges)
            })
        });
        held.shared().clone()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod contract_tests;

#[cfg(test)]
mod idle_connection_tests;
#[cfg(test)]
mod late_writes_tests;
