//! How many units report launched, counted from a watch of the unit states alone: followed
//! from before the units are submitted, waiting for them costs etcd no listing of the whole
//! cluster at the end and the bench no page of every unit each second, work that the machine
//! under measurement would otherwise share with the bench. States are read in both layouts
//! of the store: a key per unit (`states/`), and a machine's pages (`unit-states/`, a JSON
//! object of unit name to state).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use etcd_client::{EventType, GetOptions, WatchOptions};
use fleet_core::UnitState;
use tokio::sync::watch;

/// The largest listing or watch message the bench takes from etcd.
const REPLY_MAX_BYTES: usize = 512 * 1024 * 1024;

/// The count, kept current by a task that follows etcd.
pub struct LaunchedUnits {
    count: watch::Receiver<usize>,
    task: tokio::task::AbortHandle,
}

impl Drop for LaunchedUnits {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LaunchedUnits {
    /// Lists the unit states under `prefix` (the store's key prefix) on etcd at `endpoint`,
    /// then follows them.
    pub async fn follow(endpoint: &str, prefix: &str) -> Self {
        let client = etcd_client::Client::connect([endpoint], None).await.expect("connect to etcd");
        let tally = Arc::new(Mutex::new(Tally::default()));
        let (sender, count) = watch::channel(0);
        let sender = Arc::new(sender);
        let mut tasks = tokio::task::JoinSet::new();
        for range in [format!("{prefix}states/"), format!("{prefix}unit-states/")] {
            let stream = follow_range(&client, &range, &tally).await;
            let (tally, sender) = (tally.clone(), sender.clone());
            tasks.spawn(count_from(stream, tally, sender));
        }
        sender.send_replace(tally.lock().expect("the tally").launched());
        let task = tokio::spawn(async move { while tasks.join_next().await.is_some() {} }).abort_handle();
        Self { count, task }
    }

    /// How many units have a state that says launched, moving as they change.
    pub fn changes(&self) -> watch::Receiver<usize> {
        self.count.clone()
    }
}

/// Lists `range` into `tally`, and returns a watch of it from there on. 100,000 states list
/// to some 30 MiB, and etcd puts many events in one watch message (one of 6.5 MiB stopped the
/// bench at 10,000 machines): tonic's 4 MiB default would refuse both.
async fn follow_range(client: &etcd_client::Client, range: &str, tally: &Mutex<Tally>) -> etcd_client::WatchStream {
    let listed = client
        .kv_client()
        .max_decoding_message_size(REPLY_MAX_BYTES)
        .get(range, Some(GetOptions::new().with_prefix()))
        .await
        .expect("list the unit states");
    let revision = listed.header().map_or(0, |header| header.revision());
    {
        let mut tally = tally.lock().expect("the tally");
        for kv in listed.kvs() {
            tally.put(kv.key(), kv.value());
        }
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    client
        .watch_client()
        .max_decoding_message_size(REPLY_MAX_BYTES)
        .watch(range, Some(options))
        .await
        .expect("watch the unit states")
}

/// Applies `stream`'s events to `tally`, sending the count after each message.
async fn count_from(mut stream: etcd_client::WatchStream, tally: Arc<Mutex<Tally>>, sender: Arc<watch::Sender<usize>>) {
    while let Some(response) = stream.message().await.expect("the unit states' watch") {
        assert!(!response.canceled(), "the unit states' watch was cancelled: {}", response.cancel_reason());
        let mut tally = tally.lock().expect("the tally");
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => tally.put(kv.key(), kv.value()),
                EventType::Delete => tally.delete(kv.key()),
            }
        }
        sender.send_replace(tally.launched());
    }
}

/// The states that say launched, by key (a page's by its key and the unit's name), and how
/// many each unit has (a unit counts once, however many machines say they run it).
#[derive(Default)]
struct Tally {
    launched_states: HashMap<Vec<u8>, String>,
    by_unit: HashMap<String, usize>,
    /// The units each page held, by the page's key.
    pages: HashMap<Vec<u8>, Vec<String>>,
}

/// Whether `key` is a machine's page of states rather than one unit's state.
fn is_page(key: &[u8]) -> bool {
    String::from_utf8_lossy(key).contains("/unit-states/")
}

fn page_entry(page: &[u8], unit: &str) -> Vec<u8> {
    let mut key = page.to_vec();
    key.push(0);
    key.extend_from_slice(unit.as_bytes());
    key
}

impl Tally {
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.delete(key);
        if is_page(key) {
            // A page the bench cannot read counts as no state.
            let Ok(states) = serde_json::from_slice::<BTreeMap<String, UnitState>>(value) else { return };
            let units: Vec<String> = states.keys().cloned().collect();
            for (unit, state) in states {
                self.put_state(page_entry(key, &unit), state);
            }
            self.pages.insert(key.to_vec(), units);
            return;
        }
        // A state the bench cannot read counts as not launched.
        let Ok(state) = serde_json::from_slice::<UnitState>(value) else { return };
        self.put_state(key.to_vec(), state);
    }

    fn put_state(&mut self, key: Vec<u8>, state: UnitState) {
        if state.launched {
            *self.by_unit.entry(state.name.clone()).or_default() += 1;
            self.launched_states.insert(key, state.name);
        }
    }

    fn delete(&mut self, key: &[u8]) {
        if let Some(units) = self.pages.remove(key) {
            for unit in units {
                self.delete_state(&page_entry(key, &unit));
            }
            return;
        }
        self.delete_state(key);
    }

    fn delete_state(&mut self, key: &[u8]) {
        let Some(unit) = self.launched_states.remove(key) else { return };
        if let Entry::Occupied(mut states) = self.by_unit.entry(unit) {
            *states.get_mut() -= 1;
            if *states.get() == 0 {
                states.remove();
            }
        }
    }

    fn launched(&self) -> usize {
        self.by_unit.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{SystemdState, UnitFile};

    fn state(name: &str, machine: &str, launched: bool) -> Vec<u8> {
        let state = UnitState {
            name: name.into(),
            machine_id: machine.into(),
            hash: UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap().hash(),
            systemd: SystemdState::new("loaded", "active", "running"),
            launched,
            drift: None,
            health: None,
            secrets: Default::default(),
        };
        serde_json::to_vec(&state).unwrap()
    }

    fn page(states: &[(&str, bool)]) -> Vec<u8> {
        let states: BTreeMap<&str, serde_json::Value> = states
            .iter()
            .map(|(name, launched)| (*name, serde_json::from_slice(&state(name, "m1", *launched)).unwrap()))
            .collect();
        serde_json::to_vec(&states).unwrap()
    }

    /// A machine's states moving from a key each to one page, then the page changing.
    #[test]
    fn states_in_pages_count_as_the_units_they_hold() {
        let mut tally = Tally::default();
        tally.put(b"p/states/m1/a", &state("a", "m1", true));
        tally.put(b"p/unit-states/m1/0", &page(&[("a", true), ("b", true)]));
        tally.delete(b"p/states/m1/a");
        assert_eq!(tally.launched(), 2);
        tally.put(b"p/unit-states/m1/0", &page(&[("a", false), ("b", true), ("c", true)]));
        assert_eq!(tally.launched(), 2, "a no longer launched, c launched");
        tally.delete(b"p/unit-states/m1/0");
        assert_eq!(tally.launched(), 0);
    }

    #[test]
    fn a_unit_counts_once_while_some_state_of_it_says_launched() {
        let mut tally = Tally::default();
        tally.put(b"s/m1/a", &state("a", "m1", false));
        assert_eq!(tally.launched(), 0, "loaded is not launched");
        tally.put(b"s/m1/a", &state("a", "m1", true));
        tally.put(b"s/m2/a", &state("a", "m2", true));
        tally.put(b"s/m1/b", &state("b", "m1", true));
        assert_eq!(tally.launched(), 2, "a unit on two machines counts once");
        tally.delete(b"s/m1/a");
        assert_eq!(tally.launched(), 2, "a still runs on m2");
        tally.put(b"s/m2/a", &state("a", "m2", false));
        assert_eq!(tally.launched(), 1);
        tally.put(b"s/m1/b", b"{not json");
        assert_eq!(tally.launched(), 0, "an unreadable state counts as not launched");
        tally.delete(b"s/m9/z");
        assert_eq!(tally.launched(), 0);
    }
}
