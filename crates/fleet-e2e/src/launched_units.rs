//! How many units report launched, counted from a watch of the unit states alone: followed
//! from before the units are submitted, waiting for them costs etcd no listing of the whole
//! cluster at the end and the bench no page of every unit each second, work that the machine
//! under measurement would otherwise share with the bench.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

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
        let states = format!("{prefix}states/");
        // 100,000 states list to some 30 MiB, and etcd puts many events in one watch message
        // (one of 6.5 MiB stopped the bench at 10,000 machines): tonic's 4 MiB default would
        // refuse both.
        let listed = client
            .kv_client()
            .max_decoding_message_size(REPLY_MAX_BYTES)
            .get(states.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .expect("list the unit states");
        let revision = listed.header().map_or(0, |header| header.revision());
        let mut tally = Tally::default();
        for kv in listed.kvs() {
            tally.put(kv.key(), kv.value());
        }
        let (sender, count) = watch::channel(tally.launched());
        let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let mut stream = client
            .watch_client()
            .max_decoding_message_size(REPLY_MAX_BYTES)
            .watch(states.as_str(), Some(options))
            .await
            .expect("watch the unit states");
        let task = tokio::spawn(async move {
            while let Some(response) = stream.message().await.expect("the unit states' watch") {
                assert!(!response.canceled(), "the unit states' watch was cancelled: {}", response.cancel_reason());
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    match event.event_type() {
                        EventType::Put => tally.put(kv.key(), kv.value()),
                        EventType::Delete => tally.delete(kv.key()),
                    }
                }
                sender.send_replace(tally.launched());
            }
        })
        .abort_handle();
        Self { count, task }
    }

    /// How many units have a state that says launched, moving as they change.
    pub fn changes(&self) -> watch::Receiver<usize> {
        self.count.clone()
    }
}

/// The states that say launched, by key, and how many each unit has (a unit counts once,
/// however many machines say they run it).
#[derive(Default)]
struct Tally {
    launched_states: HashMap<Vec<u8>, String>,
    by_unit: HashMap<String, usize>,
}

impl Tally {
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.delete(key);
        // A state the bench cannot read counts as not launched.
        let Ok(state) = serde_json::from_slice::<UnitState>(value) else { return };
        if state.launched {
            *self.by_unit.entry(state.name.clone()).or_default() += 1;
            self.launched_states.insert(key.to_vec(), state.name);
        }
    }

    fn delete(&mut self, key: &[u8]) {
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
            run: None,
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
