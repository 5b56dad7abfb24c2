//! Where the parts of a fleetd hand the events they make: a bounded queue and one task that
//! writes what has queued up as one batch. Making an event never waits for the store: when
//! the store is away or slower than events come, the queue fills and further events are
//! dropped and counted (a warning says how many), so no decision waits for its event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_core::events::NewEvent;
use tokio::sync::mpsc;

use crate::EventLog;

/// The most events waiting to be written.
const QUEUED: usize = 10_000;
/// The most events one write holds.
const PER_WRITE: usize = 1_000;
/// How often a batch is tried before it is dropped.
const TRIES: u32 = 5;

/// Microseconds since the Unix epoch by this machine's clock: when an event is made.
pub fn micros_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_micros()).unwrap_or(i64::MAX))
}

/// A handle to hand events to; cheap to clone. One that discards is what a part without an
/// event log (a test, the simulation) is given.
#[derive(Clone, Default)]
pub struct EventSink {
    queue: Option<mpsc::Sender<NewEvent>>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// A sink that keeps nothing.
    pub fn discarding() -> Self {
        Self::default()
    }

    /// A sink writing to `log`, with its writer task on the current runtime; the task ends
    /// when every handle is dropped, after writing what was queued.
    pub fn writing_to(log: Arc<dyn EventLog>) -> Self {
        let (queue, queued) = mpsc::channel(QUEUED);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(write_batches(log, queued, dropped.clone()));
        Self { queue: Some(queue), dropped }
    }

    /// Hands one event over, never waiting.
    pub fn note(&self, event: NewEvent) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn note_all(&self, events: impl IntoIterator<Item = NewEvent>) {
        for event in events {
            self.note(event);
        }
    }

    /// Whether events handed over are kept anywhere.
    pub fn keeps(&self) -> bool {
        self.queue.is_some()
    }
}

async fn write_batches(log: Arc<dyn EventLog>, mut queued: mpsc::Receiver<NewEvent>, dropped: Arc<AtomicU64>) {
    let mut batch = Vec::with_capacity(PER_WRITE);
    while queued.recv_many(&mut batch, PER_WRITE).await > 0 {
        let mut tries = 0;
        let mut pause = Duration::from_millis(100);
        loop {
            match log.append_events(&batch).await {
                Ok(()) => break,
                Err(error) if tries + 1 < TRIES => {
                    tracing::debug!(%error, "events not written yet");
                    tries += 1;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(error) => {
                    tracing::warn!(%error, events = batch.len(), "events dropped: the event log could not be written");
                    break;
                }
            }
        }
        batch.clear();
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!(events = lost, "events dropped: they came faster than the event log took them");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::events::{EventKind, EventPage};

    /// A log that never answers: what a store away looks like to the writer.
    struct Away;

    #[async_trait::async_trait]
    impl EventLog for Away {
        async fn append_events(&self, _: &[NewEvent]) -> crate::Result<()> {
            std::future::pending().await
        }
        async fn events_after(&self, _: u64, _: usize) -> crate::Result<EventPage> {
            Ok(EventPage::default())
        }
        fn event_changes(&self) -> crate::ChangeSignal {
            tokio::sync::watch::channel(0).1
        }
        async fn trim_events(&self, _: usize, _: i64) -> crate::Result<usize> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let sink = EventSink::writing_to(Arc::new(Away));
        // The writer holds one batch it cannot write; the queue behind it fills, then drops.
        for _ in 0..(PER_WRITE + QUEUED + 10) {
            sink.note(NewEvent::new(0, EventKind::Write, "x"));
        }
        assert!(sink.dropped.load(Ordering::Relaxed) >= 10, "{}", sink.dropped.load(Ordering::Relaxed));
        let discarding = EventSink::discarding();
        discarding.note(NewEvent::new(0, EventKind::Write, "x"));
        assert!(!discarding.keeps());
    }
}
