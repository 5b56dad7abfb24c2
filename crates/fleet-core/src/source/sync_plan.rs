//! A source's sync as a pure function: (the source at a commit, what the cluster holds) →
//! the writes that make the cluster hold what the source says, and the units it may not touch.

use std::collections::BTreeMap;

use super::content::SourceContent;
use crate::drift::DriftPolicy;
use crate::{DesiredState, UnitFile, UnitHash};

/// A unit as the cluster holds it, with its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldUnit {
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// The source that owns it; `None`: made by hand.
    pub source: Option<String>,
    pub drift: DriftPolicy,
}

/// One write of a sync, to be made with the source as the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncChange {
    Create {
        name: String,
        file: UnitFile,
        desired: DesiredState,
    },
    /// New content, or the same content taken over from another owner or with another drift
    /// policy.
    Replace {
        name: String,
        file: UnitFile,
        desired: DesiredState,
    },
    SetDesired {
        name: String,
        desired: DesiredState,
    },
    Destroy {
        name: String,
    },
}

impl SyncChange {
    pub fn unit(&self) -> &str {
        match self {
            Self::Create { name, .. }
            | Self::Replace { name, .. }
            | Self::SetDesired { name, .. }
            | Self::Destroy { name } => name,
        }
    }
}

impl SyncChange {
    /// Whether this change is new content for a unit of `source` that runs: what a source
    /// with waves (`--max-unavailable`) hands to its rollout rather than writing at once.
    pub fn goes_out_in_waves(&self, held: &BTreeMap<String, HeldUnit>, source: &str) -> bool {
        let Self::Replace { name, file, desired: DesiredState::Launched } = self else { return false };
        held.get(name).is_some_and(|unit| {
            unit.source.as_deref() == Some(source) && unit.desired == DesiredState::Launched && unit.hash != file.hash()
        })
    }
}

/// A unit the source names that another owner holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedElsewhere {
    pub unit: String,
    /// The other source; `None`: made by hand.
    pub owner: Option<String>,
}

impl OwnedElsewhere {
    /// `unit (source other)` or `unit (made by hand)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.unit, self.owner_words())
    }

    /// `source other` or `made by hand`.
    pub fn owner_words(&self) -> String {
        match &self.owner {
            Some(source) => format!("source {source}"),
            None => "made by hand".to_string(),
        }
    }
}

/// How a source treats what it does not own and what it no longer names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncRules {
    /// Units the source made and no longer names stay (owned, unchanged).
    pub keep_removed: bool,
    /// Units held by hand or by another source are taken over.
    pub take_over: bool,
    /// What the machines do when the source's units drift there.
    pub drift: DriftPolicy,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPlan {
    pub changes: Vec<SyncChange>,
    pub owned_elsewhere: Vec<OwnedElsewhere>,
}

/// What source `source` must write so that the cluster holds `content`. Units whose file did
/// not read are left alone (neither changed nor destroyed); a halted source writes nothing.
pub fn plan_sync(
    source: &str,
    content: &SourceContent,
    held: &BTreeMap<String, HeldUnit>,
    rules: SyncRules,
) -> SyncPlan {
    let mut plan = SyncPlan::default();
    if content.halted {
        return plan;
    }
    let ours = |unit: &HeldUnit| unit.source.as_deref() == Some(source);
    for (name, wanted) in &content.units {
        let (name, file, desired) = (name.clone(), wanted.file.clone(), wanted.desired);
        let Some(current) = held.get(&name) else {
            plan.changes.push(SyncChange::Create { name, file, desired });
            continue;
        };
        if !ours(current) && !rules.take_over {
            plan.owned_elsewhere.push(OwnedElsewhere { unit: name, owner: current.source.clone() });
        } else if !ours(current) || current.hash != file.hash() || current.drift != rules.drift {
            plan.changes.push(SyncChange::Replace { name, file, desired });
        } else if current.desired != desired {
            plan.changes.push(SyncChange::SetDesired { name, desired });
        }
    }
    if !rules.keep_removed {
        for (name, current) in held {
            if ours(current) && !content.units.contains_key(name) && !content.broken.contains(name) {
                plan.changes.push(SyncChange::Destroy { name: name.clone() });
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::content::read_source;

    const A: &str = "[Service]\nExecStart=/bin/true\n";
    const B: &str = "[Service]\nExecStart=/bin/false\n";

    fn held(text: &str, desired: DesiredState, source: Option<&str>) -> HeldUnit {
        let hash = UnitFile::parse(text).expect("a unit file").hash();
        HeldUnit { hash, desired, source: source.map(str::to_string), drift: DriftPolicy::Correct }
    }

    fn kinds(plan: &SyncPlan) -> Vec<String> {
        plan.changes
            .iter()
            .map(|change| {
                let kind = match change {
                    SyncChange::Create { .. } => "create",
                    SyncChange::Replace { .. } => "replace",
                    SyncChange::SetDesired { .. } => "set",
                    SyncChange::Destroy { .. } => "destroy",
                };
                format!("{kind} {}", change.unit())
            })
            .collect()
    }

    #[test]
    fn creates_replaces_sets_and_destroys_only_its_own() {
        let content = read_source(
            &[
                ("new.service".into(), A.into()),
                ("changed.service".into(), B.into()),
                ("stopped.service".into(), A.into()),
                ("same.service".into(), A.into()),
                ("byhand.service".into(), A.into()),
                ("fleet-desired.conf".into(), "stopped.service = loaded\n".into()),
            ],
            crate::source::content::DEFAULT_MAX_UNITS,
        );
        let held = BTreeMap::from([
            ("changed.service".to_string(), held(A, DesiredState::Launched, Some("git"))),
            ("stopped.service".to_string(), held(A, DesiredState::Launched, Some("git"))),
            ("same.service".to_string(), held(A, DesiredState::Launched, Some("git"))),
            ("byhand.service".to_string(), held(A, DesiredState::Launched, None)),
            ("gone.service".to_string(), held(A, DesiredState::Launched, Some("git"))),
            ("other.service".to_string(), held(A, DesiredState::Launched, Some("elsewhere"))),
        ]);
        let plan = plan_sync("git", &content, &held, SyncRules::default());
        assert_eq!(
            kinds(&plan),
            vec!["replace changed.service", "create new.service", "set stopped.service", "destroy gone.service"]
        );
        assert_eq!(plan.owned_elsewhere, vec![OwnedElsewhere { unit: "byhand.service".into(), owner: None }]);
        let rules = SyncRules { keep_removed: true, take_over: true, drift: DriftPolicy::Correct };
        let kept = plan_sync("git", &content, &held, rules);
        assert_eq!(
            kinds(&kept),
            vec!["replace byhand.service", "replace changed.service", "create new.service", "set stopped.service"]
        );
    }

    #[test]
    fn only_new_content_for_its_own_running_units_goes_out_in_waves() {
        let content = read_source(
            &[
                ("runs.service".into(), B.into()),
                ("stopped.service".into(), B.into()),
                ("byhand.service".into(), B.into()),
                ("new.service".into(), B.into()),
            ],
            crate::source::content::DEFAULT_MAX_UNITS,
        );
        let held = BTreeMap::from([
            ("runs.service".to_string(), held(A, DesiredState::Launched, Some("git"))),
            ("stopped.service".to_string(), held(A, DesiredState::Loaded, Some("git"))),
            ("byhand.service".to_string(), held(A, DesiredState::Launched, None)),
        ]);
        let rules = SyncRules { take_over: true, ..SyncRules::default() };
        let plan = plan_sync("git", &content, &held, rules);
        let waves: Vec<&str> =
            plan.changes.iter().filter(|change| change.goes_out_in_waves(&held, "git")).map(SyncChange::unit).collect();
        assert_eq!(waves, vec!["runs.service"], "{:?}", kinds(&plan));
    }

    #[test]
    fn a_broken_file_keeps_its_unit_and_a_halted_source_writes_nothing() {
        let held = BTreeMap::from([("a.service".to_string(), held(A, DesiredState::Launched, Some("git")))]);
        let broken = read_source(
            &[("a.service".into(), "[Service]\nnot an option\n".into())],
            crate::source::content::DEFAULT_MAX_UNITS,
        );
        assert!(plan_sync("git", &broken, &held, SyncRules::default()).changes.is_empty());
        let halted = read_source(
            &[("fleet-desired.conf".into(), "nonsense\n".into())],
            crate::source::content::DEFAULT_MAX_UNITS,
        );
        assert!(plan_sync("git", &halted, &held, SyncRules::default()).changes.is_empty());
    }

    /// The cluster after `plan`, with `source` as the writer.
    fn applied(
        source: &str,
        mut held: BTreeMap<String, HeldUnit>,
        plan: &SyncPlan,
        drift: DriftPolicy,
    ) -> BTreeMap<String, HeldUnit> {
        let owner = Some(source.to_string());
        for change in &plan.changes {
            match change {
                SyncChange::Create { name, file, desired } | SyncChange::Replace { name, file, desired } => {
                    let unit = HeldUnit { hash: file.hash(), desired: *desired, source: owner.clone(), drift };
                    held.insert(name.clone(), unit);
                }
                SyncChange::SetDesired { name, desired } => {
                    if let Some(unit) = held.get_mut(name) {
                        unit.desired = *desired;
                    }
                }
                SyncChange::Destroy { name } => {
                    held.remove(name);
                }
            }
        }
        held
    }

    proptest::proptest! {
        /// A sync converges in one step, and touches nothing another owner holds.
        #[test]
        fn one_sync_converges_and_spares_other_owners(
            wanted in proptest::collection::btree_map(0u8..12, (0u8..3, 0u8..3), 0..10),
            present in proptest::collection::btree_map(0u8..12, (0u8..3, 0u8..3, 0u8..3), 0..10),
            keep_removed: bool,
            report_only: bool,
            held_report_only: bool,
        ) {
            let policy = |report: bool| if report { DriftPolicy::Report } else { DriftPolicy::Correct };
            let state = |n: u8| [DesiredState::Inactive, DesiredState::Loaded, DesiredState::Launched][usize::from(n)];
            let text = |n: u8| format!("[Service]\nExecStart=/bin/sleep {n}\n");
            let mut files: Vec<(String, String)> =
                wanted.iter().map(|(unit, (body, _))| (format!("u{unit}.service"), text(*body))).collect();
            let lines: String =
                wanted.iter().map(|(unit, (_, desired))| format!("u{unit}.service = {}\n", state(*desired))).collect();
            files.push(("fleet-desired.conf".into(), lines));
            let content = read_source(&files, crate::source::content::DEFAULT_MAX_UNITS);
            let owners = [None, Some("git".to_string()), Some("other".to_string())];
            let held: BTreeMap<String, HeldUnit> = present
                .iter()
                .map(|(unit, (body, desired, owner))| {
                    let hash = UnitFile::parse(&text(*body)).expect("a unit file").hash();
                    let source = owners[usize::from(*owner)].clone();
                    let unit_held = HeldUnit { hash, desired: state(*desired), source, drift: policy(held_report_only) };
                    (format!("u{unit}.service"), unit_held)
                })
                .collect();
            let rules = SyncRules { keep_removed, take_over: false, drift: policy(report_only) };
            let plan = plan_sync("git", &content, &held, rules);
            for change in &plan.changes {
                let owner = held.get(change.unit()).map(|unit| unit.source.as_deref());
                proptest::prop_assert!(matches!(owner, None | Some(Some("git"))), "{change:?} touches another owner's unit");
            }
            let after = applied("git", held, &plan, rules.drift);
            proptest::prop_assert!(plan_sync("git", &content, &after, rules).changes.is_empty());
        }
    }
}
