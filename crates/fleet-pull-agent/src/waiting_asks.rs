//! The journal questions a manager relayed to this machine and it has not answered yet
//! (`journal_inbox.rs` answers them through the manager).

use std::collections::BTreeMap;

use fleet_api_schema::JournalAsk;
use fleet_core::unpoisoned::Locked;
use fleet_registry::JournalQuestion;
use tokio::sync::watch;

/// At most this many questions wait for an answer: the oldest go first. (A manager relays a
/// few at a time; the cluster bounds those in flight.)
const MOST_WAITING: usize = 64;

/// The questions heard and not answered yet, by the manager's id.
pub(crate) struct WaitingAsks {
    asks: std::sync::Mutex<BTreeMap<u64, JournalAsk>>,
    changes: watch::Sender<u64>,
}

impl Default for WaitingAsks {
    fn default() -> Self {
        Self { asks: std::sync::Mutex::new(BTreeMap::new()), changes: watch::channel(0).0 }
    }
}

impl WaitingAsks {
    /// Notes a question heard from the manager.
    pub(crate) fn heard(&self, ask: JournalAsk) {
        let mut asks = self.asks.locked();
        asks.insert(ask.id, ask);
        while asks.len() > MOST_WAITING {
            asks.pop_first();
        }
        drop(asks);
        self.changes.send_modify(|moves| *moves = moves.wrapping_add(1));
    }

    pub(crate) fn waiting(&self) -> Vec<(String, JournalQuestion)> {
        let asks = self.asks.locked();
        asks.values()
            .map(|ask| {
                let question = JournalQuestion { unit: ask.unit.clone(), lines: ask.lines, status: ask.status };
                (ask.id.to_string(), question)
            })
            .collect()
    }

    /// Moves when a question is heard.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Takes question `id` away: whether it was waiting.
    pub(crate) fn take(&self, id: u64) -> bool {
        self.asks.locked().remove(&id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(id: u64) -> JournalAsk {
        JournalAsk { id, unit: format!("u{id}.service"), lines: 10, status: id.is_multiple_of(2) }
    }

    /// Questions wait by id until taken, each taken once; at most [`MOST_WAITING`] wait, the
    /// oldest going first; every question heard moves the signal.
    #[test]
    fn questions_wait_until_taken_and_the_oldest_go_past_the_bound() {
        let waiting = WaitingAsks::default();
        let heard = waiting.changes.subscribe();
        waiting.heard(ask(7));
        assert!(heard.has_changed().unwrap(), "a question moves the signal");
        assert_eq!(
            waiting.waiting(),
            [("7".to_string(), JournalQuestion { unit: "u7.service".into(), lines: 10, status: false })]
        );
        assert!(waiting.take(7));
        assert!(!waiting.take(7), "a question is taken once");
        for id in 0..(MOST_WAITING as u64 + 5) {
            waiting.heard(ask(id));
        }
        let ids: Vec<String> = waiting.waiting().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids.len(), MOST_WAITING);
        assert_eq!(ids.first().map(String::as_str), Some("5"), "the five oldest went");
    }
}
