//! Records only the etcd store keeps.

use fleet_core::drift::DriftPolicy;
use fleet_core::{DesiredState, UnitHash};
use serde::{Deserialize, Serialize};

use crate::UnitRecord;

/// What an agent needs to know of a unit it should hold: under `schedule/<machine>/<unit>`
/// and `global/<unit>`. The unit's name is the last element of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub hash: UnitHash,
    pub desired: DesiredState,
    #[serde(default, skip_serializing_if = "DriftPolicy::is_default")]
    pub drift: DriftPolicy,
}

impl Assignment {
    /// The agents' copy of `record`.
    pub fn of(record: &UnitRecord) -> Self {
        Self { hash: record.hash, desired: record.desired, drift: record.drift }
    }
}
