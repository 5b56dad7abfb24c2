//! The agents' facet of the etcd store. Each machine reads from its own watch-fed copy of
//! `schedule/<machine>/`, `global/`, its presence and its metadata: a fallback reconcile
//! reads nothing from etcd, and only changes to this machine's work wake it.

use fleet_core::unpoisoned::Locked;
use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use fleet_core::{MachineState, UnitFile, UnitHash};

use super::EtcdRegistry;
use super::connection::MAX_TXN_OPS;
use super::keys::KeyRange;
use super::mirror::MirrorData;
use super::records::{Assignment, CarriedBody};
use fleet_registry::codec::{decode_listed, encode, machine_from_records};
use fleet_registry::{
    AgentRegistry, AssignedUnit, ChangeSignal, MachineWork, RegistryError, RequiredPlaces, Result, StateReport,
};

/// The assignments under `collection` in a machine's copy.
/// The units assigned under `collection`, each with the revision of the record of where its
/// requirements run that its assignment was written after (`Assignment::places_at`).
fn assignments(
    registry: &EtcdRegistry,
    data: &MirrorData,
    collection: String,
) -> Result<Vec<(AssignedUnit, Option<i64>)>> {
    let range = KeyRange::prefix(collection.clone());
    let mut units = Vec::new();
    for (key, entry) in data.range(&range) {
        let Some(name) = registry.keys().name_in(&collection, key) else { continue };
        // Parsed once per revision: an agent reads its work on every pass.
        let assignment = entry.decoded::<Assignment>(key)?;
        let Assignment { hash, desired, drift, secrets, places_at } = Assignment::clone(&assignment);
        let unit =
            AssignedUnit { name: name.to_string(), hash, desired, drift, secrets, run: None, required_at: Vec::new() };
        units.push((unit, places_at));
    }
    Ok(units)
}

/// How long a read of a machine's work waits for its copy's first listing.
const FIRST_LISTING: std::time::Duration = std::time::Duration::from_secs(10);

/// One pull agent's state changes to write (a key's new value, or its removal), under the
/// lease its presence hangs on.
pub(crate) struct StatesWrite {
    changes: Vec<(String, Option<Vec<u8>>)>,
    lease: i64,
}

impl EtcdRegistry {
    /// Writes the state changes of the pull agents that reported at the same time
    /// ([`crate::written_together`]): one transaction for all, each value under its
    /// agent's lease; a key written twice (one agent twice in the batch) starts another. (A
    /// fleetd's own machine writes alone, as every fleetd of a cluster does.)
    async fn write_states(&self, batch: Vec<StatesWrite>) -> Result<Vec<()>> {
        if let [alone] = batch.as_slice() {
            self.connection().write(&alone.changes, alone.lease).await?;
            return Ok(vec![()]);
        }
        let count = batch.len();
        let mut txns: Vec<(HashSet<String>, Vec<TxnOp>)> = Vec::new();
        for write in batch {
            let fresh = |txn: &(HashSet<String>, Vec<TxnOp>)| write.changes.iter().all(|(key, _)| !txn.0.contains(key));
            if !txns.last().is_some_and(fresh) {
                txns.push((HashSet::new(), Vec::new()));
            }
            let Some((keys, ops)) = txns.last_mut() else { continue };
            for (key, value) in write.changes {
                ops.push(match value {
                    Some(value) => TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(write.lease))),
                    None => TxnOp::delete(key.as_str(), None),
                });
                keys.insert(key);
            }
        }
        for (_, ops) in txns {
            self.connection().txn(Txn::new().and_then(ops)).await?;
        }
        Ok(vec![(); count])
    }
}

#[async_trait]
impl AgentRegistry for EtcdRegistry {
    /// A pull agent announces itself when it comes to this manager, and again when its work
    /// shows it absent or a request of its went unanswered: its presence is (re)written under
    /// this manager's lease, whatever this manager held for it before (another manager may
    /// have written it since, or given it up), unless this manager holds it as announced.
    async fn announce_for_agent(&self, machine: &MachineState) -> Result<()> {
        if self.holds_presence_as_announced(machine).await? {
            return Ok(());
        }
        self.take_over_session(machine).await
    }

    async fn register_machine(&self, machine: &MachineState) -> Result<()> {
        let Some(session) = self.session(&machine.id) else {
            return self.open_session(machine).await;
        };
        // Registered already (fleetd announces before its agent starts, and a reload registers
        // again): write only when what the cluster sees of this machine changed.
        {
            let mut known = session.machine.locked();
            if *known == *machine {
                return Ok(());
            }
            *known = machine.clone();
        }
        let key = self.keys().machine(&machine.id);
        self.connection().write(&[(key, Some(encode(machine)))], session.lease()).await.map(|_| ())
    }

    async fn unregister_machine(&self, machine_id: &str) -> Result<()> {
        // The machine's agent is done following its work: its cache goes by the rule.
        self.inner.work_caches.locked().remove(machine_id);
        let Some(session) = self.take_session(machine_id) else {
            return Ok(());
        };
        self.close_session(&session).await
    }

    async fn machine_work(&self, machine_id: &str) -> Result<MachineWork> {
        // A manager that just started lists every agent's work once: an agent asking meanwhile
        // waits for that listing instead of being turned away (each refusal lengthened its
        // backoff, and 10,000 agents came back over many seconds after the manager was ready).
        drop(self.work_mirror(machine_id).listed(FIRST_LISTING).await);
        let work = self.work_from_copy(machine_id)?;
        self.restore_states(machine_id, &work).await?;
        self.hold_agent_talking_here(machine_id).await?;
        Ok(work)
    }

    async fn unit_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        Ok(self.read_bodies(std::slice::from_ref(hash)).await?.remove(hash))
    }

    async fn unit_bodies(&self, machine_id: &str, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        let mut found = self.carried_bodies(machine_id, hashes);
        let unread: Vec<UnitHash> = hashes.iter().filter(|hash| !found.contains_key(hash)).copied().collect();
        if !unread.is_empty() {
            found.extend(self.read_bodies(&unread).await?);
        }
        Ok(found)
    }

    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> Result<()> {
        if reports.is_empty() {
            return Ok(());
        }
        let Some(session) = self.session(machine_id) else {
            return Err(fleet_registry::RegistryError::NotAnnounced { machine_id: machine_id.to_string() });
        };
        let keys = self.keys();
        let lease = session.lease();
        let changes: Vec<(String, Option<Vec<u8>>)> = reports
            .iter()
            .map(|report| match report {
                StateReport::Set(state) => (keys.state(machine_id, &state.name), Some(encode(state))),
                StateReport::Remove(name) => (keys.state(machine_id, name), None),
            })
            .collect();
        for chunk in changes.chunks(MAX_TXN_OPS) {
            if session.own() {
                // This fleetd's own machine: nothing to write it with. Its API's lists show
                // what it reported, as they show what the API wrote.
                let revision = self.connection().write(chunk, lease).await?;
                let held = session.states.locked();
                // A removal makes an event only where there was a state to remove.
                let changed = chunk.iter().filter(|(key, value)| value.is_some() || held.contains_key(key));
                self.wrote_at(revision, changed.map(|(key, _)| key.as_str()));
            } else {
                // A pull agent's: written with the other agents' reports of the moment.
                let write = StatesWrite { changes: chunk.to_vec(), lease };
                let batches = &self.inner.state_batches;
                let write_batch = |batch: Vec<StatesWrite>| {
                    let registry = self.clone();
                    async move { registry.write_states(batch).await }
                };
                let written = batches.write(write, chunk.len(), MAX_TXN_OPS, write_batch).await;
                self.noting_agent_lease(lease, written)?;
            }
            let mut written = session.states.locked();
            let mut to_restore = session.to_restore.locked();
            for (key, value) in chunk {
                to_restore.remove(key);
                match value {
                    Some(value) => written.insert(key.clone(), value.clone()),
                    None => written.remove(key),
                };
            }
        }
        Ok(())
    }

    fn presence_lapses(&self, machine_id: &str) -> Option<ChangeSignal> {
        Some(self.lapse_signal(machine_id).subscribe())
    }

    fn presence_lapse_handled(&self, machine_id: &str) {
        let lapses = *self.lapse_signal(machine_id).borrow();
        self.lapse_ack(machine_id).send_replace(lapses);
    }

    fn presence_renewed(&self, machine_id: &str) -> fleet_registry::Renewal {
        let Some(session) = self.session(machine_id) else { return fleet_registry::Renewal::NotHeld };
        let renewed = match session.own() {
            true => Some(session.renewed()),
            false => self.inner.agent_lease.renewed(session.lease()),
        };
        renewed.map_or(fleet_registry::Renewal::NotHeld, fleet_registry::Renewal::SentAt)
    }

    fn machine_changes(&self, machine_id: &str) -> ChangeSignal {
        self.work_changes(machine_id)
    }
}

impl EtcdRegistry {
    /// The bodies among `hashes` that this machine's schedule and the global units carry,
    /// each checked against its hash: what is missing or does not match is read from
    /// `bodies/` instead.
    fn carried_bodies(&self, machine_id: &str, hashes: &[UnitHash]) -> HashMap<UnitHash, UnitFile> {
        let mut found = HashMap::new();
        let mirror = self.work_mirror(machine_id);
        let data = mirror.read();
        let (schedule, globals) =
            (KeyRange::prefix(self.keys().schedule(machine_id)), KeyRange::prefix(self.keys().globals()));
        for (key, entry) in data.range(&schedule).chain(data.range(&globals)) {
            if found.len() == hashes.len() {
                break;
            }
            let Some(CarriedBody { hash, body: Some(body) }) = decode_listed::<CarriedBody>(key, &entry.value) else {
                continue;
            };
            if !hashes.contains(&hash) || found.contains_key(&hash) {
                continue;
            }
            let file = UnitFile::from_options(body);
            if file.hash() == hash {
                found.insert(hash, file);
            } else {
                tracing::warn!(
                    key,
                    "a unit body carried with an assignment does not match its hash; reading it instead"
                );
            }
        }
        found
    }

    /// This machine's work as its copy holds it, once the copy has caught up with the
    /// machine's last registration.
    fn work_from_copy(&self, machine_id: &str) -> Result<MachineWork> {
        let mirror = self.work_mirror(machine_id);
        let data = mirror.synced()?;
        let rejoined_at = match self.session(machine_id) {
            Some(session) => session.rejoined_at(),
            // A claim that got no answer may have landed as a fresh presence, after the
            // engine moved what runs here: until a claim is confirmed, nothing shows what is
            // still this machine's.
            None if self.unconfirmed_claim(machine_id).is_some() => return Err(RegistryError::PresenceLapsed),
            None => 0,
        };
        if !data.current_since(rejoined_at) {
            // The registration asked for a listing; asked again on every read until the copy
            // is current (the asks coalesce, and listings are spaced), so that no lost ask
            // leaves the work unreadable.
            mirror.relist();
            return Err(RegistryError::PresenceLapsed);
        }
        let keys = self.keys();
        let machine_key = keys.machine(machine_id);
        let metadata_key = keys.metadata(machine_id);
        let overrides = data.entries.get(&metadata_key).map(|entry| (metadata_key.as_str(), entry.value.as_slice()));
        let machine = data
            .entries
            .get(&machine_key)
            .and_then(|entry| machine_from_records(&machine_key, &entry.value, overrides, None));
        let mut globals: Vec<AssignedUnit> =
            assignments(self, &data, keys.globals())?.into_iter().map(|(unit, _)| unit).collect();
        for global in &mut globals {
            let key = keys.run_ticket(&global.name);
            global.run = data.entries.get(&key).and_then(|entry| decode_listed(&key, &entry.value));
        }
        let mut scheduled = Vec::new();
        for (mut unit, places_at) in assignments(self, &data, keys.schedule(machine_id))? {
            let key = keys.required_place(machine_id, &unit.name);
            if let Some(written_at) = places_at
                && mirror.seen_through(&data, &key).is_some_and(|seen| seen < written_at)
            {
                // The placement is here, where its requirements run not yet: the copy watches
                // that range apart, and etcd may deliver it later. Read again once it came.
                return Err(RegistryError::NotListedYet);
            }
            let record = data.entries.get(&key).and_then(|entry| decode_listed::<RequiredPlaces>(&key, &entry.value));
            unit.required_at = record.map(|record| record.places).unwrap_or_default();
            scheduled.push(unit);
        }
        Ok(MachineWork { machine, scheduled, globals })
    }

    /// After a re-registration, writes again the states of the units `work` (read from a
    /// copy that has caught up with it) still gives this machine, under the new lease. A
    /// state the agent reported since is newer and stays: each write is on the key being
    /// absent.
    async fn restore_states(&self, machine_id: &str, work: &MachineWork) -> Result<()> {
        let Some(session) = self.session(machine_id) else { return Ok(()) };
        let pending = std::mem::take(&mut *session.to_restore.locked());
        if pending.is_empty() {
            return Ok(());
        }
        let keys = self.keys();
        let here: HashSet<String> =
            work.scheduled.iter().chain(&work.globals).map(|unit| keys.state(machine_id, &unit.name)).collect();
        let (kept, gone): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(key, _)| here.contains(key));
        tracing::info!(
            machine_id,
            restored = kept.len(),
            dropped = gone.len(),
            "writing unit states again after registering again"
        );
        let lease = session.lease();
        for (done, chunk) in kept.chunks(MAX_TXN_OPS).enumerate() {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(key, value)| {
                    let absent = Compare::version(key.as_str(), CompareOp::Equal, 0);
                    let put = TxnOp::put(key.as_str(), value.clone(), Some(PutOptions::new().with_lease(lease)));
                    TxnOp::txn(Txn::new().when([absent]).and_then([put]))
                })
                .collect();
            if let Err(error) = self.connection().txn(Txn::new().and_then(ops)).await {
                // What was not written is tried again on the next read of the work.
                let mut to_restore = session.to_restore.locked();
                for (key, value) in kept.into_iter().skip(done * MAX_TXN_OPS) {
                    to_restore.entry(key).or_insert(value);
                }
                return Err(error);
            }
            let mut written = session.states.locked();
            for (key, value) in chunk {
                written.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        Ok(())
    }
}
