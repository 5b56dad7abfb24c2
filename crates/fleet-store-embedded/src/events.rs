//! The event log on the embedded store: a table of batches by number, each the JSON list of
//! its events; key 0 holds the highest index trimmed so far. Appending and trimming are their
//! own transactions, outside [`EmbeddedRegistry::write`]: an event is no change to the cluster,
//! so it wakes only the event log's readers, never the engine or an agent.

use async_trait::async_trait;
use fleet_core::events::{Event, EventPage, NewEvent, PER_BATCH, batch_of, batches_to_trim, index_of};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::{EmbeddedRegistry, unavailable};
use fleet_registry::{ChangeSignal, EventLog, RegistryError, Result};

/// Batch number → the JSON list of its events; key [`TRIMMED`] → the highest index trimmed
/// (8 bytes, big-endian).
pub const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const TRIMMED: u64 = 0;

fn decode_batch(batch: u64, value: &[u8]) -> Vec<NewEvent> {
    fleet_registry::codec::decode_listed::<Vec<NewEvent>>(&format!("events/{batch}"), value).unwrap_or_default()
}

/// The log's table as of `txn`; `None` before the first event was stored.
fn events_table(txn: &redb::ReadTransaction) -> Result<Option<redb::ReadOnlyTable<u64, &'static [u8]>>> {
    match txn.open_table(EVENTS) {
        Ok(table) => Ok(Some(table)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(unavailable(error)),
    }
}

fn trimmed_through(value: Option<&[u8]>) -> u64 {
    value.and_then(|bytes| <[u8; 8]>::try_from(bytes).ok()).map_or(0, u64::from_be_bytes)
}

impl EmbeddedRegistry {
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&redb::Database) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || work(&db)).await.map_err(unavailable).and_then(|result| result)
    }
}

#[async_trait]
impl EventLog for EmbeddedRegistry {
    async fn append_events(&self, events: &[NewEvent]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let batches: Vec<Vec<u8>> =
            events.chunks(PER_BATCH as usize).map(|chunk| fleet_registry::codec::encode(&chunk)).collect();
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            {
                let mut table = txn.open_table(EVENTS).map_err(unavailable)?;
                // After the last batch kept, or after the last trimmed when none is.
                let last = table.last().map_err(unavailable)?.map_or(TRIMMED, |(key, _)| key.value());
                let trimmed = trimmed_through(table.get(TRIMMED).map_err(unavailable)?.as_ref().map(|v| v.value()));
                for (number, batch) in (last.max(batch_of(trimmed)) + 1..).zip(batches) {
                    table.insert(number, batch.as_slice()).map_err(unavailable)?;
                }
            }
            txn.commit().map_err(unavailable)
        })
        .await?;
        self.signals.events.send_modify(|count| *count += 1);
        Ok(())
    }

    async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(unavailable)?;
            let Some(table) = events_table(&txn)? else { return Ok(EventPage::default()) };
            let trimmed = trimmed_through(table.get(TRIMMED).map_err(unavailable)?.as_ref().map(|value| value.value()));
            let mut page = EventPage { trimmed_through: trimmed, ..EventPage::default() };
            let first_batch = table.range(TRIMMED + 1..).map_err(unavailable)?.next();
            if let Some(row) = first_batch {
                let (number, _) = row.map_err(unavailable)?;
                page.oldest = Some(index_of(number.value(), 0));
            }
            for row in table.range(batch_of(after).max(TRIMMED + 1)..).map_err(unavailable)? {
                let (number, value) = row.map_err(unavailable)?;
                let number = number.value();
                for (place, event) in decode_batch(number, value.value()).into_iter().enumerate() {
                    let index = index_of(number, place);
                    if index <= after {
                        continue;
                    }
                    if page.events.len() == limit {
                        page.more = true;
                        return Ok(page);
                    }
                    page.events.push(Event { index, event });
                }
            }
            Ok(page)
        })
        .await
    }

    async fn events_before(&self, before: u64, limit: usize) -> Result<Vec<Event>> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(unavailable)?;
            let Some(table) = events_table(&txn)? else { return Ok(Vec::new()) };
            let mut found = Vec::new();
            for row in table.range(TRIMMED + 1..=batch_of(before).max(TRIMMED + 1)).map_err(unavailable)?.rev() {
                let (number, value) = row.map_err(unavailable)?;
                let number = number.value();
                for (place, event) in decode_batch(number, value.value()).into_iter().enumerate().rev() {
                    let index = index_of(number, place);
                    if index >= before {
                        continue;
                    }
                    if found.len() == limit {
                        return Ok(found);
                    }
                    found.push(Event { index, event });
                }
            }
            Ok(found)
        })
        .await
    }

    fn event_changes(&self) -> ChangeSignal {
        self.signals.events.subscribe()
    }

    async fn trim_events(&self, most: usize, oldest_at: i64) -> Result<usize> {
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            let trimmed = {
                let mut table = txn.open_table(EVENTS).map_err(unavailable)?;
                let mut batches = Vec::new();
                for row in table.range(TRIMMED + 1..).map_err(unavailable)? {
                    let (number, value) = row.map_err(unavailable)?;
                    let number = number.value();
                    let times = decode_batch(number, value.value()).iter().map(|event| event.at).collect();
                    batches.push((number, times));
                }
                let trim = batches_to_trim(&batches, most, oldest_at);
                for (number, _) in &batches[..trim.batches] {
                    table.remove(*number).map_err(unavailable)?;
                }
                if let Some(through) = trim.through {
                    table.insert(TRIMMED, through.to_be_bytes().as_slice()).map_err(unavailable)?;
                }
                trim.events
            };
            txn.commit().map_err(unavailable)?;
            Ok::<_, RegistryError>(trimmed)
        })
        .await
    }
}
