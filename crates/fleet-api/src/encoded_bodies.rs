//! Unit bodies as the change streams carry them, each encoded once: a change that reaches
//! thousands of agents (a global unit, a rollout's new content) encodes its body for the
//! first and hands the same bytes to the rest.

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleet_core::{UnitFile, UnitHash};
use serde_json::value::RawValue;

use crate::schema::AgentHashedBody;

/// How many encoded bodies are kept; past it the oldest half goes (a body is encoded again
/// when next sent).
const KEPT: usize = 1024;

/// One body's encoding, [`AgentHashedBody`] as JSON.
pub type EncodedBody = Arc<RawValue>;

#[derive(Default)]
pub struct EncodedBodies {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    bodies: HashMap<UnitHash, (u64, EncodedBody)>,
    /// Moves on with each body kept: its order of arrival.
    arrivals: u64,
}

impl EncodedBodies {
    /// The encoding of `hash`'s body, if kept.
    pub fn get(&self, hash: &UnitHash) -> Option<EncodedBody> {
        let kept = self.kept.locked();
        kept.bodies.get(hash).map(|(_, body)| body.clone())
    }

    /// Encodes `file`, the body of `hash`, and keeps it.
    pub fn encode(&self, hash: UnitHash, file: UnitFile) -> Option<EncodedBody> {
        let body = AgentHashedBody { hash: hash.to_string(), options: options_of(file) };
        let encoded: EncodedBody = serde_json::value::to_raw_value(&body).ok()?.into();
        let mut kept = self.kept.locked();
        if kept.bodies.len() >= KEPT {
            let mut ages: Vec<u64> = kept.bodies.values().map(|(arrival, _)| *arrival).collect();
            let (_, median, _) = ages.select_nth_unstable(KEPT / 2);
            let median = *median;
            kept.bodies.retain(|_, (arrival, _)| *arrival > median);
        }
        kept.arrivals += 1;
        let arrival = kept.arrivals;
        kept.bodies.insert(hash, (arrival, encoded.clone()));
        Some(encoded)
    }
}

/// A unit file's options as the API carries them.
pub(crate) fn options_of(file: fleet_core::UnitFile) -> Vec<fleet_api_schema::UnitOption> {
    file.into_options()
        .into_iter()
        .map(|option| fleet_api_schema::UnitOption { name: option.name, section: option.section, value: option.value })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(number: usize) -> UnitFile {
        UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep {number}\n")).unwrap()
    }

    #[test]
    fn a_body_is_encoded_once_and_read_back_as_the_schema_says() {
        let bodies = EncodedBodies::default();
        let hash = file(1).hash();
        assert!(bodies.get(&hash).is_none());
        let encoded = bodies.encode(hash, file(1)).unwrap();
        let again = bodies.get(&hash).unwrap();
        assert!(Arc::ptr_eq(&encoded, &again), "the same bytes for every stream");
        let read: AgentHashedBody = serde_json::from_str(again.get()).unwrap();
        assert_eq!(read.hash, hash.to_string());
        assert_eq!(read.options.len(), 1);
        assert_eq!(read.options[0].value, "/bin/sleep 1");
    }

    #[test]
    fn past_its_bound_the_oldest_bodies_go_first() {
        let bodies = EncodedBodies::default();
        for number in 0..=KEPT {
            bodies.encode(file(number).hash(), file(number));
        }
        assert!(bodies.get(&file(0).hash()).is_none(), "the first kept went");
        assert!(bodies.get(&file(KEPT).hash()).is_some(), "the newest stays");
        let kept = bodies.kept.lock().unwrap().bodies.len();
        assert!(kept <= KEPT / 2 + 1, "half went: {kept} kept");
    }
}
