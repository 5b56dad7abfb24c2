//! The journal questions managers relay to this machine on its change stream (or long polls),
//! as the one journal-answering facet every kind of machine has
//! ([`fleet_registry::JournalInbox`]): fleetd answers them by the same reconciler whether the
//! questions come through etcd or through a manager.

use std::collections::BTreeMap;

use async_trait::async_trait;
use fleet_api_schema::JournalAsk;
use fleet_core::unpoisoned::Locked;
use fleet_registry::{ChangeSignal, JournalInbox, JournalQuestion, Result};
use tokio::sync::watch;

use crate::registry::RemoteRegistry;

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

    fn waiting(&self) -> Vec<(String, JournalQuestion)> {
        let asks = self.asks.locked();
        asks.values()
            .map(|ask| {
                let question = JournalQuestion { unit: ask.unit.clone(), lines: ask.lines, status: ask.status };
                (ask.id.to_string(), question)
            })
            .collect()
    }

    /// Takes question `id` away: whether it was waiting.
    fn take(&self, id: u64) -> bool {
        self.asks.locked().remove(&id).is_some()
    }
}

#[async_trait]
impl JournalInbox for RemoteRegistry {
    async fn journal_questions(&self, machine: &str) -> Result<Vec<(String, JournalQuestion)>> {
        self.check_machine(machine)?;
        Ok(self.journal_asks().waiting())
    }

    fn journal_question_changes(&self, _machine: &str) -> ChangeSignal {
        self.journal_asks().changes.subscribe()
    }

    /// Taken away before it is sent: an answer the manager could not take is not sent again
    /// (the asker has its own deadline, and says no answer came).
    async fn answer_journal(&self, machine: &str, id: &str, answer: &[u8]) -> Result<()> {
        self.check_machine(machine)?;
        // An id this machine never gave out names nothing waiting.
        let Ok(id) = id.parse::<u64>() else { return Ok(()) };
        if !self.journal_asks().take(id) {
            return Ok(());
        }
        self.post_journal_answer(id, answer.to_vec()).await
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
