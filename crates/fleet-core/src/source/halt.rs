//! When a source stops rolling a commit out: its rollout reverted itself on that commit (a
//! gate failed), so rolling the same content out again would fail the same way, again and
//! again. The source stays halted on the commit, with the reason, until a new commit arrives
//! or an administrator forces a sync (`fleetctl source sync --force`), which lets the same
//! commit be rolled out once more.

use serde::{Deserialize, Serialize};

/// What a source's rollout carries: the commit its newest content came from, and the source's
/// count of forced syncs when it was written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolledFrom {
    pub commit: String,
    #[serde(default)]
    pub forced: u64,
}

/// The source's last rollout, as far as halting goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastRollout<'a> {
    /// `None` for a rollout written before rollouts named their commit: it halts nothing.
    pub from: Option<&'a RolledFrom>,
    /// Why it reverted itself, if it did (reverting or reverted).
    pub reverted: Option<&'a str>,
}

/// A source halted on a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Halt {
    pub commit: String,
    pub why: String,
}

/// Whether a source that fetched `commit`, with `forced` forced syncs so far, is halted by its
/// last rollout: only when that rollout reverted itself while carrying this very commit, since
/// the last forced sync.
pub fn halt(commit: &str, forced: u64, last: Option<LastRollout<'_>>) -> Option<Halt> {
    let last = last?;
    let (from, reverted) = (last.from?, last.reverted?);
    (from.commit == commit && from.forced == forced)
        .then(|| Halt { commit: commit.to_string(), why: reverted.to_string() })
}

impl Halt {
    /// The status line of a source `name` halted so.
    pub fn describe(&self, name: &str) -> String {
        let short: String = self.commit.chars().take(12).collect();
        format!(
            "halted on commit {short}: its rollout source-{name} reverted itself ({}); a new commit, or `fleetctl source sync --force {name}`, rolls out again",
            self.why
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(commit: &str, forced: u64) -> RolledFrom {
        RolledFrom { commit: commit.into(), forced }
    }

    #[test]
    fn a_reverted_commit_stays_halted_until_a_new_commit_or_a_forced_sync() {
        let bad = from("c1", 0);
        let reverted = Some(LastRollout { from: Some(&bad), reverted: Some("web@1 was unhealthy") });
        let halted = halt("c1", 0, reverted).expect("the same commit again is halted");
        assert_eq!(halted, Halt { commit: "c1".into(), why: "web@1 was unhealthy".into() });
        assert!(halted.describe("web").contains("source sync --force web"));
        assert_eq!(halt("c2", 0, reverted), None, "a new commit rolls out");
        assert_eq!(halt("c1", 1, reverted), None, "a forced sync rolls the same commit out once more");
        // Once forced, the commit's next rollout carries the new count: its revert halts again.
        let again = from("c1", 1);
        assert!(halt("c1", 1, Some(LastRollout { from: Some(&again), reverted: Some("still") })).is_some());
    }

    #[test]
    fn only_a_rollout_that_reverted_itself_halts() {
        let good = from("c1", 0);
        assert_eq!(halt("c1", 0, None), None, "no rollout yet");
        assert_eq!(halt("c1", 0, Some(LastRollout { from: Some(&good), reverted: None })), None, "done or running");
        assert_eq!(halt("c1", 0, Some(LastRollout { from: None, reverted: Some("old") })), None, "from before commits");
    }
}
