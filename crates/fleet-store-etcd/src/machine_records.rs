//! A machine as the watch-fed copy holds it: its presence record, its metadata overrides and
//! its drain, each decoded once per revision.

use fleet_core::MachineState;
use fleet_core::drain::Drain;
use fleet_registry::codec::machine_with;

use super::mirror::{Entry, MirrorData};

/// The machine whose presence is `entry` (at `key`), with the metadata overrides at
/// `metadata_key` and the drain at `drain_key` if asked for. Each record is decoded once per
/// revision (`mirror::Entry::decoded_listed`): every engine pass reads every machine, and
/// while 10,000 machines joined, decoding their records again on each pass was a twentieth of
/// their manager's CPU.
pub(super) fn machine_of(
    data: &MirrorData,
    key: &str,
    entry: &Entry,
    metadata_key: &str,
    drain_key: Option<&str>,
) -> Option<MachineState> {
    let machine = entry.decoded_listed::<MachineState>(key)?;
    let overrides = data.entries.get(metadata_key).and_then(|entry| entry.decoded_listed(metadata_key));
    let drain = drain_key
        .and_then(|drain_key| Some((drain_key, data.entries.get(drain_key)?)))
        .and_then(|(drain_key, entry)| entry.decoded_listed::<Drain>(drain_key));
    Some(machine_with(MachineState::clone(&machine), overrides.as_deref(), drain.as_deref().cloned()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fleet_registry::codec::encode;

    use super::*;

    fn entry(value: Vec<u8>, revision: i64) -> Entry {
        Entry::new(value, revision, revision, 0)
    }

    fn copy_with(records: &[(&str, Entry)]) -> MirrorData {
        let mut data = MirrorData::default();
        for (key, entry) in records {
            data.entries.insert((*key).to_string(), entry.clone());
        }
        data
    }

    #[test]
    fn a_machine_takes_its_overrides_and_drain_and_each_record_is_decoded_once() {
        let machine =
            MachineState { id: "m1".into(), metadata: [("zone".into(), "a".into())].into(), ..Default::default() };
        let overrides: BTreeMap<String, String> = [("zone".into(), "b".into()), ("rack".into(), "r1".into())].into();
        let drain = Drain::new(fleet_core::rollout::MaxUnavailable::Count(1), 1_700_000_000);
        let data = copy_with(&[
            ("machines/m1", entry(encode(&machine), 1)),
            ("metadata/m1", entry(encode(&overrides), 2)),
            ("drains/m1", entry(encode(&drain), 3)),
        ]);
        let presence = &data.entries["machines/m1"];
        let read = |drain_key| machine_of(&data, "machines/m1", presence, "metadata/m1", drain_key);
        let first = read(Some("drains/m1")).expect("readable");
        assert_eq!(first.metadata, overrides);
        assert_eq!(first.drain, Some(drain));
        for key in ["machines/m1", "metadata/m1", "drains/m1"] {
            assert_eq!(format!("{:?}", data.entries[key].decoded), "Decoded(kept)", "{key} decoded and kept");
        }
        assert_eq!(read(Some("drains/m1")), Some(first.clone()), "read again from what was kept");
        assert_eq!(read(None).map(|machine| machine.drain), Some(None), "no drain unless asked for");
        let unreadable = copy_with(&[("machines/m2", entry(b"{not json".to_vec(), 4))]);
        assert_eq!(
            machine_of(&unreadable, "machines/m2", &unreadable.entries["machines/m2"], "metadata/m2", None),
            None
        );
    }
}
