//! Many unit writes in one call (what `POST /fleet/v1/units` asks of a store): each is the
//! write one `PUT /fleet/v1/units/{name}` makes, and each succeeds or fails on its own.

use fleet_core::{DesiredState, UnitFile};

/// One unit write of a batch.
#[derive(Clone, Debug)]
pub struct UnitChange {
    pub name: String,
    /// With content, the unit is created or replaced with it ([`crate::ApiRegistry::put_unit_as`]);
    /// without, only the desired state of the unit there changes
    /// ([`crate::ApiRegistry::set_desired_state_as`]).
    pub file: Option<UnitFile>,
    pub desired: DesiredState,
}

/// What became of one unit write of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitChanged {
    /// Stored (created, replaced, or its desired state set).
    Written,
    /// Only a desired state was given, and there is no such unit.
    NoSuchUnit,
}
