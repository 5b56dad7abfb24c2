//! `fleetctl source add|list|status|pause|resume|sync|remove`: git sources.

use fleet_api_schema::Source;
use fleet_core::duration::parse_go_duration;

use super::create::unit_file;
use super::token::time;
use crate::context::Context;
use crate::diff::unified;
use crate::table::tab_table;
use crate::{Outcome, SourceCommand};

pub async fn run(context: &Context, command: SourceCommand) -> Outcome {
    match command {
        SourceCommand::Add(add_arguments) => {
            let crate::SourceAdd {
                repo,
                branch,
                revision,
                paths,
                interval,
                credentials,
                keep_removed,
                webhook_secret,
                max_unavailable,
                min_ready,
                deadline,
                gates,
                drift,
                name,
            } = *add_arguments;
            let Ok((canary, bake_seconds, auto_revert)) = super::rollout::gate_settings(&gates) else {
                return Outcome::Usage;
            };
            let seconds = |flag: &str, value: &str| match parse_go_duration(value) {
                Ok(span) => Ok(span.as_secs()),
                Err(error) => {
                    eprintln!("Invalid --{flag} {value:?}: {error}");
                    Err(Outcome::Usage)
                }
            };
            let (min_ready_seconds, deadline_seconds) =
                match (seconds("min-ready", &min_ready), seconds("deadline", &deadline)) {
                    (Ok(min_ready), Ok(deadline)) => (min_ready, deadline),
                    (Err(outcome), _) | (_, Err(outcome)) => return outcome,
                };
            let interval_seconds = match parse_go_duration(&interval) {
                Ok(interval) => interval.as_secs().max(1),
                Err(error) => {
                    eprintln!("Invalid --interval {interval:?}: {error}");
                    return Outcome::Usage;
                }
            };
            let source = Source {
                name,
                repo,
                branch,
                revision,
                paths,
                interval_seconds: Some(interval_seconds),
                credentials,
                keep_removed,
                take_over: context.take_over,
                webhook_secret,
                max_unavailable,
                min_ready_seconds: Some(min_ready_seconds),
                deadline_seconds: Some(deadline_seconds),
                canary,
                bake_seconds,
                auto_revert,
                drift: Some(drift),
                ..Source::default()
            };
            add(context, &source).await
        }
        SourceCommand::List { no_legend } => list(context, no_legend).await,
        SourceCommand::Status { diff, name } => status(context, &name, diff).await,
        SourceCommand::Pause { name } => set_paused(context, &name, true).await,
        SourceCommand::Resume { name } => set_paused(context, &name, false).await,
        SourceCommand::Sync { force, name } => match context.client.sync_source(&name, force).await {
            Ok(()) => {
                let again = if force { ", rolling out again a commit it halted on" } else { "" };
                eprintln!("Source {name} will sync now{again}");
                Outcome::Success
            }
            Err(error) => {
                eprintln!("Error syncing source {name}: {error}");
                Outcome::Failure
            }
        },
        SourceCommand::Remove { keep_units, name } => remove(context, &name, keep_units).await,
    }
}

async fn add(context: &Context, source: &Source) -> Outcome {
    match context.client.put_source(source).await {
        Ok(created) => {
            let verb = if created { "added" } else { "changed" };
            eprintln!("Source {} {verb}; it syncs now (see: fleetctl source status {})", source.name, source.name);
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error adding source {}: {error}", source.name);
            Outcome::Failure
        }
    }
}

/// One word for where a source stands.
fn state(source: &Source) -> &'static str {
    match &source.status {
        _ if source.paused => "paused",
        None => "pending",
        Some(status) if status.error.is_some() => "failing",
        Some(status) if !status.current => "syncing",
        Some(status) if status.halted.is_some() => "halted",
        Some(status) if !status.problems.is_empty() || !status.owned_elsewhere.is_empty() => "problems",
        Some(status) if !status.out_of_sync.is_empty() => "out of sync",
        Some(_) => "synced",
    }
}

fn reference(source: &Source) -> String {
    match (&source.branch, &source.revision) {
        (Some(branch), _) => branch.clone(),
        (None, Some(revision)) => format!("@{revision}"),
        (None, None) => "(default)".to_string(),
    }
}

fn short_commit(source: &Source) -> String {
    source
        .status
        .as_ref()
        .and_then(|status| status.commit.as_deref())
        .map_or("-".to_string(), |commit| commit.chars().take(8).collect())
}

async fn list(context: &Context, no_legend: bool) -> Outcome {
    let sources = match context.client.sources().await {
        Ok(sources) => sources,
        Err(error) => {
            eprintln!("Error listing sources: {error}");
            return Outcome::Failure;
        }
    };
    let mut rows = Vec::with_capacity(sources.len() + 1);
    if !no_legend {
        rows.push(["NAME", "REPO", "REF", "COMMIT", "STATE", "UNITS"].map(str::to_string).to_vec());
    }
    for source in &sources {
        let units = source.status.as_ref().map_or(0, |status| status.units);
        rows.push(vec![
            source.name.clone(),
            source.repo.clone(),
            reference(source),
            short_commit(source),
            state(source).to_string(),
            units.to_string(),
        ]);
    }
    print!("{}", tab_table(&rows));
    Outcome::Success
}

async fn status(context: &Context, name: &str, diff: bool) -> Outcome {
    let source = match context.client.source(name).await {
        Ok(Some(source)) => source,
        Ok(None) => {
            eprintln!("Source {name} not found");
            return Outcome::Failure;
        }
        Err(error) => {
            eprintln!("Error reading source {name}: {error}");
            return Outcome::Failure;
        }
    };
    println!("Source:    {}", source.name);
    println!("Repo:      {}", source.repo);
    println!("Ref:       {}", reference(&source));
    if !source.paths.is_empty() {
        println!("Paths:     {}", source.paths.join(", "));
    }
    println!("Interval:  {}s", source.interval_seconds.unwrap_or_default());
    println!("State:     {}", state(&source));
    if let Some(max_unavailable) = &source.max_unavailable {
        println!("Rollouts:  {}", rollout_settings(&source, max_unavailable));
    }
    if source.drift.as_deref() == Some("report") {
        println!("Drift:     reported only (machines do not put drifted units back)");
    }
    let Some(status) = &source.status else {
        println!("Not synced yet");
        return Outcome::Success;
    };
    println!("Commit:    {}", status.commit.as_deref().unwrap_or("-"));
    let changes = if status.changes == 1 { "change" } else { "changes" };
    println!("Units:     {} (last sync made {} {changes})", status.units, status.changes);
    println!("Attempted: {}", time(status.attempted_at));
    println!("Synced:    {}", status.synced_at.map_or("never".to_string(), time));
    if let Some(error) = &status.error {
        println!("Error:     {error}");
    }
    if let Some(halted) = &status.halted {
        println!("Halted:    {halted}");
    }
    for problem in &status.problems {
        println!("Problem:   {problem}");
    }
    for entry in &status.out_of_sync {
        println!("Out of sync: {}: {}", entry.unit, entry.why);
        if let (true, Some(wanted)) = (diff, &entry.wanted) {
            print!("{}", unit_diff(context, &entry.unit, wanted).await);
        }
    }
    drifted(context, name).await
}

/// How a source rolls its new content out, in one line.
fn rollout_settings(source: &Source, max_unavailable: &str) -> String {
    let mut words = vec![
        format!("at most {max_unavailable} down"),
        format!("min ready {}s", source.min_ready_seconds.unwrap_or_default()),
        format!("deadline {}s", source.deadline_seconds.unwrap_or_default()),
    ];
    if let Some(canary) = &source.canary {
        let bake = source.bake_seconds.map_or(" until promoted".to_string(), |bake| format!(", baked {bake}s"));
        words.push(format!("canary {canary}{bake}"));
    }
    if source.auto_revert {
        words.push("auto-revert".to_string());
    }
    words.join(", ")
}

/// How the cluster's `unit` differs from the source's file for it.
async fn unit_diff(context: &Context, unit: &str, wanted: &str) -> String {
    let held = match context.client.unit(unit).await {
        Ok(Some(held)) => unit_file(&held).serialize(),
        Ok(None) => String::new(),
        Err(error) => return format!("(cannot read {unit} from the cluster: {error})\n"),
    };
    unified(&format!("{unit} (cluster)"), &held, &format!("{unit} (source)"), wanted)
}

/// Prints the source's units that drifted on their machines, and those their health checks
/// find unhealthy, with how many of each.
async fn drifted(context: &Context, name: &str) -> Outcome {
    let (units, states) = match (context.client.units().await, context.client.unit_states(None).await) {
        (Ok(units), Ok(states)) => (units, states),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("Error reading the source's units: {error}");
            return Outcome::Failure;
        }
    };
    let owned: std::collections::BTreeSet<&str> =
        units.iter().filter(|unit| unit.source.as_deref() == Some(name)).map(|unit| unit.name.as_str()).collect();
    let ours: Vec<&fleet_api_schema::UnitState> =
        states.iter().filter(|state| owned.contains(state.name.as_str())).collect();
    let drifted: Vec<_> = ours.iter().filter(|state| !state.drift.is_empty()).collect();
    let unhealthy: Vec<_> = ours.iter().filter(|state| state.health == "unhealthy").collect();
    for state in &drifted {
        println!("Drifted:   {} on {}: {}", state.name, state.machine_id, state.drift);
    }
    for state in &unhealthy {
        println!("Unhealthy: {} on {}: {}", state.name, state.machine_id, super::list::health_text(state));
    }
    if !drifted.is_empty() || !unhealthy.is_empty() {
        println!("Units:     {} drifted, {} unhealthy", drifted.len(), unhealthy.len());
    }
    Outcome::Success
}

async fn set_paused(context: &Context, name: &str, paused: bool) -> Outcome {
    let verb = if paused { "pausing" } else { "resuming" };
    let mut source = match context.client.source(name).await {
        Ok(Some(source)) => source,
        Ok(None) => {
            eprintln!("Source {name} not found");
            return Outcome::Failure;
        }
        Err(error) => {
            eprintln!("Error {verb} source {name}: {error}");
            return Outcome::Failure;
        }
    };
    source.paused = paused;
    source.status = None;
    match context.client.put_source(&source).await {
        Ok(_) => {
            eprintln!("Source {name} {}", if paused { "paused" } else { "resumed" });
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error {verb} source {name}: {error}");
            Outcome::Failure
        }
    }
}

async fn remove(context: &Context, name: &str, keep_units: bool) -> Outcome {
    match context.client.remove_source(name, keep_units).await {
        Ok(true) => {
            let units = if keep_units { "its units stay, as units made by hand" } else { "its units are destroyed" };
            eprintln!("Removed source {name}; {units}");
            Outcome::Success
        }
        Ok(false) => {
            eprintln!("Source {name} not found");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error removing source {name}: {error}");
            Outcome::Failure
        }
    }
}
