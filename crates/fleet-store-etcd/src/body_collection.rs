//! Unit bodies are content-addressed and shared by every unit of that content; the engine
//! leader's fleetd deletes the ones no unit refers to any more (a chore, `chores.rs`). Its snapshots count the units of each
//! content as they decode the copy's records, so a content that loses its last unit is
//! noticed in proportion to the change; once per leadership it also lists `bodies/`, for
//! what went unused before it led.
//!
//! Why no reference keys are needed: every write of a unit record with some content writes
//! that content's body in the same transaction where it is absent (and only there: a body
//! never changes, so putting it again would cost etcd a put per unit for nothing). A body is
//! deleted only on the condition that it was last written, and every unit record last
//! written, at or before the revision of the copy that showed it unused: a unit that took up
//! the content since then either found the body there, and holds the deletion back, or
//! wrote it again after the deletion.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeSet, HashMap};

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp, TxnOpResponse};
use fleet_core::UnitHash;

use super::EtcdRegistry;
use super::connection::NESTED_PER_TXN;
use super::keys::prefix_end;
use fleet_registry::Result;

/// How many units of each content the cluster's cache holds, and the contents that lost their
/// last unit and wait to be collected.
#[derive(Default)]
pub(super) struct ContentCounts {
    in_use: HashMap<UnitHash, usize>,
    unused: BTreeSet<UnitHash>,
    /// The revision up to which the copy's units were counted.
    revision: i64,
    /// Whether `bodies/` was listed since this engine took the leadership.
    swept: bool,
    /// Moves whenever the counts are forgotten, so a collection that began before does not
    /// take an empty count for "unused".
    epoch: u64,
}

impl ContentCounts {
    pub fn add(&mut self, hash: UnitHash) {
        *self.in_use.entry(hash).or_default() += 1;
    }

    pub fn remove(&mut self, hash: UnitHash) {
        if let Some(count) = self.in_use.get_mut(&hash) {
            *count -= 1;
            if *count == 0 {
                self.in_use.remove(&hash);
                self.unused.insert(hash);
            }
        }
    }

    /// Notes that the counts hold every unit up to `revision`.
    pub fn counted_up_to(&mut self, revision: i64) {
        self.revision = revision;
    }

    /// Forgets everything (the copy is gone): the next leadership counts and sweeps afresh.
    pub fn clear(&mut self) {
        let epoch = self.epoch.wrapping_add(1);
        *self = Self { epoch, ..Self::default() };
    }

    /// Whether a collection would have anything to do: a sweep not made yet, or contents
    /// that lost their last unit.
    pub fn has_work(&self) -> bool {
        self.revision > 0 && (!self.swept || !self.unused.is_empty())
    }

    /// The contents to collect now, and the revision that showed them unused.
    fn due(&mut self) -> (Vec<UnitHash>, i64) {
        let in_use = &self.in_use;
        self.unused.retain(|hash| !in_use.contains_key(hash));
        (self.unused.iter().copied().collect(), self.revision)
    }
}

impl EtcdRegistry {
    /// Whether a collection would have anything to do.
    pub(super) fn bodies_to_collect(&self) -> bool {
        self.inner.engine_records.locked().contents.has_work()
    }

    /// Deletes the bodies no unit of the engine's last snapshot refers to; the first time
    /// after taking the leadership, every such body in `bodies/` (and the body reference keys
    /// that earlier versions wrote). Costs no request when nothing lost its last unit. Answers
    /// how many bodies are gone.
    pub(super) async fn delete_unused_bodies(&self) -> Result<usize> {
        let (mut candidates, revision, swept, epoch) = {
            let mut records = self.inner.engine_records.locked();
            let contents = &mut records.contents;
            let (swept, epoch) = (contents.swept, contents.epoch);
            let (candidates, revision) = contents.due();
            (candidates, revision, swept, epoch)
        };
        if revision == 0 {
            return Ok(0);
        }
        if !swept {
            candidates.extend(self.unused_in_store(revision, epoch).await?);
            candidates.sort_unstable();
            candidates.dedup();
        }
        let gone = self.delete_bodies_unchanged_since(&candidates, revision).await?;
        let mut records = self.inner.engine_records.locked();
        let contents = &mut records.contents;
        if contents.epoch == epoch {
            // A body written again since stays a candidate: the next collection looks again.
            contents.unused.extend(candidates.iter().filter(|hash| !gone.contains(hash)));
            for hash in &gone {
                contents.unused.remove(hash);
            }
            contents.swept = true;
        }
        Ok(gone.len())
    }

    /// The bodies in `bodies/` that no counted unit refers to and that were written at or
    /// before `revision` (none if the counts were forgotten meanwhile); the reference keys of
    /// earlier versions go with the listing.
    async fn unused_in_store(&self, revision: i64, epoch: u64) -> Result<Vec<UnitHash>> {
        let keys = self.keys();
        let bodies = keys.bodies();
        let listed = self.connection().get(&bodies, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        let legacy_refs = TxnOp::delete(keys.legacy_refs(), Some(DeleteOptions::new().with_prefix()));
        self.connection().txn(Txn::new().and_then([legacy_refs])).await?;
        let records = self.inner.engine_records.locked();
        if records.contents.epoch != epoch {
            return Ok(Vec::new());
        }
        Ok(listed
            .kvs()
            .iter()
            .filter(|kv| kv.mod_revision() <= revision)
            .filter_map(|kv| keys.name_in(&bodies, &String::from_utf8_lossy(kv.key())).and_then(UnitHash::parse_hex))
            .filter(|hash| !records.contents.in_use.contains_key(hash))
            .collect())
    }

    /// Deletes each body of `hashes` that was last written at or before `revision`, while no
    /// unit record was written after it; the hashes whose body is gone now (deleted, or there
    /// was none).
    async fn delete_bodies_unchanged_since(&self, hashes: &[UnitHash], revision: i64) -> Result<Vec<UnitHash>> {
        let keys = self.keys();
        let units = keys.units();
        let no_unit_written_since =
            Compare::mod_revision(units.as_str(), CompareOp::Less, revision + 1).with_range(prefix_end(&units));
        let mut gone = Vec::new();
        for chunk in hashes.chunks(NESTED_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|hash| {
                    let key = keys.body(&hash.to_string());
                    let unchanged = Compare::mod_revision(key.as_str(), CompareOp::Less, revision + 1);
                    let delete = TxnOp::delete(key.as_str(), None);
                    TxnOp::txn(Txn::new().when([unchanged]).and_then([delete]))
                })
                .collect();
            // Once per transaction, not per body: etcd compares every unit record for it.
            let txn = Txn::new().when([no_unit_written_since.clone()]).and_then(ops);
            let reply = self.connection().txn(txn).await?;
            if !reply.succeeded() {
                break;
            }
            for (hash, response) in chunk.iter().zip(reply.op_responses()) {
                if matches!(response, TxnOpResponse::Txn(inner) if inner.succeeded()) {
                    gone.push(*hash);
                }
            }
        }
        if !gone.is_empty() {
            tracing::debug!(bodies = gone.len(), "collected unit bodies no unit refers to");
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> UnitHash {
        fleet_core::UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep {n}\n")).unwrap().hash()
    }

    #[test]
    fn a_content_is_due_once_its_last_unit_goes_and_not_once_it_is_taken_up_again() {
        let mut counts = ContentCounts::default();
        counts.add(hash(1));
        counts.add(hash(1));
        counts.add(hash(2));
        counts.remove(hash(1));
        assert_eq!(counts.due().0, Vec::<UnitHash>::new(), "one unit still has it");
        counts.remove(hash(1));
        counts.remove(hash(2));
        counts.counted_up_to(7);
        let mut due = counts.due().0;
        due.sort_unstable();
        let mut expected = vec![hash(1), hash(2)];
        expected.sort_unstable();
        assert_eq!(due, expected);
        counts.add(hash(2));
        assert_eq!(counts.due(), (vec![hash(1)], 7), "taken up again before it was collected");
        counts.remove(hash(3));
        assert_eq!(counts.due().0, vec![hash(1)], "a content never counted is not due");
    }
}
