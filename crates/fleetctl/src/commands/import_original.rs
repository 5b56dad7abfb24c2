//! `fleetctl import-original --etcd URL`: takes over the units of an original fleet cluster,
//! read from its etcd's v2 keys (nothing there is changed), with the machines they run on,
//! so that fleet's fleetd on each machine finds them running and keeps them as they run. A
//! dry run first reports what becomes of each unit; one unit refused (here, for what the
//! original holds, or by fleetd) and nothing is imported.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_api_schema::{ImportReport, ImportRequest, ImportUnit, ImportedUnitReport};
use fleet_client::ClientOptions;
use fleet_client::original_registry::{OriginalRegistry, OriginalUnit, read_original_registry};
use fleet_core::UnitFile;

use super::create::schema_options;
use crate::Outcome;
use crate::context::Context;
use crate::output::{OutputFlag, OutputFormat};
use crate::table::tab_table;

#[derive(Debug, clap::Args)]
pub struct ImportFlags {
    /// The original's etcd (http:// or https://), its v2 API on (etcd 3.4: --enable-v2)
    #[arg(long = "etcd", value_name = "URL")]
    pub etcd: String,
    /// Where the original keeps its registry (its etcd_key_prefix)
    #[arg(long = "prefix", default_value = "/_coreos.com/fleet/")]
    pub prefix: String,
    /// Report what the import would do, writing nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// The CA that signed the original's etcd certificate (PEM)
    #[arg(long = "original-ca-file", value_name = "FILE")]
    pub original_ca_file: Option<std::path::PathBuf>,
    /// A client certificate for the original's etcd (PEM)
    #[arg(long = "original-cert-file", value_name = "FILE")]
    pub original_cert_file: Option<std::path::PathBuf>,
    /// The key of --original-cert-file (PEM)
    #[arg(long = "original-key-file", value_name = "FILE")]
    pub original_key_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub output: OutputFlag,
}

pub async fn run(context: &Context, flags: &ImportFlags) -> Outcome {
    let options = ClientOptions {
        timeout: Duration::from_secs(60),
        ca_file: flags.original_ca_file.clone(),
        cert_file: flags.original_cert_file.clone(),
        key_file: flags.original_key_file.clone(),
        ..ClientOptions::default()
    };
    let original = match read_original_registry(&flags.etcd, &flags.prefix, &options).await {
        Ok(original) => original,
        Err(error) => {
            eprintln!("Error reading the original's registry: {error}");
            return Outcome::Failure;
        }
    };
    let (mut request, refused_here) = import_request(&original);
    request.dry_run = true;
    let planned = if request.units.is_empty() {
        ImportReport::default()
    } else {
        match context.client.import(&request).await {
            Ok(report) => report,
            Err(error) => {
                eprintln!("Error importing: {error}");
                return Outcome::Failure;
            }
        }
    };
    let mut report = merged(planned, refused_here);
    warn_of_metadata(context, &original, &report).await;
    let refused = report.units.iter().filter(|unit| unit.action == "refused").count();
    if report.units.is_empty() {
        eprintln!("The original's registry holds no units: nothing to import");
        return Outcome::Success;
    }
    if refused > 0 || flags.dry_run {
        print_report(&report, flags.output.output);
        return if refused > 0 {
            eprintln!("Nothing imported: {refused} of {} units refused", report.units.len());
            Outcome::Failure
        } else {
            eprintln!("Dry run: nothing written");
            Outcome::Success
        };
    }
    request.dry_run = false;
    match context.client.import(&request).await {
        Ok(written) => report = written,
        Err(error) => {
            eprintln!("Error importing: {error}");
            return Outcome::Failure;
        }
    }
    print_report(&report, flags.output.output);
    if flags.output.output == OutputFormat::Table {
        println!("{}", summary(&report));
    }
    Outcome::Success
}

/// The request that imports every unit of `original` fleetctl can read, each content carried
/// once (under its hash); and the units it cannot, with why.
fn import_request(original: &OriginalRegistry) -> (ImportRequest, Vec<ImportedUnitReport>) {
    let mut request = ImportRequest::default();
    let mut refused = Vec::new();
    for unit in &original.units {
        match importable(unit) {
            Ok((import, file)) => {
                if let Some(key) = &import.content {
                    request.contents.entry(key.clone()).or_insert_with(|| schema_options(&file));
                }
                request.units.push(import);
            }
            Err(reason) => refused.push(ImportedUnitReport {
                name: unit.name.clone(),
                action: "refused".into(),
                desired_state: unit.found.as_ref().map(|found| found.desired_state.clone()).unwrap_or_default(),
                machine_id: unit.found.as_ref().ok().and_then(|found| found.machine.clone()),
                hash: None,
                reason: Some(reason),
            }),
        }
    }
    (request, refused)
}

/// One unit of the original as the import carries it, with its file; or why it cannot be.
fn importable(unit: &OriginalUnit) -> Result<(ImportUnit, UnitFile), String> {
    let found = unit.found.as_ref().map_err(Clone::clone)?;
    let file = UnitFile::parse(&found.text).map_err(|error| format!("its unit file: {error}"))?;
    let hash = file.hash().to_string();
    if hash != found.hash {
        return Err(format!("its unit file hashes to {hash}, where the original keeps it as {}", found.hash));
    }
    let import = ImportUnit {
        name: unit.name.clone(),
        desired_state: found.desired_state.clone(),
        options: Vec::new(),
        content: Some(hash),
        machine_id: found.machine.clone(),
    };
    Ok((import, file))
}

/// fleetd's report with the units refused here, in name order.
fn merged(mut report: ImportReport, refused_here: Vec<ImportedUnitReport>) -> ImportReport {
    report.units.extend(refused_here);
    report.units.sort_by(|a, b| a.name.cmp(&b.name));
    report
}

/// Warns of each machine that runs imported units whose metadata in fleet differs from the
/// original's: units asking for metadata are refused there, the others may move later.
async fn warn_of_metadata(context: &Context, original: &OriginalRegistry, report: &ImportReport) {
    let hosting: std::collections::BTreeSet<&str> =
        report.units.iter().filter_map(|unit| unit.machine_id.as_deref()).collect();
    let in_fleet = context.machines().await;
    for machine in original.machines.iter().filter(|machine| hosting.contains(machine.id.as_str())) {
        let Some(joined) = in_fleet.get(&machine.id) else { continue };
        if joined.metadata != machine.metadata {
            eprintln!(
                "Warning: machine {} has metadata {} in the original, {} in fleet: give its fleet.conf the original's metadata=",
                machine.id,
                shown(&machine.metadata),
                shown(&joined.metadata)
            );
        }
    }
}

fn shown(metadata: &BTreeMap<String, String>) -> String {
    if metadata.is_empty() {
        return "(none)".into();
    }
    metadata.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
}

fn print_report(report: &ImportReport, format: OutputFormat) {
    if format == OutputFormat::Json {
        crate::output::print_json(&crate::output::ImportOutput::of(report));
        return;
    }
    let mut rows = vec![["UNIT", "ACTION", "DSTATE", "MACHINE", "REASON"].map(str::to_string).to_vec()];
    for unit in &report.units {
        rows.push(vec![
            unit.name.clone(),
            unit.action.clone(),
            unit.desired_state.clone(),
            unit.machine_id.clone().unwrap_or_else(|| "-".into()),
            unit.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    print!("{}", tab_table(&rows));
}

/// What an import wrote, counted by what becomes of the units.
fn summary(report: &ImportReport) -> String {
    let count = |action: &str| report.units.iter().filter(|unit| unit.action == action).count();
    format!(
        "Imported {} units: {} kept on the machine that runs them, {} global, {} for the engine to place, {} stored inactive",
        report.units.len(),
        count("adopt"),
        count("global"),
        count("place"),
        count("store")
    )
}

#[cfg(test)]
mod tests;
