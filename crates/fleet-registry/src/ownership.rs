//! Who may write a unit: a unit made by a source belongs to it; neither another source nor a
//! hand write changes it unless it explicitly takes it over.

use fleet_core::drift::DriftPolicy;
use fleet_core::unit_history::ChangedBy;
use serde::{Deserialize, Serialize};

/// Who writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// An API client (fleetctl, the original's clients), or a rollout of units made by hand.
    Hand { take_over: bool, by: ChangedBy },
    /// A source's sync (or a rollout of its units), writing its units with its drift policy.
    Source { name: String, take_over: bool, drift: DriftPolicy, by: ChangedBy },
}

impl Writer {
    /// A hand write that takes nothing over: what the original's clients send.
    pub const BY_HAND: Writer = Writer::Hand { take_over: false, by: ChangedBy::UNKNOWN };

    /// A hand write by the identity `name`, taking units over from their source or not.
    pub fn identity(name: &str, take_over: bool) -> Self {
        Self::Hand { take_over, by: ChangedBy::identity(name) }
    }

    /// Who the versions this writer makes are by.
    pub fn changed_by(&self) -> &ChangedBy {
        match self {
            Self::Hand { by, .. } | Self::Source { by, .. } => by,
        }
    }

    fn owner(&self) -> Option<&str> {
        match self {
            Self::Hand { .. } => None,
            Self::Source { name, .. } => Some(name),
        }
    }

    fn takes_over(&self) -> bool {
        match self {
            Self::Hand { take_over, .. } | Self::Source { take_over, .. } => *take_over,
        }
    }

    /// The drift policy of the units this writer writes: a hand write's are corrected.
    pub fn drift_policy(&self) -> DriftPolicy {
        match self {
            Self::Hand { .. } => DriftPolicy::Correct,
            Self::Source { drift, .. } => *drift,
        }
    }

    /// The owner a unit has after this write, or who keeps it from being written. `current`
    /// is the unit's owner now (`None` for a unit that does not exist or was made by hand).
    pub fn owner_after(&self, exists: bool, current: Option<&str>) -> Result<Option<String>, OwnedBy> {
        let mine = !exists || current == self.owner() || self.takes_over();
        if mine { Ok(self.owner().map(str::to_string)) } else { Err(OwnedBy { owner: current.map(str::to_string) }) }
    }
}

/// The owner that kept a write out: a source, or `None` when the unit was made by hand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedBy {
    pub owner: Option<String>,
}

impl OwnedBy {
    /// The error a refused write of `unit` answers.
    pub fn into_error(self, unit: &str) -> crate::RegistryError {
        crate::RegistryError::Owned { unit: unit.to_string(), owner: self.owner }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_own_what_they_make() {
        let git = Writer::Source {
            name: "git".into(),
            take_over: false,
            drift: DriftPolicy::Correct,
            by: ChangedBy::UNKNOWN,
        };
        let other = Writer::Source {
            name: "other".into(),
            take_over: false,
            drift: DriftPolicy::Correct,
            by: ChangedBy::UNKNOWN,
        };
        assert_eq!(git.owner_after(false, None), Ok(Some("git".into())));
        assert_eq!(git.owner_after(true, Some("git")), Ok(Some("git".into())));
        assert_eq!(other.owner_after(true, Some("git")), Err(OwnedBy { owner: Some("git".into()) }));
        assert_eq!(git.owner_after(true, None), Err(OwnedBy { owner: None }));
        assert_eq!(Writer::BY_HAND.owner_after(true, None), Ok(None));
        assert_eq!(Writer::BY_HAND.owner_after(true, Some("git")), Err(OwnedBy { owner: Some("git".into()) }));
        assert_eq!(Writer::identity("token:ci", true).owner_after(true, Some("git")), Ok(None));
        let taking = Writer::Source {
            name: "other".into(),
            take_over: true,
            drift: DriftPolicy::Correct,
            by: ChangedBy::UNKNOWN,
        };
        assert_eq!(taking.owner_after(true, Some("git")), Ok(Some("other".into())));
    }
}
