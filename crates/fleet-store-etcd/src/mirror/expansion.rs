//! A copy that holds keys standing for several others (a machine's pages of unit states) also
//! holds those others, as if they were written one by one: its readers read one layout.
//!
//! A machine switches layout in one transaction (its pages put, its per-unit keys deleted),
//! but ranges are watched apart, so the copy may apply the deletes after the pages: a key
//! shown both ways keeps showing while either shows it. Each change of a machine's pages
//! recomputes what all its pages show.

use std::collections::BTreeMap;

use super::Entry;
use crate::state_pages;

/// Which keys of a copy stand for others: `<pages><machine>/<page>` holds the states of
/// `<units><machine>/<unit>`.
#[derive(Clone, Debug)]
pub struct Expansion {
    pub pages: String,
    pub units: String,
}

impl Expansion {
    /// The per-unit keys and values page `key` holding `value` stands for; `None` when `key`
    /// is not a page. A page that does not decode stands for nothing (and is logged).
    pub(crate) fn expanded(&self, key: &str, value: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
        let machine = self.machine_of_page(key)?;
        match state_pages::expand(key, value) {
            Ok(states) => Some(
                states
                    .into_iter()
                    .filter(|(unit, _)| !unit.is_empty() && !unit.contains('/'))
                    .map(|(unit, state)| (format!("{}{machine}/{unit}", self.units), state))
                    .collect(),
            ),
            Err(error) => {
                tracing::error!(%error, "skipping a page of unit states that cannot be read");
                Some(Vec::new())
            }
        }
    }

    fn machine_of_page<'k>(&self, key: &'k str) -> Option<&'k str> {
        let (machine, page) = key.strip_prefix(&self.pages)?.rsplit_once('/')?;
        (!machine.is_empty() && !machine.contains('/') && page.parse::<u32>().is_ok()).then_some(machine)
    }

    fn machine_of_unit<'k>(&self, key: &'k str) -> Option<&'k str> {
        let (machine, unit) = key.strip_prefix(&self.units)?.split_once('/')?;
        (!machine.is_empty() && !unit.is_empty() && !unit.contains('/')).then_some(machine)
    }

    /// What every page of `machine` in `entries` shows, by per-unit key, with the page it
    /// came from.
    fn shown<'e>(&self, entries: &'e BTreeMap<String, Entry>, machine: &str) -> BTreeMap<String, (Vec<u8>, &'e Entry)> {
        let prefix = format!("{}{machine}/", self.pages);
        let pages = entries.range(prefix.clone()..).take_while(|(key, _)| key.starts_with(&prefix));
        let mut shown = BTreeMap::new();
        for (key, page) in pages {
            for (unit_key, state) in self.expanded(key, &page.value).unwrap_or_default() {
                shown.insert(unit_key, (state, page));
            }
        }
        shown
    }

    /// Adds to a fresh listing's `entries` the keys its pages stand for.
    pub fn expand_listing(&self, entries: &mut BTreeMap<String, Entry>) {
        let machines: Vec<String> = entries
            .range(self.pages.clone()..)
            .take_while(|(key, _)| key.starts_with(&self.pages))
            .filter_map(|(key, _)| self.machine_of_page(key).map(str::to_string))
            .collect();
        let mut standing = Vec::new();
        for machine in machines.iter().collect::<std::collections::BTreeSet<_>>() {
            let shown = self.shown(entries, machine);
            standing.extend(shown.into_iter().map(|(key, (state, page))| (key, Self::entry_of(page, state))));
        }
        entries.extend(standing);
    }

    /// Applies a change of `key` (its new entry, or `None`: deleted) to `entries`, with the
    /// keys it stands for when it is a page; returns those others whose value changed. A state
    /// shown as before keeps its entry (and what readers decoded of it).
    pub fn apply(&self, entries: &mut BTreeMap<String, Entry>, key: &str, new: Option<Entry>) -> Vec<String> {
        if let Some(machine) = self.machine_of_page(key).map(str::to_string) {
            let before = self.shown(entries, &machine);
            let before: BTreeMap<String, Vec<u8>> =
                before.into_iter().map(|(unit_key, (state, _))| (unit_key, state)).collect();
            Self::set(entries, key, new);
            let after: Vec<(String, Vec<u8>, Entry)> = self
                .shown(entries, &machine)
                .into_iter()
                .map(|(unit_key, (state, page))| (unit_key, state.clone(), Self::entry_of(page, state)))
                .collect();
            let mut changed = Vec::new();
            for unit_key in before.keys() {
                let still = after.iter().any(|(shown, _, _)| shown == unit_key);
                if !still && entries.get(unit_key).is_some_and(|entry| entry.from_page) {
                    entries.remove(unit_key);
                    changed.push(unit_key.clone());
                }
            }
            for (unit_key, state, entry) in after {
                if entries.get(&unit_key).is_some_and(|held| held.value == state) {
                    continue;
                }
                entries.insert(unit_key.clone(), entry);
                changed.push(unit_key);
            }
            return changed;
        }
        let deleted_unit = new.is_none().then(|| self.machine_of_unit(key)).flatten().map(str::to_string);
        Self::set(entries, key, new);
        // A per-unit key deleted while its machine's pages show the unit (a switch of layout
        // applied pages first): the page's state stays.
        if let Some(machine) = deleted_unit
            && let Some((state, page)) = self.shown(entries, &machine).remove(key)
        {
            let entry = Self::entry_of(page, state);
            entries.insert(key.to_string(), entry);
        }
        Vec::new()
    }

    fn set(entries: &mut BTreeMap<String, Entry>, key: &str, new: Option<Entry>) {
        match new {
            Some(entry) => entries.insert(key.to_string(), entry),
            None => entries.remove(key),
        };
    }

    fn entry_of(page: &Entry, state: Vec<u8>) -> Entry {
        Entry { from_page: true, ..Entry::new(state, page.create_revision, page.mod_revision, page.lease) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expansion() -> Expansion {
        Expansion { pages: "p/unit-states/".into(), units: "p/states/".into() }
    }

    fn page(states: &[(&str, &str)], revision: i64) -> Entry {
        let value = format!(
            "{{{}}}",
            states.iter().map(|(unit, state)| format!("\"{unit}\":{state}")).collect::<Vec<_>>().join(",")
        );
        Entry::new(value.into_bytes(), 1, revision, 7)
    }

    fn state(value: &str, revision: i64) -> Entry {
        Entry::new(value.as_bytes().to_vec(), 1, revision, 7)
    }

    #[test]
    fn a_page_shows_as_its_units_keys_until_it_changes_or_goes() {
        let expansion = expansion();
        let mut entries = BTreeMap::new();
        entries.insert("p/unit-states/m1/0".to_string(), page(&[("a.service", "1"), ("b.service", "2")], 5));
        expansion.expand_listing(&mut entries);
        assert_eq!(entries["p/states/m1/a.service"].value, b"1");
        assert_eq!(entries["p/states/m1/b.service"].lease, 7);

        let second = page(&[("a.service", "1"), ("c.service", "3")], 6);
        let changed = expansion.apply(&mut entries, "p/unit-states/m1/0", Some(second));
        assert_eq!(changed, ["p/states/m1/b.service", "p/states/m1/c.service"]);
        assert_eq!(entries["p/states/m1/a.service"].mod_revision, 5, "an unchanged state keeps its entry");
        assert!(!entries.contains_key("p/states/m1/b.service"));

        let changed = expansion.apply(&mut entries, "p/unit-states/m1/0", None);
        assert_eq!(changed, ["p/states/m1/a.service", "p/states/m1/c.service"]);
        assert!(entries.is_empty(), "{entries:?}");
    }

    /// The switch of layout seen pages first: the per-unit keys' deletes that follow leave
    /// the states the page shows.
    #[test]
    fn a_per_unit_key_deleted_after_its_page_came_leaves_the_pages_state() {
        let expansion = expansion();
        let mut entries = BTreeMap::new();
        for unit in ["a.service", "b.service"] {
            expansion.apply(&mut entries, &format!("p/states/m1/{unit}"), Some(state("1", 3)));
        }
        expansion.apply(&mut entries, "p/unit-states/m1/0", Some(page(&[("a.service", "1"), ("b.service", "1")], 4)));
        for unit in ["a.service", "b.service"] {
            expansion.apply(&mut entries, &format!("p/states/m1/{unit}"), None);
        }
        assert_eq!(entries["p/states/m1/a.service"].value, b"1");
        assert!(entries["p/states/m1/b.service"].from_page);
        assert_eq!(entries.len(), 3);
    }

    /// Pages that shrink to one: a unit moved onto the page that stays keeps showing, in
    /// whatever order the page's put and the others' deletes apply.
    #[test]
    fn a_unit_moved_between_pages_keeps_showing_whatever_the_order() {
        let expansion = expansion();
        for put_first in [true, false] {
            let mut entries = BTreeMap::new();
            expansion.apply(&mut entries, "p/unit-states/m1/0", Some(page(&[("a.service", "1")], 2)));
            expansion.apply(&mut entries, "p/unit-states/m1/1", Some(page(&[("b.service", "2")], 2)));
            let merged = page(&[("a.service", "1"), ("b.service", "2")], 3);
            if put_first {
                expansion.apply(&mut entries, "p/unit-states/m1/0", Some(merged));
                expansion.apply(&mut entries, "p/unit-states/m1/1", None);
            } else {
                expansion.apply(&mut entries, "p/unit-states/m1/1", None);
                expansion.apply(&mut entries, "p/unit-states/m1/0", Some(merged));
            }
            assert_eq!(entries["p/states/m1/b.service"].value, b"2", "put first: {put_first}");
            assert_eq!(entries.len(), 3, "put first: {put_first}");
        }
    }

    #[test]
    fn keys_that_are_not_pages_stand_for_nothing() {
        let expansion = expansion();
        let mut entries = BTreeMap::new();
        assert!(expansion.apply(&mut entries, "p/unit-states/m1", Some(state("{}", 2))).is_empty());
        entries.insert("p/unit-states/m2/0".into(), state("not json", 2));
        expansion.expand_listing(&mut entries);
        assert_eq!(entries.len(), 2);
    }
}
