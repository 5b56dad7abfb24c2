//! Fetching and reading git sources: each source's bare repository kept under one directory,
//! credentials read from files, and each source's content held at the commit last read, so
//! that a fetch that finds the same commit reads and parses nothing again. The syncer reads
//! through it, and so does the API's plan of a sync (`fleet_registry::SourceReading`): one
//! reader per fleetd, so the two never fetch into one repository at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::source::{FileProblem, SourceContent, read_source};
use fleet_core::unit_name::validate_name;
use fleet_core::unpoisoned::Locked;
use fleet_registry::{ReadSource, SourceReading, SourceRecord};
use fleet_source::{Credentials, FetchRequest, Fetched, fetch};

/// The longest a fetch may take before the attempt counts as failed.
const FETCH_LIMIT: Duration = Duration::from_secs(300);

/// Where sources are fetched to and read from, and how many units one may hold.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Where each source's bare repository is kept (`<dir>/<source>`), made 0700.
    pub cache_dir: PathBuf,
    /// Where credentials files are read (`<dir>/<credentials name>`).
    pub credentials_dir: PathBuf,
    /// The most units one source may hold (`source_max_units`).
    pub max_units: usize,
}

pub struct SourceReader {
    config: ReaderConfig,
    /// Each source's content at the commit last read.
    read: Mutex<BTreeMap<String, ReadContent>>,
    /// One fetch at a time into each source's repository.
    fetching: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A source's content as read at `commit`, from the place `origin` says.
struct ReadContent {
    origin: String,
    commit: String,
    content: Arc<SourceContent>,
}

/// Where a source's files come from: a change of any of it means reading them again.
fn origin(source: &SourceRecord) -> String {
    format!("{}\n{:?}\n{:?}\n{:?}", source.repo, source.branch, source.revision, source.paths)
}

impl SourceReader {
    pub fn new(config: ReaderConfig) -> Self {
        Self { config, read: Mutex::default(), fetching: Mutex::default() }
    }

    /// Fetches `source` and reads what it holds: the held content when the commit is the one
    /// read last (from the same place), else its files read now. The error as the source's
    /// status shows it.
    pub async fn read(&self, source: &SourceRecord) -> Result<ReadSource, String> {
        let turn = self.fetching.locked().entry(source.name.clone()).or_default().clone();
        let _turn = turn.lock().await;
        let fetched = self.fetch(source).await?;
        Ok(ReadSource { content: self.content(source, &fetched), commit: fetched.commit })
    }

    /// Lets go of what is held for the sources not named in `kept` (removed from the cluster):
    /// their content, their turn to fetch and their clones in the cache directory, those of
    /// an earlier fleetd on this machine included. A source whose fetch is under way, or
    /// waited for, is left for the next call.
    pub async fn forget_others(&self, kept: &BTreeSet<String>) {
        self.read.locked().retain(|name, _| kept.contains(name));
        let mut gone: BTreeSet<String> =
            self.fetching.locked().keys().filter(|name| !kept.contains(*name)).cloned().collect();
        if let Ok(entries) = std::fs::read_dir(&self.config.cache_dir) {
            let clones = entries.flatten().filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()));
            gone.extend(
                clones.filter_map(|entry| entry.file_name().into_string().ok()).filter(|name| !kept.contains(name)),
            );
        }
        for name in gone {
            // Its turn taken (made if there was none) while its clone goes: a fetch asked for
            // meanwhile waits for it, then clones afresh.
            let turn = {
                let mut fetching = self.fetching.locked();
                let turn = fetching.entry(name.clone()).or_default();
                // Held by the map alone: no fetch runs or waits for its turn.
                if Arc::strong_count(turn) > 1 {
                    continue;
                }
                match turn.clone().try_lock_owned() {
                    Ok(turn) => turn,
                    Err(_) => continue,
                }
            };
            let clone = self.config.cache_dir.join(&name);
            let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&clone) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            })
            .await;
            if let Ok(Err(error)) = removed {
                tracing::warn!(source = name, %error, "cannot remove the clone of a source removed");
            }
            let mut fetching = self.fetching.locked();
            // Only the map's and this guard's: no fetch came for it meanwhile.
            if fetching.get(&name).is_some_and(|held| Arc::strong_count(held) == 2) {
                fetching.remove(&name);
            }
            drop(turn);
        }
    }

    /// The commit whose content is held for `source`, if any.
    fn known_commit(&self, source: &SourceRecord) -> Option<String> {
        let read = self.read.locked();
        read.get(&source.name).filter(|held| held.origin == origin(source)).map(|held| held.commit.clone())
    }

    /// The content of what was fetched: the held one when the commit is unchanged, or the
    /// files read now (and held for next time).
    fn content(&self, source: &SourceRecord, fetched: &Fetched) -> Arc<SourceContent> {
        let mut read = self.read.locked();
        if fetched.unchanged
            && let Some(held) = read.get(&source.name).filter(|held| held.commit == fetched.commit)
        {
            return held.content.clone();
        }
        let content = Arc::new(content_of(fetched, self.config.max_units));
        let held = ReadContent { origin: origin(source), commit: fetched.commit.clone(), content: content.clone() };
        read.insert(source.name.clone(), held);
        content
    }

    /// Fetches on a blocking thread; the error as the status shows it.
    async fn fetch(&self, source: &SourceRecord) -> Result<Fetched, String> {
        let credentials = match &source.credentials_file {
            Some(name) => Some(read_credentials(&self.config.credentials_dir, name)?),
            None => None,
        };
        let cache = self.config.cache_dir.join(&source.name);
        make_private_dir(&self.config.cache_dir)?;
        let known = self.known_commit(source);
        let source = source.clone();
        let work = tokio::task::spawn_blocking(move || {
            let request = FetchRequest {
                repo: &source.repo,
                branch: source.branch.as_deref(),
                revision: source.revision.as_deref(),
                paths: &source.paths,
                credentials: credentials.as_ref(),
                known_commit: known.as_deref(),
            };
            fetch(&cache, &request).map_err(|error| error.to_string())
        });
        match tokio::time::timeout(FETCH_LIMIT, work).await {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => Err(format!("the fetch stopped: {error}")),
            Err(_) => Err(format!("the fetch took over {FETCH_LIMIT:?}")),
        }
    }
}

#[async_trait]
impl SourceReading for SourceReader {
    async fn read_source(&self, source: &SourceRecord) -> Result<ReadSource, String> {
        self.read(source).await
    }

    async fn forget_others(&self, kept: &BTreeSet<String>) {
        SourceReader::forget_others(self, kept).await;
    }
}

/// The source's content, with the files that could not be read as problems (and their units
/// left alone).
fn content_of(fetched: &Fetched, max_units: usize) -> SourceContent {
    let mut content = read_source(&fetched.files, max_units);
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
