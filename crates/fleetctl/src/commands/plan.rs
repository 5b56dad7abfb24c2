//! `fleetctl plan`: what submit, load, start, stop, unload, destroy, a drain, a rollout, a
//! revert or a source's sync would do, asked of fleetd before anything is written. The units' writes are worked out as the command works
//! them out (the same files, the same registry, the same warnings), then fleetd's planner
//! says where each unit would go, what it would move and what would wait, and why.

use std::collections::{BTreeMap, BTreeSet};

use fleet_api_schema::{Plan, PlanRequest, PlanUnit, PlannedSync, PlannedUnit, Unit};
use fleet_core::rollout::Gates;

use super::create::{Creations, Replacing, creations, unit_file};
use super::lifecycle::{desired_state_writes, existing_units, inactive_already};
use crate::context::Context;
use crate::diff::unified;
use crate::output::{OutputFormat, PlanOutput, ReplacementOrder, print_json};
use crate::table::tab_table;
use crate::{CreateFlags, Outcome};

/// The command planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Planned {
    Submit,
    Load,
    Start,
    Stop,
    Unload,
    Destroy,
    /// `plan machine drain MACHINE...`
    Machine,
    /// `plan rollout FILE`: the content a rollout of FILE gives its units
    Rollout,
    /// `plan revert UNIT --to VERSION`: the unit as that version had it
    Revert,
    /// `plan source sync NAME`: what a sync of the source would write now
    Source,
}

/// What is planned: the command, with its flags.
pub struct Asked<'a> {
    pub planned: Planned,
    pub create: &'a CreateFlags,
    /// `plan rollout --instances PATTERN`.
    pub instances: Option<&'a str>,
    /// `plan rollout --canary SIZE`.
    pub canary: Option<&'a str>,
    /// `plan revert --to VERSION`.
    pub to: Option<u64>,
    /// `plan source sync --force`.
    pub force: bool,
}

/// Where a rollout started now would replace each unit of `plan` it changes, with the canary
/// `gates` ask for: the order the API gives a new rollout (the units as `rollout start` sends
/// them, by name), from where each runs now.
fn replacement_order(plan: &Plan, gates: &Gates) -> ReplacementOrder {
    let mut changed: Vec<&PlannedUnit> = plan.units.iter().filter(|unit| unit.action == "change").collect();
    changed.sort_by(|a, b| a.name.cmp(&b.name));
    let (canary, ordered) = gates.replacement_order(changed, |unit| unit.machine_before.as_deref());
    let canary = canary.map_or(0, |canary| canary.count);
    ordered.into_iter().enumerate().map(|(index, unit)| (unit.name.clone(), (index + 1, index < canary))).collect()
}

pub async fn run(context: &Context, asked: &Asked<'_>, arguments: &[String], output: OutputFormat) -> Outcome {
    if (asked.instances.is_some() || asked.canary.is_some()) && asked.planned != Planned::Rollout {
        eprintln!("--instances and --canary apply to plan rollout only");
        return Outcome::Usage;
    }
    if asked.to.is_some() != (asked.planned == Planned::Revert) {
        eprintln!("--to goes with plan revert, which needs it: fleetctl plan revert UNIT --to VERSION");
        return Outcome::Usage;
    }
    if asked.force && asked.planned != Planned::Source {
        eprintln!("--force applies to plan source sync only");
        return Outcome::Usage;
    }
    let gates = match Gates::parse(asked.canary, None, false) {
        Ok(gates) => gates,
        Err(error) => {
            eprintln!("{error}");
            return Outcome::Usage;
        }
    };
    let (request, contents) = match request(context, asked, arguments).await {
        Ok(asked) => asked,
        Err(outcome) => return outcome,
    };
    if request.units.is_empty()
        && request.destroy.is_empty()
        && request.drain.is_empty()
        && request.source_sync.is_none()
    {
        println!("Nothing to do: every unit named is as the command would leave it.");
        return Outcome::Success;
    }
    let plan = match context.client.plan(&request).await {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("Error planning: {error}");
            return Outcome::Failure;
        }
    };
    let order = (asked.planned == Planned::Rollout).then(|| replacement_order(&plan, &gates));
    match output {
        OutputFormat::Json => print_json(&PlanOutput::of(&plan, order.as_ref())),
        OutputFormat::Table | OutputFormat::Wide => {
            let (contents, from) = match &plan.source {
                Some(sync) => {
                    print_sync(sync);
                    (sync_contents(context, sync).await, "source")
                }
                None => (contents, "local"),
            };
            print_plan(&plan, &contents, order.as_ref(), from, output == OutputFormat::Wide)
        }
    }
    Outcome::Success
}

/// What a planned sync read and what it would leave alone, before its table.
fn print_sync(sync: &PlannedSync) {
    let short: String = sync.commit.chars().take(12).collect();
    println!("Source {} at commit {short}", sync.name);
    if let Some(halted) = &sync.halted {
        println!("Nothing would be written: {halted}");
    }
    for problem in &sync.problems {
        println!("Problem (its unit keeps what it has): {problem}");
    }
    for owned in &sync.owned_elsewhere {
        println!("Left alone, held elsewhere: {owned}");
    }
    if let Some(rollout) = &sync.rollout {
        println!("New content for running units goes out in rollout {rollout}: {}", sync.rolled.join(", "));
    }
    println!();
}

/// The unit files before (the cluster's) and after (the source's) of the units a planned
/// sync changes, for their diffs.
async fn sync_contents(context: &Context, sync: &PlannedSync) -> Contents {
    let names: BTreeSet<String> = sync.contents.keys().cloned().collect();
    let existing = match crate::wait::fetch_units(context, &names).await {
        Ok(existing) => existing,
        Err(error) => {
            eprintln!("Error reading the units' files for their diffs: {error}");
            return Contents::new();
        }
    };
    existing
        .into_iter()
        .filter_map(|(name, unit)| {
            let after = sync.contents.get(&name)?.clone();
            Some((name, (unit_file(&unit).serialize(), after)))
        })
        .collect()
}

/// The unit files before and after, by unit, for the diffs of changed units.
type Contents = BTreeMap<String, (String, String)>;

/// What `planned` would write for `arguments`.
async fn request(
    context: &Context,
    asked: &Asked<'_>,
    arguments: &[String],
) -> Result<(PlanRequest, Contents), Outcome> {
    let (planned, create) = (asked.planned, asked.create);
    if arguments.is_empty() {
        eprintln!("No units given");
        return Err(Outcome::Usage);
    }
    match planned {
        Planned::Submit | Planned::Load | Planned::Start => {
            let (from, to): (&[&str], &'static str) = match planned {
                Planned::Submit => (&["inactive"], "inactive"),
                Planned::Load => (&["inactive", "loaded"], "loaded"),
                _ => (&["inactive", "loaded", "launched"], "launched"),
            };
            let replacing = Replacing { allowed: create.replace, from, to, waves: None };
            let created = creations(context, arguments, &replacing).await.map_err(|error| {
                eprintln!("Error creating units: {error}");
                Outcome::Failure
            })?;
            Ok(created_request(created, (planned != Planned::Submit).then_some(to)))
        }
        Planned::Stop | Planned::Unload => {
            let target = if planned == Planned::Stop { "loaded" } else { "inactive" };
            let units: Vec<Unit> =
                existing_units(context, arguments).await?.into_iter().filter(|unit| !inactive_already(unit)).collect();
            Ok((with_shared_contents(desired_state_writes(&units, target, &BTreeSet::new())), Contents::new()))
        }
        Planned::Machine => match arguments.split_first() {
            Some((verb, machines)) if verb == "drain" && !machines.is_empty() => {
                Ok((PlanRequest { drain: machines.to_vec(), ..PlanRequest::default() }, Contents::new()))
            }
            _ => {
                eprintln!("Usage: fleetctl plan machine drain MACHINE...");
                Err(Outcome::Usage)
            }
        },
        Planned::Rollout => {
            let [argument] = arguments else {
                eprintln!("Usage: fleetctl plan rollout FILE");
                return Err(Outcome::Usage);
            };
            let (_, file, names) = super::rollout::targets(context, argument, asked.instances).await?;
            let wanted: BTreeSet<String> = names.into_iter().collect();
            let existing = crate::wait::fetch_units(context, &wanted).await.map_err(|error| {
                eprintln!("Error listing units: {error}");
                Outcome::Failure
            })?;
            let options = super::create::schema_options(&file);
            let mut contents = Contents::new();
            let mut units = Vec::new();
            for (name, unit) in existing {
                contents.insert(name.clone(), (unit_file(&unit).serialize(), file.serialize()));
                units.push(Unit {
                    name,
                    desired_state: unit.desired_state,
                    options: options.clone(),
                    ..Unit::default()
                });
            }
            Ok((with_shared_contents(units), contents))
        }
        Planned::Revert => {
            let ([argument], Some(to)) = (arguments, asked.to) else {
                eprintln!("Usage: fleetctl plan revert UNIT --to VERSION");
                return Err(Outcome::Usage);
            };
            let name = fleet_core::unit_name::mangle(argument);
            let (current, version) =
                super::history::current_and_version(context, &name, to).await.map_err(|error| {
                    eprintln!("Error planning the revert of {name}: {error}");
                    Outcome::Failure
                })?;
            let reverted = super::history::as_unit(&name, &version);
            let mut contents = Contents::new();
            let (before, after) = (unit_file(&current), unit_file(&reverted));
            if before.hash() != after.hash() {
                contents.insert(name, (before.serialize(), after.serialize()));
            }
            Ok((with_shared_contents(vec![reverted]), contents))
        }
        Planned::Source => match arguments {
            [verb, name] if verb == "sync" => {
                let request = PlanRequest {
                    source_sync: Some(name.clone()),
                    source_sync_force: asked.force,
                    ..PlanRequest::default()
                };
                Ok((request, Contents::new()))
            }
            _ => {
                eprintln!("Usage: fleetctl plan source sync [--force] NAME");
                Err(Outcome::Usage)
            }
        },
        Planned::Destroy => {
            let units = existing_units(context, arguments).await?;
            Ok((
                PlanRequest { destroy: units.into_iter().map(|unit| unit.name).collect(), ..PlanRequest::default() },
                Contents::new(),
            ))
        }
    }
}

/// The writes of a command that creates what is missing, then (unless `target` is `None`,
/// as for submit) sets every named unit's desired state to `target`.
fn created_request(created: Creations, target: Option<&str>) -> (PlanRequest, Contents) {
    let Creations { names, to_create, existing, .. } = created;
    let mut contents = Contents::new();
    for unit in &to_create {
        if let Some(before) = existing.get(&unit.name) {
            contents.insert(unit.name.clone(), (unit_file(before).serialize(), unit_file(unit).serialize()));
        }
    }
    // New units and replacements carry the command's desired state already.
    let written: BTreeSet<String> = to_create.iter().map(|unit| unit.name.clone()).collect();
    let mut units = to_create;
    if let Some(target) = target {
        let mut seen = BTreeSet::new();
        let named: Vec<Unit> = names
            .iter()
            .filter(|name| seen.insert(name.as_str()))
            .filter_map(|name| existing.get(name).cloned())
            .collect();
        units.extend(desired_state_writes(&named, target, &written));
    }
    (with_shared_contents(units), contents)
}

/// A plan request of `units`, each content carried once (the instances of a template share
/// theirs), under a short key (ten thousand units then fit the API's bound on a request).
fn with_shared_contents(units: Vec<Unit>) -> PlanRequest {
    let mut request = PlanRequest::default();
    let mut keys: std::collections::HashMap<fleet_core::UnitHash, String> = std::collections::HashMap::new();
    for unit in units {
        let content = match unit.options.is_empty() {
            true => None,
            false => {
                let next = keys.len().to_string();
                let key = keys.entry(unit_file(&unit).hash()).or_insert(next).clone();
                request.contents.entry(key.clone()).or_insert(unit.options);
                Some(key)
            }
        };
        request.units.push(PlanUnit {
            name: unit.name,
            desired_state: unit.desired_state,
            options: Vec::new(),
            content,
        });
    }
    request
}

/// The plan as a table, then the diff of each changed unit, then the index.
/// `from` names where the new files come from (`local`, `source`).
fn print_plan(plan: &Plan, contents: &Contents, order: Option<&ReplacementOrder>, from: &str, wide: bool) {
    let mut header = ["UNIT", "ACTION", "STATE", "MACHINE"].map(str::to_string).to_vec();
    if order.is_some() {
        header.push("ORDER".to_string());
    }
    let rows: Vec<Vec<String>> = std::iter::once(header)
        .chain(plan.units.iter().map(|unit| {
            let mut row = row(unit, wide);
            if let Some(order) = order {
                row.push(match order.get(&unit.name) {
                    Some((place, true)) => format!("{place} (canary)"),
                    Some((place, false)) => place.to_string(),
                    None => "-".to_string(),
                });
            }
            row
        }))
        .collect();
    if plan.units.is_empty() {
        println!("Nothing would change.");
    } else {
        print!("{}", tab_table(&rows));
    }
    for unit in plan.units.iter().filter(|unit| unit.action == "change") {
        if let Some((before, after)) = contents.get(&unit.name) {
            print!(
                "\n{}",
                unified(&format!("{} (cluster)", unit.name), before, &format!("{} ({from})", unit.name), after)
            );
        }
    }
    match plan.source {
        // A sync is made by the engine leader, when it comes to it: no index guards it.
        Some(_) => println!("\nPlan index: {} (nothing was written)", plan.index),
        None => println!(
            "\nPlan index: {} (nothing was written; with --if-unchanged {} the command refuses if the cluster changes first)",
            plan.index, plan.index
        ),
    }
}

fn row(unit: &PlannedUnit, wide: bool) -> Vec<String> {
    let machine = |id: &Option<String>| match id {
        Some(id) if wide => id.clone(),
        Some(id) => id.chars().take(8).collect(),
        None => "-".to_string(),
    };
    let state = match (&unit.desired_state_before, &unit.desired_state) {
        (before, after) if before == after => after.clone().unwrap_or_else(|| "-".into()),
        (before, after) => format!("{} -> {}", before.as_deref().unwrap_or("-"), after.as_deref().unwrap_or("-")),
    };
    let placement = match (&unit.machine_before, &unit.machine, &unit.waiting) {
        (_, None, Some(waiting)) => format!("{} -> waits: {waiting}", machine(&unit.machine_before)),
        (before, after, Some(waiting)) if before == after => format!("{}, {waiting}", machine(after)),
        (before, after, _) if before == after => machine(after),
        (before, after, _) => format!("{} -> {}", machine(before), machine(after)),
    };
    // A unit on a calendar or a batch unit is placed only for a run (when that is); a running
    // unit that waits for units the change takes down or moves does something (what).
    let placement = [&unit.runs, &unit.on_required]
        .into_iter()
        .flatten()
        .fold(placement, |placement, note| format!("{placement}; {note}"));
    vec![unit.name.clone(), unit.action.clone(), state, placement]
}
