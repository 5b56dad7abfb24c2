//! Events as the event streams send them, each encoded once: a hundred followers of one
//! stream are sent the same bytes, encoded for the first. An index names one event for good
//! (indexes only grow, and none is used twice), so an encoding never goes stale.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fleet_core::events::Event;
use fleet_core::unpoisoned::Locked;

/// How many encodings are kept; past it the oldest go (followers read in index order, so
/// the oldest are the ones read already).
const KEPT: usize = 50_000;

#[derive(Default)]
pub struct EncodedEvents {
    kept: Mutex<BTreeMap<u64, Arc<str>>>,
}

impl EncodedEvents {
    /// `event` as one server-sent event, encoded by `encode` unless it was already.
    pub fn sent(&self, event: &Event, encode: impl FnOnce(&Event) -> String) -> Arc<str> {
        if let Some(kept) = self.kept.locked().get(&event.index) {
            return kept.clone();
        }
        let encoded: Arc<str> = encode(event).into();
        let mut kept = self.kept.locked();
        kept.insert(event.index, encoded.clone());
        while kept.len() > KEPT {
            kept.pop_first();
        }
        encoded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::events::{EventKind, NewEvent};

    #[test]
    fn an_event_is_encoded_once_and_the_oldest_go_past_the_bound() {
        let encodings = EncodedEvents::default();
        let event = |index| Event { index, event: NewEvent::new(0, EventKind::Placed, "placed") };
        let encoded = std::cell::Cell::new(0);
        let encode = |event: &Event| {
            encoded.set(encoded.get() + 1);
            format!("id: {}\n\n", event.index)
        };
        assert_eq!(&*encodings.sent(&event(1), encode), "id: 1\n\n");
        assert_eq!(&*encodings.sent(&event(1), encode), "id: 1\n\n");
        assert_eq!(encoded.get(), 1);
        for index in 2..=(KEPT as u64 + 1) {
            encodings.sent(&event(index), encode);
        }
        assert_eq!(encodings.kept.locked().first_key_value().map(|(index, _)| *index), Some(2));
    }
}
