//! submit, load, start, stop, unload, destroy and restart.

use std::collections::{BTreeMap, BTreeSet};

use fleet_api_schema::Unit;
use fleet_core::duration::parse_go_duration;
use fleet_core::rollout::MaxUnavailable;
use fleet_core::unit_name::mangle;

use super::create::{Replacing, Waves, in_parallel, is_global, lazy_create, write_units};
use crate::context::Context;
use crate::unit_arguments::{Matched, UnitList, is_pattern, match_patterns};
use crate::wait::{Attempts, fetch_units, wait_for_active, wait_for_gone, wait_for_state};
use crate::{BlockFlags, CreateFlags, Outcome, WaveFlags};

/// Creates what is missing among `arguments` (the original's lazy creation), then gives
/// every named unit, in argument order: those this command wrote as written, the others
/// read back with their current state; and the names of those it wrote with
/// `replacing.to` as their desired state.
async fn create_and_find(
    context: &Context,
    arguments: &[String],
    replacing: &Replacing<'_>,
    failing: &str,
) -> Result<(Vec<Unit>, BTreeSet<String>, Option<String>), Outcome> {
    if arguments.is_empty() {
        eprintln!("No units given");
        return Err(Outcome::Usage);
    }
    let mut created = lazy_create(context, arguments, replacing).await.map_err(|error| {
        eprintln!("Error creating units: {error}");
        Outcome::Failure
    })?;
    let untouched: Vec<String> =
        created.names.iter().filter(|name| !created.written.contains_key(*name)).cloned().collect();
    let mut found = BTreeMap::new();
    if !untouched.is_empty() {
        let units = find_units(context, &untouched).await.map_err(|error| {
            eprintln!("Error {failing} units: {error}");
            Outcome::Failure
        })?;
        found.extend(units.into_iter().map(|unit| (unit.name.clone(), unit)));
    }
    let at_target: BTreeSet<String> = created
        .written
        .values()
        .filter(|unit| unit.desired_state.as_deref() == Some(replacing.to))
        .map(|unit| unit.name.clone())
        .collect();
    let mut seen = BTreeSet::new();
    let units = created
        .names
        .iter()
        .filter(|name| seen.insert(name.as_str()))
        .filter_map(|name| created.written.remove(name).or_else(|| found.remove(name)))
        .collect();
    Ok((units, at_target, created.rollout))
}

/// The existing units among `arguments`, in argument order.
async fn find_units(context: &Context, arguments: &[String]) -> Result<Vec<Unit>, String> {
    let names: Vec<String> = arguments.iter().map(|argument| mangle(argument)).collect();
    let wanted: BTreeSet<String> = names.iter().cloned().collect();
    let mut found = fetch_units(context, &wanted).await?;
    let mut seen = BTreeSet::new();
    Ok(names.into_iter().filter(|name| seen.insert(name.clone())).filter_map(|name| found.remove(&name)).collect())
}

/// The existing units among `arguments` for stop, unload and destroy; the original's
/// messages when there are none (unknown names are ignored).
async fn units_to_act_on(context: &Context, arguments: &[String], failing: &str) -> Result<Vec<Unit>, Outcome> {
    if arguments.is_empty() {
        eprintln!("No units given");
        return Err(Outcome::Usage);
    }
    match find_units(context, arguments).await {
        Ok(units) if units.is_empty() => {
            eprintln!("Units not found in registry");
            Err(Outcome::Success)
        }
        Ok(units) => Ok(units),
        Err(error) => {
            eprintln!("{failing}: {error}");
            Err(Outcome::Failure)
        }
    }
}

/// The existing units among `arguments`, for a plan of stop, unload or destroy: none is an
/// error, as for the commands.
pub async fn existing_units(context: &Context, arguments: &[String]) -> Result<Vec<Unit>, Outcome> {
    match units_to_act_on(context, arguments, "Error retrieving units").await {
        Ok(units) => Ok(units),
        Err(Outcome::Success) => Err(Outcome::Failure),
        Err(outcome) => Err(outcome),
    }
}

/// Sets `target` as the desired state of every unit not already there; returns those it
/// changed, with those `already` set to it by this command (created or replaced with it).
async fn set_desired_state(
    context: &Context,
    units: Vec<Unit>,
    target: &'static str,
    already: &BTreeSet<String>,
) -> Result<Vec<Unit>, String> {
    let triggered: Vec<Unit> = units
        .into_iter()
        .filter(|unit| unit.desired_state.as_deref() != Some(target) || already.contains(&unit.name))
        .collect();
    write_units(context, desired_state_writes(&triggered, target, already)).await?;
    Ok(triggered)
}

/// The writes that give `units` the desired state `target`: one for each unit not there yet,
/// unless this command set it already (`already`: created or replaced with it).
pub fn desired_state_writes(units: &[Unit], target: &str, already: &BTreeSet<String>) -> Vec<Unit> {
    units
        .iter()
        .filter(|unit| unit.desired_state.as_deref() != Some(target) && !already.contains(&unit.name))
        .map(|unit| Unit { name: unit.name.clone(), desired_state: Some(target.to_string()), ..Unit::default() })
        .collect()
}

/// Whether stop and unload leave `unit` alone: a unit that is not global and is inactive
/// already (stop says it cannot stop it).
pub fn inactive_already(unit: &Unit) -> bool {
    !is_global(unit) && unit.current_state.as_deref().unwrap_or("inactive") == "inactive"
}

/// Says which units changed state: global ones are never waited for; with `--no-block` the
/// others are only announced. Returns the non-global units to wait for, or `None` when no
/// wait follows.
fn announce_triggered(triggered: Vec<Unit>, verb: &str, attempts: Attempts) -> Option<Vec<String>> {
    let (global, scheduled): (Vec<Unit>, Vec<Unit>) = triggered.into_iter().partition(is_global);
    for unit in &global {
        println!("Triggered global unit {} {verb}", unit.name);
    }
    // A unit on a calendar runs at its elapses, not now, and a batch unit's run ends: nothing
    // to wait for (`fleetctl runs` shows their runs).
    let (with_runs, scheduled): (Vec<Unit>, Vec<Unit>) =
        scheduled.into_iter().partition(|unit| calendar_of(unit).is_some() || is_batch(unit));
    for unit in &with_runs {
        match calendar_of(unit).filter(|_| verb == "start") {
            Some(calendar) => println!("Triggered unit {} {verb}; it runs {}", unit.name, next_run(&calendar)),
            None if verb == "start" => {
                println!("Triggered unit {} {verb}; fleetctl runs {} shows how its run ends", unit.name, unit.name)
            }
            None => println!("Triggered unit {} {verb}", unit.name),
        }
    }
    let names: Vec<String> = scheduled.into_iter().map(|unit| unit.name).collect();
    if attempts == Attempts::NoBlock {
        for name in &names {
            println!("Triggered unit {name} {verb}");
        }
        return None;
    }
    Some(names)
}

/// The calendar of a unit with `[X-Fleet] Schedule=` (the last one, as fleet reads it).
fn calendar_of(unit: &Unit) -> Option<String> {
    let schedule = unit.options.iter().rev().find(|option| option.section == "X-Fleet" && option.name == "Schedule")?;
    Some(schedule.value.clone())
}

/// Whether a unit says `[X-Fleet] Batch=true` (the last one, as fleet reads it).
fn is_batch(unit: &Unit) -> bool {
    let batch = unit.options.iter().rev().find(|option| option.section == "X-Fleet" && option.name == "Batch");
    batch.and_then(|option| fleet_core::service_values::parse_systemd_bool(&option.value)).unwrap_or(false)
}

/// `on Mon..Fri *-*-* 02:00:00 Europe/Berlin, next at 2026-12-07 01:00:00 UTC`.
fn next_run(calendar: &str) -> String {
    match fleet_core::calendar::CalendarSpec::parse(calendar.trim()) {
        Ok(spec) => format!("on {spec}, next at {}", super::file_facts::next_elapse_text(&spec)),
        Err(_) => format!("on {calendar}"),
    }
}

/// The units a command names: ranges and the list file expanded, patterns matched against
/// the cluster's units (listed only when there is a pattern), with the patterns that matched
/// nothing.
pub async fn named_units(context: &Context, list: &UnitList) -> Result<Matched, Outcome> {
    let arguments = list.arguments().map_err(|error| {
        eprintln!("{error}");
        Outcome::Usage
    })?;
    if !arguments.iter().any(|argument| is_pattern(argument)) {
        return Ok(Matched { names: arguments, unmatched: Vec::new() });
    }
    let cluster = context.client.units().await.map_err(|error| {
        eprintln!("Error listing units: {error}");
        Outcome::Failure
    })?;
    let names: BTreeSet<String> = cluster.into_iter().map(|unit| unit.name).collect();
    match_patterns(&arguments, &names).map_err(|error| {
        eprintln!("{error}");
        Outcome::Failure
    })
}

fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

pub async fn submit(context: &Context, arguments: &[String], create: &CreateFlags) -> Outcome {
    if arguments.is_empty() {
        eprintln!("No units given");
        return Outcome::Usage;
    }
    let replacing = Replacing { allowed: create.replace, from: &["inactive"], to: "inactive", waves: None };
    match lazy_create(context, arguments, &replacing).await {
        Ok(_) => Outcome::Success,
        Err(error) => {
            eprintln!("Error creating units: {error}");
            Outcome::Failure
        }
    }
}

/// load and start: create, set the desired state, wait for the current state.
async fn schedule(
    context: &Context,
    arguments: &[String],
    create: &CreateFlags,
    waves: Option<Waves>,
    block: &BlockFlags,
    (target, verb, failing): (&'static str, &str, &str),
) -> Outcome {
    let from: &[&str] =
        if target == "launched" { &["inactive", "loaded", "launched"] } else { &["inactive", "loaded"] };
    let replacing = Replacing { allowed: create.replace, from, to: target, waves };
    let (units, at_target, rollout) = match create_and_find(context, arguments, &replacing, failing).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let triggered = match set_desired_state(context, units, target, &at_target).await {
        Ok(triggered) => triggered,
        Err(error) => {
            eprintln!("Error {failing} units: {error}");
            return Outcome::Failure;
        }
    };
    let attempts = Attempts::from_flags(block);
    let Some(names) = announce_triggered(triggered, verb, attempts) else { return Outcome::Success };
    // A rollout started for running units blocks like the units do: until it is done.
    if let Some(rollout) = rollout
        && let Err(error) = super::rollout::wait_settled(context, &rollout, attempts.deadline()).await
    {
        eprintln!("Error waiting for rollout {rollout}: {error}");
        return Outcome::Failure;
    }
    if let Err(error) = wait_for_state(context, &names, target, attempts).await {
        report_wait_failure(&error, "Error waiting for unit states, exit status");
        return Outcome::Failure;
    }
    if target == "launched"
        && let Err(error) = wait_for_active(context, &names).await
    {
        report_wait_failure(&error, "Error waiting for systemd unit states, err");
        return Outcome::Failure;
    }
    Outcome::Success
}

/// The original's two lines for a wait that failed (the second one names the stage, with the
/// failure again), then what fleet adds to explain it (such as why a unit cannot be placed).
fn report_wait_failure(error: &str, stage: &str) {
    let (failure, explanation) = match error.split_once('\n') {
        Some((failure, explanation)) => (failure, Some(explanation)),
        None => (error, None),
    };
    eprintln!("Error waiting for units: {failure}");
    eprintln!("{stage}: {failure}");
    if let Some(explanation) = explanation {
        eprintln!("{explanation}");
    }
}

pub async fn load(context: &Context, arguments: &[String], create: &CreateFlags, block: &BlockFlags) -> Outcome {
    schedule(context, arguments, create, None, block, ("loaded", "load", "loading")).await
}

pub async fn start(
    context: &Context,
    arguments: &[String],
    create: &CreateFlags,
    waves: &WaveFlags,
    block: &BlockFlags,
) -> Outcome {
    let waves = match &waves.max_unavailable {
        None => None,
        Some(max_unavailable) => {
            if let Err(error) = MaxUnavailable::parse(max_unavailable) {
                eprintln!("Invalid --max-unavailable: {error}");
                return Outcome::Usage;
            }
            match parse_go_duration(&waves.min_ready) {
                Ok(min_ready) => {
                    Some(Waves { max_unavailable: max_unavailable.clone(), min_ready_seconds: min_ready.as_secs() })
                }
                Err(error) => {
                    eprintln!("Invalid --min-ready {:?}: {error}", waves.min_ready);
                    return Outcome::Usage;
                }
            }
        }
    };
    schedule(context, arguments, create, waves, block, ("launched", "start", "starting")).await
}

/// stop and unload: only existing units; wait for the lower state.
async fn lower(
    context: &Context,
    arguments: &[String],
    block: &BlockFlags,
    (target, verb, done, acting_on): (&'static str, &str, &str, &str),
) -> Outcome {
    let units = match units_to_act_on(context, arguments, "Error retrieving units").await {
        Ok(units) => units,
        Err(outcome) => return outcome,
    };
    let mut outcome = Outcome::Success;
    let mut acting = Vec::new();
    for unit in units {
        if inactive_already(&unit) {
            if target == "loaded" {
                eprintln!("Unable to stop unit {} in state inactive", unit.name);
                outcome = Outcome::Failure;
            }
            continue;
        }
        acting.push(unit);
    }
    let triggered = match set_desired_state(context, acting, target, &BTreeSet::new()).await {
        Ok(triggered) => triggered,
        Err(error) => {
            eprintln!("Error {acting_on} units: {error}");
            return Outcome::Failure;
        }
    };
    let attempts = Attempts::from_flags(block);
    let Some(names) = announce_triggered(triggered, verb, attempts) else { return outcome };
    if names.is_empty() && matches!(outcome, Outcome::Failure) {
        return outcome;
    }
    match wait_for_state(context, &names, target, attempts).await {
        Ok(()) => {
            eprintln!("Successfully {done} units {}.", go_list(&names));
            outcome
        }
        Err(error) => {
            eprintln!("Failed to {verb} units {}. err: {error}", go_list(&names));
            Outcome::Failure
        }
    }
}

pub async fn stop(context: &Context, arguments: &[String], block: &BlockFlags) -> Outcome {
    lower(context, arguments, block, ("loaded", "stop", "stopped", "stopping")).await
}

pub async fn unload(context: &Context, arguments: &[String], block: &BlockFlags) -> Outcome {
    lower(context, arguments, block, ("inactive", "unload", "unloaded", "unloading")).await
}

pub async fn destroy(context: &Context, arguments: &[String], block: &BlockFlags) -> Outcome {
    let units = match units_to_act_on(context, arguments, "Error destroying units").await {
        Ok(units) => units,
        Err(outcome) => return outcome,
    };
    let names: Vec<String> = units.into_iter().map(|unit| unit.name).collect();
    let client = context.client.clone();
    let results = in_parallel(names.clone(), move |name| {
        let client = client.clone();
        async move { client.destroy_unit(&name).await.map_err(|error| error.to_string()) }
    })
    .await;
    for (name, result) in names.iter().zip(results) {
        if let Err(error) = result {
            eprintln!("Error destroying units: {error}");
            return Outcome::Failure;
        }
        println!("Destroyed {name}");
    }
    let attempts = Attempts::from_flags(block);
    if attempts != Attempts::NoBlock
        && let Err(error) = wait_for_gone(context, &names, attempts).await
    {
        eprintln!("Error waiting for units: {error}");
        return Outcome::Failure;
    }
    Outcome::Success
}

/// Waits until no machine reports the global unit `name` as active.
async fn wait_global_stopped(context: &Context, name: &str, attempts: Attempts) -> Result<(), String> {
    let deadline = match attempts {
        Attempts::Limited(n) => Some(std::time::Instant::now() + crate::wait::ATTEMPT * n),
        _ => None,
    };
    loop {
        let states = context.client.unit_states(Some(name)).await.map_err(|error| error.to_string())?;
        if states.iter().all(|state| state.systemd_active_state != "active") {
            return Ok(());
        }
        if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
            return Err(format!("timed out waiting for global unit {name} to stop"));
        }
        tokio::time::sleep(crate::wait::POLL).await;
    }
}

/// Restarts one unit: a global one on every machine, a scheduled one through loaded and
/// back to launched, waiting for each step.
async fn restart_one(context: &Context, unit: &Unit, attempts: Attempts) -> Result<(), String> {
    let name = std::slice::from_ref(&unit.name);
    let set = async |target: &'static str| {
        context.client.set_desired_state(&unit.name, target).await.map_err(|error| error.to_string())
    };
    if is_global(unit) {
        set("loaded").await?;
        wait_global_stopped(context, &unit.name, attempts).await?;
        set("launched").await?;
        println!("Triggered global unit {} restart", unit.name);
        return Ok(());
    }
    match unit.current_state.as_deref().unwrap_or("inactive") {
        "inactive" => {
            eprintln!("Unable to restart unit {} in state inactive", unit.name);
            return Ok(());
        }
        "loaded" => {}
        _ => {
            set("loaded").await?;
            wait_for_state(context, name, "loaded", attempts).await?;
        }
    }
    set("launched").await?;
    wait_for_state(context, name, "launched", attempts).await
}

pub async fn restart(context: &Context, arguments: &[String], block_attempts: u32) -> Outcome {
    let attempts = Attempts::from_count(block_attempts);
    let replacing = Replacing { allowed: false, from: &[], to: "inactive", waves: None };
    let units = match create_and_find(context, arguments, &replacing, "restarting").await {
        Ok((units, _, _)) => units,
        Err(outcome) => return outcome,
    };
    for unit in &units {
        if let Err(error) = restart_one(context, unit, attempts).await {
            eprintln!("Error restarting units: {error}");
            return Outcome::Failure;
        }
    }
    Outcome::Success
}
