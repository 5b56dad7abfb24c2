//! list-machines, list-unit-files and list-units.

use std::collections::BTreeMap;

use fleet_api_schema::{Machine, Unit, UnitState};
use fleet_core::UnitHash;

use super::file_facts::{FactsByContents, next_elapse_text};
use crate::context::Context;
use crate::output::{BudgetJson, MachineRow, OutputFormat, RequiresJson, UnitFileRow, UnitRow, print_json};
use crate::reservations::{capacity_cell, reserved_by_machine, reserved_cell};
use crate::table::{MachineIds, MachineLegends, machine_ip, tab_table};
use crate::{ListFlags, Outcome};

/// The columns to print: those of `--fields`, or every one with `-o wide`.
fn columns<'a>(fields: &'a str, valid: &[&'a str], output: OutputFormat) -> Result<Vec<&'a str>, Outcome> {
    if output == OutputFormat::Wide {
        return Ok(valid.to_vec());
    }
    parse_fields(fields, valid).map_err(|message| {
        eprintln!("{message}");
        Outcome::Failure
    })
}

/// Checks `--fields` against the valid names: the original's message, then the valid fields.
fn parse_fields<'a>(fields: &'a str, valid: &[&str]) -> Result<Vec<&'a str>, String> {
    let listed = || format!("\nValid fields: {}", valid.join(","));
    if fields.is_empty() {
        return Err(format!("Must define output format{}", listed()));
    }
    let fields: Vec<&str> = fields.split(',').collect();
    match fields.iter().find(|field| !valid.contains(field)) {
        Some(bad) => Err(format!("Invalid key in output format: {bad:?}{}", listed())),
        None => Ok(fields),
    }
}

fn print_table(fields: &[&str], rows: Vec<Vec<String>>, no_legend: bool) {
    let mut table = Vec::with_capacity(rows.len() + 1);
    if !no_legend {
        table.push(fields.iter().map(|field| field.to_uppercase()).collect());
    }
    table.extend(rows);
    print!("{}", tab_table(&table));
}

fn or_dash(text: &str) -> String {
    if text.is_empty() { "-".to_string() } else { text.to_string() }
}

pub async fn machines(context: &Context, list: &ListFlags, fields: &str, output: OutputFormat) -> Outcome {
    let valid = [
        "machine",
        "ip",
        "metadata",
        "units",
        "connection",
        "leader",
        "capacity",
        "reserved",
        "drain",
        "taints",
        "state",
        "version",
    ];
    let fields = match columns(fields, &valid, output) {
        Ok(fields) => fields,
        Err(outcome) => return outcome,
    };
    let machines = match context.client.machines_listed(true).await {
        Ok(machines) => machines,
        Err(error) => {
            eprintln!("Error retrieving list of active machines from fleet API ({error})");
            return Outcome::Failure;
        }
    };
    let wants = |field: &str| output == OutputFormat::Json || fields.contains(&field);
    let mut states = Vec::new();
    if wants("units") || wants("reserved") {
        match context.client.unit_states(None).await {
            Ok(listed) => states = listed,
            Err(error) => {
                eprintln!("Error retrieving list of units from repository: {error}");
                return Outcome::Failure;
            }
        }
    }
    let mut units_on: BTreeMap<String, usize> = BTreeMap::new();
    states.iter().for_each(|state| *units_on.entry(state.machine_id.clone()).or_default() += 1);
    let units_of = |machine: &str| units_on.get(machine).copied().unwrap_or(0);
    let reserved = if wants("reserved") {
        match context.client.units().await {
            Ok(units) => reserved_by_machine(&units, &states),
            Err(error) => {
                eprintln!("Error retrieving list of units from repository: {error}");
                return Outcome::Failure;
            }
        }
    } else {
        BTreeMap::new()
    };
    let reserved_on = |machine: &str| reserved.get(machine).copied().unwrap_or_default();
    // `-o wide` shows machine IDs whole, as `--full` does.
    let full = list.full || output == OutputFormat::Wide;
    if output == OutputFormat::Json {
        let rows: Vec<MachineRow<'_>> = machines
            .iter()
            .map(|machine| MachineRow {
                machine: &machine.id,
                ip: &machine.primary_ip,
                metadata: &machine.metadata,
                units: units_of(&machine.id),
                connection: Some(machine.connection.as_str()).filter(|word| !word.is_empty()),
                leader: machine.engine_leader,
                capacity: machine.capacity,
                reserved: reserved_on(&machine.id).into(),
                drain: machine.drain.as_ref().map(|drain| drain.state.as_str()),
                taints: &machine.taints,
                out_of_touch_since: Some(machine.out_of_touch_since.as_str()).filter(|since| !since.is_empty()),
                version: Some(machine.version.as_str()).filter(|version| !version.is_empty()),
            })
            .collect();
        print_json(&rows);
        return Outcome::Success;
    }
    let ids = MachineIds::of(machines.iter().map(|machine| machine.id.as_str()));
    let rows = machines
        .iter()
        .map(|machine| {
            fields
                .iter()
                .map(|field| match *field {
                    "machine" => ids.legend(&machine.id, full),
                    "ip" => or_dash(&machine.primary_ip),
                    "units" => units_of(&machine.id).to_string(),
                    "connection" => or_dash(&machine.connection),
                    "leader" => if machine.engine_leader { "engine" } else { "-" }.to_string(),
                    "capacity" => capacity_cell(machine.capacity),
                    "reserved" => reserved_cell(reserved_on(&machine.id), machine.capacity),
                    "drain" => machine.drain.as_ref().map_or("-".to_string(), |drain| drain.state.clone()),
                    "taints" => or_dash(&machine.taints.join(",")),
                    "state" => machine_state(machine),
                    "version" => or_dash(&machine.version),
                    _ => {
                        or_dash(&machine.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
                    }
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    // The original's table has no leader column, and scripts read it: with the legend on and
    // no leader column asked for, which machine leads is said beneath, on stderr.
    if !list.no_legend
        && !fields.contains(&"leader")
        && let Some(leader) = machines.iter().find(|machine| machine.engine_leader)
    {
        eprintln!("Engine leader: {} (-o wide shows more)", ids.legend(&leader.id, full));
    }
    if !fields.contains(&"state") {
        for machine in machines.iter().filter(|machine| !machine.out_of_touch_since.is_empty()) {
            eprintln!("Out of touch: {}, {}", ids.legend(&machine.id, full), machine_state(machine));
        }
    }
    Outcome::Success
}

pub async fn unit_files(context: &Context, list: &ListFlags, fields: &str, output: OutputFormat) -> Outcome {
    let fields = if output == OutputFormat::Wide {
        vec![
            "unit", "hash", "dstate", "state", "target", "global", "desc", "reason", "source", "sync", "schedule",
            "next",
        ]
    } else {
        let valid = [
            "budget", "desc", "dstate", "global", "hash", "next", "priority", "reason", "requires", "schedule",
            "source", "state", "sync", "target", "terms", "tmachine", "unit", "version",
        ];
        match columns(fields, &valid, output) {
            Ok(fields) => fields,
            Err(outcome) => return outcome,
        }
    };
    if fields.contains(&"tmachine") && output != OutputFormat::Json {
        eprintln!("WARNING: The \"tmachine\" field is deprecated. Use \"target\" instead");
    }
    let mut units = match context.client.units().await {
        Ok(units) => units,
        Err(error) => {
            eprintln!("Error retrieving list of units from repository: {error}");
            return Outcome::Failure;
        }
    };
    units.sort_by(|a, b| a.name.cmp(&b.name));
    let machines = if output == OutputFormat::Json || fields.iter().any(|f| *f == "target" || *f == "tmachine") {
        context.machines().await
    } else {
        Default::default()
    };
    let sync = source_sync(context, &units).await;
    let sync_of = |unit: &Unit| -> Option<&str> {
        match sync.get(unit.name.as_str()) {
            Some(why) => Some(why.as_str()),
            None => unit.source.as_ref().map(|_| "in sync"),
        }
    };
    let mut files = FactsByContents::default();
    if output == OutputFormat::Json {
        let facts: Vec<_> = units.iter().map(|unit| files.of(unit)).collect();
        let rows: Vec<UnitFileRow<'_>> = units
            .iter()
            .zip(&facts)
            .map(|(unit, file)| {
                let global = file.global(unit);
                let machine = unit.machine_id.as_deref().filter(|_| !global);
                UnitFileRow {
                    unit: &unit.name,
                    hash: file.hash.to_string(),
                    description: file.description(),
                    desired_state: unit.desired_state.as_deref(),
                    current_state: unit.current_state.as_deref().filter(|_| !global),
                    global,
                    machine,
                    machine_ip: machine.and_then(|machine| machine_ip(&machines, machine)),
                    reason: unit.reason.as_deref(),
                    source: unit.source.as_deref(),
                    sync: sync_of(unit),
                    schedule: file.schedule.as_ref().map(ToString::to_string),
                    next_elapse: file.schedule.as_ref().map(next_elapse_text),
                    priority: file.priority,
                    disruption_budget: file.budget.as_ref().map(BudgetJson::of),
                    requires: RequiresJson::of(&file.dependencies),
                    terms: file.terms(unit),
                    version: unit.version.unwrap_or(1),
                }
            })
            .collect();
        print_json(&rows);
        return Outcome::Success;
    }
    let legends = MachineLegends::of(&machines);
    let rows = units
        .iter()
        .map(|unit| {
            let file = files.of(unit);
            let global = file.global(unit);
            fields
                .iter()
                .map(|field| match *field {
                    "unit" => unit.name.clone(),
                    "global" => global.to_string(),
                    "dstate" => or_dash(unit.desired_state.as_deref().unwrap_or("")),
                    "state" if global => "-".to_string(),
                    "state" => or_dash(unit.current_state.as_deref().unwrap_or("")),
                    "target" | "tmachine" if global => "global".to_string(),
                    "target" | "tmachine" => match &unit.machine_id {
                        Some(id) => legends.full_legend(id, list.full),
                        None => "-".to_string(),
                    },
                    "hash" if list.full => file.hash.to_string(),
                    "hash" => file.hash.short(),
                    "desc" => or_dash(file.description().unwrap_or("")),
                    "source" => or_dash(unit.source.as_deref().unwrap_or("")),
                    "sync" => or_dash(sync_of(unit).unwrap_or("")),
                    "schedule" => file.schedule.as_ref().map_or_else(|| "-".to_string(), ToString::to_string),
                    "next" => file.schedule.as_ref().map_or_else(|| "-".to_string(), next_elapse_text),
                    "priority" => file.priority.to_string(),
                    "budget" => file.budget.as_ref().map_or_else(|| "-".to_string(), |budget| budget.short()),
                    "requires" => file.dependencies.short(),
                    "terms" => or_dash(&file.terms(unit).join("; ")),
                    "version" => unit.version.unwrap_or(1).to_string(),
                    _ => or_dash(unit.reason.as_deref().unwrap_or("")),
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    let on_calendar = units.iter().filter(|unit| files.of(unit).schedule.is_some()).count();
    if on_calendar > 0 && !fields.contains(&"next") {
        eprintln!(
            "{on_calendar} unit(s) run on a calendar, placed only while a run runs; see: fleetctl list-unit-files --fields unit,schedule,next,state"
        );
    }
    if !sync.is_empty() && !fields.contains(&"sync") {
        eprintln!(
            "{} unit(s) are out of sync with their source; see: fleetctl list-unit-files --fields unit,source,sync",
            sync.len()
        );
    }
    Outcome::Success
}

/// Why each unit a source owns is out of sync with it (the first clause of the reason), for
/// the units listed; nothing when no listed unit has a source, or the sources cannot be read.
async fn source_sync(context: &Context, units: &[Unit]) -> BTreeMap<String, String> {
    if units.iter().all(|unit| unit.source.is_none()) {
        return BTreeMap::new();
    }
    let Ok(sources) = context.client.sources().await else { return BTreeMap::new() };
    sources
        .into_iter()
        .filter_map(|source| source.status)
        .flat_map(|status| status.out_of_sync)
        .map(|entry| {
            let short = entry.why.split(';').next().unwrap_or_default().to_string();
            (entry.unit, short)
        })
        .collect()
}

pub async fn units(context: &Context, list: &ListFlags, fields: &str, output: OutputFormat) -> Outcome {
    let fields = if output == OutputFormat::Wide {
        vec!["unit", "machine", "active", "sub", "load", "hash", "drift", "health"]
    } else {
        match columns(fields, &["active", "drift", "hash", "health", "load", "machine", "sub", "unit"], output) {
            Ok(fields) => fields,
            Err(outcome) => return outcome,
        }
    };
    let mut states = match context.client.unit_states_listed(None, true).await {
        Ok(states) => states,
        Err(error) => {
            eprintln!("Error retrieving list of units from repository: {error}");
            return Outcome::Failure;
        }
    };
    states.sort_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
    let machines = if output == OutputFormat::Json || fields.contains(&"machine") {
        context.machines().await
    } else {
        Default::default()
    };
    if output == OutputFormat::Json {
        let rows: Vec<UnitRow<'_>> = states.iter().map(|state| unit_row(state, &machines)).collect();
        print_json(&rows);
        return Outcome::Success;
    }
    let legends = MachineLegends::of(&machines);
    let rows = states
        .iter()
        .map(|state| {
            fields
                .iter()
                .map(|field| match *field {
                    "unit" => state.name.clone(),
                    "machine" if state.machine_id.is_empty() => "-".to_string(),
                    "machine" => legends.full_legend(&state.machine_id, list.full),
                    "hash" => match UnitHash::parse_hex(&state.hash) {
                        Some(hash) if !list.full => hash.short(),
                        _ => or_dash(&state.hash),
                    },
                    "load" => or_dash(&state.systemd_load_state),
                    "active" => active_text(state),
                    "drift" => or_dash(&state.drift),
                    "health" => or_dash(&health_text(state)),
                    _ => or_dash(&state.systemd_sub_state),
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    let drifted = states.iter().filter(|state| !state.drift.is_empty()).count();
    if drifted > 0 && !fields.contains(&"drift") {
        eprintln!(
            "{drifted} unit(s) drifted on their machines from what fleet made them; see: fleetctl list-units --fields unit,machine,active,drift"
        );
    }
    let unhealthy = states.iter().filter(|state| state.health == "unhealthy").count();
    if unhealthy > 0 && !fields.contains(&"health") {
        eprintln!(
            "{unhealthy} unit(s) found unhealthy by their health checks; see: fleetctl list-units --fields unit,machine,active,health"
        );
    }
    Outcome::Success
}

/// A machine's presence: `present`, or `out of touch since …` while units wait for it.
fn machine_state(machine: &Machine) -> String {
    match machine.out_of_touch_since.as_str() {
        "" => "present".to_string(),
        since => format!("out of touch since {since}"),
    }
}

/// A unit's active state; for one whose machine is out of touch, `unknown (machine out of
/// touch since …)`.
pub fn active_text(state: &UnitState) -> String {
    match state.out_of_touch_since.as_str() {
        "" => or_dash(&state.systemd_active_state),
        since => format!("{} (machine out of touch since {since})", state.systemd_active_state),
    }
}

/// What a unit's health check says, on one line (`unhealthy (restarted 2 times): HTTP 500`);
/// empty for a unit without a check or not running.
pub fn health_text(state: &UnitState) -> String {
    let Some(status) = fleet_core::health::HealthStatus::from_word(&state.health) else { return String::new() };
    let report = fleet_core::health::HealthReport {
        status,
        failure: state.health_failure.clone(),
        restarts: state.health_restarts,
        given_up: state.health_given_up,
    };
    report.describe()
}

/// One unit on one machine, as `-o json` shows it.
pub fn unit_row<'a>(state: &'a UnitState, machines: &'a BTreeMap<String, Machine>) -> UnitRow<'a> {
    UnitRow {
        unit: &state.name,
        machine: &state.machine_id,
        machine_ip: machine_ip(machines, &state.machine_id),
        hash: &state.hash,
        load_state: &state.systemd_load_state,
        active_state: &state.systemd_active_state,
        sub_state: &state.systemd_sub_state,
        drift: &state.drift,
        health: &state.health,
        health_failure: &state.health_failure,
        out_of_touch_since: Some(state.out_of_touch_since.as_str()).filter(|since| !since.is_empty()),
    }
}
