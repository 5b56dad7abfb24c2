//! list-machines, list-unit-files and list-units.

use fleet_core::UnitHash;

use super::create::{is_global, unit_file};
use crate::context::Context;
use crate::table::{machine_full_legend, machine_id_legend, tab_table};
use crate::{ListFlags, Outcome};

/// Checks `--fields` against the valid names; the original's messages.
fn parse_fields<'a>(fields: &'a str, valid: &[&str]) -> Result<Vec<&'a str>, String> {
    if fields.is_empty() {
        return Err("Must define output format".to_string());
    }
    let fields: Vec<&str> = fields.split(',').collect();
    match fields.iter().find(|field| !valid.contains(field)) {
        Some(bad) => Err(format!("Invalid key in output format: {bad:?}")),
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

pub async fn machines(context: &Context, list: &ListFlags, fields: &str) -> Outcome {
    let fields = match parse_fields(fields, &["ip", "machine", "metadata"]) {
        Ok(fields) => fields,
        Err(message) => {
            eprintln!("{message}");
            return Outcome::Failure;
        }
    };
    let machines = match context.client.machines().await {
        Ok(machines) => machines,
        Err(error) => {
            eprintln!("Error retrieving list of active machines from fleet API ({error})");
            return Outcome::Failure;
        }
    };
    let rows = machines
        .iter()
        .map(|machine| {
            fields
                .iter()
                .map(|field| match *field {
                    "machine" => machine_id_legend(&machine.id, list.full),
                    "ip" => or_dash(&machine.primary_ip),
                    _ => {
                        or_dash(&machine.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
                    }
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    Outcome::Success
}

pub async fn unit_files(context: &Context, list: &ListFlags, fields: &str) -> Outcome {
    let valid = ["desc", "dstate", "global", "hash", "reason", "state", "target", "tmachine", "unit"];
    let fields = match parse_fields(fields, &valid) {
        Ok(fields) => fields,
        Err(message) => {
            eprintln!("{message}");
            return Outcome::Failure;
        }
    };
    if fields.contains(&"tmachine") {
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
    let machines = if fields.iter().any(|f| *f == "target" || *f == "tmachine") {
        context.machines().await
    } else {
        Default::default()
    };
    let rows = units
        .iter()
        .map(|unit| {
            let global = is_global(unit);
            let file = unit_file(unit);
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
                        Some(id) => machine_full_legend(id, &machines, list.full),
                        None => "-".to_string(),
                    },
                    "hash" if list.full => file.hash().to_string(),
                    "hash" => file.hash().short(),
                    "desc" => or_dash(file.description().unwrap_or("")),
                    _ => or_dash(unit.reason.as_deref().unwrap_or("")),
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    Outcome::Success
}

pub async fn units(context: &Context, list: &ListFlags, fields: &str) -> Outcome {
    let fields = match parse_fields(fields, &["active", "hash", "load", "machine", "sub", "unit"]) {
        Ok(fields) => fields,
        Err(message) => {
            eprintln!("{message}");
            return Outcome::Failure;
        }
    };
    let mut states = match context.client.unit_states(None).await {
        Ok(states) => states,
        Err(error) => {
            eprintln!("Error retrieving list of units from repository: {error}");
            return Outcome::Failure;
        }
    };
    states.sort_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
    let machines = if fields.contains(&"machine") { context.machines().await } else { Default::default() };
    let rows = states
        .iter()
        .map(|state| {
            fields
                .iter()
                .map(|field| match *field {
                    "unit" => state.name.clone(),
                    "machine" if state.machine_id.is_empty() => "-".to_string(),
                    "machine" => machine_full_legend(&state.machine_id, &machines, list.full),
                    "hash" => match UnitHash::parse_hex(&state.hash) {
                        Some(hash) if !list.full => hash.short(),
                        _ => or_dash(&state.hash),
                    },
                    "load" => or_dash(&state.systemd_load_state),
                    "active" => or_dash(&state.systemd_active_state),
                    _ => or_dash(&state.systemd_sub_state),
                })
                .collect()
        })
        .collect();
    print_table(&fields, rows, list.no_legend);
    Outcome::Success
}
