//! Many unit writes per etcd transaction. Each unit's write is a nested transaction on its
//! own conditions (the unit and its placement as the API's copy holds them), so a unit that
//! changed meanwhile fails alone and is written again alone, from a fresh read; bodies, which
//! the instances of a template share, are written once per transaction, where absent.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::task::JoinSet;

use super::api::{Current, Planned, UnitPut, Writes, put_if_absent};
use super::connection::NESTED_PER_TXN;
use super::{EtcdRegistry, UNIT_BATCHES_IN_FLIGHT};
use fleet_registry::codec::encode;
use fleet_registry::{ApiRegistry, Refused, RegistryError, Result, UnitChange, UnitChanged, Writer};

/// One unit's nested transaction, waiting for its answer.
struct Nested {
    change: usize,
    writes: Writes,
    current: Current,
}

/// What a guess from the copy planned for one change: its writes, or nothing to batch (it is
/// then made alone, from a fresh read).
fn batched<T>(planned: Planned<std::result::Result<T, Refused>>) -> Option<Writes> {
    match planned {
        Planned::Write(writes, Ok(_)) => Some(writes),
        // An answer without a write is given only from a fresh read.
        Planned::Write(_, Err(_)) | Planned::Done(_) => None,
    }
}

impl EtcdRegistry {
    pub(super) async fn change_units_batched(
        &self,
        changes: &[UnitChange],
        writer: &Writer,
    ) -> Result<Vec<Result<UnitChanged>>> {
        let mut answers: Vec<Option<Result<UnitChanged>>> =
            std::iter::repeat_with(|| None).take(changes.len()).collect();
        // Guesses come from the copy; it should hold this API's own writes first (if it cannot,
        // the guesses are only staler, and their conditions catch that).
        if let Err(error) = Self::up_to_date(self.api_mirror()).await {
            tracing::debug!(%error, "writing a batch of units from a copy that is behind");
        }
        // Up to UNIT_BATCHES_IN_FLIGHT transactions of this call are in flight while the next
        // is planned, so that etcd does not wait between them (a wave of a rollout is several).
        // A unit is batched once per call (its name again is made alone, after, in order), so
        // transactions in flight together never write the same unit.
        let mut names = BTreeSet::new();
        let mut in_flight: JoinSet<(Vec<Nested>, Vec<String>, Result<TxnResponse>)> = JoinSet::new();
        let mut failed: Option<String> = None;
        let mut next = 0;
        loop {
            while failed.is_none() && next < changes.len() && in_flight.len() < UNIT_BATCHES_IN_FLIGHT {
                let (chunk, bodies, after) = self.next_chunk(changes, next, writer, &mut names);
                next = after;
                if chunk.is_empty() {
                    continue;
                }
                let mut ops: Vec<TxnOp> = Vec::with_capacity(bodies.len() + chunk.len());
                let mut body_keys = Vec::with_capacity(bodies.len());
                for (key, value) in bodies {
                    ops.push(put_if_absent(&key, value));
                    body_keys.push(key);
                }
                for nested in &chunk {
                    let name = &changes[nested.change].name;
                    let conditions = self.write_conditions(name, writer, &nested.current);
                    let txn = Txn::new().when(conditions).and_then(nested.writes.ops.clone());
                    ops.push(TxnOp::txn(txn));
                }
                let registry = self.clone();
                in_flight.spawn(async move {
                    let turn = registry.inner.unit_batches.acquire().await;
                    registry.wait_while_etcd_is_behind().await;
                    let written = registry.connection().big_txn(Txn::new().and_then(ops)).await;
                    drop(turn);
                    (chunk, body_keys, written)
                });
            }
            let Some(done) = in_flight.join_next().await else { break };
            let (chunk, body_keys, written) =
                done.map_err(|error| RegistryError::Unavailable(format!("etcd: a write task ended: {error}")))?;
            let reply = match written {
                Ok(reply) => reply,
                Err(error) => {
                    // etcd failed: what is not written yet fails with it (below), rather than
                    // each unit waiting out its own timeout alone; what is in flight is still
                    // heard out.
                    failed.get_or_insert(match error {
                        RegistryError::Unavailable(message) => message,
                        other => other.to_string(),
                    });
                    continue;
                }
            };
            let revision = reply.header().map_or(0, |header| header.revision());
            let responses = reply.op_responses();
            let (body_responses, unit_responses) = responses.split_at(body_keys.len().min(responses.len()));
            self.api_wrote_at(revision, &body_keys, body_responses);
            for (nested, response) in chunk.into_iter().zip(unit_responses) {
                if let TxnOpResponse::Txn(inner) = response
                    && inner.succeeded()
                {
                    self.api_wrote_at(revision, &nested.writes.keys, &inner.op_responses());
                    answers[nested.change] = Some(Ok(UnitChanged::Written));
                }
            }
        }
        // What could not be batched, or lost a race, is made alone (read, plan, retry); once
        // etcd fails, the rest fail with it.
        for (change, answer) in changes.iter().zip(answers.iter_mut()) {
            if answer.is_some() {
                continue;
            }
            if let Some(message) = &failed {
                *answer = Some(Err(RegistryError::Unavailable(message.clone())));
                continue;
            }
            let alone = self.change_unit_as(change, writer).await;
            if let Err(RegistryError::Unavailable(message)) = &alone {
                failed = Some(message.clone());
            }
            *answer = Some(alone);
        }
        Ok(answers.into_iter().map(|answer| answer.unwrap_or(Ok(UnitChanged::Written))).collect())
    }

    /// The changes from `start` that fit one transaction, planned from the copy's guesses,
    /// with the bodies they need; and where the next chunk starts. Changes without a guess,
    /// and those whose name `names` (the call's batched units) holds already, are skipped
    /// here (made alone later).
    fn next_chunk<'a>(
        &self,
        changes: &'a [UnitChange],
        start: usize,
        writer: &Writer,
        names: &mut BTreeSet<&'a str>,
    ) -> (Vec<Nested>, BTreeMap<String, Vec<u8>>, usize) {
        let keys = self.keys();
        let mut chunk = Vec::new();
        let mut bodies: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut index = start;
        while index < changes.len() && chunk.len() + bodies.len() + 2 <= NESTED_PER_TXN {
            let change = &changes[index];
            index += 1;
            // One transaction writes a key once, and two in flight never the same: a name
            // given twice is made alone.
            if !names.insert(change.name.as_str()) {
                continue;
            }
            let Some(current) = self.current_in_copy(&change.name) else { continue };
            let planned = match &change.file {
                Some(file) => {
                    let put = UnitPut::new(&change.name, file, change.desired);
                    batched(self.plan_put(&put, writer, &current)).inspect(|_| {
                        bodies.entry(keys.body(&put.hash.to_string())).or_insert_with(|| encode(&file.options()));
                    })
                }
                None => match self.plan_desired(&change.name, change.desired, writer, &current) {
                    Planned::Write(writes, Ok(true)) => Some(writes),
                    _ => None,
                },
            };
            if let Some(writes) = planned {
                chunk.push(Nested { change: index - 1, writes, current });
            }
        }
        (chunk, bodies, index)
    }
}
