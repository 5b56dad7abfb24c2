//! A rollout on etcd, in pieces. Its driver stores a running rollout on every pass, and a
//! rollout may name 100,000 units, each with content of its own: whole, the record is
//! megabytes, more than one etcd request may carry, rewritten every pass. So it is kept as
//! a head at `rollouts/<name>` (the record without its units' names, contents and bodies,
//! plus the units' steps as runs), rewritten on each pass, and the part that never changes
//! while the rollout runs (names, contents, bodies), written once in slices of at most
//! [`PART_BYTES`] under `rollouts/<name>/<digest>/<index>`. The head names the digest of the
//! part it goes with; the slices are written before the head, in earlier revisions of the
//! same watched range, so a copy that holds a head holds its slices. Records stored whole
//! (before the pieces) are still read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use fleet_core::rollout::{FixedUnits, Rollout, StepRuns, join_units, split_units};
use fleet_registry::codec::{decode, encode};
use fleet_registry::{RegistryError, RolloutRecord};

/// The most bytes of the fixed part one slice carries (etcd refuses requests over 1.5 MiB
/// by default).
pub const PART_BYTES: usize = 512 * 1024;

/// What of a rollout stays as it is while it runs.
#[derive(Deserialize)]
pub struct Fixed {
    units: FixedUnits,
    bodies: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct FixedRef<'a> {
    units: &'a FixedUnits,
    bodies: &'a BTreeMap<String, String>,
}

/// What is rewritten on every pass.
#[derive(Serialize, Deserialize)]
pub struct Head {
    /// The record with no units and no bodies.
    record: RolloutRecord,
    /// The digest of the fixed part the head goes with, and how many slices it is.
    pub fixed: String,
    pub slices: usize,
    steps: StepRuns,
}

/// What a `rollouts/<name>` key holds: a head, or a record stored whole by an earlier version.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stored {
    Head(Head),
    Whole(RolloutRecord),
}

/// A record cut for storing: its head, and its fixed part in slices, with their digest.
pub struct Pieces {
    pub head: Vec<u8>,
    pub digest: String,
    pub slices: Vec<Vec<u8>>,
}

/// `record` cut into a head and the slices of its fixed part.
pub fn pieces(record: &RolloutRecord) -> Pieces {
    let (units, steps) = split_units(&record.rollout.units);
    let fixed = encode(&FixedRef { units: &units, bodies: &record.bodies });
    let digest = hex(ring::digest::digest(&ring::digest::SHA256, &fixed).as_ref());
    let slices: Vec<Vec<u8>> = fixed.chunks(PART_BYTES).map(<[u8]>::to_vec).collect();
    let head = Head { record: without_units(record), fixed: digest.clone(), slices: slices.len(), steps };
    Pieces { head: encode(&head), digest, slices }
}

/// Whether the `rollouts/<name>` value `stored` holds `record` (its head, as the record's own
/// pieces make it; or the whole record, stored by an earlier version), compared as records, not
/// as bytes: another version may encode the same head differently.
pub fn holds(stored: &[u8], record: &RolloutRecord) -> bool {
    match decode::<Stored>("rollouts/", stored) {
        Ok(Stored::Head(head)) => {
            let (_, steps) = split_units(&record.rollout.units);
            head.record == without_units(record) && head.steps == steps && head.fixed == pieces(record).digest
        }
        Ok(Stored::Whole(whole)) => whole == *record,
        Err(_) => false,
    }
}

/// The fixed part from its slices, in order (`key`: where they are, for an error).
pub fn fixed_from_slices<'a>(key: &str, slices: impl Iterator<Item = &'a [u8]>) -> Result<Fixed, RegistryError> {
    decode(key, &slices.collect::<Vec<&[u8]>>().concat())
}

/// The record a head and its fixed part make.
pub fn joined(head: &Head, fixed: &Fixed) -> Result<RolloutRecord, String> {
    let mut record = head.record.clone();
    record.rollout.units = join_units(&fixed.units, &head.steps)?;
    record.bodies = fixed.bodies.clone();
    Ok(record)
}

/// `record` with no units and no bodies: what its head carries beside the steps.
fn without_units(record: &RolloutRecord) -> RolloutRecord {
    // Destructured in full: a field added to a rollout must be carried here too.
    let RolloutRecord { name, rollout, bodies: _, created, source_commit, secret, started_by } = record;
    let Rollout { units: _, max_unavailable, min_ready, deadline, state, undo, canary, auto_revert, reverted, held } =
        rollout;
    RolloutRecord {
        name: name.clone(),
        rollout: Rollout {
            units: Vec::new(),
            max_unavailable: *max_unavailable,
            min_ready: *min_ready,
            deadline: *deadline,
            state: state.clone(),
            undo: *undo,
            canary: canary.clone(),
            auto_revert: *auto_revert,
            reverted: reverted.clone(),
            held: held.clone(),
        },
        bodies: BTreeMap::new(),
        created: *created,
        source_commit: source_commit.clone(),
        secret: secret.clone(),
        started_by: started_by.clone(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::UnitFile;
    use fleet_core::rollout::{MaxUnavailable, RolloutState, RolloutUnit, Step};

    fn record(units: usize, own_content: usize) -> RolloutRecord {
        let file = |text: &str| UnitFile::parse(&format!("[Service]\nExecStart={text}\n")).expect("a unit");
        let mut bodies = BTreeMap::new();
        let units = (0..units)
            .map(|index| {
                let to = if index < own_content { file(&format!("/bin/own {index}")) } else { file("/bin/b") };
                bodies.insert(to.hash().to_string(), to.serialize());
                RolloutUnit {
                    name: format!("web@{index}.service"),
                    from: file("/bin/a").hash(),
                    to: to.hash(),
                    step: Step::Waiting,
                }
            })
            .collect();
        RolloutRecord {
            name: "web".into(),
            rollout: Rollout {
                units,
                max_unavailable: MaxUnavailable::Percent(10),
                min_ready: 3,
                deadline: 60,
                state: RolloutState::Running,
                undo: false,
                canary: None,
                auto_revert: true,
                reverted: None,
                held: None,
            },
            bodies,
            created: 1_700_000_000,
            source_commit: Some(fleet_core::source::halt::RolledFrom { commit: "c0ffee".into(), forced: 2 }),
            secret: None,
            started_by: Some("token:ci".into()),
        }
    }

    fn read_back(pieces: &Pieces) -> RolloutRecord {
        let Ok(Stored::Head(head)) = decode::<Stored>("head", &pieces.head) else { panic!("a head") };
        assert_eq!((head.fixed.as_str(), head.slices), (pieces.digest.as_str(), pieces.slices.len()));
        let fixed = fixed_from_slices("slices", pieces.slices.iter().map(Vec::as_slice)).expect("the fixed part");
        joined(&head, &fixed).expect("joined")
    }

    #[test]
    fn a_record_cut_into_pieces_reads_back_whole() {
        for (units, own) in [(0, 0), (1, 1), (1000, 10), (20_000, 5_000)] {
            let record = record(units, own);
            let pieces = pieces(&record);
            assert!(pieces.slices.iter().all(|slice| slice.len() <= PART_BYTES));
            assert_eq!(read_back(&pieces), record);
        }
    }

    #[test]
    fn a_pass_rewrites_a_small_head_and_keeps_the_fixed_part() {
        let mut record = record(20_000, 5_000);
        let before = pieces(&record);
        assert!(before.slices.len() > 1, "a fixed part over one slice");
        for unit in record.rollout.units.iter_mut().take(2_000) {
            unit.step = Step::Replacing { since: 1_700_000_100 };
        }
        record.rollout.state = RolloutState::Paused { reason: "by hand".into() };
        let after = pieces(&record);
        assert_eq!(after.digest, before.digest, "the fixed part is the same");
        assert!(after.head.len() < 1_000, "a head of {} bytes", after.head.len());
        assert_eq!(read_back(&after), record);
    }

    #[test]
    fn a_record_stored_whole_is_still_read() {
        let record = record(3, 1);
        let Ok(Stored::Whole(read)) = decode::<Stored>("whole", &encode(&record)) else { panic!("whole") };
        assert_eq!(read, record);
    }

    /// Each slice of `name`'s fixed parts on etcd, with the revision it was last written at.
    async fn slices_on_etcd(registry: &crate::EtcdRegistry, name: &str) -> Vec<(String, i64)> {
        let prefix = registry.keys().rollout_slices(name);
        let reply = registry.connection().get(&prefix, Some(etcd_client::GetOptions::new().with_prefix())).await;
        let reply = reply.expect("a read of the slices");
        reply.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.mod_revision())).collect()
    }

    #[tokio::test]
    async fn a_pass_writes_the_head_alone_and_new_content_replaces_the_slices() {
        use fleet_registry::SourceRegistry;
        let etcd = fleet_testkit::EtcdServer::start();
        let registry = crate::tests::registry(&etcd, std::time::Duration::from_secs(10)).await;
        let mut record = record(20_000, 5_000);
        registry.put_rollout(&record).await.expect("stored");
        let slices = slices_on_etcd(&registry, "web").await;
        assert!(slices.len() > 1, "a fixed part of several slices: {slices:?}");
        for unit in record.rollout.units.iter_mut().take(2_000) {
            unit.step = Step::Replacing { since: 1_700_000_100 };
        }
        registry.put_rollout(&record).await.expect("stepped");
        assert_eq!(slices_on_etcd(&registry, "web").await, slices, "a pass leaves the slices as they were");
        assert_eq!(
            registry.rollouts().await.expect("read").iter().map(|read| (**read).clone()).collect::<Vec<_>>(),
            [record]
        );

        // Another rollout of the name, to other content: the first one's slices go.
        let other = RolloutRecord { name: "web".into(), ..super::tests::record(100, 10) };
        let mut other = other;
        other.rollout.units.iter_mut().for_each(|unit| unit.name = format!("api-{}", unit.name));
        registry.put_rollout(&other).await.expect("replaced");
        let now = slices_on_etcd(&registry, "web").await;
        assert!(now.len() == 1 && !slices.iter().any(|(key, _)| *key == now[0].0), "only the new slice: {now:?}");

        // A record an earlier version stored whole is read beside it.
        let whole = RolloutRecord { name: "old".into(), ..super::tests::record(3, 1) };
        let put = etcd_client::TxnOp::put(registry.keys().rollout("old"), encode(&whole), None);
        registry.connection().txn(etcd_client::Txn::new().and_then(vec![put])).await.expect("written whole");
        fleet_testkit::eventually("the whole record is read", || async {
            registry.rollouts().await.is_ok_and(|read| {
                read.iter().map(|read| (**read).clone()).collect::<Vec<_>>() == [whole.clone(), other.clone()]
            })
        })
        .await;

        assert!(registry.remove_rollout("web").await.expect("removed"));
        assert!(slices_on_etcd(&registry, "web").await.is_empty(), "its slices went with it");
        assert!(registry.remove_rollout("old").await.expect("removed"));
        assert!(registry.rollouts().await.expect("read").is_empty());
    }
}
