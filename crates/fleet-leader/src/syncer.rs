//! The engine leader's source syncer: while its fleetd leads, every source that is due is
//! fetched, read, planned against what the cluster holds and written with the source as the
//! writer; what happened goes to the source's status. Git → leader → agents: the agents see
//! ordinary units.

use fleet_core::events::{EventKind, NewEvent};
use fleet_registry::{EventSink, micros_now};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::rollout::{MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step, units_after_sync};
use fleet_core::source::cadence::{LastAttempt, next_sync};
use fleet_core::source::halt::{Halt, RolledFrom};
use fleet_core::source::{OwnedElsewhere, SourceContent, SyncChange, plan_sync, rollout_of};
use fleet_core::unit_history::ChangedBy;
use fleet_registry::{OutOfSync, RegistryError, RolloutRecord, SourceRecord, SourceStatus, UnitView, Writer};
use fleet_runtime::Lifecycle;
use fleet_runtime::Next;
use tokio::sync::watch;

use crate::leader_store::LeaderStore;
use crate::now;
use crate::source_reader::SourceReader;
use fleet_runtime::{LeaderPass, Triggers, while_leading};

/// The largest unit file a status keeps for a diff.
const WANTED_TEXT_MAX: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct SyncerConfig {
    /// The shortest wait between two passes (a source due again at once is not fetched in
    /// a tight loop).
    pub tick: Duration,
}

pub struct SourceSyncer {
    config: SyncerConfig,
    registry: Arc<dyn LeaderStore>,
    /// Fetches and reads the sources (shared with the API's plans of a sync).
    reader: Arc<SourceReader>,
    /// Where the syncs go as events.
    events: EventSink,
}

impl SourceSyncer {
    /// The syncer of the sources of `registry`, fetched and read through `reader` (one per
    /// fleetd: its API plans syncs through it too).
    pub fn new(config: SyncerConfig, registry: Arc<dyn LeaderStore>, reader: Arc<SourceReader>) -> Self {
        Self { config, registry, reader, events: EventSink::discarding() }
    }

    /// Tells `events` of each sync that changed something and each that failed.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    fn note(&self, source: &str, message: String) {
        self.events.note(NewEvent::new(micros_now(), EventKind::Sync, format!("source {source}: {message}")));
    }

    /// Syncs while `leads` says this fleetd leads, until `lifecycle` ends it.
    pub async fn run(self, leads: watch::Receiver<bool>, lifecycle: watch::Receiver<Lifecycle>) {
        let changes = Triggers::none().with(self.registry.source_changes());
        while_leading(self, changes, leads, lifecycle).await;
    }

    /// Syncs every source that is due; returns when the next one is due (seconds since the
    /// epoch), if any is.
    async fn sync_due(&self) -> Result<Option<u64>, RegistryError> {
        let mut statuses: BTreeMap<String, SourceStatus> = self.registry.source_statuses().await?.into_iter().collect();
        let mut next_due: Option<u64> = None;
        let sources = self.registry.sources().await?;
        // A source removed leaves nothing behind: its clone on disk, its content held.
        self.reader.forget_others(&sources.iter().map(|source| source.name.clone()).collect()).await;
        for source in sources {
            if source.paused {
                continue;
            }
            let mut status = statuses.remove(&source.name).unwrap_or_default();
            if due(&source, &status) <= now() {
                status = self.sync(&source, status).await;
                self.registry.set_source_status(&source.name, &status).await?;
            }
            let at = due(&source, &status);
            next_due = Some(next_due.map_or(at, |earliest| earliest.min(at)));
        }
        Ok(next_due)
    }

    /// One sync of `source`; its new status (a failure is in the status, not an error).
    async fn sync(&self, source: &SourceRecord, previous: SourceStatus) -> SourceStatus {
        let mut status = SourceStatus {
            attempted_at: now(),
            generation: source.generation,
            commit: previous.commit.clone(),
            synced_at: previous.synced_at,
            units: previous.units,
            ..SourceStatus::default()
        };
        let fetched = match self.reader.read(source).await {
            Ok(fetched) => fetched,
            Err(error) => {
                tracing::warn!(source = source.name, %error, "source fetch failed");
                if previous.error.as_ref() != Some(&error) {
                    self.note(&source.name, format!("fetch failed: {error}"));
                }
                status.error = Some(error);
                status.failures = previous.failures.saturating_add(1);
                return status;
            }
        };
        let content = fetched.content.clone();
        let last_rollout = match self.registry.rollouts().await {
            Ok(rollouts) => rollouts.into_iter().find(|record| record.name == rollout_of(&source.name)),
            Err(error) => {
                status.error = Some(format!("reading the source's rollout: {error}"));
                status.failures = previous.failures.saturating_add(1);
                return status;
            }
        };
        if let Some(halted) = source.halted_at(&fetched.commit, source.forced, last_rollout.as_deref()) {
            return halted_status(source, status, previous, &halted);
        }
        let rolling =
            Rolling { from: RolledFrom { commit: fetched.commit.clone(), forced: source.forced }, last_rollout };
        match self.apply(source, &content, &rolling).await {
            Ok(applied) => {
                if applied.changes > 0 {
                    tracing::info!(
                        source = source.name,
                        commit = fetched.commit,
                        changes = applied.changes,
                        "source synced"
                    );
                    self.note(&source.name, format!("synced commit {}: {} changes", fetched.commit, applied.changes));
                }
                status.commit = Some(fetched.commit);
                status.synced_at = Some(status.attempted_at);
                status.problems = content.problems.iter().map(ToString::to_string).collect();
                status.owned_elsewhere = applied.owned_elsewhere;
                status.out_of_sync = applied.out_of_sync;
                status.units = applied.units;
                status.changes = applied.changes;
            }
            Err(error) => {
                tracing::warn!(source = source.name, %error, "applying a source's changes failed");
                self.note(&source.name, format!("applying commit {} failed: {error}", fetched.commit));
                status.error = Some(format!("applying commit {}: {error}", fetched.commit));
                status.failures = previous.failures.saturating_add(1);
            }
        }
        status
    }

    /// Plans against what the cluster holds and writes the plan as the source; new content
    /// for its running units goes out as a rollout when the source asks for waves.
    async fn apply(
        &self,
        source: &SourceRecord,
        content: &SourceContent,
        rolling: &Rolling,
    ) -> Result<Applied, RegistryError> {
        // From the store's watch-fed copy, which holds this fleetd's own writes before it
        // answers: a sync of a source reads no unit from etcd.
        let views: BTreeMap<String, UnitView> =
            self.registry.units_copied().await?.into_iter().map(|unit| (unit.name.clone(), unit)).collect();
        let held = fleet_registry::held_units(views.values());
        let plan = plan_sync(&source.name, content, &held, source.sync_rules());
        let by = ChangedBy::source(&source.name, Some(&rolling.from.commit));
        let writer = Writer::Source { name: source.name.clone(), take_over: source.take_over, drift: source.drift, by };
        let mut owned_elsewhere: Vec<String> = plan.owned_elsewhere.iter().map(OwnedElsewhere::describe).collect();
        let mut out_of_sync = Vec::new();
        for owned in &plan.owned_elsewhere {
            out_of_sync.push(out_of_sync_entry(content, &owned.unit, held_elsewhere(owned)));
        }
        let (rolled, direct) = match source.waves() {
            Some(max_unavailable) => {
                let (rolled, direct): (Vec<&SyncChange>, Vec<&SyncChange>) =
                    plan.changes.iter().partition(|change| change.goes_out_in_waves(&held, &source.name));
                self.roll_out(source, max_unavailable, &rolled, &views, rolling).await?;
                let why = format!("new content waiting in rollout {}", rollout_of(&source.name));
                out_of_sync.extend(rolled.iter().map(|change| out_of_sync_entry(content, change.unit(), why.clone())));
                (rolled.len(), direct)
            }
            None => (0, plan.changes.iter().collect()),
        };
        for name in &content.broken {
            if views.get(name).is_some_and(|unit| unit.source.as_deref() == Some(source.name.as_str())) {
                let why = "its file in the source does not read (see the problems); it keeps its content".to_string();
                out_of_sync.push(OutOfSync { unit: name.clone(), why, wanted: None });
            }
        }
        let mut changes = rolled;
        for change in direct {
            let written = match change {
                SyncChange::Create { name, file, desired } | SyncChange::Replace { name, file, desired } => {
                    self.registry.put_unit_as(name, file, *desired, &writer).await
                }
                SyncChange::SetDesired { name, desired } => {
                    self.registry.set_desired_state_as(name, *desired, &writer).await.map(drop)
                }
                SyncChange::Destroy { name } => self.registry.destroy_unit_as(name, &writer).await.map(drop),
            };
            match written {
                Ok(()) => changes += 1,
                // Taken by another owner since the plan was made.
                Err(RegistryError::Owned { unit, owner }) => {
                    let owned = OwnedElsewhere { unit, owner };
                    out_of_sync.push(out_of_sync_entry(content, &owned.unit, held_elsewhere(&owned)));
                    owned_elsewhere.push(owned.describe());
                }
                Err(error) => return Err(error),
            }
        }
        let units = content.units.len().saturating_sub(owned_elsewhere.len());
        out_of_sync.sort_by(|a, b| a.unit.cmp(&b.unit));
        Ok(Applied { changes, owned_elsewhere, out_of_sync, units })
    }
}

impl SourceSyncer {
    /// Hands `changes` (replacements of running units) to the source's rollout: merged into the
    /// one under way, which a sync that finds nothing new leaves as it is
    /// (`fleet_core::rollout::units_after_sync`).
    async fn roll_out(
        &self,
        source: &SourceRecord,
        max_unavailable: MaxUnavailable,
        changes: &[&SyncChange],
        views: &BTreeMap<String, UnitView>,
        rolling: &Rolling,
    ) -> Result<(), RegistryError> {
        let (commit, existing) = (&rolling.from, rolling.last_rollout.clone());
        if changes.is_empty() {
            return Ok(());
        }
        let name = rollout_of(&source.name);
        let mut bodies = BTreeMap::new();
        let mut units = Vec::new();
        for change in changes {
            let SyncChange::Replace { name, file, .. } = change else { continue };
            let Some(current) = views.get(name) else { continue };
            bodies.insert(current.hash.to_string(), current.file.serialize());
            bodies.insert(file.hash().to_string(), file.serialize());
            units.push(RolloutUnit { name: name.clone(), from: current.hash, to: file.hash(), step: Step::Waiting });
        }
        let (_, units) = source
            .gates
            .replacement_order(units, |unit| views.get(&unit.name).and_then(|view| view.machine_id.as_deref()));
        // What a unit requires among them goes before it (and into a canary with it).
        let units = fleet_core::rollout::dependency_order::rollout_units_required_first(units, &bodies);
        let Some(units) = units_after_sync(existing.as_ref().map(|record| &record.rollout), &units) else {
            // Nothing new for the rollout; it carries this commit's content all the same.
            return match existing {
                Some(record) if record.source_commit.as_ref() != Some(commit) => {
                    let record = RolloutRecord { source_commit: Some(commit.clone()), ..RolloutRecord::clone(&record) };
                    self.registry.put_rollout(&record).await
                }
                _ => Ok(()),
            };
        };
        // The bodies of the units kept from the rollout under way stay with it.
        let created = match existing {
            Some(record) if record.rollout.state != RolloutState::Done => {
                for (hash, text) in &record.bodies {
                    bodies.entry(hash.clone()).or_insert_with(|| text.clone());
                }
                record.created
            }
            _ => now(),
        };
        tracing::info!(source = source.name, units = units.len(), %max_unavailable, "rolling out new content");
        let rollout = Rollout {
            canary: source.gates.canary_of(units.len()),
            units,
            max_unavailable,
            min_ready: source.min_ready_seconds,
            deadline: source.deadline_seconds,
            state: RolloutState::Running,
            undo: false,
            auto_revert: source.gates.auto_revert,
            reverted: None,
            held: None,
        };
        let record = RolloutRecord {
            name,
            rollout,
            bodies,
            created,
            source_commit: Some(commit.clone()),
            secret: None,
            started_by: None,
        };
        self.registry.put_rollout(&record).await
    }
}

/// The status of `source` halted on `halted`: nothing written, what the last sync found kept,
/// and its units waiting in the reverted rollout said to wait for the halt's end.
fn halted_status(
    source: &SourceRecord,
    mut status: SourceStatus,
    previous: SourceStatus,
    halted: &Halt,
) -> SourceStatus {
    let why = halted.describe(&source.name);
    if previous.halted.is_none() {
        tracing::warn!(
            source = source.name,
            commit = halted.commit,
            reason = halted.why,
            "source halted: its rollout reverted itself"
        );
    }
    let waiting = format!("new content waiting in rollout {}", rollout_of(&source.name));
    status.commit = Some(halted.commit.clone());
    status.problems = previous.problems;
    status.owned_elsewhere = previous.owned_elsewhere;
    status.out_of_sync = previous
        .out_of_sync
        .into_iter()
        .map(|entry| if entry.why == waiting { OutOfSync { why: why.clone(), ..entry } } else { entry })
        .collect();
    status.halted = Some(why);
    status
}

/// What a sync rolls out from: the commit fetched, and the source's rollout as this sync read
/// it (read once, for the halt and for the rollout both).
struct Rolling {
    from: RolledFrom,
    last_rollout: Option<Arc<RolloutRecord>>,
}

struct Applied {
    changes: usize,
    owned_elsewhere: Vec<String>,
    out_of_sync: Vec<OutOfSync>,
    units: usize,
}

fn held_elsewhere(owned: &OwnedElsewhere) -> String {
    format!("held elsewhere ({}); source add --take-over takes it", owned.owner_words())
}

/// `unit` is out of sync for `why`; with the source's file for it, if small enough to keep.
fn out_of_sync_entry(content: &SourceContent, unit: &str, why: String) -> OutOfSync {
    let wanted =
        content.units.get(unit).map(|wanted| wanted.file.serialize()).filter(|text| text.len() <= WANTED_TEXT_MAX);
    OutOfSync { unit: unit.to_string(), why, wanted }
}

/// When `source` is due a sync, after the attempt `status` records (seconds since the epoch).
fn due(source: &SourceRecord, status: &SourceStatus) -> u64 {
    let last = LastAttempt {
        at: (status.attempted_at > 0).then_some(status.attempted_at),
        current: status.generation == source.generation,
        failures: status.failures,
    };
    next_sync(&source.name, source.interval_seconds, last)
}

impl LeaderPass for SourceSyncer {
    type Error = RegistryError;
    const NAME: &'static str = "source sync pass";

    /// With no source, nothing is due: the next pass waits for a change (a source added,
    /// asked to sync, or its webhook called), and the store is not read meanwhile.
    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Ok(match self.sync_due().await? {
            Some(due) => Next::After(Duration::from_secs(due.saturating_sub(now())).max(self.config.tick)),
            None => Next::OnChange,
        })
    }
}
