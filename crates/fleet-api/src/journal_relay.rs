//! Journals of units on pull agents, which a manager cannot reach: a request waits while the
//! agent's long poll carries the question to it, and the agent posts the answer back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_api_schema::{Journal, JournalAsk};
use tokio::sync::{oneshot, watch};

#[derive(Default)]
pub struct JournalRelay {
    next_id: AtomicU64,
    /// Questions not yet carried to each machine.
    asks: Mutex<HashMap<String, Vec<JournalAsk>>>,
    /// Requests waiting for an answer: the machine asked, and where the answer goes.
    waiting: Mutex<HashMap<u64, (String, oneshot::Sender<Journal>)>>,
    /// Moves when a machine has a question.
    asked: Mutex<HashMap<String, watch::Sender<u64>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl JournalRelay {
    /// Asks `machine` for `unit`'s journal; `None` when no answer comes within `limit`.
    pub async fn ask(&self, machine: &str, unit: &str, lines: usize, status: bool, limit: Duration) -> Option<Journal> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        lock(&self.waiting).insert(id, (machine.to_string(), answer));
        lock(&self.asks).entry(machine.to_string()).or_default().push(JournalAsk {
            id,
            unit: unit.to_string(),
            lines,
            status,
        });
        if let Some(signal) = lock(&self.asked).get(machine) {
            signal.send_modify(|count| *count += 1);
        }
        let journal = tokio::time::timeout(limit, answered).await.ok().and_then(Result::ok);
        lock(&self.waiting).remove(&id);
        journal
    }

    /// The questions for `machine`, taken.
    pub fn take(&self, machine: &str) -> Vec<JournalAsk> {
        lock(&self.asks).remove(machine).unwrap_or_default()
    }

    /// Moves when `machine` gets a question.
    pub fn asked(&self, machine: &str) -> watch::Receiver<u64> {
        lock(&self.asked).entry(machine.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Delivers `machine`'s answer to question `id`; `false` when there is no such question
    /// for that machine (anymore).
    pub fn answer(&self, machine: &str, id: u64, journal: Journal) -> bool {
        let mut waiting = lock(&self.waiting);
        match waiting.get(&id) {
            Some((asked, _)) if asked == machine => {
                waiting.remove(&id).is_some_and(|(_, answer)| answer.send(journal).is_ok())
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_question_reaches_its_machine_and_only_its_answer_returns() {
        let relay = Arc::new(JournalRelay::default());
        let mut asked = relay.asked("m1");
        let asking = {
            let relay = relay.clone();
            tokio::spawn(async move { relay.ask("m1", "a.service", 5, false, Duration::from_secs(5)).await })
        };
        asked.changed().await.unwrap();
        let asks = relay.take("m1");
        assert_eq!(asks.len(), 1);
        let journal = Journal { machine_id: "m1".into(), name: "a.service".into(), text: "hello".into(), status: None };
        assert!(!relay.answer("m2", asks[0].id, journal.clone()), "another machine cannot answer");
        assert!(relay.answer("m1", asks[0].id, journal.clone()));
        assert_eq!(asking.await.unwrap(), Some(journal));
        assert!(
            relay.ask("m1", "a.service", 5, false, Duration::from_millis(50)).await.is_none(),
            "no answer, no journal"
        );
    }
}
