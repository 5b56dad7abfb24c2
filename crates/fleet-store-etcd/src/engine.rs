//! The engine's facet of the etcd store: leadership through a lease-backed key, a snapshot
//! from the watch-fed copy, and schedule writes batched into transactions fenced by the
//! leader key's create revision, so a deposed leader cannot write.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use fleet_core::job::global_runs::RunTicket;
use fleet_core::job::runs::JobRecord;
use fleet_core::schedule::Decision;
use fleet_core::{MachineState, UnitFile, UnitHash};

use super::caches::CATCH_UP;
use super::connection::{MAX_TXN_OPS, NESTED_PER_TXN};
use super::job_records::ReadFor;
use super::keys::KeyRange;
use super::leadership::Leadership;
use super::mirror::MirrorData;
use super::records::{Assignment, CarryingAssignment};
use super::session::grant_lease;
use super::{ENGINE_UNITS_RANGE, EtcdRegistry, SeenRecord, SeenRecords};
use fleet_registry::apply_rule::{Condition, ReasonWrite, UnitWrite, grouped_by_machine, unit_writes};
use fleet_registry::codec::{Options, decode_listed, encode, machine_from_records};
use fleet_registry::{
    ChangeSignal, EngineLease, EngineRegistry, EngineSnapshot, RegistryError, Result, SilentDeparture, SnapshotUnit,
    StoredJob, UnitRecord,
};

/// How many of the engine's schedule transactions are in flight at once.
const TXNS_IN_FLIGHT: usize = 4;

/// The live machines of a copy that holds machines and metadata, in ID order.
pub(super) fn machines_in(registry: &EtcdRegistry, data: &MirrorData) -> Result<Vec<MachineState>> {
    let keys = registry.keys();
    let machines = keys.machines();
    let machine_range = KeyRange::prefix(machines.clone());
    let mut result = Vec::new();
    for (key, entry) in data.range(&machine_range) {
        let Some(id) = keys.name_in(&machines, key) else { continue };
        result.extend(machine_in(registry, data, id, key, entry));
    }
    Ok(result)
}

/// The machine `id` whose presence is `entry` (at `key`) in a copy that holds machines,
/// metadata and drains, with its metadata overrides and drain; `None` when its record cannot
/// be read.
pub(super) fn machine_in(
    registry: &EtcdRegistry,
    data: &MirrorData,
    id: &str,
    key: &str,
    entry: &super::mirror::Entry,
) -> Option<MachineState> {
    let (metadata_key, drain_key) = (registry.keys().metadata(id), registry.keys().drain(id));
    let record = |key: &str| data.entries.get(key).map(|entry| entry.value.as_slice());
    let overrides = record(&metadata_key).map(|bytes| (metadata_key.as_str(), bytes));
    let drain = record(&drain_key).map(|bytes| (drain_key.as_str(), bytes));
    machine_from_records(key, &entry.value, overrides, drain)
}

impl EtcdRegistry {
    /// One unit's write as one nested transaction: the apply rule's conditions become its
    /// compares, so a unit that changed meanwhile is skipped without holding back the rest.
    /// A landing unit carries `carried` (a body and its hash) when its content is that.
    fn unit_txn(&self, data: &MirrorData, write: &UnitWrite, carried: Option<(UnitHash, &UnitFile)>) -> Option<TxnOp> {
        let keys = self.keys();
        let unit = write.unit.as_str();
        let (unit_key, placement_key) = (keys.unit(unit), keys.placement(unit));
        let compares = write
            .conditions()
            .into_iter()
            .map(|condition| match condition {
                Condition::UnitUnchanged => data
                    .entries
                    .get(&unit_key)
                    .map(|entry| Compare::mod_revision(unit_key.as_str(), CompareOp::Equal, entry.mod_revision)),
                Condition::UnitExists => Some(Compare::version(unit_key.as_str(), CompareOp::Greater, 0)),
                Condition::PlacedOn(machine) => {
                    Some(Compare::value(placement_key.as_str(), CompareOp::Equal, machine.as_str()))
                }
                Condition::Unplaced => Some(Compare::version(placement_key.as_str(), CompareOp::Equal, 0)),
                Condition::MachineAbsent(machine) => {
                    Some(Compare::version(keys.machine(&machine), CompareOp::Equal, 0))
                }
            })
            .collect::<Option<Vec<Compare>>>()?;
        let mut ops = Vec::new();
        if let Some(leaving) = &write.leaves {
            ops.push(TxnOp::delete(keys.scheduled(&leaving.machine, unit), None));
            if write.lands_on.is_none() {
                ops.push(TxnOp::delete(placement_key.as_str(), None));
            }
        }
        if let Some(machine) = &write.lands_on {
            let record = data.entries.get(&unit_key)?.decoded::<UnitRecord>(&unit_key).ok()?;
            let places_key = keys.required_place(machine, unit);
            let places_at = data.entries.get(&places_key).map(|entry| entry.mod_revision);
            let assignment = Assignment { places_at, ..Assignment::of(&record) };
            let value = match carried.filter(|(hash, _)| *hash == record.hash) {
                Some((_, file)) => encode(&CarryingAssignment { assignment: &assignment, body: file.options() }),
                None => encode(&assignment),
            };
            ops.push(TxnOp::put(placement_key.as_str(), machine.as_str(), None));
            ops.push(TxnOp::put(keys.scheduled(machine, unit), value, None));
        }
        match &write.reason {
            ReasonWrite::Set(reason) => ops.push(TxnOp::put(keys.reason(unit), reason.as_str(), None)),
            ReasonWrite::Clear => ops.push(TxnOp::delete(keys.reason(unit), None)),
            ReasonWrite::Keep => {}
        }
        Some(TxnOp::txn(Txn::new().when(compares).and_then(ops)))
    }

    /// The compare every write of the leading engine is fenced by: the leader key still the
    /// one `lease` created, so a deposed leader cannot write.
    pub(super) fn leader_fence(&self, lease: &EngineLease) -> Compare {
        Compare::create_revision(self.keys().leader(), CompareOp::Equal, lease.token as i64)
    }

    /// Ends the leadership if etcd said its lease is gone (its keeper renews it meanwhile; a
    /// lease that merely went unrenewed is left to the fence).
    pub(super) async fn check_leadership(&self, lease: &EngineLease) -> Result<()> {
        let mut leadership = self.inner.leadership.lock().await;
        let Some(held) = leadership.as_ref().filter(|held| held.token as u64 == lease.token) else {
            return Err(RegistryError::LeadershipLost);
        };
        held.clock.came_by();
        if held.clock.gone() {
            tracing::warn!("engine lease expired while applying a plan");
            *leadership = None;
            return Err(RegistryError::LeadershipLost);
        }
        Ok(())
    }

    /// Whether the copy that follows the leader key shows it created by someone else than this
    /// fleetd's leadership of `token` (the key's absence proves nothing: a copy may not show
    /// the key just created yet).
    fn leader_key_held_by_another(&self, token: i64) -> bool {
        let data = self.leader_mirror().read();
        data.synced && data.entries.get(&self.keys().leader()).is_some_and(|entry| entry.create_revision != token)
    }

    /// The landing units that are the first of their content on their machine, with that
    /// content's hash: each carries its body ([`CarryingAssignment`]). A machine holds the
    /// content of every unit the copy places on it, and of those landing before it.
    fn first_of_their_content(&self, data: &MirrorData, writes: &[UnitWrite]) -> HashMap<String, UnitHash> {
        let landing: HashSet<&str> = writes.iter().filter_map(|write| write.lands_on.as_deref()).collect();
        if landing.is_empty() {
            return HashMap::new();
        }
        let keys = self.keys();
        let hash_of = |unit: &str| {
            let key = keys.unit(unit);
            data.entries.get(&key)?.decoded_listed::<UnitRecord>(&key).map(|record| record.hash)
        };
        let placements = keys.placements();
        let mut held: HashMap<&str, HashSet<UnitHash>> = HashMap::new();
        for (key, entry) in data.range(&KeyRange::prefix(placements.clone())) {
            let Some(machine) = std::str::from_utf8(&entry.value).ok().and_then(|machine| landing.get(machine)) else {
                continue;
            };
            if let Some(hash) = keys.name_in(&placements, key).and_then(hash_of) {
                held.entry(machine).or_default().insert(hash);
            }
        }
        let mut carriers = HashMap::new();
        for write in writes {
            let Some(machine) = write.lands_on.as_deref() else { continue };
            if let Some(hash) = hash_of(&write.unit)
                && held.entry(machine).or_default().insert(hash)
            {
                carriers.insert(write.unit.clone(), hash);
            }
        }
        carriers
    }

    /// The bodies `carriers` carry, in one read; none when they cannot be read (the machines
    /// then read them themselves).
    async fn bodies_to_carry(&self, carriers: &HashMap<String, UnitHash>) -> HashMap<UnitHash, UnitFile> {
        let mut hashes: Vec<UnitHash> = carriers.values().copied().collect();
        hashes.sort_unstable();
        hashes.dedup();
        if hashes.is_empty() {
            return HashMap::new();
        }
        self.read_bodies(&hashes).await.unwrap_or_else(|error| {
            tracing::debug!(%error, "cannot read the bodies to carry: the machines read them themselves");
            HashMap::new()
        })
    }

    /// The reasons the cluster's cache holds now, by unit.
    fn stored_reasons(&self, data: &MirrorData) -> Vec<(String, String)> {
        let keys = self.keys();
        let reasons = keys.reasons();
        data.range(&KeyRange::prefix(reasons.clone()))
            .filter_map(|(key, entry)| {
                let unit = keys.name_in(&reasons, key)?;
                Some((unit.to_string(), String::from_utf8_lossy(&entry.value).into_owned()))
            })
            .collect()
    }
}

/// The highest revision at which any nested transaction in `reply` wrote.
fn written_revision(reply: &etcd_client::TxnResponse) -> Option<i64> {
    let wrote = reply.op_responses().iter().any(|op| matches!(op, TxnOpResponse::Txn(inner) if inner.succeeded()));
    wrote.then(|| reply.header().map_or(0, |header| header.revision()))
}

#[async_trait]
impl EngineRegistry for EtcdRegistry {
    async fn acquire_leadership(&self, machine_id: &str) -> Result<Option<EngineLease>> {
        let mut leadership = self.inner.leadership.lock().await;
        let lease_of = |held: &Leadership| EngineLease { machine_id: machine_id.to_string(), token: held.token as u64 };
        if let Some(held) = leadership.as_ref() {
            held.clock.came_by();
            if !held.clock.gone() && !self.leader_key_held_by_another(held.token) {
                if held.clock.lives() {
                    return Ok(Some(lease_of(held)));
                }
                // etcd 3.4 refuses every renewal while it is more than a second behind in
                // applying what it committed (a storm of registrations or of unit writes can
                // do that for seconds on end), and a store that is away refuses everything:
                // the leader leads on while its lease lives by its clock, its writes fenced by
                // its key. Past that the pass fails, and its keeper goes on trying until etcd
                // answers.
                tracing::debug!(last_renewed_ago = ?held.clock.since_renewed(), "engine lease not renewed within its life");
                return Err(RegistryError::Unavailable(
                    "etcd: the engine lease was not renewed within its life".into(),
                ));
            }
            tracing::warn!(last_renewed_ago = ?held.clock.since_renewed(), "engine lease expired");
            *leadership = None;
        }
        let leader_key = self.keys().leader();
        {
            let data = self.leader_mirror().read();
            if data.synced && data.entries.contains_key(&leader_key) {
                self.drop_engine_mirror();
                return Ok(None);
            }
        }
        // etcd counts the lease's life from when it received the grant: from when it was sent.
        let sent = tokio::time::Instant::now();
        let granted = grant_lease(self.connection(), self.inner.lifetimes.engine_lease_ttl).await?;
        let lease = granted.id;
        let txn = Txn::new()
            .when([Compare::create_revision(leader_key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(leader_key.as_str(), machine_id, Some(PutOptions::new().with_lease(lease)))]);
        let reply = self.connection().txn(txn).await?;
        if !reply.succeeded() {
            let _ = super::session::revoke(self.connection(), lease).await;
            self.drop_engine_mirror();
            return Ok(None);
        }
        let token = reply.header().map_or(0, |header| header.revision());
        let held = Leadership::hold(self.connection().clone(), lease, token, granted.ttl, sent);
        let granted = lease_of(&held);
        *leadership = Some(held);
        // The new leader lists the cluster now; its first snapshot waits for that listing.
        self.engine_mirror();
        Ok(Some(granted))
    }

    async fn release_leadership(&self, lease: &EngineLease) -> Result<()> {
        let mut leadership = self.inner.leadership.lock().await;
        if let Some(held) = leadership.take() {
            if held.token as u64 != lease.token {
                *leadership = Some(held);
                return Ok(());
            }
            self.drop_engine_mirror();
            super::session::revoke(self.connection(), held.lease).await?;
        }
        Ok(())
    }

    async fn snapshot(&self) -> Result<EngineSnapshot> {
        let mirror = self.engine_mirror();
        let data = mirror.listed(self.connection().timeout).await?;
        let keys = self.keys();
        let (units_prefix, placements) = (keys.units(), keys.placements());
        // Units and placements are both in name order: one walk over each, side by side.
        let placement_range = KeyRange::prefix(placements.clone());
        let mut placed = data
            .range(&placement_range)
            .filter_map(|(key, entry)| Some((keys.name_in(&placements, key)?, entry)))
            .peekable();
        let mut units = Vec::new();
        let unit_range = KeyRange::prefix(units_prefix.clone());
        // Each record is decoded once per version, by whichever reader of the cache asks first;
        // the counts of units per content move only for what changed since the last pass.
        let mut seen = self.inner.engine_records.locked();
        seen.pass = seen.pass.wrapping_add(1);
        let pass = seen.pass;
        for (key, entry) in data.range(&unit_range) {
            let Some(name) = keys.name_in(&units_prefix, key) else { continue };
            let Some(record) = entry.decoded_listed::<UnitRecord>(key) else { continue };
            match seen.by_key.get_mut(key.as_str()) {
                Some(counted) if counted.mod_revision == entry.mod_revision => counted.seen = pass,
                _ => {
                    record.contents().into_iter().for_each(|hash| seen.contents.add(hash));
                    let counted = SeenRecord { mod_revision: entry.mod_revision, record: record.clone(), seen: pass };
                    if let Some(replaced) = seen.by_key.insert(key.clone(), counted) {
                        replaced.record.contents().into_iter().for_each(|hash| seen.contents.remove(hash));
                    }
                }
            }
            while placed.next_if(|(placed_name, _)| *placed_name < name).is_some() {}
            let machine_id = placed
                .next_if(|(placed_name, _)| *placed_name == name)
                .map(|(_, entry)| String::from_utf8_lossy(&entry.value).into_owned());
            units.push(SnapshotUnit { name: name.to_string(), hash: record.hash, desired: record.desired, machine_id });
        }
        let SeenRecords { by_key, contents, .. } = &mut *seen;
        by_key.retain(|_, counted| {
            let current = counted.seen == pass;
            if !current {
                counted.record.contents().into_iter().for_each(|hash| contents.remove(hash));
            }
            current
        });
        contents.counted_up_to(data.seen.get(ENGINE_UNITS_RANGE).copied().unwrap_or(0));
        let bodies_to_collect = contents.has_work();
        drop(seen);
        if bodies_to_collect {
            self.inner.chores_signal.send_modify(|moves| *moves = moves.wrapping_add(1));
        }
        Ok(EngineSnapshot { revision: data.generation, machines: machines_in(self, &data)?, units })
    }

    async fn snapshot_revision(&self) -> Result<Option<u64>> {
        Ok(Some(self.engine_mirror().listed(self.connection().timeout).await?.generation))
    }

    async fn unit_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        self.read_bodies(hashes).await
    }

    /// From the cluster's cache, which holds every machine's states: asked for the runs the
    /// engine follows, while a unit waits to leave a machine, and when an engine takes over
    /// with units unplaced.
    async fn reported_states(&self, units: &BTreeSet<String>) -> Result<Vec<std::sync::Arc<fleet_core::UnitState>>> {
        if units.is_empty() {
            return Ok(Vec::new());
        }
        fleet_registry::ApiRegistry::states_of_units(self, units).await
    }

    /// From the cluster's cache once it holds this engine's writes; from etcd after a compare
    /// lost (`job_records.rs`).
    async fn job_records(&self) -> Result<Vec<StoredJob>> {
        self.stored_jobs(&self.engine_mirror(), ReadFor::Writing).await
    }

    async fn run_tickets(&self) -> Result<BTreeMap<String, RunTicket>> {
        self.stored_tickets(&self.engine_mirror()).await
    }

    /// Fenced by the leader key; writing the same ticket again is harmless (a machine runs a
    /// ticket once).
    async fn put_run_ticket(&self, lease: &EngineLease, unit: &str, ticket: Option<&RunTicket>) -> Result<()> {
        self.check_leadership(lease).await?;
        let key = self.keys().run_ticket(unit);
        let write = match ticket {
            Some(ticket) => TxnOp::put(key.as_str(), encode(ticket), None),
            None => TxnOp::delete(key.as_str(), None),
        };
        let reply = self.connection().txn(Txn::new().when([self.leader_fence(lease)]).and_then([write])).await?;
        if !reply.succeeded() {
            *self.inner.leadership.lock().await = None;
            return Err(RegistryError::LeadershipLost);
        }
        self.api_wrote(&reply, &[key]);
        Ok(())
    }

    /// Fenced by the leader key, then the record's own revision compared (0: absent), so a
    /// lost answer is read back rather than written twice.
    async fn put_job_record(
        &self,
        lease: &EngineLease,
        unit: &str,
        record: Option<&JobRecord>,
        version: u64,
    ) -> Result<bool> {
        self.check_leadership(lease).await?;
        let (key, guarded) = self.job_write(unit, record, version);
        let reply =
            self.connection().txn(Txn::new().when([self.leader_fence(lease)]).and_then([TxnOp::txn(guarded)])).await?;
        if !reply.succeeded() {
            *self.inner.leadership.lock().await = None;
            return Err(RegistryError::LeadershipLost);
        }
        let revision = reply.header().map(|header| header.revision());
        Ok(
            matches!(reply.op_responses().first(), Some(TxnOpResponse::Txn(inner)) if self.job_written(&key, revision, inner)),
        )
    }

    async fn apply(&self, lease: &EngineLease, decisions: &[Decision], unplaced: &[(String, String)]) -> Result<()> {
        let mirror = self.engine_mirror();
        let (writes, carriers) = {
            let data = mirror.listed(self.connection().timeout).await?;
            let stored = self.stored_reasons(&data);
            let writes = grouped_by_machine(unit_writes(
                decisions,
                unplaced,
                stored.iter().map(|(unit, reason)| (unit.as_str(), reason.as_str())),
            ));
            let carriers = self.first_of_their_content(&data, &writes);
            (writes, carriers)
        };
        let bodies = self.bodies_to_carry(&carriers).await;
        let unit_txns: Vec<TxnOp> = {
            let data = mirror.synced()?;
            writes
                .iter()
                .filter_map(|write| {
                    let carried = carriers.get(&write.unit).and_then(|hash| Some((*hash, bodies.get(hash)?)));
                    self.unit_txn(&data, write, carried)
                })
                .collect()
        };
        let fence = self.leader_fence(lease);
        // Units are independent of each other, so their transactions go a few at a time:
        // etcd commits concurrent ones together.
        let mut batches =
            unit_txns.chunks(NESTED_PER_TXN).map(|batch| Txn::new().when([fence.clone()]).and_then(batch.to_vec()));
        let mut running = tokio::task::JoinSet::new();
        let mut last_write: Option<i64> = None;
        loop {
            self.check_leadership(lease).await?;
            while running.len() < TXNS_IN_FLIGHT
                && let Some(txn) = batches.next()
            {
                let connection = self.connection().clone();
                running.spawn(async move { connection.big_txn(txn).await });
            }
            let Some(joined) = running.join_next().await else { break };
            let reply =
                joined.map_err(|error| RegistryError::Unavailable(format!("etcd: a write task failed: {error}")))??;
            if !reply.succeeded() {
                *self.inner.leadership.lock().await = None;
                return Err(RegistryError::LeadershipLost);
            }
            last_write = last_write.max(written_revision(&reply));
        }
        if let Some(revision) = last_write
            && !mirror.wait_for(revision, CATCH_UP).await
        {
            tracing::debug!(revision, "the engine's watch has not caught up with its own writes yet");
        }
        Ok(())
    }

    async fn recorded_required_places(&self) -> Result<Vec<fleet_registry::RequiredPlaces>> {
        self.leader_records(&self.keys().all_required_places()).await
    }

    async fn record_required_places(
        &self,
        lease: &EngineLease,
        places: &[fleet_registry::RequiredPlaces],
    ) -> Result<()> {
        let keys = self.keys();
        let wanted = places.iter().map(|record| (keys.required_place(&record.machine, &record.unit), record)).collect();
        self.replace_leader_records(lease, &keys.all_required_places(), wanted).await
    }

    async fn recorded_out_of_touch(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        self.leader_records(&self.keys().all_out_of_touch()).await
    }

    async fn record_out_of_touch(&self, lease: &EngineLease, machines: &[fleet_core::OutOfTouch]) -> Result<()> {
        let keys = self.keys();
        let wanted = machines.iter().map(|machine| (keys.out_of_touch(&machine.id), machine)).collect();
        self.replace_leader_records(lease, &keys.all_out_of_touch(), wanted).await
    }

    async fn recorded_silent_departures(&self) -> Result<Vec<SilentDeparture>> {
        self.leader_records(&self.keys().all_silent_departures()).await
    }

    async fn record_silent_departures(&self, lease: &EngineLease, departures: &[SilentDeparture]) -> Result<()> {
        let keys = self.keys();
        let wanted = departures.iter().map(|departure| (keys.silent_departure(&departure.unit), departure)).collect();
        self.replace_leader_records(lease, &keys.all_silent_departures(), wanted).await
    }

    fn engine_changes(&self) -> ChangeSignal {
        self.leader_mirror();
        self.inner.engine_signal.subscribe()
    }

    fn state_changes(&self) -> ChangeSignal {
        self.inner.api_signal.subscribe()
    }
}

impl EtcdRegistry {
    /// The bodies of `hashes` the cluster's cache holds while it is up, and the hashes it
    /// does not hold (all of them while it does not run).
    fn copied_bodies(&self, hashes: &[UnitHash]) -> (HashMap<UnitHash, UnitFile>, Vec<UnitHash>) {
        let mut found = HashMap::new();
        let Some(copy) = self.cluster_cache_running() else { return (found, hashes.to_vec()) };
        let data = copy.read();
        if !data.synced || !data.streaming {
            return (found, hashes.to_vec());
        }
        let keys = self.keys();
        let mut unread = Vec::new();
        for hash in hashes {
            let key = keys.body(&hash.to_string());
            // Parsed once per revision of the body, however often it is asked for.
            match data.entries.get(&key).and_then(|entry| entry.decoded_listed::<Options>(&key)) {
                Some(options) => {
                    found.insert(*hash, UnitFile::from_options(options.as_ref().clone()));
                }
                None => unread.push(*hash),
            }
        }
        (found, unread)
    }

    /// The bodies of `hashes` that exist: from the cluster's cache where it holds them
    /// (a body is written with the units that name it, so a copy that shows a unit holds its
    /// body), the rest in one read of etcd (the whole collection when asked for more than a
    /// transaction holds).
    pub(super) async fn read_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        let (mut found, hashes) = self.copied_bodies(hashes);
        if hashes.is_empty() {
            return Ok(found);
        }
        let hashes = hashes.as_slice();
        let keys = self.keys();
        let mut bodies = Vec::new();
        if hashes.len() > MAX_TXN_OPS {
            let (_, replies) = self.connection().read(vec![super::connection::get_prefix(&keys.bodies())]).await?;
            bodies.extend(replies.into_iter().flat_map(|reply| reply.kvs().to_vec()));
        } else if !hashes.is_empty() {
            let gets = hashes.iter().map(|hash| TxnOp::get(keys.body(&hash.to_string()), None)).collect();
            let (_, replies) = self.connection().small_read(gets).await?;
            bodies.extend(replies.into_iter().flat_map(|reply| reply.kvs().to_vec()));
        }
        let bodies_prefix = keys.bodies();
        for kv in bodies {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(hash) = keys.name_in(&bodies_prefix, &key).and_then(UnitHash::parse_hex) else { continue };
            if (hashes.contains(&hash) || hashes.len() > MAX_TXN_OPS)
                && let Some(options) = decode_listed::<Options>(&key, kv.value())
            {
                found.insert(hash, UnitFile::from_options(options));
            }
        }
        Ok(found)
    }
}
