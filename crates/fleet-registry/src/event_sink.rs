//! Where the parts of a fleetd hand the events they make: a bounded queue and one task that
//! writes what has queued up as one batch. Making an event never waits for the store: when
//! the store is away or slower than events come, the queue fills and further events are
//! dropped and counted (a warning says how many), so no decision waits for its event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use fleet_core::events::NewEvent;
use tokio::sync::mpsc;

use crate::EventLog;

/// The most events waiting to be written: an engine pass that places 100,000 units makes
/// 100,000 events at once.
const QUEUED: usize = 500_000;
/// The most events one write holds.
const PER_WRITE: usize = 1_000;
/// About the most bytes one write holds (etcd refuses a request over 1.5 MiB).
const BYTES_PER_WRITE: usize = 512 * 1024;
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
    queue: Option<mpsc::UnboundedSender<Vec<NewEvent>>>,
    /// Events handed over and not written yet (at most [`QUEUED`]).
    queued: Arc<AtomicUsize>,
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
        let (queue, handed) = mpsc::unbounded_channel();
        let (queued, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(0)));
        tokio::spawn(write_batches(log, handed, queued.clone(), dropped.clone()));
        Self { queue: Some(queue), queued, dropped }
    }

    /// Hands one event over, never waiting.
    pub fn note(&self, event: NewEvent) {
        self.note_all([event]);
    }

    /// Hands events over together, never waiting: all of them, or (the queue full) none.
    pub fn note_all(&self, events: impl IntoIterator<Item = NewEvent>) {
        let Some(queue) = &self.queue else { return };
        let events: Vec<NewEvent> = events.into_iter().collect();
        let count = events.len();
        if count == 0 {
            return;
        }
        let taken = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
            (queued + count <= QUEUED).then_some(queued + count)
        });
        if taken.is_err() || queue.send(events).is_err() {
            if taken.is_ok() {
                self.queued.fetch_sub(count, Ordering::AcqRel);
            }
            self.dropped.fetch_add(count as u64, Ordering::Relaxed);
        }
    }

    /// Whether events handed over are kept anywhere.
    pub fn keeps(&self) -> bool {
        self.queue.is_some()
    }
}

/// About how many bytes an event takes stored.
fn stored_size(event: &NewEvent) -> usize {
    let named: usize = [&event.unit, &event.machine, &event.by].into_iter().flatten().map(String::len).sum();
    let units: usize = event.units.iter().map(|unit| unit.len() + 3).sum();
    96 + event.message.len() + named + units
}

/// The next write's events, taken from the front of `pending`: at most [`PER_WRITE`] and
/// about [`BYTES_PER_WRITE`] (one event at least).
fn next_write(pending: &mut std::collections::VecDeque<NewEvent>) -> Vec<NewEvent> {
    let (mut count, mut bytes) = (0, 0);
    for event in pending.iter() {
        bytes += stored_size(event);
        if count > 0 && (count == PER_WRITE || bytes > BYTES_PER_WRITE) {
            break;
        }
        count += 1;
    }
    pending.drain(..count).collect()
}

async fn write_batches(
    log: Arc<dyn EventLog>,
    mut handed: mpsc::UnboundedReceiver<Vec<NewEvent>>,
    queued: Arc<AtomicUsize>,
    dropped: Arc<AtomicU64>,
) {
    let mut pending = std::collections::VecDeque::new();
    while let Some(events) = handed.recv().await {
        pending.extend(events);
        // What else was handed over meanwhile goes in the same writes.
        while pending.len() < PER_WRITE
            && let Ok(more) = handed.try_recv()
        {
            pending.extend(more);
        }
        while !pending.is_empty() {
            let batch = next_write(&mut pending);
            write_one(log.as_ref(), &batch).await;
            queued.fetch_sub(batch.len(), Ordering::AcqRel);
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!(events = lost, "events dropped: they came faster than the event log took them");
        }
    }
}

/// Writes one batch, trying again a few times while the store is away; drops it after.
async fn write_one(log: &dyn EventLog, batch: &[NewEvent]) {
    let mut pause = Duration::from_millis(100);
    for tries in 1..=TRIES {
        match log.append_events(batch).await {
            Ok(()) => return,
            Err(error) if tries < TRIES => {
                tracing::debug!(%error, "events not written yet");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                tracing::warn!(%error, events = batch.len(), "events dropped: the event log could not be written");
            }
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
        async fn events_before(&self, _: u64, _: usize) -> crate::Result<Vec<fleet_core::events::Event>> {
            Ok(Vec::new())
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
        let many = |count| (0..count).map(|_| NewEvent::new(0, EventKind::Write, "x")).collect::<Vec<_>>();
        sink.note_all(many(QUEUED - 5));
        sink.note_all(many(10));
        sink.note(NewEvent::new(0, EventKind::Write, "x"));
        assert_eq!(sink.dropped.load(Ordering::Relaxed), 10, "a handful that does not fit goes whole");
        assert_eq!(sink.queued.load(Ordering::Relaxed), QUEUED - 4);
        let discarding = EventSink::discarding();
        discarding.note(NewEvent::new(0, EventKind::Write, "x"));
        assert!(!discarding.keeps());
    }

    #[test]
    fn a_write_holds_at_most_its_count_and_about_its_bytes() {
        let mut pending: std::collections::VecDeque<NewEvent> =
            (0..2_500).map(|_| NewEvent::new(0, EventKind::Placed, "placed on m1")).collect();
        assert_eq!(next_write(&mut pending).len(), PER_WRITE);
        let long = "x".repeat(fleet_core::events::LONGEST_MESSAGE);
        let mut pending: std::collections::VecDeque<NewEvent> =
            (0..1_000).map(|_| NewEvent::new(0, EventKind::Write, long.as_str())).collect();
        let write = next_write(&mut pending);
        assert!(write.len() < PER_WRITE && write.iter().map(stored_size).sum::<usize>() <= BYTES_PER_WRITE);
    }
}
