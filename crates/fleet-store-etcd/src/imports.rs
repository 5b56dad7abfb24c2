//! An import (`ApiRegistry::import_units`): units written with their placements, many per
//! transaction, each on the condition that neither its unit nor its placement exists; when one
//! finds its name taken, or etcd fails, what the import wrote is deleted again, so it leaves
//! all of its units or none. (Bodies it wrote stay: the engine collects those no unit has.)

use std::collections::{BTreeMap, BTreeSet, HashSet};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use fleet_core::{Requirements, UnitHash};
use fleet_registry::codec::encode;
use fleet_registry::{Imported, ImportedUnit, Result, UnitRecord, Writer};

use super::EtcdRegistry;
use super::api::{Writes, put_if_absent};
use super::connection::NESTED_PER_TXN;
use super::records::{Assignment, CarryingAssignment};

/// The most bytes one transaction carries (etcd refuses requests over 1.5 MiB).
const BYTES_PER_TXN: usize = 1024 * 1024;

/// A unit whose write was not answered: taken back only if written once and not since.
const UNKNOWN_REVISION: i64 = 0;

/// One imported unit and its nested transaction's writes.
struct Written<'a> {
    unit: &'a ImportedUnit,
    writes: Writes,
}

impl EtcdRegistry {
    pub(super) async fn import(&self, units: &[ImportedUnit], writer: &Writer) -> Result<Imported> {
        let existing = self.existing_units(units).await?;
        if !existing.is_empty() {
            return Ok(Imported::Existing(existing));
        }
        let mut written: Vec<(&ImportedUnit, i64)> = Vec::new();
        let mut next = 0;
        while next < units.len() {
            let (chunk, bodies, after) = self.import_chunk(units, next, writer);
            next = after;
            let mut ops: Vec<TxnOp> = bodies.iter().map(|(key, value)| put_if_absent(key, value.clone())).collect();
            let keys = self.keys();
            for nested in &chunk {
                let name = nested.unit.name.as_str();
                let absent = [
                    Compare::version(keys.unit(name), CompareOp::Equal, 0),
                    Compare::version(keys.placement(name), CompareOp::Equal, 0),
                ];
                ops.push(TxnOp::txn(Txn::new().when(absent).and_then(nested.writes.ops.clone())));
            }
            let reply = match self.connection().big_txn(Txn::new().and_then(ops)).await {
                Ok(reply) => reply,
                Err(error) => {
                    // The chunk may have been written without its answer reaching here: its
                    // units are taken back too where they were written once and not since.
                    written.extend(chunk.iter().map(|nested| (nested.unit, UNKNOWN_REVISION)));
                    self.take_back(&written).await;
                    return Err(error);
                }
            };
            let revision = reply.header().map_or(0, |header| header.revision());
            let responses = reply.op_responses();
            let (body_responses, unit_responses) = responses.split_at(bodies.len().min(responses.len()));
            let body_keys: Vec<String> = bodies.into_keys().collect();
            self.api_wrote_at(revision, &body_keys, body_responses);
            let mut taken = Vec::new();
            for (nested, response) in chunk.iter().zip(unit_responses) {
                match response {
                    TxnOpResponse::Txn(inner) if inner.succeeded() => {
                        self.api_wrote_at(revision, &nested.writes.keys, &inner.op_responses());
                        written.push((nested.unit, revision));
                    }
                    _ => taken.push(nested.unit.name.clone()),
                }
            }
            if !taken.is_empty() {
                self.take_back(&written).await;
                return Ok(Imported::Existing(taken));
            }
        }
        Ok(Imported::Written)
    }

    /// The names of `units` that exist already, read from etcd (a copy could be behind).
    async fn existing_units(&self, units: &[ImportedUnit]) -> Result<Vec<String>> {
        let keys = self.keys();
        let mut existing = Vec::new();
        for chunk in units.chunks(NESTED_PER_TXN) {
            let gets = chunk
                .iter()
                .map(|unit| TxnOp::get(keys.unit(&unit.name), Some(etcd_client::GetOptions::new().with_count_only())))
                .collect();
            let (_, replies) = self.connection().read(gets).await?;
            for (unit, reply) in chunk.iter().zip(replies) {
                if reply.count() > 0 {
                    existing.push(unit.name.clone());
                }
            }
        }
        Ok(existing)
    }

    /// The units from `start` that fit one transaction with the bodies they need, and where
    /// the next chunk starts.
    fn import_chunk<'a>(
        &self,
        units: &'a [ImportedUnit],
        start: usize,
        writer: &Writer,
    ) -> (Vec<Written<'a>>, BTreeMap<String, Vec<u8>>, usize) {
        let keys = self.keys();
        let (mut chunk, mut bodies, mut bytes) = (Vec::new(), BTreeMap::new(), 0);
        // A machine's first unit of each content carries the body, as the engine's writes do.
        let mut carried_to: HashSet<(&str, UnitHash)> = HashSet::new();
        let mut index = start;
        while index < units.len() && chunk.len() + bodies.len() + 2 <= NESTED_PER_TXN && bytes < BYTES_PER_TXN {
            let unit = &units[index];
            index += 1;
            let hash = unit.file.hash();
            let body_key = keys.body(&hash.to_string());
            if let std::collections::btree_map::Entry::Vacant(entry) = bodies.entry(body_key) {
                let body = encode(&unit.file.options());
                bytes += body.len();
                entry.insert(body);
            }
            let record = UnitRecord {
                hash,
                desired: unit.desired,
                global: Requirements::from_unit(&unit.name, &unit.file).global,
                source: None,
                drift: Writer::BY_HAND.drift_policy(),
                secrets: Default::default(),
                versions: UnitRecord::versions_after(None, hash, unit.desired, writer, 0),
            };
            let mut writes = Writes::default();
            let encoded = encode(&record);
            bytes += encoded.len();
            writes.put(keys.unit(&unit.name), encoded);
            let assignment = Assignment::of(&record);
            let carrying = || encode(&CarryingAssignment { assignment: &assignment, body: unit.file.options() });
            let copy = match (record.global, &unit.machine) {
                (true, _) => Some((keys.global(&unit.name), carrying())),
                (false, Some(machine)) => {
                    writes.put(keys.placement(&unit.name), machine.as_bytes().to_vec());
                    let first = carried_to.insert((machine.as_str(), hash));
                    Some((keys.scheduled(machine, &unit.name), if first { carrying() } else { encode(&assignment) }))
                }
                (false, None) => None,
            };
            if let Some((key, value)) = copy {
                bytes += value.len();
                writes.put(key, value);
            }
            chunk.push(Written { unit, writes });
        }
        (chunk, bodies, index)
    }

    /// Deletes the units of `written` (each as written at its revision: a unit someone changed
    /// since is theirs now), with their placements and the agents' copies: where the import put
    /// them and where the engine may have moved them since.
    async fn take_back(&self, written: &[(&ImportedUnit, i64)]) {
        let keys = self.keys();
        for chunk in written.chunks(NESTED_PER_TXN) {
            let gets = chunk.iter().map(|(unit, _)| TxnOp::get(keys.placement(&unit.name), None)).collect();
            let placed_now: Vec<Option<String>> = match self.connection().read(gets).await {
                Ok((_, replies)) => replies
                    .iter()
                    .map(|reply| reply.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
                    .collect(),
                Err(_) => vec![None; chunk.len()],
            };
            let ops: Vec<TxnOp> = chunk
                .iter()
                .zip(placed_now)
                .map(|((unit, revision), now)| {
                    let name = unit.name.as_str();
                    let mut deletes = vec![
                        TxnOp::delete(keys.unit(name), None),
                        TxnOp::delete(keys.placement(name), None),
                        TxnOp::delete(keys.global(name), None),
                    ];
                    let machines: BTreeSet<&str> = unit.machine.as_deref().into_iter().chain(now.as_deref()).collect();
                    deletes
                        .extend(machines.into_iter().map(|machine| TxnOp::delete(keys.scheduled(machine, name), None)));
                    let unchanged = match *revision {
                        UNKNOWN_REVISION => Compare::version(keys.unit(name), CompareOp::Equal, 1),
                        revision => Compare::mod_revision(keys.unit(name), CompareOp::Equal, revision),
                    };
                    TxnOp::txn(Txn::new().when([unchanged]).and_then(deletes))
                })
                .collect();
            if let Err(error) = self.connection().big_txn(Txn::new().and_then(ops)).await {
                tracing::error!(%error, units = chunk.len(), "an import that failed could not take back the units it wrote");
            }
        }
    }
}
