//! `fleetctl rollout start|list|status|pause|resume|undo|promote`: new content in waves, a
//! canary first when asked.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_api_schema::{Rollout, RolloutRequest, UnitOption};
use fleet_core::duration::parse_go_duration;
use fleet_core::glob::glob_matches;
use fleet_core::unit_name::{UnitNameInfo, with_default_unit_type};

use super::create::schema_options;
use crate::context::Context;
use crate::local_units::{read_unit_file, warn_ignored_options};
use crate::output::OutputFormat;
use crate::table::tab_table;
use crate::{Outcome, RolloutCommand};

pub async fn run(context: &Context, command: RolloutCommand) -> Outcome {
    match command {
        RolloutCommand::Start { max_unavailable, min_ready, deadline, gates, instances, name, file } => {
            let request = StartRequest { max_unavailable, min_ready, deadline, gates, instances, name, file };
            start(context, request).await
        }
        RolloutCommand::List { no_legend } => list(context, no_legend).await,
        RolloutCommand::Status { name, wait, output } => {
            let name = rollout_named(context, &name).await;
            status(context, &name, wait, output.output).await
        }
        RolloutCommand::Pause { name } => act(context, &name, "pause").await,
        RolloutCommand::Resume { name } => act(context, &name, "resume").await,
        RolloutCommand::Undo { name, to: None } => act(context, &name, "undo").await,
        RolloutCommand::Undo { name, to: Some(to) } => undo_to(context, &name, to).await,
        RolloutCommand::Promote { name } => act(context, &name, "promote").await,
    }
}

/// The rollout `name` names: itself, or where no rollout has that name and a source does,
/// that source's rollout (`source-NAME`), said on stderr.
async fn rollout_named(context: &Context, name: &str) -> String {
    if matches!(context.client.rollout_progress(name).await, Ok(Some(_))) {
        return name.to_string();
    }
    let of_source = fleet_core::source::rollout_of(name);
    match context.client.source(name).await {
        Ok(Some(_)) => {
            eprintln!("Rollout {of_source} (of source {name})");
            of_source
        }
        _ => name.to_string(),
    }
}

/// Shows the rollout; with `wait`, once it is done (success) or paused (failure).
async fn status(context: &Context, name: &str, wait: bool, output: OutputFormat) -> Outcome {
    let settled = if wait { wait_settled(context, name, None).await } else { Ok(()) };
    let outcome = match settled {
        Ok(()) => Outcome::Success,
        // The rollout shown says why it stopped.
        Err(Unsettled::Stopped(_)) => Outcome::Failure,
        Err(Unsettled::Failed(error)) => {
            eprintln!("{error}");
            return Outcome::Failure;
        }
    };
    // The wait read the steps' counts only: the units are read once, to be shown.
    match context.client.rollout(name).await.map_err(|error| format!("Error reading rollout {name}: {error}")) {
        Ok(Some(rollout)) => {
            match output {
                OutputFormat::Json => crate::output::print_json(&rollout),
                OutputFormat::Table | OutputFormat::Wide => show(&rollout),
            }
            outcome
        }
        Ok(None) => {
            eprintln!("Rollout {name} not found");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("{error}");
            Outcome::Failure
        }
    }
}

/// How often a wait reads the rollout again.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// Why a rollout waited for did not finish.
pub enum Unsettled {
    /// It stopped by itself or by hand (paused, failed, reverted, a canary waiting to be
    /// promoted), with why.
    Stopped(String),
    Failed(String),
}

impl std::fmt::Display for Unsettled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stopped(why) | Self::Failed(why) => f.write_str(why),
        }
    }
}

/// Why a rollout that stopped before it was done stopped.
fn why_stopped(rollout: &Rollout) -> String {
    match rollout.state.as_str() {
        "reverted" => format!("reverted: {}", rollout.reverted.as_deref().unwrap_or("a gate failed")),
        "canary" => format!("its canary is done and waits for: fleetctl rollout promote {}", rollout.name),
        _ => format!("paused: {}", rollout.reason.as_deref().unwrap_or("by hand")),
    }
}

/// Reads the progress of rollout `name` every half second until it finished (done or
/// undone), stopped (paused, failed, reverted), is gone, or `deadline` passes.
pub async fn wait_settled(context: &Context, name: &str, deadline: Option<Instant>) -> Result<(), Unsettled> {
    let mut said = String::new();
    loop {
        let progress = context.client.rollout_progress(name).await;
        // While it waits, it says how far the rollout is, on stderr, each time that moves.
        if let Ok(Some(rollout)) = &progress {
            let held = rollout.held.as_ref().map(|held| format!("; {held}")).unwrap_or_default();
            let line = format!("Rollout {name}: {} ({}){held}", rollout.state, counts(rollout));
            if line != said {
                eprintln!("{line}");
                said = line;
            }
        }
        match progress {
            // Finished: its new content, or (undone) its old content back.
            Ok(Some(rollout)) if rollout.state == "done" || rollout.state == "undone" => return Ok(()),
            // Still going by itself: waves, an undo begun by a failed gate, a canary baking.
            Ok(Some(rollout)) if rollout.state == "running" || rollout.state == "reverting" => {}
            Ok(Some(rollout))
                if rollout.state == "canary"
                    && rollout.canary.as_ref().is_some_and(|canary| canary.bake_seconds.is_some()) => {}
            // Paused, failed, reverted, or a canary waiting for a promotion.
            Ok(Some(rollout)) => return Err(Unsettled::Stopped(why_stopped(&rollout))),
            Ok(None) => return Err(Unsettled::Failed(format!("Rollout {name} not found"))),
            Err(error) => return Err(Unsettled::Failed(format!("Error reading rollout {name}: {error}"))),
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(Unsettled::Failed(format!("timed out waiting for rollout {name} to finish")));
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

struct StartRequest {
    max_unavailable: String,
    min_ready: String,
    deadline: String,
    gates: crate::RolloutGates,
    instances: Option<String>,
    name: Option<String>,
    file: String,
}

/// What a rollout of the unit file `argument` gives its content to: the unit it names, or
/// every instance in the cluster of the template it names (those `instances` matches). The
/// unit's name, its file and the units; the command's words when there are none.
pub async fn targets(
    context: &Context,
    argument: &str,
    instances: Option<&str>,
) -> Result<(String, fleet_core::UnitFile, Vec<String>), Outcome> {
    let path = with_default_unit_type(argument);
    let unit = Path::new(&path).file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let file = match read_unit_file(Path::new(&path)) {
        Ok(Some(file)) => file,
        Ok(None) => {
            eprintln!("Error starting rollout: unable to find {path}");
            return Err(Outcome::Failure);
        }
        Err(error) => {
            eprintln!("Error starting rollout: {error}");
            return Err(Outcome::Failure);
        }
    };
    warn_ignored_options(&unit, &file);
    let units: Vec<String> = if UnitNameInfo::new(&unit).is_template() {
        let cluster = match context.client.units().await {
            Ok(units) => units,
            Err(error) => {
                eprintln!("Error listing units: {error}");
                return Err(Outcome::Failure);
            }
        };
        cluster
            .into_iter()
            .map(|held| held.name)
            .filter(|held| UnitNameInfo::new(held).template().as_deref() == Some(unit.as_str()))
            .filter(|held| instances.is_none_or(|pattern| glob_matches(pattern, held)))
            .collect()
    } else {
        vec![unit.clone()]
    };
    if units.is_empty() {
        eprintln!("Error starting rollout: no instance of {unit} in the cluster");
        return Err(Outcome::Failure);
    }
    Ok((unit, file, units))
}

/// A rollout name from a unit name: `web@.service` → `web`.
pub(crate) fn default_name(unit: &str) -> String {
    let stem = unit.rsplit_once('.').map_or(unit, |(stem, _)| stem).trim_end_matches('@');
    let name: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(63)
        .collect();
    if name.is_empty() { "rollout".to_string() } else { name }
}

async fn start(context: &Context, request: StartRequest) -> Outcome {
    let seconds = |flag: &str, value: &str| {
        parse_go_duration(value).map(|d| d.as_secs()).map_err(|error| {
            eprintln!("Invalid --{flag} {value:?}: {error}");
            Outcome::Usage
        })
    };
    let (min_ready, deadline) = match (seconds("min-ready", &request.min_ready), seconds("deadline", &request.deadline))
    {
        (Ok(min_ready), Ok(deadline)) => (min_ready, deadline),
        (Err(outcome), _) | (_, Err(outcome)) => return outcome,
    };
    let Ok((canary, bake_seconds, auto_revert)) = gate_settings(&request.gates) else { return Outcome::Usage };
    let (unit, file, units) = match targets(context, &request.file, request.instances.as_deref()).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let name = request.name.unwrap_or_else(|| default_name(&unit));
    let body = RolloutRequest {
        units,
        options: schema_options(&file),
        max_unavailable: request.max_unavailable,
        min_ready_seconds: Some(min_ready),
        deadline_seconds: Some(deadline),
        canary,
        bake_seconds,
        auto_revert,
        ..RolloutRequest::default()
    };
    match context.client.start_rollout(&name, &body).await {
        Ok(rollout) => {
            eprintln!(
                "Rollout {name} started: {} units, at most {} down at once (see: fleetctl rollout status {name})",
                rollout.units.len(),
                rollout.max_unavailable
            );
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error starting rollout {name}: {error}");
            Outcome::Failure
        }
    }
}

/// The canary, bake time (seconds) and auto-revert of `gates`, as a request carries them; a
/// bad value is said on stderr.
pub fn gate_settings(gates: &crate::RolloutGates) -> Result<(Option<String>, Option<u64>, bool), ()> {
    let bake = match gates.bake.as_deref().map(parse_go_duration).transpose() {
        Ok(bake) => bake.map(|bake| bake.as_secs()),
        Err(error) => {
            eprintln!("Invalid --bake {:?}: {error}", gates.bake.as_deref().unwrap_or_default());
            return Err(());
        }
    };
    if let Err(error) = fleet_core::rollout::Gates::parse(gates.canary.as_deref(), bake, gates.auto_revert) {
        eprintln!("Invalid rollout gates: {error}");
        return Err(());
    }
    Ok((gates.canary.clone(), bake, gates.auto_revert))
}

/// How many units are done, in flight and failed, of how many (from `steps`; a fleetd from
/// before it answers with the units only, which are counted then). An undo's units that are
/// done are back on their old content, and said so: "3/3 done" of a reverted rollout read as
/// a success (issue 68).
fn counts(rollout: &Rollout) -> String {
    let mut steps = rollout.steps.clone();
    if steps.is_empty() {
        for unit in &rollout.units {
            *steps.entry(unit.step.clone()).or_default() += 1;
        }
    }
    let count = |step: &str| steps.get(step).copied().unwrap_or(0);
    let total: usize = steps.values().sum();
    let moving = count("replacing") + count("ready");
    let done = match rollout.state.as_str() {
        "reverting" | "reverted" | "undone" => "back on their old content",
        _ => "done",
    };
    format!("{}/{total} {done}, {moving} in flight, {} failed", count("done"), count("failed"))
}

fn show(rollout: &Rollout) {
    println!("Rollout:         {}", rollout.name);
    println!("State:           {}", rollout.state);
    if let Some(reason) = &rollout.reason {
        println!("Why:             {reason}");
    }
    if let Some(why) = &rollout.reverted {
        println!("Reverted:        {why}");
    }
    if let Some(held) = &rollout.held {
        println!("Held:            {held}");
    }
    println!("Max unavailable: {}", rollout.max_unavailable);
    println!("Min ready:       {}s", rollout.min_ready_seconds);
    if let Some(canary) = &rollout.canary {
        let bake = canary.bake_seconds.map_or("until promoted".to_string(), |bake| format!("bakes {bake}s"));
        let promoted = if canary.promoted { ", promoted" } else { "" };
        println!("Canary:          {} units, {bake}{promoted}", canary.count);
    }
    if rollout.auto_revert {
        println!("Auto-revert:     yes");
    }
    println!("Units:           {}", counts(rollout));
    let mut rows = vec![["UNIT", "STEP", "WHY"].map(str::to_string).to_vec()];
    for unit in &rollout.units {
        rows.push(vec![unit.name.clone(), unit.step.clone(), unit.why.clone().unwrap_or_else(|| "-".into())]);
    }
    print!("{}", tab_table(&rows));
}

async fn list(context: &Context, no_legend: bool) -> Outcome {
    let rollouts = match context.client.rollouts().await {
        Ok(rollouts) => rollouts,
        Err(error) => {
            eprintln!("Error listing rollouts: {error}");
            return Outcome::Failure;
        }
    };
    let mut rows = Vec::with_capacity(rollouts.len() + 1);
    if !no_legend {
        rows.push(["NAME", "STATE", "UNITS", "MAX-UNAVAILABLE"].map(str::to_string).to_vec());
    }
    for rollout in &rollouts {
        rows.push(vec![rollout.name.clone(), rollout.state.clone(), counts(rollout), rollout.max_unavailable.clone()]);
    }
    print!("{}", tab_table(&rows));
    Outcome::Success
}

async fn act(context: &Context, name: &str, action: &str) -> Outcome {
    match context.client.rollout_action(name, action).await {
        Ok(rollout) => {
            eprintln!("Rollout {name}: {} ({})", rollout.state, counts(&rollout));
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error: cannot {action} rollout {name}: {error}");
            Outcome::Failure
        }
    }
}

/// Every unit rollout `name` touched back to its version `to`, in a new rollout with the same
/// bound on units down. Nothing starts unless every unit keeps that version.
async fn undo_to(context: &Context, name: &str, to: u64) -> Outcome {
    let rollout = match context.client.rollout(name).await {
        Ok(Some(rollout)) => rollout,
        Ok(None) => {
            eprintln!("Rollout {name} not found");
            return Outcome::Failure;
        }
        Err(error) => {
            eprintln!("Error reading rollout {name}: {error}");
            return Outcome::Failure;
        }
    };
    let mut files = BTreeMap::new();
    for unit in &rollout.units {
        match context.client.unit_version(&unit.name, to).await {
            Ok(version) => files.insert(unit.name.clone(), version.options),
            Err(error) => {
                eprintln!("Error undoing rollout {name} to version {to}: {}: {error}", unit.name);
                return Outcome::Failure;
            }
        };
    }
    if files.is_empty() {
        eprintln!("Rollout {name} touched no unit");
        return Outcome::Failure;
    }
    let new_name = rollout_name("", name, &format!("-to-v{to}"));
    match roll_back(context, &new_name, files, rollout.max_unavailable.clone(), rollout.min_ready_seconds).await {
        Ok(()) => Outcome::Success,
        Err(error) => {
            eprintln!("Error undoing rollout {name} to version {to}: {error}");
            Outcome::Failure
        }
    }
}

/// Starts rollout `name` giving each unit of `files` its content back, and waits for it.
pub async fn roll_back(
    context: &Context,
    name: &str,
    files: BTreeMap<String, Vec<UnitOption>>,
    max_unavailable: String,
    min_ready: u64,
) -> Result<(), String> {
    let request =
        RolloutRequest { files, max_unavailable, min_ready_seconds: Some(min_ready), ..RolloutRequest::default() };
    let rollout = context.client.start_rollout(name, &request).await.map_err(|error| error.to_string())?;
    eprintln!(
        "Rollout {name} started: {} units get their old content back, at most {} down at once (see: fleetctl rollout status {name})",
        rollout.units.len(),
        rollout.max_unavailable
    );
    wait_settled(context, name, None).await.map_err(|error| error.to_string())
}

/// A rollout name from `prefix`, the rollout name made of `name` (a unit's or a rollout's)
/// and `suffix`, cut to the 63 characters a rollout name may have.
pub fn rollout_name(prefix: &str, name: &str, suffix: &str) -> String {
    let whole = format!("{prefix}{}{suffix}", default_name(name));
    whole.chars().take(63).collect::<String>().trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use fleet_api_schema::Rollout;

    #[test]
    fn an_undos_units_are_counted_back_on_their_old_content() {
        let rollout = |state: &str| Rollout {
            state: state.into(),
            steps: [("done".to_string(), 3)].into_iter().collect(),
            ..Rollout::default()
        };
        assert_eq!(super::counts(&rollout("done")), "3/3 done, 0 in flight, 0 failed");
        for undo in ["reverted", "reverting", "undone"] {
            assert_eq!(super::counts(&rollout(undo)), "3/3 back on their old content, 0 in flight, 0 failed");
        }
    }

    #[test]
    fn rollout_names_come_from_unit_names() {
        assert_eq!(super::default_name("web@.service"), "web");
        assert_eq!(super::default_name("API_Server.service"), "api-server");
        assert_eq!(super::default_name("@.service"), "rollout");
    }

    #[test]
    fn rollouts_that_bring_versions_back_are_named_for_what_they_undo() {
        assert_eq!(super::rollout_name("revert-", "Web@1.service", ""), "revert-web-1");
        assert_eq!(super::rollout_name("", "replace-1700000000", "-to-v3"), "replace-1700000000-to-v3");
        assert_eq!(super::rollout_name("revert-", &"a".repeat(80), "").len(), 63);
    }
}
