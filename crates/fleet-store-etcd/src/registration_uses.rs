//! Uses of a registration token without a use limit, counted apart per writer. Such a
//! token's record is not written by joins: each fleetd counts the joins it admits through it
//! under a key of its own (`registration-uses/<token>/<writer>`, the writer a random ID drawn
//! when the process connects), which no other fleetd writes. So fleetds that admit joins
//! through the same token at once never write a key in common, where every join batch
//! compared and rewrote the token's one record and four managers lost a third of their
//! batches to each other. A token with a use limit still counts on its record: its limit is
//! one count that every writer must see.
//!
//! A counter names the token it counts by the token key's creation revision, so a counter
//! left from an earlier token of the same name counts for nothing; it carries the token's
//! lease, so it ends with the token's expiry, and revoking the token deletes its counters.

use std::collections::HashMap;

use etcd_client::KeyValue;
use serde::{Deserialize, Serialize};

use fleet_registry::RegistrationRecord;
use fleet_registry::codec::decode_listed;

/// What one writer counted of one token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CountedUses {
    /// The creation revision of the token key these uses count for.
    pub token_revision: i64,
    pub uses: u32,
}

/// One writer's counter as read, with its key's mod revision.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Counter {
    writer: String,
    counted: CountedUses,
    revision: i64,
}

/// Every counter read, by token name.
#[derive(Debug, Default)]
pub(crate) struct UseCounters {
    by_token: HashMap<String, Vec<Counter>>,
}

impl UseCounters {
    /// The counters in a listing of `prefix` (`registration-uses/`); keys that do not parse
    /// are skipped (and logged by the decoder).
    pub(crate) fn read(prefix: &str, kvs: &[KeyValue]) -> Self {
        let mut by_token: HashMap<String, Vec<Counter>> = HashMap::new();
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key());
            let Some((token, writer)) = key.strip_prefix(prefix).and_then(|rest| rest.split_once('/')) else {
                continue;
            };
            let Some(counted) = decode_listed::<CountedUses>(&key, kv.value()) else { continue };
            by_token.entry(token.to_string()).or_default().push(Counter {
                writer: writer.to_string(),
                counted,
                revision: kv.mod_revision(),
            });
        }
        Self { by_token }
    }

    /// The uses counted apart for the token `name` whose key was created at `token_revision`.
    fn total(&self, name: &str, token_revision: i64) -> u32 {
        self.by_token.get(name).map_or(0, |counters| {
            counters
                .iter()
                .filter(|counter| counter.counted.token_revision == token_revision)
                .fold(0u32, |total, counter| total.saturating_add(counter.counted.uses))
        })
    }

    /// What `writer` counted for the token `name` created at `token_revision` (nothing for a
    /// counter of an earlier token of that name), and its counter key's mod revision (0:
    /// absent), which its next write compares.
    pub(crate) fn own(&self, name: &str, token_revision: i64, writer: &str) -> (CountedUses, i64) {
        let counter = self.by_token.get(name).and_then(|counters| counters.iter().find(|c| c.writer == writer));
        match counter {
            Some(counter) if counter.counted.token_revision == token_revision => {
                (counter.counted.clone(), counter.revision)
            }
            Some(counter) => (CountedUses { token_revision, uses: 0 }, counter.revision),
            None => (CountedUses { token_revision, uses: 0 }, 0),
        }
    }
}

/// A registration token's key as listed.
#[derive(Clone, Debug)]
pub(crate) struct ListedToken {
    pub key: String,
    pub revision: i64,
    /// Its creation revision: what its counters name it by.
    pub created: i64,
    /// Its expiry's lease (0: none), which its counters carry too.
    pub lease: i64,
}

/// The tokens in a listing of `registrations/` (undecodable ones skipped and logged), each
/// with every use counted: on its record and, without a use limit, apart by `counters`.
pub(crate) fn listed_tokens(kvs: &[KeyValue], counters: &UseCounters) -> Vec<(ListedToken, RegistrationRecord)> {
    kvs.iter()
        .filter_map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let mut record = decode_listed::<RegistrationRecord>(&key, kv.value())?;
            if counted_apart(&record) {
                record.uses = record.uses.saturating_add(counters.total(&record.name, kv.create_revision()));
            }
            let listed =
                ListedToken { key, revision: kv.mod_revision(), created: kv.create_revision(), lease: kv.lease() };
            Some((listed, record))
        })
        .collect()
}

/// Whether joins through `token` are counted apart rather than on its record.
pub(crate) fn counted_apart(token: &RegistrationRecord) -> bool {
    token.max_uses.is_none()
}

/// A writer ID for this process's counters: random, so two fleetds never share one.
pub(crate) fn new_writer() -> String {
    let mut bytes = [0u8; 8];
    // Without the system's randomness (never seen), the process ID and the clock still set
    // writers apart; a shared writer would only make its fleetds' joins race, as before.
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.subsec_nanos());
        bytes = (u64::from(std::process::id()) << 32 | u64::from(nanos)).to_be_bytes();
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_are_distinct_and_safe_in_a_key() {
        let (a, b) = (new_writer(), new_writer());
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|byte| byte.is_ascii_hexdigit()));
    }
}
