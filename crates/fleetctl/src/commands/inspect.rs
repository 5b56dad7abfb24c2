//! cat, status and journal.

use std::time::Duration;

use fleet_core::unit_name::mangle;
use fleet_core::unknown_options::unit_warnings;

use super::create::{is_global, unit_file};
use super::list::{health_text, unit_row};
use crate::Outcome;
use crate::context::Context;
use crate::output::{OutputFormat, UnitStatus, print_json};
use crate::table::MachineLegends;

pub async fn cat(context: &Context, arguments: &[String]) -> Outcome {
    let [argument] = arguments else {
        eprintln!("One unit file must be provided");
        return Outcome::Usage;
    };
    let name = mangle(argument);
    match context.client.unit(&name).await {
        Ok(Some(unit)) => {
            print!("{}", unit_file(&unit).serialize());
            Outcome::Success
        }
        Ok(None) => {
            eprintln!("Unit {name} not found");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error retrieving Unit {name}: {error}");
            Outcome::Failure
        }
    }
}

/// The unit `name`, or the original's message when it does not exist.
async fn existing_unit(context: &Context, name: &str) -> Result<fleet_api_schema::Unit, Outcome> {
    match context.client.unit(name).await {
        Ok(Some(unit)) => Ok(unit),
        Ok(None) => {
            eprintln!("Unit {name} does not exist.");
            Err(Outcome::Failure)
        }
        Err(error) => {
            eprintln!("Error retrieving Unit {name}: {error}");
            Err(Outcome::Failure)
        }
    }
}

/// `systemctl status` of the unit when the machine serving the API runs it under systemd;
/// otherwise a report in its style built from what the cluster knows, with the unit's recent
/// log from the machine serving the API.
pub async fn status(context: &Context, arguments: &[String], output: OutputFormat) -> Outcome {
    if arguments.is_empty() {
        eprintln!("No units given");
        return Outcome::Usage;
    }
    let machines = context.machines().await;
    let mut found = Vec::new();
    let mut not_running = false;
    let mut unreadable = false;
    for (index, argument) in arguments.iter().enumerate() {
        let name = mangle(argument);
        let unit = match existing_unit(context, &name).await {
            Ok(unit) => unit,
            Err(outcome) => return outcome,
        };
        if !is_global(&unit) && unit.current_state.as_deref().unwrap_or("inactive") == "inactive" {
            eprintln!("Unit {name} does not appear to be loaded.");
            return Outcome::Failure;
        }
        let states = context.client.unit_states(Some(&name)).await.unwrap_or_default();
        // As `systemctl status`: a unit that runs nowhere, or not everywhere it is, exits 3.
        not_running |= states.is_empty() || states.iter().any(|state| state.systemd_active_state != "active");
        // A log that cannot be had is said, not left out in silence (issue 68).
        let report = match context.client.status(&name, 10).await {
            Ok(report) => Some(report),
            Err(error) => {
                eprintln!("Unable to read the journal of {name}: {error}");
                unreadable = true;
                None
            }
        };
        if output == OutputFormat::Json {
            found.push((unit, states, report));
            continue;
        }
        if index > 0 {
            println!();
        }
        // On the machine running the unit, systemd's own report, as `systemctl status`.
        if let Some(journal) = &report
            && let Some(status) = &journal.status
            && states.iter().any(|state| state.machine_id == journal.machine_id)
        {
            print!("{status}");
            for line in states.iter().filter_map(health_line) {
                println!("{line}");
            }
            print_unknown_options(&unit);
            continue;
        }
        // As systemctl status shows it: the specifiers of the unit's name expanded.
        let name_info = fleet_core::unit_name::UnitNameInfo::new(&name);
        let description = unit_file(&unit)
            .description()
            .map(|description| fleet_core::unit_name::expand_specifiers(description, &name_info));
        match &description {
            Some(description) => println!("● {name} - {description}"),
            None => println!("● {name}"),
        }
        for state in &states {
            println!("   Machine: {}", MachineLegends::of(&machines).full_legend(&state.machine_id, false));
            println!("    Loaded: {}", state.systemd_load_state);
            println!("    Active: {} ({})", state.systemd_active_state, state.systemd_sub_state);
            if let Some(line) = health_line(state) {
                println!("{line}");
            }
        }
        print_unknown_options(&unit);
        if let Some(journal) = &report
            && !journal.text.is_empty()
        {
            println!();
            print!("{}", journal.text);
        }
    }
    if output == OutputFormat::Json {
        let files: Vec<_> = found.iter().map(|(unit, _, _)| unit_file(unit)).collect();
        let statuses: Vec<UnitStatus<'_>> = found
            .iter()
            .zip(&files)
            .map(|((unit, states, report), file)| {
                let global = is_global(unit);
                UnitStatus {
                    unit: &unit.name,
                    description: file.description(),
                    desired_state: unit.desired_state.as_deref(),
                    current_state: unit.current_state.as_deref().filter(|_| !global),
                    global,
                    hash: file.hash().to_string(),
                    states: states.iter().map(|state| unit_row(state, &machines)).collect(),
                    log: report.as_ref().map(|journal| journal.text.lines().collect()).unwrap_or_default(),
                    unknown_options: unit_warnings(&unit.name, file),
                }
            })
            .collect();
        print_json(&statuses);
    }
    match (not_running, unreadable) {
        (true, _) => Outcome::Exit(SYSTEMCTL_NOT_ACTIVE),
        (false, true) => Outcome::Failure,
        (false, false) => Outcome::Success,
    }
}

/// `   Warning: unknown option ExecStrat= in [Service], …`: what in the unit file neither
/// systemd nor fleet knows, a likely reason why it fails (issue 68), and the metadata
/// requirements it ignores.
fn print_unknown_options(unit: &fleet_api_schema::Unit) {
    for warning in unit_warnings(&unit.name, &unit_file(unit)) {
        println!("   Warning: {warning}");
    }
}

/// `    Health: unhealthy: HTTP 500`, for a unit with a health check that runs.
fn health_line(state: &fleet_api_schema::UnitState) -> Option<String> {
    let text = health_text(state);
    (!text.is_empty()).then(|| format!("    Health: {text}"))
}

/// `systemctl status`'s exit status for a unit that is not active.
const SYSTEMCTL_NOT_ACTIVE: u8 = 3;

pub async fn journal(context: &Context, arguments: &[String], lines: usize, follow: bool) -> Outcome {
    let [argument] = arguments else {
        eprintln!("One unit file must be provided.");
        return Outcome::Usage;
    };
    let name = mangle(argument);
    let unit = match existing_unit(context, &name).await {
        Ok(unit) => unit,
        Err(outcome) => return outcome,
    };
    if is_global(&unit) {
        eprintln!("Unable to retrieve journal of global unit {name}.");
        return Outcome::Failure;
    }
    if unit.current_state.as_deref().unwrap_or("inactive") == "inactive" {
        eprintln!("Unit {name} does not appear to be running.");
        let file = super::create::unit_file(&unit);
        if fleet_core::Requirements::from_unit(&name, &file).job.is_some_and(|job| job.keeps_runs()) {
            // On a calendar or a batch unit: placed only while a run runs.
            eprintln!("Its runs' last lines: fleetctl runs {name}");
        }
        return Outcome::Failure;
    }
    let mut printed: Vec<String> = match context.client.journal(&name, lines).await {
        Ok(journal) => journal.text.lines().map(str::to_string).collect(),
        Err(error) => {
            eprintln!("Error retrieving journal of {name}: {error}");
            return Outcome::Failure;
        }
    };
    for line in &printed {
        println!("{line}");
    }
    if !follow {
        return Outcome::Success;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(journal) = context.client.journal(&name, lines.max(1000)).await else {
            continue;
        };
        let recent: Vec<String> = journal.text.lines().map(str::to_string).collect();
        let start = match printed.last() {
            Some(last) => recent.iter().rposition(|line| line == last).map_or(0, |position| position + 1),
            None => 0,
        };
        for line in &recent[start..] {
            println!("{line}");
        }
        if start < recent.len() {
            printed = recent;
        }
    }
}
