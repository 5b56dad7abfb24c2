//! The API's facet of the etcd store: list pages and, while it runs, single units from the
//! cluster's cache (`api_copy.rs`), other reads straight from etcd; writes as transactions
//! conditional on the revisions read, retried when another writer got there first.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetResponse, KeyValue, Txn, TxnOp};
use fleet_core::drain::Drain;
use fleet_core::secrets::SecretPins;
use fleet_core::{DesiredState, MachineId, MachineState, Requirements, UnitFile, UnitHash, UnitState};

use super::EtcdRegistry;
use super::job_records::ReadFor;
use super::records::{Assignment, CarryingAssignment};
use fleet_registry::codec::{MetadataOverrides, Options, decode, encode};
use fleet_registry::{
    ApiRegistry, ChangeSignal, MetadataChange, Page, PageRequest, Refused, RegistryError, Result, UnitChange,
    UnitChanged, UnitRecord, UnitView, Writer,
};

/// How often a conditional write is tried before giving up on a busy key.
const ATTEMPTS: usize = 10;

fn busy() -> RegistryError {
    RegistryError::Unavailable("etcd: the unit kept changing under concurrent writes; try again".to_string())
}

fn first(reply: &GetResponse) -> Option<&KeyValue> {
    reply.kvs().first()
}

fn text(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.value()).into_owned()
}

fn mod_revision(reply: &GetResponse) -> i64 {
    first(reply).map_or(0, KeyValue::mod_revision)
}

/// What a unit write starts from: the unit and where it is placed, with their revisions.
pub(super) struct Current {
    record: Option<UnitRecord>,
    pub(super) record_revision: i64,
    machine: Option<String>,
    placement_revision: i64,
    /// The revision at which it was seen so: a write that finds the unit absent is fenced by
    /// the destroys after it (`write_conditions`).
    seen_at: i64,
}

/// A transaction's operations with the key each one changes, so that the cluster's cache can wait
/// for exactly the changes the transaction made.
#[derive(Default)]
pub(super) struct Writes {
    pub ops: Vec<TxnOp>,
    pub keys: Vec<String>,
}

impl Writes {
    pub(super) fn put(&mut self, key: String, value: impl Into<Vec<u8>>) {
        self.ops.push(TxnOp::put(key.as_str(), value, None));
        self.keys.push(key);
    }

    fn delete(&mut self, key: String) {
        self.ops.push(TxnOp::delete(key.as_str(), None));
        self.keys.push(key);
    }

    /// A content-addressed body, written only where it is absent: a body once written never
    /// changes, so a unit taking up a content that has one costs etcd no put.
    pub fn put_body(&mut self, key: String, value: impl Into<Vec<u8>>) {
        self.ops.push(put_if_absent(&key, value));
        self.keys.push(key);
    }
}

/// A nested transaction that puts `value` at `key` only when no value is there.
pub(super) fn put_if_absent(key: &str, value: impl Into<Vec<u8>>) -> TxnOp {
    let absent = Compare::version(key, CompareOp::Equal, 0);
    TxnOp::txn(Txn::new().when([absent]).and_then([TxnOp::put(key, value, None)]))
}

/// What one attempt of an optimistic unit write found to do.
pub(super) enum Planned<T> {
    /// Write these operations (if the unit did not change meanwhile), then answer `T`.
    Write(Writes, T),
    /// Nothing to write: answer `T` at once.
    Done(T),
}

/// Runs `attempt` until it has written (`Some`), `ATTEMPTS` times at most: an optimistic
/// write that lost a race with another writer reads again and tries again.
async fn optimistically<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    for _ in 0..ATTEMPTS {
        if let Some(value) = attempt().await? {
            return Ok(value);
        }
    }
    Err(busy())
}

impl EtcdRegistry {
    /// One unit's optimistic write: `plan` sees the unit's record and placement as they are,
    /// and its operations are written only if neither changed meanwhile. The first attempt
    /// starts from the cluster's cache when it is up (no read: its revisions are checked by the
    /// write itself); an answer without a write is only given from a fresh read.
    async fn write_unit<T>(&self, name: &str, writer: &Writer, plan: impl Fn(&Current) -> Planned<T>) -> Result<T> {
        let guess = std::sync::Mutex::new(self.current_in_copy(name));
        optimistically(|| async {
            let guessed = guess.locked().take();
            let (current, guessed) = match guessed {
                Some(current) => (current, true),
                None => (self.current(name, writer).await?, false),
            };
            match plan(&current) {
                Planned::Done(_) if guessed => Ok(None),
                Planned::Done(value) => Ok(Some(value)),
                Planned::Write(writes, value) => {
                    let txn = Txn::new().when(self.write_conditions(name, writer, &current)).and_then(writes.ops);
                    let reply = self.connection().txn(txn).await?;
                    if reply.succeeded() {
                        self.api_wrote(&reply, &writes.keys);
                    }
                    Ok(reply.succeeded().then_some(value))
                }
            }
        })
        .await
    }

    /// How many past versions a unit keeps (`ApiRegistry::keep_versions`).
    fn versions_kept(&self) -> usize {
        self.inner.versions_kept.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The unit and its placement as the cluster's cache holds them, if the cache is up.
    pub(super) fn current_in_copy(&self, name: &str) -> Option<Current> {
        let mirror = self.api_copy_if_up(&super::caches::Cache::Cluster)?;
        let data = mirror.read();
        let keys = self.keys();
        let (unit_key, placement_key) = (keys.unit(name), keys.placement(name));
        let unit = data.entries.get(&unit_key);
        let placement = data.entries.get(&placement_key);
        Some(Current {
            record: match unit {
                Some(entry) => Some(decode(&unit_key, &entry.value).ok()?),
                None => None,
            },
            record_revision: unit.map_or(0, |entry| entry.mod_revision),
            machine: placement.map(|entry| String::from_utf8_lossy(&entry.value).into_owned()),
            placement_revision: placement.map_or(0, |entry| entry.mod_revision),
            seen_at: data.revision,
        })
    }

    /// The unit and its placement as etcd holds them now, read for a write by `writer`:
    /// `SourceRemoved` (in the same read) when `writer` is a source that no longer exists.
    async fn current(&self, name: &str, writer: &Writer) -> Result<Current> {
        let keys = self.keys();
        let (unit_key, placement_key) = (keys.unit(name), keys.placement(name));
        let mut gets = vec![TxnOp::get(unit_key.as_str(), None), TxnOp::get(placement_key.as_str(), None)];
        let source = match writer {
            Writer::Source { name, .. } => Some(name),
            Writer::Hand { .. } => None,
        };
        if let Some(source) = source {
            gets.push(TxnOp::get(keys.source(source), None));
        }
        let (seen_at, replies) = self.connection().read(gets).await?;
        let [unit, placement, source_record @ ..] = replies.as_slice() else {
            return Err(RegistryError::Unavailable("etcd: short reply".into()));
        };
        if let Some(source) = source
            && source_record.first().is_some_and(|record| first(record).is_none())
        {
            return Err(RegistryError::SourceRemoved { name: source.clone() });
        }
        Ok(Current {
            record: first(unit).map(|kv| decode(&unit_key, kv.value())).transpose()?,
            record_revision: mod_revision(unit),
            machine: first(placement).map(text),
            placement_revision: mod_revision(placement),
            seen_at,
        })
    }

    /// The conditions of a write of `name` by `writer` planned from `current`: the unit and
    /// its placement are as `current` holds them, and a source writing still exists (a sync
    /// under way when its source is removed writes nothing after).
    ///
    /// A unit seen absent is absent again after a destroy, so "absent" alone would let a
    /// create that etcd carries out late (its answer lost, its member stalled or cut off while
    /// it was on the way) bring back a unit destroyed since. So the write also asks that no
    /// unit of its `destroyed/` bucket was destroyed after the unit was seen absent.
    pub(super) fn write_conditions(&self, name: &str, writer: &Writer, current: &Current) -> Vec<Compare> {
        let keys = self.keys();
        let mut compares = vec![
            Compare::mod_revision(keys.unit(name), CompareOp::Equal, current.record_revision),
            Compare::mod_revision(keys.placement(name), CompareOp::Equal, current.placement_revision),
        ];
        if current.record_revision == 0 {
            compares.push(Compare::mod_revision(keys.destroyed(name), CompareOp::Less, current.seen_at + 1));
        }
        if let Writer::Source { name: source, .. } = writer {
            compares.push(Compare::version(keys.source(source), CompareOp::Greater, 0));
        }
        compares
    }

    /// The writes that tell the agents about `record`: the schedule entry of the machine it
    /// is placed on, and the global index. With the unit's `content` written, the global
    /// entry carries it, and the schedule entry when the content is new
    /// ([`CarryingAssignment`]): the machines have it from their own watch instead of reading it.
    fn agent_copies(
        &self,
        name: &str,
        record: &UnitRecord,
        current: &Current,
        writes: &mut Writes,
        content: Option<&UnitFile>,
    ) {
        let keys = self.keys();
        let encoded = |assignment: &Assignment, content: Option<&UnitFile>| match content {
            Some(file) => encode(&CarryingAssignment { assignment, body: file.options() }),
            None => encode(assignment),
        };
        if record.global {
            writes.put(keys.global(name), encoded(&Assignment::of(record), content));
        } else if current.record.as_ref().is_some_and(|old| old.global) {
            writes.delete(keys.global(name));
        }
        if let Some(machine) = &current.machine {
            // The machine holds the content it runs: only new content travels to it.
            let new_content = current.record.as_ref().is_none_or(|old| old.hash != record.hash);
            let assignment = Assignment { places_at: self.places_at(machine, name), ..Assignment::of(record) };
            writes.put(keys.scheduled(machine, name), encoded(&assignment, content.filter(|_| new_content)));
        }
    }

    /// The revision of the record of where `name`'s requirements run on `machine`, as the
    /// cluster's cache holds it where it runs: a rewrite of the placement names it as the
    /// engine's placement did (`Assignment::places_at`), so the agent does not read the one
    /// before the other. A cache behind etcd names an earlier revision of the record, which
    /// asks the agent's copy less, never more; with no cache running here, none is named.
    fn places_at(&self, machine: &str, name: &str) -> Option<i64> {
        let cache = self.cluster_cache_running()?;
        let data = cache.read();
        if !(data.synced && data.streaming) {
            return None;
        }
        data.entries.get(&self.keys().required_place(machine, name)).map(|entry| entry.mod_revision)
    }
}

impl EtcdRegistry {
    /// The secret pins of a unit (`CredentialRegistry::set_secret_pins`), written as any unit
    /// write is: over what was read, its machine's copy with it.
    pub(super) async fn set_pins(&self, name: &str, pins: &SecretPins) -> Result<bool> {
        self.write_unit(name, &Writer::BY_HAND, |current| self.plan_pins(name, pins, current))
            .await?
            .map_err(|refused| refused.into_error(name))
    }

    /// Removes a unit whose record cannot be read: every key named after it (its body, which
    /// the engine collects once no unit has it, is left to the engine).
    async fn destroy_unreadable_unit(&self, name: &str) -> Result<bool> {
        let keys = self.keys();
        let (_, replies) = self.connection().read(vec![TxnOp::get(keys.placement(name), None)]).await?;
        let mut ops = vec![
            TxnOp::put(keys.destroyed(name), name, None),
            TxnOp::delete(keys.unit(name), None),
            TxnOp::delete(keys.placement(name), None),
            TxnOp::delete(keys.reason(name), None),
            TxnOp::delete(keys.global(name), None),
        ];
        if let Some(machine) = replies.first().and_then(first).map(text) {
            ops.push(TxnOp::delete(keys.scheduled(&machine, name), None));
        }
        self.connection().txn(Txn::new().and_then(ops)).await?;
        Ok(true)
    }
}

/// A unit to store, with what its record needs computed once.
pub(super) struct UnitPut<'a> {
    pub name: &'a str,
    pub file: &'a UnitFile,
    pub hash: UnitHash,
    pub global: bool,
    pub desired: DesiredState,
}

impl<'a> UnitPut<'a> {
    pub fn new(name: &'a str, file: &'a UnitFile, desired: DesiredState) -> Self {
        Self { name, file, hash: file.hash(), global: Requirements::from_unit(name, file).global, desired }
    }
}

impl EtcdRegistry {
    /// What storing `put` over `current` writes, its body aside: the caller writes the body in
    /// the same transaction (once however many units share it), which is what keeps the
    /// engine from collecting a body a unit has just taken up (`body_collection`).
    pub(super) fn plan_put(
        &self,
        put: &UnitPut<'_>,
        writer: &Writer,
        current: &Current,
    ) -> Planned<std::result::Result<(), Refused>> {
        let (keys, name) = (self.keys(), put.name);
        let source = match owner_after(writer, name, current) {
            Ok(source) => source,
            Err(refused) => return Planned::Done(Err(refused)),
        };
        let record = UnitRecord {
            hash: put.hash,
            desired: put.desired,
            global: put.global,
            source,
            drift: writer.drift_policy(),
            // A rotation's pins hold across new content: the unit is still on its way.
            secrets: current.record.as_ref().map(|old| old.secrets.clone()).unwrap_or_default(),
            versions: UnitRecord::versions_after(
                current.record.as_ref(),
                put.hash,
                put.desired,
                writer,
                self.versions_kept(),
            ),
        };
        let mut writes = Writes::default();
        writes.put(keys.unit(name), encode(&record));
        self.agent_copies(name, &record, current, &mut writes, Some(put.file));
        Planned::Write(writes, Ok(()))
    }

    /// What setting the secret pins of the unit `current` holds writes; `false` when there is
    /// no unit. Nothing else of it changes, its owner included.
    pub(super) fn plan_pins(
        &self,
        name: &str,
        pins: &SecretPins,
        current: &Current,
    ) -> Planned<std::result::Result<bool, Refused>> {
        let Some(old) = &current.record else {
            return Planned::Done(Ok(false));
        };
        if old.secrets == *pins {
            return Planned::Done(Ok(true));
        }
        let record = UnitRecord { secrets: pins.clone(), ..old.clone() };
        let mut writes = Writes::default();
        writes.put(self.keys().unit(name), encode(&record));
        self.agent_copies(name, &record, current, &mut writes, None);
        Planned::Write(writes, Ok(true))
    }

    /// What setting the desired state of the unit `current` holds writes; `false` when
    /// there is no unit.
    pub(super) fn plan_desired(
        &self,
        name: &str,
        desired: DesiredState,
        writer: &Writer,
        current: &Current,
    ) -> Planned<std::result::Result<bool, Refused>> {
        let Some(old) = &current.record else {
            return Planned::Done(Ok(false));
        };
        let source = match owner_after(writer, name, current) {
            Ok(source) => source,
            Err(refused) => return Planned::Done(Err(refused)),
        };
        let versions = UnitRecord::versions_after(Some(old), old.hash, desired, writer, self.versions_kept());
        let record = UnitRecord { desired, source, versions, ..old.clone() };
        let mut writes = Writes::default();
        writes.put(self.keys().unit(name), encode(&record));
        self.agent_copies(name, &record, current, &mut writes, None);
        Planned::Write(writes, Ok(true))
    }
}

/// Who owns `name` after `writer` writes it, or why it is kept out (another owner, or a
/// change since the plan guarding the write): over `current`, which the write's transaction
/// is conditioned on.
fn owner_after(writer: &Writer, name: &str, current: &Current) -> std::result::Result<Option<String>, Refused> {
    writer.admits(name, current.record.as_ref(), current.machine.as_deref())
}

fn missing_body(key: String) -> RegistryError {
    RegistryError::Corrupt { key, reason: "unit body missing".into() }
}

#[async_trait]
impl ApiRegistry for EtcdRegistry {
    /// From the cluster's cache when it runs (as a unit is, `unit_from_copy`), else from etcd
    /// (`job_records.rs`).
    async fn job_record(&self, unit: &str) -> Result<Option<fleet_registry::StoredJob>> {
        self.stored_job(unit).await
    }

    /// From the cluster's cache, as the lists are (`job_records.rs`).
    async fn all_job_records(&self) -> Result<Vec<fleet_registry::StoredJob>> {
        self.stored_jobs(&self.api_mirror(), ReadFor::Showing).await
    }

    /// One transaction comparing the record's own revision (0: absent); the engine wakes on
    /// it through the cluster's cache, which holds the records.
    async fn put_dispatched_run(
        &self,
        unit: &str,
        record: &fleet_core::job::runs::JobRecord,
        version: u64,
    ) -> Result<bool> {
        let (key, write) = self.job_write(unit, Some(record), version);
        let reply = self.connection().txn(write).await?;
        let revision = reply.header().map(|header| header.revision());
        Ok(self.job_written(&key, revision, &reply))
    }

    /// etcd's revision, which every write under any key moves: one read of one key.
    async fn revision(&self) -> Result<Option<u64>> {
        let reply = self.connection().get(&self.keys().units(), None).await?;
        Ok(reply.header().map(|header| u64::try_from(header.revision()).unwrap_or(0)))
    }

    /// From the API's watch-fed copy, as every list is: no reader goes to etcd for what the
    /// copy holds.
    async fn units(&self) -> Result<Vec<UnitView>> {
        Ok(self.units_page_from_copy(PageRequest::everything()).await?.items)
    }

    async fn units_page(&self, request: PageRequest) -> Result<Page<UnitView>> {
        self.units_page_from_copy(request).await
    }

    async fn unit_states_page(&self, request: PageRequest, machine: Option<&str>) -> Result<Page<UnitState>> {
        self.unit_states_page_from_copy(request, machine).await
    }

    async fn states_of_units(&self, names: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>> {
        self.states_of_units_from_copy(names).await
    }

    fn unit_changes(&self) -> ChangeSignal {
        self.inner.api_signal.subscribe()
    }

    /// From the cluster's cache while it runs (a leader's, or a fleetd's that lists), else
    /// from etcd.
    async fn unit(&self, name: &str) -> Result<Option<UnitView>> {
        if let Some(read) = self.unit_from_copy(name).await {
            return read;
        }
        let keys = self.keys();
        let current = self.current(name, &Writer::BY_HAND).await?;
        let Some(record) = current.record else {
            return Ok(None);
        };
        let body_key = keys.body(&record.hash.to_string());
        let mut gets = vec![TxnOp::get(body_key.as_str(), None), TxnOp::get(keys.reason(name), None)];
        if let Some(machine) = &current.machine {
            gets.push(TxnOp::get(keys.state(machine, name), None));
        }
        let (_, replies) = self.connection().read(gets).await?;
        let body = replies.first().and_then(first).ok_or_else(|| missing_body(body_key.clone()))?;
        let file = UnitFile::from_options(decode::<Options>(&body_key, body.value())?);
        let reason = replies.get(1).and_then(first).map(text);
        let state = match (replies.get(2).and_then(first), &current.machine) {
            (Some(kv), Some(machine)) => Some(decode(&keys.state(machine, name), kv.value())?),
            _ => None,
        };
        Ok(Some(UnitView::from_records(name, record, file, current.machine, reason, state.as_ref())))
    }

    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        let put = UnitPut::new(name, file, desired);
        let body_key = self.keys().body(&put.hash.to_string());
        self.write_unit(name, writer, |current| {
            let mut planned = self.plan_put(&put, writer, current);
            if let Planned::Write(writes, _) = &mut planned {
                writes.put_body(body_key.clone(), encode(&file.options()));
            }
            planned
        })
        .await?
        .map_err(|refused| refused.into_error(name))
    }

    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        self.write_unit(name, writer, |current| self.plan_desired(name, desired, writer, current))
            .await?
            .map_err(|refused| refused.into_error(name))
    }

    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>> {
        self.change_units_batched(changes, writer).await
    }

    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        let keys = self.keys();
        let destroyed = self
            .write_unit(name, writer, |current| {
                let Some(record) = &current.record else {
                    return Planned::Done(Ok(false));
                };
                if let Err(refused) = owner_after(writer, name, current) {
                    return Planned::Done(Err(refused));
                }
                let mut writes = Writes::default();
                writes.put(keys.destroyed(name), name);
                writes.delete(keys.unit(name));
                writes.delete(keys.placement(name));
                writes.delete(keys.reason(name));
                if record.global {
                    writes.delete(keys.global(name));
                }
                if let Some(machine) = &current.machine {
                    writes.delete(keys.scheduled(machine, name));
                }
                Planned::Write(writes, Ok(true))
            })
            .await;
        match destroyed {
            Ok(Ok(destroyed)) => Ok(destroyed),
            Ok(Err(refused)) => Err(refused.into_error(name)),
            Err(RegistryError::Corrupt { key, reason }) => {
                tracing::error!(key, reason, "destroying a unit whose record cannot be read");
                self.destroy_unreadable_unit(name).await
            }
            Err(error) => Err(error),
        }
    }

    async fn import_units(
        &self,
        units: &[fleet_registry::ImportedUnit],
        writer: &Writer,
    ) -> Result<fleet_registry::Imported> {
        self.import(units, writer).await
    }

    async fn kept_body(&self, hash: &fleet_core::UnitHash) -> Result<Option<UnitFile>> {
        fleet_registry::AgentRegistry::unit_body(self, hash).await
    }

    fn keep_versions(&self, kept: usize) {
        self.inner.versions_kept.store(kept, std::sync::atomic::Ordering::Relaxed);
    }

    /// From the API's watch-fed copy, in (unit, machine) order.
    async fn unit_states(&self) -> Result<Vec<UnitState>> {
        Ok(self.unit_states_page_from_copy(PageRequest::everything(), None).await?.items)
    }

    /// From the API's watch-fed copy, in machine ID order.
    async fn machines(&self) -> Result<Vec<MachineState>> {
        Ok(self.machines_page_from_copy(PageRequest::everything()).await?.items)
    }

    async fn machines_page(&self, request: PageRequest) -> Result<Page<MachineState>> {
        self.machines_page_from_copy(request).await
    }

    async fn drains(&self) -> Result<Vec<(MachineId, Drain)>> {
        self.drains_from_copy().await
    }

    async fn machines_out_of_touch(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        self.out_of_touch_from_copy().await
    }

    async fn required_places_of(&self, unit: &str, machine: &str) -> Result<Vec<fleet_registry::RequiredPlace>> {
        self.required_places_from_copy(unit, machine).await
    }

    async fn engine_leader(&self) -> Result<Option<MachineId>> {
        let key = self.keys().leader();
        // A fleetd that runs an engine follows the leader key already; one that does not reads
        // it (a list must not start a watch that outlives it).
        if let Some(mirror) = self.inner.leader_cache.get() {
            let data = mirror.read();
            if data.synced && data.streaming {
                return Ok(data.entries.get(&key).map(|entry| String::from_utf8_lossy(&entry.value).into_owned()));
            }
        }
        let reply = self.connection().get(key.as_str(), None).await?;
        Ok(first(&reply).map(text))
    }

    async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<()> {
        let keys = self.keys();
        let machines: Vec<String> = changes
            .iter()
            .map(|change| match change {
                MetadataChange::Set { machine_id, .. } | MetadataChange::Remove { machine_id, .. } => {
                    machine_id.clone()
                }
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        optimistically(|| async {
            let gets = machines.iter().map(|machine| TxnOp::get(keys.metadata(machine), None)).collect();
            let (_, replies) = self.connection().read(gets).await?;
            let mut current: BTreeMap<&str, (MetadataOverrides, i64)> = BTreeMap::new();
            for (machine, reply) in machines.iter().zip(&replies) {
                let overrides = match first(reply) {
                    Some(kv) => decode(&keys.metadata(machine), kv.value())?,
                    None => MetadataOverrides::new(),
                };
                current.insert(machine, (overrides, mod_revision(reply)));
            }
            for change in changes {
                let (machine_id, key, value) = match change {
                    MetadataChange::Set { machine_id, key, value } => (machine_id, key, value.clone()),
                    MetadataChange::Remove { machine_id, key } => (machine_id, key, String::new()),
                };
                if let Some((overrides, _)) = current.get_mut(machine_id.as_str()) {
                    overrides.insert(key.clone(), value);
                }
            }
            let compares: Vec<Compare> = current
                .iter()
                .map(|(machine, (_, revision))| {
                    Compare::mod_revision(keys.metadata(machine), CompareOp::Equal, *revision)
                })
                .collect();
            let mut writes = Writes::default();
            for (machine, (overrides, _)) in &current {
                writes.put(keys.metadata(machine), encode(overrides));
            }
            let reply = self.connection().txn(Txn::new().when(compares).and_then(writes.ops)).await?;
            if reply.succeeded() {
                self.api_wrote(&reply, &writes.keys);
            }
            Ok(reply.succeeded().then_some(()))
        })
        .await
    }
    async fn set_drain(&self, machine_id: &str, drain: Option<&Drain>) -> Result<()> {
        let mut writes = Writes::default();
        match drain {
            Some(drain) => writes.put(self.keys().drain(machine_id), encode(drain)),
            None => writes.delete(self.keys().drain(machine_id)),
        }
        let reply = self.connection().txn(Txn::new().and_then(writes.ops)).await?;
        self.api_wrote(&reply, &writes.keys);
        Ok(())
    }

    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool> {
        let key = self.keys().drain(machine_id);
        let reply = self.connection().get(&key, None).await?;
        let standing: Option<Drain> = first(&reply).map(|kv| decode(&key, kv.value())).transpose()?;
        if standing.is_none_or(|standing| standing.started != drain.started) {
            return Ok(false);
        }
        let mut writes = Writes::default();
        writes.put(key.clone(), encode(drain));
        let unchanged = Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_revision(&reply));
        let reply = self.connection().txn(Txn::new().when(vec![unchanged]).and_then(writes.ops)).await?;
        if reply.succeeded() {
            self.api_wrote(&reply, &writes.keys);
        }
        Ok(reply.succeeded())
    }
}
