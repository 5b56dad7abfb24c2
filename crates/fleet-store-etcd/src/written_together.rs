//! Writes that arrive at the same time, written in one transaction. etcd spends most of a
//! small write on the request itself (its proposal, its apply, its answer), not on the keys:
//! thousands of machines that each write a key at once (joins, pull agents' states after a
//! change that reaches them all) load it far less as a few transactions than as thousands of
//! requests. A write waits for its turn; the one whose turn it is takes every write waiting,
//! up to a batch's bound, writes them together and answers each.

use fleet_core::unpoisoned::Locked;
use std::sync::{Arc, Mutex};

use fleet_registry::{RegistryError, Result};
use tokio::sync::oneshot;

struct Waiting<Request, Outcome> {
    request: Request,
    /// How much of a batch's bound it takes (its operations).
    weight: usize,
    answer: oneshot::Sender<Result<Outcome>>,
}

/// The writes of one kind waiting, and whose turn it is to write them.
pub(crate) struct WrittenTogether<Request, Outcome> {
    waiting: Mutex<Vec<Waiting<Request, Outcome>>>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl<Request, Outcome> Default for WrittenTogether<Request, Outcome> {
    fn default() -> Self {
        Self { waiting: Mutex::new(Vec::new()), turn: Arc::new(tokio::sync::Mutex::new(())) }
    }
}

impl<Request: Send + 'static, Outcome: Send + 'static> WrittenTogether<Request, Outcome> {
    /// Writes `request` (of `weight`) with whatever else waits, at most `most` weight a batch
    /// (a heavier request alone): `write` writes a batch and answers its requests in order.
    /// A batch that fails fails each of its requests.
    ///
    /// A batch, once taken, is written to the end on a task of its own, holding the turn:
    /// the request whose turn it was may be dropped meanwhile (its client gone, its timeout
    /// passed), and the others in its batch are still written and answered. (Dropped with it,
    /// they were lost: 800 announcements on one manager in a 100,000-agent run.)
    pub(crate) async fn write<Written>(
        &self,
        request: Request,
        weight: usize,
        most: usize,
        write: impl Fn(Vec<Request>) -> Written,
    ) -> Result<Outcome>
    where
        Written: Future<Output = Result<Vec<Outcome>>> + Send + 'static,
    {
        let (answer, mut answered) = oneshot::channel();
        self.waiting.locked().push(Waiting { request, weight, answer });
        loop {
            let turn = self.turn.clone().lock_owned().await;
            // A batch written while this request waited for its turn may have answered it.
            match answered.try_recv() {
                Ok(outcome) => return outcome,
                Err(oneshot::error::TryRecvError::Closed) => return Err(lost()),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch = self.take(most);
            if batch.is_empty() {
                return Err(lost());
            }
            let (requests, answers): (Vec<Request>, Vec<_>) =
                batch.into_iter().map(|waiting| (waiting.request, waiting.answer)).unzip();
            let written = write(requests);
            let batch = tokio::spawn(async move {
                answer_each(answers, written.await);
                drop(turn);
            });
            // The batch goes on if this request is dropped here. Had it panicked, its answers
            // were dropped with it, which each of its requests finds out above.
            let _ = batch.await;
        }
    }

    /// Holds the turn: what is written meanwhile waits (tests line writes up with it).
    #[cfg(test)]
    pub(crate) async fn hold_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// How many writes wait.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.locked().len()
    }

    /// The oldest requests waiting, up to `most` weight (at least one).
    fn take(&self, most: usize) -> Vec<Waiting<Request, Outcome>> {
        let mut waiting = self.waiting.locked();
        let mut weight = 0;
        let count = waiting
            .iter()
            .take_while(|next| {
                weight += next.weight;
                weight <= most
            })
            .count()
            .max(1)
            .min(waiting.len());
        waiting.drain(..count).collect()
    }
}

fn lost() -> RegistryError {
    RegistryError::Unavailable("etcd: a write was lost before it was written".into())
}

/// Answers each request of a batch with its outcome, or every one with the batch's failure.
fn answer_each<Outcome>(answers: Vec<oneshot::Sender<Result<Outcome>>>, written: Result<Vec<Outcome>>) {
    match written {
        Ok(outcomes) if outcomes.len() == answers.len() => {
            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                let _ = answer.send(Ok(outcome));
            }
        }
        Ok(_) => {
            for answer in answers {
                let _ = answer.send(Err(RegistryError::Unavailable("etcd: a batch came back short".into())));
            }
        }
        Err(error) => {
            let message = error.to_string();
            for answer in answers {
                let _ = answer.send(Err(RegistryError::Unavailable(message.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn writes_waiting_together_go_in_one_batch_within_its_bound() {
        let together = Arc::new(WrittenTogether::<usize, usize>::default());
        let batches = Arc::new(Mutex::new(Vec::new()));
        // Hold the turn so that every write below waits, then let them go.
        let held = together.hold_turn().await;
        let mut tasks = Vec::new();
        for request in 0..7 {
            let (together, batches) = (together.clone(), batches.clone());
            tasks.push(tokio::spawn(async move {
                together
                    .write(request, 2, 6, |batch: Vec<usize>| {
                        batches.lock().unwrap().push(batch.clone());
                        std::future::ready(Ok(batch.iter().map(|request| request * 10).collect()))
                    })
                    .await
            }));
        }
        while together.waiting() < 7 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for (request, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await.unwrap().unwrap(), request * 10, "each answered with its own outcome");
        }
        let batches = batches.lock().unwrap();
        assert_eq!(batches.len(), 3, "7 writes of weight 2, at most 6 a batch: {batches:?}");
        assert!(batches.iter().all(|batch| batch.len() <= 3));
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 7);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_each_of_its_writes_and_a_heavy_one_goes_alone() {
        let together = WrittenTogether::<usize, ()>::default();
        let failed =
            together.write(1, 200, 128, |_| std::future::ready(Err(RegistryError::Unavailable("down".into())))).await;
        assert!(matches!(failed, Err(RegistryError::Unavailable(message)) if message.contains("down")));
        let written =
            together.write(2, 200, 128, |batch: Vec<usize>| std::future::ready(Ok(vec![(); batch.len()]))).await;
        assert!(written.is_ok(), "a write heavier than the bound is written alone");
    }

    /// The request whose turn it is may be dropped while its batch is written (its client
    /// went away, its timeout passed): the batch is still written whole, and the others in
    /// it are answered.
    #[tokio::test]
    async fn a_batch_is_written_whole_when_the_request_whose_turn_it_was_is_dropped() {
        let together = Arc::new(WrittenTogether::<usize, usize>::default());
        let release = Arc::new(tokio::sync::Notify::new());
        let batches = Arc::new(Mutex::new(Vec::new()));
        let held = together.hold_turn().await;
        let spawn = |request: usize| {
            let (together, release, batches) = (together.clone(), release.clone(), batches.clone());
            tokio::spawn(async move {
                let write = move |batch: Vec<usize>| {
                    let (release, batches) = (release.clone(), batches.clone());
                    async move {
                        batches.lock().unwrap().push(batch.clone());
                        release.notified().await;
                        Ok(batch.iter().map(|request| request * 10).collect())
                    }
                };
                together.write(request, 1, 10, write).await
            })
        };
        let first = spawn(1);
        while together.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        let second = spawn(2);
        while together.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        // The first in line takes the turn and both requests, and is dropped while writing.
        drop(held);
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert!(first.await.is_err_and(|ended| ended.is_cancelled()));
        release.notify_one();
        assert_eq!(second.await.unwrap().unwrap(), 20, "written and answered");
        assert_eq!(*batches.lock().unwrap(), vec![vec![1, 2]], "one batch, written once");
    }
}
