//! A git source as the registry keeps it, and what its last sync did.

use fleet_core::drift::DriftPolicy;
use fleet_core::rollout::Gates;
use serde::{Deserialize, Serialize};

/// A source: where its units come from and how it is synced. Holds no secret: credentials
/// stay in a file on the machines that sync, named here by path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    pub name: String,
    /// `https://…` or `file://…`.
    pub repo: String,
    /// The branch followed; `None` with a fixed `revision`, or for the remote's default.
    pub branch: Option<String>,
    /// A fixed commit (hex, full or abbreviated) or tag, instead of a branch.
    pub revision: Option<String>,
    /// Directories of the repository read (recursively); empty: the whole tree.
    pub paths: Vec<String>,
    pub interval_seconds: u64,
    /// A file on each syncing machine holding `username:password` (or a token alone) for https.
    pub credentials_file: Option<String>,
    pub paused: bool,
    /// Units gone from git stay (owned, unchanged) instead of being destroyed.
    pub keep_removed: bool,
    /// Units of the same names held by hand or by another source are taken over.
    pub take_over: bool,
    /// The name of the file (in `source_credentials_dir`) holding the secret a push webhook
    /// signs its body with; no webhook without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
    /// New content for running units goes out as a rollout (`source-<name>`) with at most
    /// this many down at once (`2`, `25%`); all at once when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
    /// How long a unit its rollout replaced must stay active before the next wave (seconds).
    #[serde(default = "default_min_ready")]
    pub min_ready_seconds: u64,
    /// Its rollouts' canary, bake time and auto-revert.
    #[serde(default, skip_serializing_if = "is_default_gates")]
    pub gates: Gates,
    /// What the machines do when the source's units drift there: put them back, or report.
    #[serde(default, skip_serializing_if = "DriftPolicy::is_default")]
    pub drift: DriftPolicy,
    /// How long a unit its rollout replaced may take to become active and healthy before
    /// the gate fails (seconds).
    #[serde(default = "default_deadline")]
    pub deadline_seconds: u64,
    /// Moves on every change of the record and every request for a sync (webhook, resume):
    /// the syncing engine syncs at once when it moved.
    pub generation: u64,
    /// Moves on every forced sync (`source sync --force`): a commit whose rollout reverted
    /// itself is rolled out once more (`fleet_core::source::halt`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub forced: u64,
}

fn default_min_ready() -> u64 {
    10
}

/// How long, by default, a unit a source's rollout replaced may take to become ready.
pub const DEFAULT_DEADLINE_SECONDS: u64 = 120;

fn default_deadline() -> u64 {
    DEFAULT_DEADLINE_SECONDS
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_default_gates(gates: &Gates) -> bool {
    *gates == Gates::default()
}

impl SourceRecord {
    /// A source of `repo` with every setting at its default: the remote's default branch, the
    /// whole tree, synced every 15 s, no credentials, no webhook, new content all at once.
    pub fn new(name: &str, repo: &str) -> Self {
        Self {
            name: name.to_string(),
            repo: repo.to_string(),
            branch: None,
            revision: None,
            paths: Vec::new(),
            interval_seconds: 15,
            credentials_file: None,
            paused: false,
            keep_removed: false,
            take_over: false,
            webhook_secret: None,
            max_unavailable: None,
            min_ready_seconds: default_min_ready(),
            gates: Gates::default(),
            drift: DriftPolicy::default(),
            deadline_seconds: DEFAULT_DEADLINE_SECONDS,
            generation: 0,
            forced: 0,
        }
    }

    /// How its syncs treat what it does not own and what it no longer names.
    pub fn sync_rules(&self) -> fleet_core::source::SyncRules {
        fleet_core::source::SyncRules { keep_removed: self.keep_removed, take_over: self.take_over, drift: self.drift }
    }

    /// The bound on units down at once its new content for running units rolls out with;
    /// `None`: it writes new content at once.
    pub fn waves(&self) -> Option<fleet_core::rollout::MaxUnavailable> {
        self.max_unavailable.as_deref().and_then(|text| fleet_core::rollout::MaxUnavailable::parse(text).ok())
    }

    /// Whether a sync at `commit`, with `forced` forced syncs so far, is halted by the
    /// source's rollout `last` (the one named `fleet_core::source::rollout_of` its name).
    pub fn halted_at(
        &self,
        commit: &str,
        forced: u64,
        last: Option<&RolloutRecord>,
    ) -> Option<fleet_core::source::halt::Halt> {
        let last = last.map(|record| fleet_core::source::halt::LastRollout {
            from: record.source_commit.as_ref(),
            reverted: record.rollout.reverted.as_deref(),
        });
        fleet_core::source::halt::halt(commit, forced, last)
    }
}

/// What the last sync of a source did, written by the engine leader that ran it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// The commit last applied (fully or with the problems below).
    pub commit: Option<String>,
    /// When the last sync attempt ended and when one last succeeded (seconds since the epoch).
    pub attempted_at: u64,
    pub synced_at: Option<u64>,
    /// Why the last attempt failed (fetch, credentials, a revision not found); `None` if it
    /// did not.
    pub error: Option<String>,
    /// Files that did not read, by path and line: those units were left as they were.
    pub problems: Vec<String>,
    /// Units the source names that another owner holds (`unit (owner)`): left alone.
    pub owned_elsewhere: Vec<String>,
    /// Units the cluster holds otherwise than the source says, after the sync: why, and the
    /// file the source has for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub out_of_sync: Vec<OutOfSync>,
    /// Units the source owns after the sync.
    pub units: usize,
    /// Writes the last sync made.
    pub changes: usize,
    /// The record's generation the last attempt synced.
    pub generation: u64,
    /// Failed attempts in a row (for the backoff), 0 after a success.
    pub failures: u32,
    /// Why the source rolls nothing out: its rollout reverted itself on the commit it is at
    /// (`fleet_core::source::halt`); `None` when it is not halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
}

/// A unit the cluster holds otherwise than its source says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfSync {
    pub unit: String,
    /// Why: owned elsewhere, waiting in a rollout, its file does not read.
    pub why: String,
    /// The unit file the source has for it (for a diff); `None` when it does not read or is
    /// too large to keep here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<String>,
}

/// A rollout as the registry keeps it: its state machine (`fleet_core::rollout`), and the
/// unit files it moves units between, by hash (the new content until it is written, the old
/// one for an undo).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub name: String,
    pub rollout: fleet_core::rollout::Rollout,
    /// Unit hash (hex) → the unit file's text.
    pub bodies: std::collections::BTreeMap<String, String>,
    /// Seconds since the epoch.
    pub created: u64,
    /// For a source's rollout: the commit its newest content came from (a revert halts the
    /// source on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_commit: Option<fleet_core::source::halt::RolledFrom>,
    /// For the rollout of a secret's new version (`secret-<name>`): the secret, and the
    /// versions its units move between (each named in the rollout by
    /// `fleet_core::secrets::version_identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<RolledSecret>,
    /// The identity that started it through the API, named in the versions it writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
}

impl RolloutRecord {
    /// Who the versions this rollout writes are by: the rollout, its source and commit, and who
    /// started it.
    pub fn changed_by(&self, source: Option<&str>) -> fleet_core::unit_history::ChangedBy {
        let commit = self.source_commit.as_ref().map(|from| from.commit.as_str()).filter(|_| source.is_some());
        fleet_core::unit_history::ChangedBy::rollout(&self.name, source)
            .at_commit(commit)
            .asked_by(self.started_by.as_deref())
    }
}

/// The secret a rollout moves units from version to version of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolledSecret {
    pub name: String,
    /// Every version a unit of the rollout is moved from or to.
    pub versions: Vec<u64>,
}

impl RolledSecret {
    /// The version a rollout's content hash names, if it names one of this secret's.
    pub fn version_of(&self, identity: fleet_core::UnitHash) -> Option<u64> {
        self.versions
            .iter()
            .copied()
            .find(|&version| fleet_core::secrets::version_identity(&self.name, version) == identity)
    }
}
