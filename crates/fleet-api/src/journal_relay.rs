//! Journals of units on pull agents, which a manager cannot reach: a request waits while the
//! agent's long poll carries the question to it, and the agent posts the answer back.

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_api_schema::{JournalAsk, RelayedJournal};
use fleet_core::journal_relay::MOST_WAITING_PER_MACHINE;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// A question not yet carried to its machine, until its asker gives up.
struct Queued {
    ask: JournalAsk,
    until: Instant,
}

/// A question carried, waiting for its answer: the machine and unit asked.
struct Waiting {
    machine: String,
    unit: String,
    answer: oneshot::Sender<RelayedJournal>,
}

#[derive(Default)]
pub struct JournalRelay {
    next_id: AtomicU64,
    /// Questions not yet carried to each machine (at most
    /// `fleet_core::journal_relay::MOST_WAITING_PER_MACHINE` each).
    asks: Mutex<HashMap<String, Vec<Queued>>>,
    /// Requests waiting for an answer.
    waiting: Mutex<HashMap<u64, Waiting>>,
    /// Moves when a machine has a question.
    asked: Mutex<HashMap<String, watch::Sender<u64>>>,
}

/// Why a question was not put to a machine.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAsked {
    #[error("machine {0} has {MOST_WAITING_PER_MACHINE} journal questions waiting already; try again shortly")]
    Busy(String),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.locked()
}

impl JournalRelay {
    /// Asks `machine` for `unit`'s journal: its answer, or `None` when none comes within
    /// `limit` (the question is then withdrawn: it is never carried later).
    pub async fn ask(
        &self,
        machine: &str,
        unit: &str,
        lines: usize,
        status: bool,
        limit: Duration,
    ) -> Result<Option<RelayedJournal>, NotAsked> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + limit;
        {
            let mut asks = lock(&self.asks);
            let queue = asks.entry(machine.to_string()).or_default();
            queue.retain(|queued| queued.until > Instant::now());
            if queue.len() >= MOST_WAITING_PER_MACHINE {
                return Err(NotAsked::Busy(machine.to_string()));
            }
            let ask = JournalAsk { id, unit: unit.to_string(), lines, status };
            queue.push(Queued { ask, until });
        }
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting { machine: machine.to_string(), unit: unit.to_string(), answer };
        lock(&self.waiting).insert(id, waiting);
        if let Some(signal) = lock(&self.asked).get(machine) {
            signal.send_modify(|count| *count += 1);
        }
        let journal = tokio::time::timeout_at(until, answered).await.ok().and_then(Result::ok);
        lock(&self.waiting).remove(&id);
        let mut asks = lock(&self.asks);
        if let Some(queue) = asks.get_mut(machine) {
            queue.retain(|queued| queued.ask.id != id);
            if queue.is_empty() {
                asks.remove(machine);
            }
        }
        Ok(journal)
    }

    /// The questions for `machine` whose askers still wait, taken.
    pub fn take(&self, machine: &str) -> Vec<JournalAsk> {
        let now = Instant::now();
        let queued = lock(&self.asks).remove(machine).unwrap_or_default();
        queued.into_iter().filter(|queued| queued.until > now).map(|queued| queued.ask).collect()
    }

    /// Moves when `machine` gets a question.
    pub fn asked(&self, machine: &str) -> watch::Receiver<u64> {
        lock(&self.asked).entry(machine.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Delivers `machine`'s answer to question `id`; `false` when there is no such question
    /// for that machine (anymore), or the journal answered is of another unit than asked.
    pub fn answer(&self, machine: &str, id: u64, answer: RelayedJournal) -> bool {
        let mut waiting = lock(&self.waiting);
        let fits = |asked: &Waiting| {
            asked.machine == machine
                && match &answer {
                    RelayedJournal::Journal(journal) => journal.name == asked.unit,
                    RelayedJournal::Failed { .. } => true,
                }
        };
        match waiting.get(&id) {
            Some(asked) if fits(asked) => waiting.remove(&id).is_some_and(|asked| asked.answer.send(answer).is_ok()),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleet_api_schema::Journal;

    use super::*;

    fn journal(machine: &str, unit: &str) -> RelayedJournal {
        RelayedJournal::Journal(Journal {
            machine_id: machine.into(),
            name: unit.into(),
            text: "hello".into(),
            ..Journal::default()
        })
    }

    #[tokio::test]
    async fn a_question_reaches_its_machine_and_only_its_answer_returns() {
        let relay = Arc::new(JournalRelay::default());
        let mut asked = relay.asked("m1");
        let asking = {
            let relay = relay.clone();
            tokio::spawn(async move { relay.ask("m1", "a.service", 5, false, Duration::from_secs(30)).await })
        };
        asked.changed().await.unwrap();
        let asks = relay.take("m1");
        assert_eq!(asks.len(), 1);
        assert!(!relay.answer("m2", asks[0].id, journal("m1", "a.service")), "another machine cannot answer");
        // Regression (issue 67): an answer for another unit than the one asked was taken.
        assert!(!relay.answer("m1", asks[0].id, journal("m1", "OTHER.service")), "nor for another unit");
        assert!(relay.answer("m1", asks[0].id, journal("m1", "a.service")));
        assert_eq!(asking.await.unwrap(), Ok(Some(journal("m1", "a.service"))));
    }

    /// Regression (issue 67): questions whose askers had given up were still delivered
    /// minutes later, and a machine known but not streaming gathered them without bound.
    #[tokio::test(start_paused = true)]
    async fn a_question_given_up_is_never_carried_and_a_machine_holds_only_so_many() {
        let relay = Arc::new(JournalRelay::default());
        let answer = relay.ask("m1", "a.service", 5, false, Duration::from_millis(50)).await;
        assert_eq!(answer, Ok(None), "no answer, no journal");
        assert!(relay.take("m1").is_empty(), "the question went with its asker");
        let asking: Vec<_> = (0..MOST_WAITING_PER_MACHINE)
            .map(|_| {
                let relay = relay.clone();
                tokio::spawn(async move { relay.ask("m1", "a.service", 5, false, Duration::from_secs(10)).await })
            })
            .collect();
        let queued = || lock(&relay.asks).get("m1").map_or(0, Vec::len);
        while queued() < MOST_WAITING_PER_MACHINE {
            tokio::task::yield_now().await;
        }
        let refused = relay.ask("m1", "a.service", 5, false, Duration::from_secs(10)).await;
        assert_eq!(refused, Err(NotAsked::Busy("m1".into())));
        for asking in asking {
            assert_eq!(asking.await.unwrap(), Ok(None));
        }
        assert!(relay.take("m1").is_empty(), "every question went with its asker");
    }
}
