//! Records only the etcd store keeps.

use fleet_core::{DesiredState, UnitHash};
use serde::{Deserialize, Serialize};

/// What an agent needs to know of a unit it should hold: under `schedule/<machine>/<unit>`
/// and `global/<unit>`. The unit's name is the last element of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub hash: UnitHash,
    pub desired: DesiredState,
}
