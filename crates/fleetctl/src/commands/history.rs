//! `fleetctl history UNIT`: a unit's versions, with when and by whom each was made;
//! `fleetctl revert UNIT --to VERSION`: a version written back, through a rollout where the unit
//! runs (our additions; `rollout undo --to` is `rollout.rs`'s).

use std::collections::BTreeMap;

use fleet_api_schema::{Unit, UnitHistory, UnitVersion};
use fleet_core::duration::parse_go_duration;
use fleet_core::max_unavailable::MaxUnavailable;
use fleet_core::unit_name::mangle;

use crate::Outcome;
use crate::context::Context;
use crate::output::{OutputFormat, print_json};
use crate::table::tab_table;

pub async fn history(context: &Context, argument: &str, output: OutputFormat, no_legend: bool) -> Outcome {
    let name = mangle(argument);
    match context.client.unit_history(&name).await {
        Ok(Some(history)) if output == OutputFormat::Json => {
            print_json(&history);
            Outcome::Success
        }
        Ok(Some(history)) => {
            print!("{}", table(&history, output == OutputFormat::Wide, no_legend));
            Outcome::Success
        }
        Ok(None) => {
            eprintln!("Unit {name} does not exist.");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error retrieving the history of {name}: {error}");
            Outcome::Failure
        }
    }
}

/// One row per version, oldest first; the current one marked `*`. Hashes in full with `wide`.
fn table(history: &UnitHistory, wide: bool, no_legend: bool) -> String {
    let mut rows = Vec::new();
    if !no_legend {
        rows.push(["CURRENT", "VERSION", "HASH", "STATE", "CHANGED", "BY"].map(str::to_string).to_vec());
    }
    for version in &history.versions {
        let hash = if wide { version.hash.clone() } else { version.hash.chars().take(7).collect() };
        rows.push(vec![
            if version.current { "*".to_string() } else { String::new() },
            version.version.to_string(),
            hash,
            version.desired_state.clone(),
            version.changed_at.clone().unwrap_or_else(|| "-".to_string()),
            version.changed_by.describe(),
        ]);
    }
    tab_table(&rows)
}

/// How a version written back reaches the units that run: in waves, as `rollout start`.
pub struct Waves {
    pub max_unavailable: String,
    pub min_ready: String,
}

impl Waves {
    /// The rollout settings, or the flag that is wrong.
    fn parsed(&self) -> Result<(String, u64), String> {
        MaxUnavailable::parse(&self.max_unavailable)
            .map_err(|error| format!("Invalid --max-unavailable {:?}: {error}", self.max_unavailable))?;
        let min_ready = parse_go_duration(&self.min_ready)
            .map_err(|error| format!("Invalid --min-ready {:?}: {error}", self.min_ready))?;
        Ok((self.max_unavailable.clone(), min_ready.as_secs()))
    }
}

pub async fn revert(context: &Context, argument: &str, to: u64, waves: &Waves) -> Outcome {
    let name = mangle(argument);
    let (max_unavailable, min_ready) = match waves.parsed() {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("{error}");
            return Outcome::Usage;
        }
    };
    let (current, version) = match current_and_version(context, &name, to).await {
        Ok(found) => found,
        Err(error) => {
            eprintln!("Error reverting {name}: {error}");
            return Outcome::Failure;
        }
    };
    let now = current.desired_state.as_deref().unwrap_or("inactive");
    let same_content = crate::commands::create::unit_file(&current).hash().to_string() == version.hash;
    let outcome = if same_content && now == version.desired_state {
        println!("Unit {name} is as version {to} was: nothing to do");
        Ok(())
    } else if same_content {
        context.client.set_desired_state(&name, &version.desired_state).await.map_err(|error| error.to_string())
    } else if now == "launched" && version.desired_state == "launched" {
        let files = BTreeMap::from([(name.clone(), version.options.clone())]);
        super::rollout::roll_back(
            context,
            &super::rollout::rollout_name("revert-", &name, ""),
            files,
            max_unavailable,
            min_ready,
        )
        .await
    } else {
        context.client.put_unit(&as_unit(&name, &version)).await.map_err(|error| error.to_string())
    };
    match outcome {
        Ok(()) => {
            println!("Unit {name} reverted to version {to} ({}, {})", short(&version), version.desired_state);
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error reverting {name} to version {to}: {error}");
            Outcome::Failure
        }
    }
}

/// The unit `name` as the cluster holds it, and its version `to` with its unit file.
pub async fn current_and_version(context: &Context, name: &str, to: u64) -> Result<(Unit, UnitVersion), String> {
    match (context.client.unit(name).await, context.client.unit_version(name, to).await) {
        (Ok(Some(current)), Ok(version)) => Ok((current, version)),
        (Ok(None), _) => Err(format!("Unit {name} does not exist.")),
        (Err(error), _) | (_, Err(error)) => Err(error.to_string()),
    }
}

/// The unit `name` as `version` had it: what a revert leaves (`fleetctl plan revert` plans it).
pub fn as_unit(name: &str, version: &UnitVersion) -> Unit {
    Unit {
        name: name.to_string(),
        options: version.options.clone(),
        desired_state: Some(version.desired_state.clone()),
        ..Unit::default()
    }
}

fn short(version: &UnitVersion) -> String {
    version.hash.chars().take(7).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::unit_history::ChangedBy;

    fn version(n: u64, current: bool, by: ChangedBy) -> UnitVersion {
        UnitVersion {
            version: n,
            hash: "0123456789abcdef0123456789abcdef01234567".into(),
            desired_state: "launched".into(),
            changed_at: (n > 1).then(|| "2026-12-05T10:00:00Z".to_string()),
            changed_by: by,
            current,
            options: Vec::new(),
        }
    }

    #[test]
    fn the_history_table_marks_the_current_version_and_says_who() {
        let history = UnitHistory {
            name: "web.service".into(),
            versions: vec![
                version(1, false, ChangedBy::UNKNOWN),
                version(2, true, ChangedBy::rollout("web", Some("app")).at_commit(Some("1a2b3c4d5e6f7a8b9c0d"))),
            ],
        };
        let shown = table(&history, false, false);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["CURRENT", "VERSION", "HASH", "STATE", "CHANGED", "BY"]
        );
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["1", "0123456", "launched", "-", "unknown"]);
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "*",
                "2",
                "0123456",
                "launched",
                "2026-12-05T10:00:00Z",
                "rollout",
                "web",
                "of",
                "source",
                "app",
                "at",
                "1a2b3c4d5e6f"
            ]
        );
        assert!(!table(&history, true, true).contains("VERSION"));
        assert!(table(&history, true, true).contains("0123456789abcdef0123456789abcdef01234567"));
    }
}
