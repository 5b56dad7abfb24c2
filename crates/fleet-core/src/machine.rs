//! Machines as the scheduler and the API see them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::drain::Drain;
use crate::resources::Resources;

pub type MachineId = String;

/// A live machine: its identity, address and effective metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineState {
    pub id: MachineId,
    pub public_ip: String,
    pub metadata: BTreeMap<String, String>,
    pub version: String,
    pub disable_engine: bool,
    /// How the machine reaches the cluster's store (records from before it was kept read as
    /// etcd members).
    #[serde(default)]
    pub connection: Connection,
    /// What units may reserve on the machine in all; `None` (a machine that does not say, such
    /// as one of the original's) limits nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Resources>,
    /// The machine's drain, while an operator drains it: it takes no new units and its units
    /// move off. Kept in a record of its own, which the stores lay over the machine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// The taints that keep the machine for the units that tolerate them (fleet.conf's
    /// `taints=`, with the runtime changes laid over them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub taints: crate::taint::Taints,
}

/// A machine the leading engine saw gone that units still wait for (`LostAfter=`,
/// `AtMostOnce=`): since when the engine counts it out of touch, what it last said of itself,
/// and the units that wait. Written by the engine; lists show it until it is back or no unit
/// waits for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfTouch {
    pub id: MachineId,
    /// Microseconds since the epoch, by the engine's clock: when it first saw the machine gone.
    pub since: i64,
    /// The machine's record as last seen present, when the engine saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<MachineState>,
    /// The units that wait for it, by name.
    #[serde(default)]
    pub units: Vec<String>,
}

/// How a machine is connected to the cluster: its fleetd holds the store itself (an etcd
/// member's client, or the one embedded store) or it pulls its work from a manager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Connection {
    #[default]
    Etcd,
    Embedded,
    Pull,
}

impl Connection {
    /// The word the API and fleetctl show.
    pub fn word(self) -> &'static str {
        match self {
            Connection::Etcd => "etcd",
            Connection::Embedded => "embedded",
            Connection::Pull => "pull",
        }
    }
}

impl MachineState {
    /// Whether `requested` names this machine, by full ID or by its 8-character short ID.
    pub fn matches_id(&self, requested: &str) -> bool {
        self.id == requested || (requested.len() == 8 && self.id.starts_with(requested))
    }

    /// The machine's metadata and taints with the runtime changes laid over them: a value
    /// replaces the configured one, an empty value removes the key (taints' entries:
    /// [`crate::taint::override_entry`]).
    pub fn with_overrides(mut self, overrides: &BTreeMap<String, String>) -> Self {
        for (key, value) in overrides {
            if let Some((key, taint)) = crate::taint::from_override(key, value) {
                match taint {
                    Some(taint) => self.taints.insert(key.to_string(), taint),
                    None => self.taints.remove(key),
                };
            } else if value.is_empty() {
                self.metadata.remove(key);
            } else {
                self.metadata.insert(key.clone(), value.clone());
            }
        }
        self
    }
}

/// Whether `id` can name a machine that joins by itself (a pull agent): 1 to 64 letters,
/// digits, `-`, `_` and `.`, starting with a letter or digit (a systemd machine ID is 32 hex
/// digits; `.`, `..` and `-rf` name nothing).
pub fn valid_machine_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.bytes().next().is_some_and(|first| first.is_ascii_alphanumeric())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub use crate::metadata_key::valid_metadata_key;

/// Parses fleet.conf's `metadata="k=v,k2=v2"`: items without `=` are ignored, keys and values
/// are trimmed, a later duplicate wins.
pub fn parse_metadata(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .filter_map(|item| item.split_once('='))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .filter(|(key, _)| !key.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 67): `..`, `.` and `-rf` were machine IDs, revoked with a 204.
    #[test]
    fn a_machine_id_starts_with_a_letter_or_digit() {
        for id in ["0f3a9c", "m1", "edge-1", "web_2.example"] {
            assert!(valid_machine_id(id), "{id}");
        }
        for id in ["", ".", "..", "-rf", "_x", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_machine_id(id), "{id:?}");
        }
    }

    #[test]
    fn short_ids_match() {
        let machine = MachineState { id: "3d1219c7aaaabbbbccccddddeeeeffff".into(), ..Default::default() };
        assert!(machine.matches_id("3d1219c7"));
        assert!(machine.matches_id("3d1219c7aaaabbbbccccddddeeeeffff"));
        assert!(!machine.matches_id("3d1219c"));
        assert!(!machine.matches_id("3d1219c8"));
    }

    #[test]
    fn metadata_parsing_and_overrides() {
        let parsed = parse_metadata(" region = us ,az=1,bogus,az=2,=x");
        assert_eq!(parsed, BTreeMap::from([("region".into(), "us".into()), ("az".into(), "2".into())]));
        let machine = MachineState { metadata: parsed, ..Default::default() };
        let overrides = BTreeMap::from([("region".into(), String::new()), ("disk".into(), "ssd".into())]);
        let merged = machine.with_overrides(&overrides).metadata;
        assert_eq!(merged, BTreeMap::from([("az".into(), "2".into()), ("disk".into(), "ssd".into())]));
    }
}
