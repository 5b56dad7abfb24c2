//! A plan of a source's sync (`fleetctl plan source sync NAME`): the writes the leader's
//! syncer would make if it synced the source now, worked out from the same pure functions
//! over the content read the same way (`fleet_registry::SourceReading`), then planned as any
//! command's writes are.

use std::sync::Arc;

use fleet_core::source::{OwnedElsewhere, SyncChange, plan_sync, rollout_of};
use fleet_registry::{ReadSource, RolloutRecord, SourceRecord, UnitChange, UnitView, held_units};

use crate::schema::PlannedSync;

/// The largest file a plan of a sync carries for a diff.
const CONTENT_MAX: usize = 64 * 1024;

/// The most bytes of files one plan of a sync carries.
const CONTENTS_MAX: usize = 4 * 1024 * 1024;

/// What a sync of a source would write now, and what the plan says of the sync itself.
pub struct SyncWrites {
    pub changes: Vec<UnitChange>,
    pub destroy: Vec<String>,
    pub sync: PlannedSync,
}

/// The writes of a sync of `source` (forced when `force`, as `source sync --force` is) that
/// read `read`, over the cluster's `units` and `rollouts`: none when the source is paused,
/// halted by its reverted rollout or by a desired-state file that does not read.
pub fn sync_writes(
    source: &SourceRecord,
    read: &ReadSource,
    force: bool,
    units: &[UnitView],
    rollouts: &[Arc<RolloutRecord>],
) -> SyncWrites {
    let content = &read.content;
    let mut sync = PlannedSync {
        name: source.name.clone(),
        commit: read.commit.clone(),
        problems: content.problems.iter().map(ToString::to_string).collect(),
        ..PlannedSync::default()
    };
    let nothing = |sync| SyncWrites { changes: Vec::new(), destroy: Vec::new(), sync };
    if source.paused {
        sync.halted = Some(format!(
            "source {} is paused: a sync writes nothing until `fleetctl source resume {}`",
            source.name, source.name
        ));
        return nothing(sync);
    }
    let rollout = rollout_of(&source.name);
    let last = rollouts.iter().find(|record| record.name == rollout);
    if let Some(halted) = source.halted_at(&read.commit, source.forced + u64::from(force), last.map(Arc::as_ref)) {
        sync.halted = Some(halted.describe(&source.name));
        return nothing(sync);
    }
    if content.halted {
        sync.halted = Some(
            "a desired-state file does not read (see the problems): nothing of the source changes until it does".into(),
        );
        return nothing(sync);
    }
    let held = held_units(units);
    let plan = plan_sync(&source.name, content, &held, source.sync_rules());
    sync.owned_elsewhere = plan.owned_elsewhere.iter().map(OwnedElsewhere::describe).collect();
    let in_waves = source.waves().is_some();
    let (mut changes, mut destroy, mut carried) = (Vec::new(), Vec::new(), 0);
    for change in &plan.changes {
        if let SyncChange::Replace { name, file, .. } = change
            && held.get(name).is_some_and(|unit| unit.hash != file.hash())
        {
            let text = file.serialize();
            if text.len() <= CONTENT_MAX && carried + text.len() <= CONTENTS_MAX {
                carried += text.len();
                sync.contents.insert(name.clone(), text);
            }
        }
        if in_waves && change.goes_out_in_waves(&held, &source.name) {
            sync.rolled.push(change.unit().to_string());
        }
        match change {
            SyncChange::Create { name, file, desired } | SyncChange::Replace { name, file, desired } => {
                changes.push(UnitChange { name: name.clone(), file: Some(file.clone()), desired: *desired });
            }
            SyncChange::SetDesired { name, desired } => {
                changes.push(UnitChange { name: name.clone(), file: None, desired: *desired });
            }
            SyncChange::Destroy { name } => destroy.push(name.clone()),
        }
    }
    if !sync.rolled.is_empty() {
        sync.rolled.sort();
        sync.rollout = Some(rollout);
    }
    SyncWrites { changes, destroy, sync }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::source::read_source;
    use fleet_core::{DesiredState, UnitFile};
    use fleet_registry::UnitRecord;

    const A: &str = "[Service]\nExecStart=/bin/sleep 1\n";
    const B: &str = "[Service]\nExecStart=/bin/sleep 2\n";

    fn view(name: &str, text: &str, desired: DesiredState, source: Option<&str>) -> UnitView {
        let file = UnitFile::parse(text).expect("a unit file");
        let record = UnitRecord { source: source.map(str::to_string), ..UnitRecord::by_hand(file.hash(), desired) };
        UnitView::from_records(name, record, file, Some("m1".into()), None, None)
    }

    fn read(files: &[(&str, &str)]) -> ReadSource {
        let files: Vec<(String, String)> =
            files.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect();
        ReadSource { commit: "c0ffee".into(), content: Arc::new(read_source(&files, 100)) }
    }

    fn names(changes: &[UnitChange]) -> Vec<&str> {
        changes.iter().map(|change| change.name.as_str()).collect()
    }

    #[test]
    fn a_sync_creates_changes_and_destroys_its_own_and_carries_the_new_files() {
        let units = [
            view("runs.service", A, DesiredState::Launched, Some("apps")),
            view("gone.service", A, DesiredState::Launched, Some("apps")),
            view("byhand.service", A, DesiredState::Launched, None),
        ];
        let source = SourceRecord { max_unavailable: Some("1".into()), ..SourceRecord::new("apps", "file:///x") };
        let read =
            read(&[("runs.service", B), ("new.service", A), ("byhand.service", B), ("bad.service", "nonsense\n")]);
        let writes = sync_writes(&source, &read, false, &units, &[]);
        assert_eq!(names(&writes.changes), ["new.service", "runs.service"]);
        assert_eq!(writes.destroy, ["gone.service"]);
        let sync = writes.sync;
        assert_eq!((sync.name.as_str(), sync.commit.as_str(), sync.halted), ("apps", "c0ffee", None));
        assert_eq!(sync.owned_elsewhere, ["byhand.service (made by hand)"]);
        assert_eq!((sync.rollout.as_deref(), sync.rolled), (Some("source-apps"), vec!["runs.service".to_string()]));
        assert_eq!(sync.contents.keys().collect::<Vec<_>>(), ["runs.service"], "only changed content is carried");
        assert!(sync.problems.iter().any(|problem| problem.contains("bad.service")), "{:?}", sync.problems);
    }

    #[test]
    fn a_paused_or_halted_source_writes_nothing_and_says_why() {
        let units = [view("runs.service", A, DesiredState::Launched, Some("apps"))];
        let paused = SourceRecord { paused: true, ..SourceRecord::new("apps", "file:///x") };
        let writes = sync_writes(&paused, &read(&[("runs.service", B)]), false, &units, &[]);
        assert!(writes.changes.is_empty() && writes.destroy.is_empty());
        assert!(writes.sync.halted.is_some_and(|why| why.contains("fleetctl source resume apps")));
        let source = SourceRecord::new("apps", "file:///x");
        let unreadable = read(&[("runs.service", B), ("fleet-desired.conf", "nonsense\n")]);
        let writes = sync_writes(&source, &unreadable, false, &units, &[]);
        assert!(writes.changes.is_empty() && writes.destroy.is_empty());
        assert!(writes.sync.halted.is_some_and(|why| why.contains("desired-state file")));
    }
}
