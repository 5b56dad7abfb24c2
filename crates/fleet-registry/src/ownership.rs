//! Who may write a unit: a unit made by a source belongs to it; neither another source nor a
//! hand write changes it unless it explicitly takes it over.

use std::sync::Arc;

use fleet_core::drift::DriftPolicy;
use fleet_core::unit_history::ChangedBy;
use serde::{Deserialize, Serialize};

use crate::{PlanGuard, UnitRecord};

/// Who writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// An API client (fleetctl, the original's clients), or a rollout of units made by hand;
    /// `guard`: the plan the write is guarded by (`?ifUnchanged=`), if any.
    Hand { take_over: bool, by: ChangedBy, guard: Option<Arc<PlanGuard>> },
    /// A source's sync (or a rollout of its units), writing its units with its drift policy.
    Source { name: String, take_over: bool, drift: DriftPolicy, by: ChangedBy },
}

impl Writer {
    /// A hand write that takes nothing over: what the original's clients send.
    pub const BY_HAND: Writer = Writer::Hand { take_over: false, by: ChangedBy::UNKNOWN, guard: None };

    /// A hand write by the identity `name`, taking units over from their source or not.
    pub fn identity(name: &str, take_over: bool) -> Self {
        Self::Hand { take_over, by: ChangedBy::identity(name), guard: None }
    }

    /// This hand writer, its units written only while each is as `guard`'s plan saw it.
    pub fn guarded_by(self, guard: Arc<PlanGuard>) -> Self {
        match self {
            Self::Hand { take_over, by, .. } => Self::Hand { take_over, by, guard: Some(guard) },
            source @ Self::Source { .. } => source,
        }
    }

    /// The plan this write is guarded by, if any.
    pub fn guard(&self) -> Option<&PlanGuard> {
        match self {
            Self::Hand { guard, .. } => guard.as_deref(),
            Self::Source { .. } => None,
        }
    }

    /// The owner `unit` has after this write, or why it may not be written: another owner
    /// holds it, or it is not as the plan guarding the write saw it. `record` is the unit's
    /// record now (`None`: no such unit) and `machine` where it is placed; a store calls this
    /// inside the write it makes, over what that write is conditioned on.
    pub fn admits(
        &self,
        unit: &str,
        record: Option<&UnitRecord>,
        machine: Option<&str>,
    ) -> Result<Option<String>, Refused> {
        if let Some(guard) = self.guard().filter(|guard| !guard.holds(unit, record, machine)) {
            return Err(Refused::ChangedSincePlan { index: guard.index });
        }
        self.owner_after(record.is_some(), record.and_then(|record| record.source.as_deref()))
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
    pub fn owner_after(&self, exists: bool, current: Option<&str>) -> Result<Option<String>, Refused> {
        let mine = !exists || current == self.owner() || self.takes_over();
        if mine {
            Ok(self.owner().map(str::to_string))
        } else {
            Err(Refused::Owned { owner: current.map(str::to_string) })
        }
    }
}

/// Why a unit write was kept out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refused {
    /// Another owner holds the unit: a source, or `None` when it was made by hand.
    Owned { owner: Option<String> },
    /// The unit is not as the plan guarding the write (its index) saw it.
    ChangedSincePlan { index: u64 },
}

impl Refused {
    /// The error a refused write of `unit` answers.
    pub fn into_error(self, unit: &str) -> crate::RegistryError {
        match self {
            Self::Owned { owner } => crate::RegistryError::Owned { unit: unit.to_string(), owner },
            Self::ChangedSincePlan { index } => {
                crate::RegistryError::ChangedSincePlan { unit: unit.to_string(), index }
            }
        }
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
        assert_eq!(other.owner_after(true, Some("git")), Err(Refused::Owned { owner: Some("git".into()) }));
        assert_eq!(git.owner_after(true, None), Err(Refused::Owned { owner: None }));
        assert_eq!(Writer::BY_HAND.owner_after(true, None), Ok(None));
        assert_eq!(Writer::BY_HAND.owner_after(true, Some("git")), Err(Refused::Owned { owner: Some("git".into()) }));
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
