//! The event log on etcd: each batch one key under `events/`, written once; its revision is
//! its place in the one order of the cluster's writes, so every member reads the same stream
//! in the same order. Read from a watch-fed copy of the range held from the first read on
//! (its changes are what a follower of the stream wakes on); trimmed by the engine leader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::events::{Event, EventPage, NewEvent, PER_BATCH, batches_to_trim, index_of};

use super::EtcdRegistry;
use super::caches::Cache;
use super::keys::KeyRange;
use super::mirror::{Mirror, MirrorData};
use fleet_registry::{ChangeSignal, EventLog, Result, codec};

/// How long a first read waits for the copy's first listing.
const FIRST_LISTING: Duration = Duration::from_secs(10);
/// The most keys one trimming transaction deletes (etcd takes 128 operations in one).
const DELETES_PER_TXN: usize = 100;

/// The batches stored, in revision order: (revision, key, events).
fn batches(data: &MirrorData, range: &KeyRange, mark: &str) -> Vec<(i64, String, std::sync::Arc<Vec<NewEvent>>)> {
    let mut batches: Vec<_> = data
        .range(range)
        .filter(|(key, _)| key.as_str() != mark)
        .filter_map(|(key, entry)| {
            entry.decoded_listed::<Vec<NewEvent>>(key).map(|events| (entry.mod_revision, key.clone(), events))
        })
        .collect();
    batches.sort_unstable_by_key(|(revision, ..)| *revision);
    batches
}

fn trimmed_through(data: &MirrorData, key: &str) -> u64 {
    data.entries.get(key).and_then(|entry| std::str::from_utf8(&entry.value).ok()?.trim().parse().ok()).unwrap_or(0)
}

impl EtcdRegistry {
    fn events_mirror(&self) -> &Mirror {
        self.held_for_good(&self.inner.events_cache, Cache::Events, || {
            let ranges = vec![KeyRange::prefix(self.keys().events())];
            Mirror::signalling(self.connection().clone(), ranges, self.inner.events_signal.clone())
        })
    }
}

/// This process's count of the batches it wrote (a part of each batch's key).
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

#[async_trait]
impl EventLog for EtcdRegistry {
    async fn append_events(&self, events: &[NewEvent]) -> Result<()> {
        for chunk in events.chunks(PER_BATCH as usize) {
            let at = chunk.first().map_or(0, |event| event.at);
            let key = self.keys().event_batch(at, &self.inner.join_writer, SEQUENCE.fetch_add(1, Ordering::Relaxed));
            self.connection().write(&[(key, Some(codec::encode(&chunk)))], 0).await?;
        }
        Ok(())
    }

    async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage> {
        let mirror = self.events_mirror();
        let data = mirror.listed(FIRST_LISTING).await?;
        let range = KeyRange::prefix(self.keys().events());
        let mut page = EventPage {
            trimmed_through: trimmed_through(&data, &self.keys().events_trimmed()),
            ..EventPage::default()
        };
        // Sorted once per change of the copy, however many followers read it.
        let mark = self.keys().events_trimmed();
        let batches = mirror.derived(&data, |data| batches(data, &range, &mark));
        page.oldest = batches.first().map(|(revision, ..)| index_of(*revision as u64, 0));
        let first =
            batches.partition_point(|(revision, ..)| index_of(*revision as u64, PER_BATCH as usize - 1) <= after);
        for (revision, _, events) in &batches[first..] {
            for (place, event) in events.iter().enumerate() {
                let index = index_of(*revision as u64, place);
                if index <= after {
                    continue;
                }
                if page.events.len() == limit {
                    page.more = true;
                    return Ok(page);
                }
                page.events.push(Event { index, event: event.clone() });
            }
        }
        Ok(page)
    }

    async fn events_before(&self, before: u64, limit: usize) -> Result<Vec<Event>> {
        let mirror = self.events_mirror();
        let data = mirror.listed(FIRST_LISTING).await?;
        let range = KeyRange::prefix(self.keys().events());
        let mark = self.keys().events_trimmed();
        let batches = mirror.derived(&data, |data| batches(data, &range, &mark));
        let end = batches.partition_point(|(revision, ..)| index_of(*revision as u64, 0) < before);
        let mut found = Vec::new();
        for (revision, _, events) in batches[..end].iter().rev() {
            for (place, event) in events.iter().enumerate().rev() {
                let index = index_of(*revision as u64, place);
                if index >= before {
                    continue;
                }
                if found.len() == limit {
                    return Ok(found);
                }
                found.push(Event { index, event: event.clone() });
            }
        }
        Ok(found)
    }

    fn event_changes(&self) -> ChangeSignal {
        // The copy starts with its first follower: its changes are what the signal moves on.
        self.events_mirror();
        self.inner.events_signal.subscribe()
    }

    async fn trim_events(&self, most: usize, oldest_at: i64) -> Result<usize> {
        let (gone, through, count) = {
            let mirror = self.events_mirror();
            let data = mirror.listed(FIRST_LISTING).await?;
            let range = KeyRange::prefix(self.keys().events());
            let mark = self.keys().events_trimmed();
            let batches = mirror.derived(&data, |data| batches(data, &range, &mark));
            let times: Vec<(u64, Vec<i64>)> = batches
                .iter()
                .map(|(revision, _, events)| (*revision as u64, events.iter().map(|event| event.at).collect()))
                .collect();
            let trim = batches_to_trim(&times, most, oldest_at);
            let gone: Vec<String> = batches[..trim.batches].iter().map(|(_, key, _)| key.clone()).collect();
            let marked = trimmed_through(&data, &self.keys().events_trimmed());
            let (through, count) = (trim.through.map_or(marked, |through| through.max(marked)), trim.events);
            (gone, through, count)
        };
        for keys in gone.chunks(DELETES_PER_TXN) {
            // The mark first: a reader never finds events gone without learning it missed them.
            let mut changes = vec![(self.keys().events_trimmed(), Some(through.to_string().into_bytes()))];
            changes.extend(keys.iter().map(|key| (key.clone(), None)));
            self.connection().write(&changes, 0).await?;
        }
        Ok(count)
    }
}
