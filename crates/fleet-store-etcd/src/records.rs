//! Records only the etcd store keeps.

use fleet_core::drift::DriftPolicy;
use fleet_core::{DesiredState, UnitHash, UnitOption};
use serde::{Deserialize, Serialize};

use fleet_core::secrets::SecretPins;
use fleet_registry::UnitRecord;

/// What an agent needs to know of a unit it should hold: under `schedule/<machine>/<unit>`
/// and `global/<unit>`. The unit's name is the last element of the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub hash: UnitHash,
    pub desired: DesiredState,
    #[serde(default, skip_serializing_if = "DriftPolicy::is_default")]
    pub drift: DriftPolicy,
    #[serde(default, skip_serializing_if = "SecretPins::is_empty")]
    pub secrets: SecretPins,
    /// For a unit placed with where its requirements run recorded for it: the revision of
    /// that record, as the engine wrote the placement. The record is written first but in
    /// another range, which an agent's copy may show later than this one; the agent reads its
    /// work once its copy holds that range up to here. Absent in records of fleet 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub places_at: Option<i64>,
}

impl Assignment {
    /// The agents' copy of `record`.
    pub fn of(record: &UnitRecord) -> Self {
        Self {
            hash: record.hash,
            desired: record.desired,
            drift: record.drift,
            secrets: record.secrets.clone(),
            places_at: None,
        }
    }
}

/// An assignment that carries its unit's body: the engine writes one for the first unit of
/// each content a machine gets, so the machine has that content from its own watch instead
/// of reading it from `bodies/` (etcd 3.4 copies its uncommitted writes for every read, and
/// at 10,000 machines those reads were most of the third of its CPU spent on such copies).
/// A reader of the assignment alone skips the body unparsed.
#[derive(Serialize)]
pub struct CarryingAssignment<'a> {
    #[serde(flatten)]
    pub assignment: &'a Assignment,
    pub body: &'a [UnitOption],
}

/// The body an assignment carries, when it carries one.
#[derive(Deserialize)]
pub struct CarriedBody {
    pub hash: UnitHash,
    #[serde(default)]
    pub body: Option<Vec<UnitOption>>,
}

/// The record a single-key read found (one that cannot be read is reported and taken as
/// none), and its mod revision (0 when there is none, which a compare takes as absent).
pub fn one<T: serde::de::DeserializeOwned>(key: &str, reply: &etcd_client::GetResponse) -> (Option<T>, i64) {
    match reply.kvs().first() {
        Some(kv) => (fleet_registry::codec::decode_listed(key, kv.value()), kv.mod_revision()),
        None => (None, 0),
    }
}
