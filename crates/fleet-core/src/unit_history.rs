//! A unit's versions. Every write that changes a unit's content or desired state makes a new
//! version; the versions before it are kept, the newest `kept` of them, each with its content
//! hash, desired state, when it was made and by whom. Creating a unit makes version 1 and keeps
//! nothing; destroying it takes its versions with it.
//!
//! The versions live in the unit's own record, so a write and its version are one write, and a
//! content a kept version names is as referenced as one a unit runs (its body is not collected).
//! A key per version would keep records small, but trimming it would need the versions read on
//! every change (or a reference key per content and unit) to know which bodies a version still
//! names; in the record, the store's copies count them as they count a unit's own content.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{DesiredState, UnitHash};

/// How many past versions a unit keeps unless configured otherwise.
pub const DEFAULT_KEPT: usize = 20;

/// The most past versions a unit may be configured to keep.
pub const MOST_KEPT: usize = 1000;

/// The longest text a [`ChangedBy`] field holds; longer values are cut where they enter.
pub const LONGEST_NAME: usize = 256;

/// Who made a version: an identity asking through the API, a source's sync at a commit, a
/// rollout (of a source or by hand). Every part is optional: a version written before fleet
/// kept versions, or by a path that knows no one, is "unknown".
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedBy {
    /// The identity that asked: `token:ci`, `cert:alice`, `unix:uid=0`, `anonymous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The source whose sync wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The commit that sync read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The rollout that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
}

/// `text` cut to [`LONGEST_NAME`] bytes at a character boundary.
fn bounded(text: &str) -> String {
    let mut end = text.len().min(LONGEST_NAME);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

impl ChangedBy {
    /// No one known.
    pub const UNKNOWN: ChangedBy = ChangedBy { identity: None, source: None, commit: None, rollout: None };

    /// An identity asking through the API.
    pub fn identity(name: &str) -> Self {
        Self { identity: Some(bounded(name)), ..Self::UNKNOWN }
    }

    /// A source's sync, at `commit` when it knows one.
    pub fn source(name: &str, commit: Option<&str>) -> Self {
        Self { source: Some(bounded(name)), ..Self::UNKNOWN }.at_commit(commit)
    }

    /// A rollout's step, of units `source` owns when it names one.
    pub fn rollout(name: &str, source: Option<&str>) -> Self {
        Self { rollout: Some(bounded(name)), source: source.map(bounded), ..Self::UNKNOWN }
    }

    /// The same, at `commit` when one is known.
    pub fn at_commit(self, commit: Option<&str>) -> Self {
        Self { commit: commit.map(bounded), ..self }
    }

    /// The same, asked for by `identity` when one is known.
    pub fn asked_by(self, identity: Option<&str>) -> Self {
        Self { identity: identity.map(bounded), ..self }
    }

    pub fn is_unknown(&self) -> bool {
        *self == Self::UNKNOWN
    }

    /// One line for a table: `token:ci`, `source app at 1a2b3c4d`, `rollout web of source app`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(rollout) = &self.rollout {
            parts.push(format!("rollout {rollout}"));
        }
        if let Some(source) = &self.source {
            let of = if self.rollout.is_some() { "of source" } else { "source" };
            parts.push(match &self.commit {
                Some(commit) => format!("{of} {source} at {}", &commit[..commit.len().min(12)]),
                None => format!("{of} {source}"),
            });
        }
        if let Some(identity) = &self.identity {
            parts.push(identity.clone());
        }
        if parts.is_empty() { "unknown".to_string() } else { parts.join(" ") }
    }
}

/// When and by whom the current version was made, and its number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub version: u64,
    /// Seconds since the Unix epoch, by the clock of the fleetd that wrote it.
    pub at: i64,
    #[serde(default, skip_serializing_if = "ChangedBy::is_unknown")]
    pub by: ChangedBy,
}

/// A version the unit had before its current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastVersion {
    pub version: u64,
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// `None` for the version a unit had when it was written before fleet kept versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
    #[serde(default, skip_serializing_if = "ChangedBy::is_unknown")]
    pub by: ChangedBy,
}

/// What a unit's record holds of its versions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    /// `None` in a record written before fleet kept versions: its content is version 1, made
    /// at an unknown time by someone unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<Stamp>,
    /// Oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub past: Vec<PastVersion>,
}

/// A write of a unit: its content and desired state after, when, by whom.
#[derive(Clone, Copy, Debug)]
pub struct Write<'a> {
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub at: i64,
    pub by: &'a ChangedBy,
}

/// A unit as its record stands before a write.
#[derive(Clone, Copy, Debug)]
pub struct Before<'a> {
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub versions: &'a Versions,
}

impl Versions {
    pub fn is_empty(&self) -> bool {
        self.current.is_none() && self.past.is_empty()
    }

    /// The current version's number: 1 for a record written before fleet kept versions.
    pub fn number(&self) -> u64 {
        self.current.as_ref().map_or(1, |stamp| stamp.version)
    }

    /// The contents the kept versions name: their bodies must be kept.
    pub fn past_contents(&self) -> impl Iterator<Item = UnitHash> + '_ {
        self.past.iter().map(|version| version.hash)
    }

    /// The versions after `write` over a unit that stood as `before` (`None`: the write creates
    /// it), keeping the newest `kept` past versions. A write that changes neither content nor
    /// desired state makes no version.
    pub fn after(before: Option<Before<'_>>, write: Write<'_>, kept: usize) -> Versions {
        let stamp = |version| Some(Stamp { version, at: write.at, by: write.by.clone() });
        let Some(before) = before else {
            return Versions { current: stamp(1), past: Vec::new() };
        };
        if before.hash == write.hash && before.desired == write.desired {
            return before.versions.clone();
        }
        let was = before.versions.current.as_ref();
        let mut past = before.versions.past.clone();
        past.push(PastVersion {
            version: before.versions.number(),
            hash: before.hash,
            desired: before.desired,
            at: was.map(|stamp| stamp.at),
            by: was.map(|stamp| stamp.by.clone()).unwrap_or_default(),
        });
        let dropped = past.len().saturating_sub(kept);
        past.drain(..dropped);
        Versions { current: stamp(before.versions.number() + 1), past }
    }

    /// Every content a unit with these versions and current content `hash` refers to.
    pub fn contents_with(&self, hash: UnitHash) -> BTreeSet<UnitHash> {
        self.past_contents().chain([hash]).collect()
    }
}

/// One version as it is shown: the current one or a past one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub version: u64,
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub at: Option<i64>,
    pub by: ChangedBy,
    pub current: bool,
}

/// Every version of a unit whose current content is `hash` with `desired`, oldest first.
pub fn shown(hash: UnitHash, desired: DesiredState, versions: &Versions) -> Vec<Shown> {
    let mut shown: Vec<Shown> = versions
        .past
        .iter()
        .map(|past| Shown {
            version: past.version,
            hash: past.hash,
            desired: past.desired,
            at: past.at,
            by: past.by.clone(),
            current: false,
        })
        .collect();
    let stamp = versions.current.as_ref();
    shown.push(Shown {
        version: versions.number(),
        hash,
        desired,
        at: stamp.map(|stamp| stamp.at),
        by: stamp.map(|stamp| stamp.by.clone()).unwrap_or_default(),
        current: true,
    });
    shown
}

/// How many past versions a unit keeps, from a setting: at most [`MOST_KEPT`].
pub fn parse_kept(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(kept) if kept <= MOST_KEPT => Ok(kept),
        _ => Err(format!("expected a whole number from 0 to {MOST_KEPT}")),
    }
}

#[cfg(test)]
mod tests;
