//! An import (`ApiRegistry::import_units`): units written with their placements, many per
//! transaction, each on the condition that neither its unit nor its placement exists and that
//! nothing in its `destroyed/` bucket was destroyed since it was seen absent (as any create);
//! when one finds its name taken, or etcd fails, what the import wrote is deleted again, so it
//! leaves all of its units or none. An import that failed first fences its chunks as a destroy
//! would, so one etcd carries out late (its answer lost) writes nothing. (Bodies it wrote stay:
//! the engine collects those no unit has.)

use std::collections::{BTreeMap, BTreeSet, HashSet};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use fleet_core::{Requirements, UnitHash};
use fleet_registry::codec::encode;
use fleet_registry::{Imported, ImportedUnit, RegistryError, Result, UnitRecord, Writer};

use super::EtcdRegistry;
use super::api::{Writes, put_if_absent};
use super::connection::NESTED_PER_TXN;
use super::records::{Assignment, CarryingAssignment};

/// The most bytes one transaction carries (etcd refuses requests over 1.5 MiB).
const BYTES_PER_TXN: usize = 1024 * 1024;

/// A unit whose write was not answered: taken back only if written once and not since.
const UNKNOWN_REVISION: i64 = 0;

/// How often units refused for a destroy beside them are seen and written again.
const FENCED_ATTEMPTS: usize = 5;

/// What sending an import's chunks came to.
enum Chunks<'a> {
    /// Written, but for these units, refused for a destroy in their `destroyed/` bucket since
    /// they were seen absent.
    Fenced(Vec<&'a ImportedUnit>),
    /// These names are taken: the import writes nothing.
    Taken(Vec<String>),
}

/// Whether the counts of a refused unit's else branch found neither it nor its placement.
fn found_none(counts: &[TxnOpResponse]) -> bool {
    counts.iter().all(|response| matches!(response, TxnOpResponse::Get(get) if get.count() == 0))
}

/// One imported unit and its nested transaction's writes.
pub(super) struct Written<'a> {
    unit: &'a ImportedUnit,
    writes: Writes,
}

impl EtcdRegistry {
    pub(super) async fn import(&self, units: &[ImportedUnit], writer: &Writer) -> Result<Imported> {
        let all: Vec<&ImportedUnit> = units.iter().collect();
        let (existing, seen_at) = self.existing_units(&all).await?;
        if !existing.is_empty() {
            return Ok(Imported::Existing(existing));
        }
        self.import_seen_absent(all, seen_at, writer).await
    }

    /// Writes `units`, all seen absent at revision `seen_at`. Each is written on the condition
    /// that neither it nor its placement exists and that no unit of its `destroyed/` bucket was
    /// destroyed since `seen_at` (as a create is, `api.rs::write_conditions`); units refused for
    /// a destroy beside them are seen again and written again, a few times at most.
    pub(super) async fn import_seen_absent(
        &self,
        mut pending: Vec<&ImportedUnit>,
        mut seen_at: i64,
        writer: &Writer,
    ) -> Result<Imported> {
        let mut written: Vec<(&ImportedUnit, i64)> = Vec::new();
        for _ in 0..FENCED_ATTEMPTS {
            let fenced = match self.write_chunks(&pending, seen_at, writer, &mut written).await {
                Ok(Chunks::Fenced(fenced)) => fenced,
                Ok(Chunks::Taken(taken)) => {
                    self.take_back(&written).await;
                    return Ok(Imported::Existing(taken));
                }
                Err(error) => {
                    self.give_up(&written).await;
                    return Err(error);
                }
            };
            if fenced.is_empty() {
                return Ok(Imported::Written);
            }
            let existing = self.existing_units(&fenced).await;
            match existing {
                Ok((existing, _)) if !existing.is_empty() => {
                    self.take_back(&written).await;
                    return Ok(Imported::Existing(existing));
                }
                Ok((_, now)) => (pending, seen_at) = (fenced, now),
                Err(error) => {
                    self.take_back(&written).await;
                    return Err(error);
                }
            }
        }
        self.take_back(&written).await;
        Err(RegistryError::Unavailable(format!(
            "etcd: units kept being destroyed beside the import's (their names share its units' destroy records) through {FENCED_ATTEMPTS} attempts; nothing was imported, run it again"
        )))
    }

    /// Sends `units` in chunks, each unit seen absent at `seen_at`, recording in `written`
    /// each one written (at its revision, or unknown for a chunk etcd did not answer).
    async fn write_chunks<'a>(
        &self,
        units: &[&'a ImportedUnit],
        seen_at: i64,
        writer: &Writer,
        written: &mut Vec<(&'a ImportedUnit, i64)>,
    ) -> Result<Chunks<'a>> {
        let mut fenced = Vec::new();
        let mut next = 0;
        while next < units.len() {
            let (chunk, bodies, after) = self.import_chunk(units, next, writer);
            next = after;
            let txn = self.chunk_txn(&chunk, &bodies, seen_at);
            let reply = match self.connection().big_txn(txn).await {
                Ok(reply) => reply,
                Err(error) => {
                    // The chunk may have been written without its answer reaching here.
                    written.extend(chunk.iter().map(|nested| (nested.unit, UNKNOWN_REVISION)));
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
                    // Refused: its else branch counted the unit and its placement.
                    TxnOpResponse::Txn(inner) if found_none(&inner.op_responses()) => fenced.push(nested.unit),
                    _ => taken.push(nested.unit.name.clone()),
                }
            }
            if !taken.is_empty() {
                return Ok(Chunks::Taken(taken));
            }
        }
        Ok(Chunks::Fenced(fenced))
    }

    /// One chunk's transaction: its bodies where absent, and each unit's nested transaction
    /// on the conditions of [`Self::import_seen_absent`], counting the unit and its placement
    /// where refused (a refusal that finds neither was a destroy beside it).
    pub(super) fn chunk_txn(&self, chunk: &[Written<'_>], bodies: &BTreeMap<String, Vec<u8>>, seen_at: i64) -> Txn {
        let keys = self.keys();
        let mut ops: Vec<TxnOp> = bodies.iter().map(|(key, value)| put_if_absent(key, value.clone())).collect();
        for nested in chunk {
            let name = nested.unit.name.as_str();
            let (unit_key, placement_key) = (keys.unit(name), keys.placement(name));
            let absent = [
                Compare::version(unit_key.as_str(), CompareOp::Equal, 0),
                Compare::version(placement_key.as_str(), CompareOp::Equal, 0),
                Compare::mod_revision(keys.destroyed(name), CompareOp::Less, seen_at + 1),
            ];
            let count = || Some(GetOptions::new().with_count_only());
            let found = [TxnOp::get(unit_key, count()), TxnOp::get(placement_key, count())];
            ops.push(TxnOp::txn(Txn::new().when(absent).and_then(nested.writes.ops.clone()).or_else(found)));
        }
        Txn::new().and_then(ops)
    }

    /// Gives up an import that failed with `written` sent: first fences every chunk sent, as
    /// a destroy of their names does (a chunk etcd carries out after this, its answer lost, is
    /// refused), then takes back what is there.
    pub(super) async fn give_up(&self, written: &[(&ImportedUnit, i64)]) {
        let keys = self.keys();
        let mut fences: BTreeMap<String, &str> = BTreeMap::new();
        for (unit, _) in written {
            fences.entry(keys.destroyed(&unit.name)).or_insert(&unit.name);
        }
        let puts: Vec<TxnOp> = fences.iter().map(|(key, name)| TxnOp::put(key.as_str(), *name, None)).collect();
        for batch in puts.chunks(NESTED_PER_TXN) {
            if let Err(error) = self.connection().big_txn(Txn::new().and_then(batch.to_vec())).await {
                tracing::error!(%error, "an import that failed could not fence the writes it may still have on their way");
            }
        }
        self.take_back(written).await;
    }

    /// The names of `units` that exist already, read from etcd (a copy could be behind), and
    /// the revision they were all seen at or after.
    pub(super) async fn existing_units(&self, units: &[&ImportedUnit]) -> Result<(Vec<String>, i64)> {
        let keys = self.keys();
        let mut existing = Vec::new();
        let mut seen_at: Option<i64> = None;
        for chunk in units.chunks(NESTED_PER_TXN) {
            let gets = chunk
                .iter()
                .map(|unit| TxnOp::get(keys.unit(&unit.name), Some(GetOptions::new().with_count_only())))
                .collect();
            let (revision, replies) = self.connection().read(gets).await?;
            seen_at = Some(seen_at.map_or(revision, |seen| seen.min(revision)));
            for (unit, reply) in chunk.iter().zip(replies) {
                if reply.count() > 0 {
                    existing.push(unit.name.clone());
                }
            }
        }
        Ok((existing, seen_at.unwrap_or(0)))
    }

    /// The units from `start` that fit one transaction with the bodies they need, and where
    /// the next chunk starts.
    pub(super) fn import_chunk<'a>(
        &self,
        units: &[&'a ImportedUnit],
        start: usize,
        writer: &Writer,
    ) -> (Vec<Written<'a>>, BTreeMap<String, Vec<u8>>, usize) {
        let keys = self.keys();
        let (mut chunk, mut bodies, mut bytes) = (Vec::new(), BTreeMap::new(), 0);
        // A machine's first unit of each content carries the body, as the engine's writes do.
        let mut carried_to: HashSet<(&str, UnitHash)> = HashSet::new();
        let mut index = start;
        while index < units.len() && chunk.len() + bodies.len() + 2 <= NESTED_PER_TXN && bytes < BYTES_PER_TXN {
            let unit = units[index];
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
