//! A machine's unit states kept in pages (store format 2): one key per page of at most
//! [`PAGE_UNITS`] units, `unit-states/<machine>/<page>`, whose value is a JSON object of unit
//! name to [`fleet_core::UnitState`], each state encoded as its own key held it in format 1.
//! A report of many units of one machine is then one write, where it was one per unit.
//!
//! A unit's page is a hash of its name modulo the machine's page count (a power of two, from
//! its unit count), so a unit stays on its page while the count stays, and a report of one
//! unit rewrites one page. Readers see pages as the per-unit keys they stand for: a copy
//! expands them ([`expand`]) into `states/<machine>/<unit>` entries, so every reader of
//! states reads one layout whichever a machine wrote.

use std::collections::BTreeMap;

use etcd_client::{DeleteOptions, GetOptions, KeyValue, TxnOp};
use fleet_registry::RegistryError;
use serde_json::value::RawValue;

use crate::keys::Keys;
use crate::mirror::Expansion;

/// The most units a page holds while the machine's pages are as many as its count asks:
/// a page of states (about 200 bytes each) stays far below etcd's request limit.
pub(crate) const PAGE_UNITS: usize = 128;

/// How many pages a machine with `units` states has: a power of two, at least one.
pub(crate) fn page_count(units: usize) -> u32 {
    let needed = units.div_ceil(PAGE_UNITS).max(1);
    u32::try_from(needed.next_power_of_two()).unwrap_or(u32::MAX)
}

/// The page of `unit` among `pages`: FNV-1a of its name (stable across builds and releases,
/// unlike std's hasher), modulo the count.
pub(crate) fn page_of(unit: &str, pages: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in unit.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(pages.max(1))) as u32
}

/// The pages of one machine's states (`states`: unit name → its encoded state), by page
/// number; states that are not JSON are left out (they were encoded by this process).
pub(crate) fn paged(states: &BTreeMap<String, Vec<u8>>) -> BTreeMap<u32, Vec<u8>> {
    let pages = page_count(states.len());
    let mut split: BTreeMap<u32, BTreeMap<&str, &RawValue>> = BTreeMap::new();
    for (unit, state) in states {
        let Ok(raw) = serde_json::from_slice::<&RawValue>(state) else { continue };
        split.entry(page_of(unit, pages)).or_default().insert(unit, raw);
    }
    split.into_iter().filter_map(|(page, states)| Some((page, serde_json::to_vec(&states).ok()?))).collect()
}

/// The per-unit states a page at `key` stands for: (unit name, encoded state), in name order.
pub(crate) fn expand(key: &str, page: &[u8]) -> Result<Vec<(String, Vec<u8>)>, RegistryError> {
    let states: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(page)
        .map_err(|error| RegistryError::Corrupt { key: key.to_string(), reason: error.to_string() })?;
    Ok(states.into_iter().map(|(unit, state)| (unit, state.get().as_bytes().to_vec())).collect())
}

/// Which keys stand for a machine's states in a copy of `keys`' store.
pub(crate) fn expansion(keys: &Keys) -> Expansion {
    Expansion { pages: keys.all_state_pages(), units: keys.all_states() }
}

/// Deletes every state of `machine`, in either layout.
pub(crate) fn deletes(keys: &Keys, machine: &str) -> [TxnOp; 2] {
    let all = || Some(DeleteOptions::new().with_prefix());
    [TxnOp::delete(keys.state(machine, ""), all()), TxnOp::delete(keys.machine_state_pages(machine), all())]
}

/// Reads every state of `machine`, in either layout: answered by [`per_unit`].
pub(crate) fn gets(keys: &Keys, machine: &str) -> [TxnOp; 2] {
    let all = || Some(GetOptions::new().with_prefix());
    [TxnOp::get(keys.state(machine, ""), all()), TxnOp::get(keys.machine_state_pages(machine), all())]
}

/// The states `kvs` (keys of either layout) hold, by their per-unit key (`states/<machine>/<unit>`).
pub(crate) fn per_unit<'a>(keys: &Keys, kvs: impl IntoIterator<Item = &'a KeyValue>) -> BTreeMap<String, Vec<u8>> {
    let expansion = expansion(keys);
    let mut states = BTreeMap::new();
    for kv in kvs {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match expansion.expanded(&key, kv.value()) {
            Some(standing) => states.extend(standing),
            None => {
                states.insert(key, kv.value().to_vec());
            }
        }
    }
    states
}

/// Key → new value (`None`: removed).
pub(crate) type Changes = Vec<(String, Option<Vec<u8>>)>;

/// A machine's states as its session holds them: by per-unit key, and as pages written.
pub(crate) type HeldStates = (BTreeMap<String, Vec<u8>>, WrittenPages);

/// What a machine's session last wrote of its pages, so that a report rewrites only the
/// pages it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WrittenPages {
    /// Each page known to be stored, as it is.
    pages: BTreeMap<u32, Vec<u8>>,
    /// Pages below this number not in `pages` may be stored too (a write that failed part
    /// way, or a count that shrank): the next write deletes them.
    unknown_below: u32,
    /// Whether the machine's states are in pages, its per-unit keys (format 1) gone.
    paged: bool,
}

impl WrittenPages {
    /// What `kvs` (the machine's states in either layout, as read) hold of pages.
    pub(crate) fn read<'a>(keys: &Keys, machine: &str, kvs: impl IntoIterator<Item = &'a KeyValue>) -> Self {
        let prefix = keys.machine_state_pages(machine);
        let mut written = Self { paged: true, ..Self::default() };
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key());
            match key.strip_prefix(&prefix).map(str::parse::<u32>) {
                Some(Ok(page)) => {
                    written.pages.insert(page, kv.value().to_vec());
                }
                Some(Err(_)) => {}
                None => written.paged = false,
            }
        }
        written
    }

    /// The writes that bring the machine's stored states to `states` (per-unit key → encoded
    /// state, all of the machine's): changed pages put, pages no longer used deleted, and
    /// the first time, the per-unit keys `per_unit_keys` deleted. Returns the writes and what
    /// is stored once they are written.
    pub(crate) fn writes_for(
        &self,
        keys: &Keys,
        machine: &str,
        states: &BTreeMap<String, Vec<u8>>,
        per_unit_keys: impl IntoIterator<Item = String>,
    ) -> (Changes, WrittenPages) {
        let prefix = keys.state(machine, "");
        let by_unit: BTreeMap<String, Vec<u8>> = states
            .iter()
            .filter_map(|(key, state)| Some((key.strip_prefix(&prefix)?.to_string(), state.clone())))
            .collect();
        let pages = paged(&by_unit);
        let mut writes: Changes = pages
            .iter()
            .filter(|(page, value)| self.pages.get(page) != Some(*value))
            .map(|(page, value)| (keys.state_page(machine, *page), Some(value.clone())))
            .collect();
        let maybe_stored = self.pages.keys().copied().chain(0..self.unknown_below);
        let gone: std::collections::BTreeSet<u32> = maybe_stored.filter(|page| !pages.contains_key(page)).collect();
        writes.extend(gone.into_iter().map(|page| (keys.state_page(machine, page), None)));
        if !self.paged {
            writes.extend(per_unit_keys.into_iter().map(|key| (key, None)));
        }
        (writes, WrittenPages { pages, unknown_below: 0, paged: true })
    }

    /// What may be stored after `self` was stored and a write towards `next` failed (part
    /// of it may have landed): contents unknown, so the next write puts every page.
    pub(crate) fn after_failure(&self, next: &WrittenPages) -> WrittenPages {
        let past = |pages: &BTreeMap<u32, Vec<u8>>| pages.keys().next_back().map_or(0, |last| last + 1);
        let unknown_below = self.unknown_below.max(past(&self.pages)).max(past(&next.pages));
        WrittenPages { pages: BTreeMap::new(), unknown_below, paged: self.paged }
    }

    /// The keys of the pages surely stored.
    pub(crate) fn stored_pages(&self, keys: &Keys, machine: &str) -> std::collections::HashSet<String> {
        self.pages.keys().map(|page| keys.state_page(machine, *page)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(count: usize) -> BTreeMap<String, Vec<u8>> {
        (0..count).map(|i| (format!("u{i}.service"), format!(r#"{{"name":"u{i}.service"}}"#).into_bytes())).collect()
    }

    #[test]
    fn pages_hold_every_state_once_and_no_more_than_twice_a_page_s_share() {
        for count in [0, 1, 10, 128, 129, 1000] {
            let all = states(count);
            let pages = paged(&all);
            assert!(pages.len() <= page_count(count) as usize);
            let mut back = BTreeMap::new();
            for (page, value) in &pages {
                let expanded = expand("k", value).unwrap();
                assert!(expanded.len() <= 2 * PAGE_UNITS, "page {page} of {count} holds {}", expanded.len());
                back.extend(expanded);
            }
            assert_eq!(back, all, "{count} states");
        }
    }

    #[test]
    fn a_unit_keeps_its_page_while_the_count_keeps() {
        assert_eq!(page_count(0), 1);
        assert_eq!(page_count(128), 1);
        assert_eq!(page_count(129), 2);
        assert_eq!(page_count(300), 4);
        // Fixed for good: a page written by one release is read by the next.
        // Pinned: a page written by one release is read by the next.
        assert_eq!(page_of("a.service", 1024), 605);
        assert_eq!(page_of("a.service", 4), 1);
        assert_eq!(page_of("web@1.service", 1), 0);
    }

    #[test]
    fn a_page_that_is_not_json_is_an_error_naming_its_key() {
        let error = expand("prefix/unit-states/m1/0", b"{not json").unwrap_err();
        assert!(error.to_string().contains("prefix/unit-states/m1/0"), "{error}");
    }
}
