//! Writing the unit states machines report, under their lease: one key per unit while the
//! store runs members of format 1, one page per up to 128 units of a machine once every
//! member reads pages (`state_pages.rs`), so that a report of many units of one machine is one
//! write. A pull agent's reports go with the other agents' of the moment (`written_together`).

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, HashSet};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::EtcdRegistry;
use super::connection::MAX_TXN_OPS;
use super::session::MachineSession;
use fleet_registry::codec::encode;
use fleet_registry::{MachineWork, Result, StateReport};

use super::state_pages::Changes;

/// One pull agent's state changes to write (a key's new value, or its removal), under the
/// lease its presence hangs on.
pub(crate) struct StatesWrite {
    changes: Changes,
    lease: i64,
}

impl EtcdRegistry {
    /// Writes `reports` of `session`'s machine in the layout the store is in.
    pub(super) async fn write_reports(
        &self,
        session: &MachineSession,
        machine_id: &str,
        reports: &[StateReport],
    ) -> Result<()> {
        let keys = self.keys();
        let reported: Changes = reports
            .iter()
            .map(|report| match report {
                StateReport::Set(state) => (keys.state(machine_id, &state.name), Some(encode(state))),
                StateReport::Remove(name) => (keys.state(machine_id, name), None),
            })
            .collect();
        if self.states_paged() {
            return self.write_paged(session, machine_id, reported).await;
        }
        for chunk in reported.chunks(MAX_TXN_OPS) {
            // A removal makes an event only where there was a state to remove.
            let eventful: HashSet<String> = {
                let held = session.states.locked();
                chunk
                    .iter()
                    .filter(|(key, value)| value.is_some() || held.contains_key(key))
                    .map(|(key, _)| key.clone())
                    .collect()
            };
            self.write_changes(session, chunk, &eventful).await?;
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

    /// Writes `changes` (per-unit keys) of `session`'s machine as pages: the pages they change,
    /// and the first time, the removal of the machine's per-unit keys.
    async fn write_paged(&self, session: &MachineSession, machine_id: &str, changes: Changes) -> Result<()> {
        let keys = self.keys();
        // One write of a machine's pages at a time: each is computed from the last one written.
        let mut written = session.pages.lock().await;
        let (states, per_unit) = {
            let held = session.states.locked();
            let mut states: BTreeMap<String, Vec<u8>> = held.clone();
            for (key, value) in &changes {
                match value {
                    Some(value) => states.insert(key.clone(), value.clone()),
                    None => states.remove(key),
                };
            }
            (states, held.keys().cloned().collect::<Vec<_>>())
        };
        let (writes, next) = written.writes_for(keys, machine_id, &states, per_unit);
        // Puts make events, and deletes of what is surely stored: a list waits for those.
        let eventful: HashSet<String> = {
            let stored = written.stored_pages(keys, machine_id);
            writes
                .iter()
                .filter(|(key, value)| value.is_some() || stored.contains(key))
                .map(|(key, _)| key.clone())
                .collect()
        };
        for chunk in writes.chunks(MAX_TXN_OPS) {
            if let Err(error) = self.write_changes(session, chunk, &eventful).await {
                *written = written.after_failure(&next);
                return Err(error);
            }
        }
        *written = next;
        *session.states.locked() = states;
        let mut to_restore = session.to_restore.locked();
        for (key, _) in &changes {
            to_restore.remove(key);
        }
        Ok(())
    }

    /// Writes one transaction's worth of `changes` under `session`'s lease; `eventful`: the
    /// keys whose change makes a watch event, which this fleetd's lists then wait for.
    async fn write_changes(
        &self,
        session: &MachineSession,
        changes: &[(String, Option<Vec<u8>>)],
        eventful: &HashSet<String>,
    ) -> Result<()> {
        let lease = session.lease();
        if session.own() {
            // This fleetd's own machine: nothing to write it with. Its API's lists show what
            // it reported, as they show what the API wrote.
            let revision = self.connection().write(changes, lease).await?;
            let changed = changes.iter().map(|(key, _)| key.as_str()).filter(|key| eventful.contains(*key));
            self.wrote_at(revision, changed);
            return Ok(());
        }
        // A pull agent's: written with the other agents' reports of the moment.
        let write = StatesWrite { changes: changes.to_vec(), lease };
        let write_batch = |batch: Vec<StatesWrite>| {
            let registry = self.clone();
            async move { registry.write_states(batch).await }
        };
        let written = self.inner.state_batches.write(write, changes.len(), MAX_TXN_OPS, write_batch).await;
        self.noting_agent_lease(lease, written)
    }

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

    /// After a re-registration, writes again the states of the units `work` (read from a
    /// copy that has caught up with it) still gives this machine, under the new lease. A
    /// state the agent reported since is newer and stays.
    pub(super) async fn restore_states(&self, machine_id: &str, work: &MachineWork) -> Result<()> {
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
        if self.states_paged() {
            // Reported since: newer, and kept.
            let newer: HashSet<String> = session.states.locked().keys().cloned().collect();
            let restored: Changes = kept
                .iter()
                .filter(|(key, _)| !newer.contains(key))
                .map(|(key, value)| (key.clone(), Some(value.clone())))
                .collect();
            let written = self.write_paged(&session, machine_id, restored).await;
            if written.is_err() {
                // Tried again on the next read of the work.
                let mut to_restore = session.to_restore.locked();
                for (key, value) in kept {
                    to_restore.entry(key).or_insert(value);
                }
            }
            return written;
        }
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

#[cfg(test)]
mod tests;
