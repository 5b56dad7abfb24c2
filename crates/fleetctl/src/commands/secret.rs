//! `fleetctl secret set|list|rm`: the cluster's secrets. A value is read from standard input
//! or a file, never from the command line (where `ps` and shell histories would keep it), and
//! is never printed.

use std::io::Read;
use std::path::Path;

use fleet_core::secrets::{MAX_VALUE_BYTES, name_problem, value_problem};

use fleet_api_schema::SecretValue;

use crate::commands::rollout::gate_settings;
use crate::commands::token::time;
use crate::context::Context;
use crate::table::tab_table;
use crate::{Outcome, SecretCommand};
use fleet_core::duration::parse_go_duration;

pub async fn run(context: &Context, command: SecretCommand) -> Outcome {
    match command {
        SecretCommand::Set { name, from_file, no_restart, max_unavailable, min_ready, deadline, gates } => {
            let how = match rotation(no_restart, max_unavailable, min_ready, deadline, &gates) {
                Ok(how) => how,
                Err(outcome) => return outcome,
            };
            set(context, &name, from_file.as_deref(), how).await
        }
        SecretCommand::List { no_legend, output } => list(context, no_legend, output.output).await,
        SecretCommand::Rm { name } => remove(context, &name).await,
        SecretCommand::Reseal => reseal(context).await,
    }
}

/// The value: the file's bytes, or standard input's to its end; one more byte than a value
/// may have is read at most, so a wrong file is not read whole. A single trailing newline
/// (what `echo` and editors add) is dropped from standard input.
fn read_value(from_file: Option<&Path>) -> Result<Vec<u8>, String> {
    let limit = MAX_VALUE_BYTES as u64 + 1;
    let mut value = Vec::new();
    match from_file {
        Some(path) => std::fs::File::open(path)
            .and_then(|file| file.take(limit).read_to_end(&mut value))
            .map_err(|error| format!("reading {}: {error}", path.display()))?,
        None => {
            std::io::stdin()
                .take(limit)
                .read_to_end(&mut value)
                .map_err(|error| format!("reading standard input: {error}"))?;
            if value.ends_with(b"\n") {
                value.pop();
                if value.ends_with(b"\r") {
                    value.pop();
                }
            }
            value.len()
        }
    };
    match value_problem(&value) {
        Some(problem) => Err(problem),
        None => Ok(value),
    }
}

/// How the new value reaches the units, as the request carries it.
fn rotation(
    no_restart: bool,
    max_unavailable: Option<String>,
    min_ready: Option<String>,
    deadline: Option<String>,
    gates: &crate::RolloutGates,
) -> Result<SecretValue, Outcome> {
    let seconds = |flag: &str, value: Option<String>| {
        value
            .map(|value| {
                parse_go_duration(&value).map(|duration| duration.as_secs()).map_err(|error| {
                    eprintln!("Invalid --{flag} {value:?}: {error}");
                    Outcome::Usage
                })
            })
            .transpose()
    };
    let min_ready_seconds = seconds("min-ready", min_ready)?;
    let deadline_seconds = seconds("deadline", deadline)?;
    let (canary, bake_seconds, auto_revert) = gate_settings(gates).map_err(|()| Outcome::Usage)?;
    Ok(SecretValue {
        value: String::new(),
        max_unavailable,
        min_ready_seconds,
        deadline_seconds,
        canary,
        bake_seconds,
        auto_revert,
        no_restart,
    })
}

async fn set(context: &Context, name: &str, from_file: Option<&Path>, how: SecretValue) -> Outcome {
    if let Some(problem) = name_problem(name) {
        eprintln!("Error setting secret: {problem}");
        return Outcome::Usage;
    }
    if from_file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!("Type the value of {name}, then Ctrl-D (or pipe it in, or give --from-file):");
    }
    let value = match read_value(from_file) {
        Ok(value) => value,
        Err(error) => {
            eprintln!("Error setting secret {name}: {error}");
            return Outcome::Failure;
        }
    };
    let no_restart = how.no_restart;
    match context.client.set_secret(name, &value, how).await {
        Ok(info) => {
            eprintln!("Set secret {} (version {}, {} bytes)", info.name, info.version, info.size);
            if let Some(rollout) = &info.rollout {
                eprintln!("Rolling it out to the units that run with it: fleetctl rollout status {rollout}");
            }
            match info.moved {
                Some(moved) if moved > 0 && no_restart => {
                    eprintln!("Written where {moved} unit(s) read it; none restarted")
                }
                Some(moved) if moved > 0 => eprintln!("{moved} unit(s) not running will start with it"),
                _ => {}
            }
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error setting secret {name}: {error}");
            Outcome::Failure
        }
    }
}

async fn list(context: &Context, no_legend: bool, output: crate::output::OutputFormat) -> Outcome {
    let secrets = match context.client.secrets().await {
        Ok(secrets) => secrets,
        Err(error) => {
            eprintln!("Error listing secrets: {error}");
            return Outcome::Failure;
        }
    };
    if output == crate::output::OutputFormat::Json {
        crate::output::print_json(&secrets);
        return Outcome::Success;
    }
    let mut rows = Vec::with_capacity(secrets.len() + 1);
    if !no_legend {
        rows.push(["NAME", "VERSION", "SIZE", "SET BY", "SET AT"].map(str::to_string).to_vec());
    }
    for secret in secrets {
        rows.push(vec![
            secret.name,
            secret.version.to_string(),
            secret.size.to_string(),
            secret.set_by,
            time(secret.set_at),
        ]);
    }
    print!("{}", tab_table(&rows));
    Outcome::Success
}

async fn remove(context: &Context, name: &str) -> Outcome {
    match context.client.remove_secret(name).await {
        Ok(true) => {
            eprintln!("Removed secret {name}");
            Outcome::Success
        }
        Ok(false) => {
            eprintln!("Secret {name} does not exist");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error removing secret {name}: {error}");
            Outcome::Failure
        }
    }
}

async fn reseal(context: &Context) -> Outcome {
    match context.client.reseal_secrets().await {
        Ok(done) => {
            eprintln!(
                "Sealed {} secrets again under key {} ({} were already)",
                done.resealed, done.sealing_key, done.already
            );
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error sealing the secrets again: {error}");
            Outcome::Failure
        }
    }
}
