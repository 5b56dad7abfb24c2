//! The engine leader's source syncer: while its fleetd leads, every source that is due is
//! fetched, read, planned against what the cluster holds and written with the source as the
//! writer; what happened goes to the source's status. Git → leader → agents: the agents see
//! ordinary units.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_core::source::cadence::{LastAttempt, next_sync};
use fleet_core::source::{FileProblem, HeldUnit, SourceContent, SyncChange, SyncRules, plan_sync, read_source};
use fleet_core::unit_name::validate_name;
use fleet_registry::{ApiRegistry, RegistryError, SourceRecord, SourceStatus, Writer};
use tokio::sync::watch;

use crate::fetch::{Credentials, FetchRequest, Fetched, fetch};

/// The longest a fetch may take before the attempt counts as failed.
const FETCH_LIMIT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug)]
pub struct SyncerConfig {
    /// Where each source's bare repository is kept (`<dir>/<source>`), made 0700.
    pub cache_dir: PathBuf,
    /// Where credentials files are read (`<dir>/<credentials name>`).
    pub credentials_dir: PathBuf,
    /// How often the sources are looked at for one that is due.
    pub tick: Duration,
}

pub struct SourceSyncer {
    config: SyncerConfig,
    registry: Arc<dyn ApiRegistry>,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

impl SourceSyncer {
    pub fn new(config: SyncerConfig, registry: Arc<dyn ApiRegistry>) -> Self {
        Self { config, registry }
    }

    /// Syncs while `leads` says this fleetd leads, until `stop`.
    pub async fn run(self, mut leads: watch::Receiver<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = leads.wait_for(|leads| *leads) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            if let Err(error) = self.pass().await {
                tracing::warn!(%error, "source sync pass failed; trying again");
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.tick) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Syncs every source that is due.
    async fn pass(&self) -> Result<(), RegistryError> {
        let mut statuses: BTreeMap<String, SourceStatus> = self.registry.source_statuses().await?.into_iter().collect();
        for source in self.registry.sources().await? {
            let status = statuses.remove(&source.name).unwrap_or_default();
            let last = LastAttempt {
                at: (status.attempted_at > 0).then_some(status.attempted_at),
                current: status.generation == source.generation,
                failures: status.failures,
            };
            if source.paused || next_sync(&source.name, source.interval_seconds, last) > now() {
                continue;
            }
            let synced = self.sync(&source, status).await;
            self.registry.set_source_status(&source.name, &synced).await?;
        }
        Ok(())
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
        let fetched = match self.fetch(source).await {
            Ok(fetched) => fetched,
            Err(error) => {
                tracing::warn!(source = source.name, %error, "source fetch failed");
                status.error = Some(error);
                status.failures = previous.failures.saturating_add(1);
                return status;
            }
        };
        let content = content_of(&fetched);
        match self.apply(source, &content).await {
            Ok(applied) => {
                if applied.changes > 0 {
                    tracing::info!(
                        source = source.name,
                        commit = fetched.commit,
                        changes = applied.changes,
                        "source synced"
                    );
                }
                status.commit = Some(fetched.commit);
                status.synced_at = Some(status.attempted_at);
                status.problems = content.problems.iter().map(ToString::to_string).collect();
                status.owned_elsewhere = applied.owned_elsewhere;
                status.units = applied.units;
                status.changes = applied.changes;
            }
            Err(error) => {
                tracing::warn!(source = source.name, %error, "applying a source's changes failed");
                status.error = Some(format!("applying commit {}: {error}", fetched.commit));
                status.failures = previous.failures.saturating_add(1);
            }
        }
        status
    }

    /// Fetches on a blocking thread; the error as the status shows it.
    async fn fetch(&self, source: &SourceRecord) -> Result<Fetched, String> {
        let credentials = match &source.credentials_file {
            Some(name) => Some(read_credentials(&self.config.credentials_dir, name)?),
            None => None,
        };
        let cache = self.config.cache_dir.join(&source.name);
        make_private_dir(&self.config.cache_dir)?;
        let source = source.clone();
        let work = tokio::task::spawn_blocking(move || {
            let request = FetchRequest {
                repo: &source.repo,
                branch: source.branch.as_deref(),
                revision: source.revision.as_deref(),
                paths: &source.paths,
                credentials: credentials.as_ref(),
            };
            fetch(&cache, &request).map_err(|error| error.to_string())
        });
        match tokio::time::timeout(FETCH_LIMIT, work).await {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => Err(format!("the fetch stopped: {error}")),
            Err(_) => Err(format!("the fetch took over {FETCH_LIMIT:?}")),
        }
    }

    /// Plans against what the cluster holds and writes the plan as the source.
    async fn apply(&self, source: &SourceRecord, content: &SourceContent) -> Result<Applied, RegistryError> {
        let held: BTreeMap<String, HeldUnit> = self
            .registry
            .units()
            .await?
            .into_iter()
            .map(|unit| (unit.name, HeldUnit { hash: unit.hash, desired: unit.desired, source: unit.source }))
            .collect();
        let rules = SyncRules { keep_removed: source.keep_removed, take_over: source.take_over };
        let plan = plan_sync(&source.name, content, &held, rules);
        let writer = Writer::Source { name: source.name.clone(), take_over: source.take_over };
        let mut owned_elsewhere: Vec<String> =
            plan.owned_elsewhere.iter().map(|owned| describe_owner(&owned.unit, owned.owner.as_deref())).collect();
        let mut changes = 0;
        for change in &plan.changes {
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
                    owned_elsewhere.push(describe_owner(&unit, owner.as_deref()))
                }
                Err(error) => return Err(error),
            }
        }
        let units = content.units.len().saturating_sub(owned_elsewhere.len());
        Ok(Applied { changes, owned_elsewhere, units })
    }
}

struct Applied {
    changes: usize,
    owned_elsewhere: Vec<String>,
    units: usize,
}

fn describe_owner(unit: &str, owner: Option<&str>) -> String {
    match owner {
        Some(source) => format!("{unit} (source {source})"),
        None => format!("{unit} (made by hand)"),
    }
}

/// The source's content, with the files that could not be read as problems (and their units
/// left alone).
fn content_of(fetched: &Fetched) -> SourceContent {
    let mut content = read_source(&fetched.files);
    for (path, why) in &fetched.unreadable {
        let base = path.rsplit('/').next().unwrap_or(path);
        if validate_name(base).is_ok() {
            content.broken.insert(base.to_string());
            content.units.remove(base);
        }
        content.problems.push(FileProblem { path: path.clone(), line: None, problem: why.clone() });
    }
    content
}

/// A credentials file of `dir`; errors never show its content.
fn read_credentials(dir: &Path, name: &str) -> Result<Credentials, String> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|error| format!("cannot read credentials file {}: {}", path.display(), error.kind()))?;
    Credentials::parse(&text).ok_or_else(|| format!("credentials file {} holds no credentials", path.display()))
}

fn make_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|error| format!("cannot make the source cache {}: {error}", dir.display()))
}
