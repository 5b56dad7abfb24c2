//! Units taken over from another registry (the original fleet's, `fleetctl import-original`):
//! written with the machine they already run on, all of them or none.

use fleet_core::{DesiredState, MachineId, UnitFile};

/// One unit of an import: its content and desired state, and the machine the other registry
/// runs it on (none: the engine places it).
#[derive(Clone, Debug)]
pub struct ImportedUnit {
    pub name: String,
    pub file: UnitFile,
    pub desired: DesiredState,
    pub machine: Option<MachineId>,
}

/// What an import wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Imported {
    /// Every unit, each placed where it named.
    Written,
    /// Nothing: units of these names exist already (the import takes over no unit of fleet's).
    Existing(Vec<String>),
}
