//! fleetd: on every machine, the engine, the agent and the HTTP API v1.

mod agent_journal_answers;
mod api_service;
mod capacity;
mod daemon;
mod event_trim;
mod host;
mod in_place;
mod journal_answers;
mod log_priority;
mod make_certificates;
mod memory_trim;
mod process_setup;
mod pull;
mod ready_probe;
mod reconcile_timing;
mod restore;
mod rotate_secrets_key;
mod run;
mod secrets_key;
mod service_manager;
mod stall_watch;
mod store;
mod store_chores;
mod store_format;
mod store_secrets;
mod supervise;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use fleetd::config::Config;

/// fleetd allocates through jemalloc: see `memory_trim.rs` for why, and for how its freed
/// pages go back to the system.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "Usage: fleetd [-config PATH] [-version] [-help] [-manual] [-sample-config]\n       \
                     fleetd -make-certificates DIR [-hosts NAME,ADDRESS,...]\n       \
                     fleetd [-config PATH] -restore FILE";

enum Invocation {
    Run(Option<PathBuf>),
    Restore { config: Option<PathBuf>, snapshot: PathBuf },
    Version,
    Help,
    Manual,
    SampleConfig,
    MakeCertificates { dir: PathBuf, hosts: Vec<String> },
    RotateSecretsKey { file: PathBuf, drop_old: bool },
}

/// Reads Go-style flags: `-config PATH`, `--config=PATH`, `-version`, `fleetd version`.
fn parse_args(args: &[String]) -> Result<Invocation, String> {
    let mut config = None;
    let mut certificates: Option<PathBuf> = None;
    let mut restore: Option<PathBuf> = None;
    let mut rotate: Option<PathBuf> = None;
    let mut drop_old = false;
    let mut hosts: Vec<String> = Vec::new();
    let mut index = 0;
    while index < args.len() {
        let arg = &args[index];
        let flag = arg.trim_start_matches('-');
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (flag, None),
        };
        match (arg.starts_with('-'), name) {
            (true, "version" | "v") => return Ok(Invocation::Version),
            (true, "help" | "h") => return Ok(Invocation::Help),
            (true, "manual") => return Ok(Invocation::Manual),
            (true, "sample-config") => return Ok(Invocation::SampleConfig),
            (true, "drop-old-keys") => drop_old = true,
            (true, "config" | "make-certificates" | "hosts" | "restore" | "rotate-secrets-key") => {
                let value = match inline {
                    Some(value) => value,
                    None => {
                        index += 1;
                        args.get(index).cloned().ok_or_else(|| format!("flag needs an argument: -{name}"))?
                    }
                };
                match name {
                    "config" => config = Some(PathBuf::from(value)),
                    "make-certificates" => certificates = Some(PathBuf::from(value)),
                    "restore" => restore = Some(PathBuf::from(value)),
                    "rotate-secrets-key" => rotate = Some(PathBuf::from(value)),
                    _ => hosts.extend(value.split(',').map(|host| host.trim().to_string())),
                }
            }
            (true, _) => return Err(format!("flag provided but not defined: {arg}")),
            (false, "version") if index == 0 => return Ok(Invocation::Version),
            (false, _) => {
                return Err("fleetd takes no arguments. Did you mean to invoke fleetctl instead?".to_string());
            }
        }
        index += 1;
    }
    if let Some(file) = rotate {
        if certificates.is_some() || restore.is_some() {
            return Err("-rotate-secrets-key goes alone".to_string());
        }
        return Ok(Invocation::RotateSecretsKey { file, drop_old });
    }
    if drop_old {
        return Err("-drop-old-keys goes with -rotate-secrets-key".to_string());
    }
    match (certificates, restore) {
        (Some(_), Some(_)) => Err("-make-certificates and -restore are two things: one at a time".to_string()),
        (Some(dir), None) => Ok(Invocation::MakeCertificates { dir, hosts }),
        (None, _) if !hosts.is_empty() => Err("-hosts goes with -make-certificates".to_string()),
        (None, Some(snapshot)) => Ok(Invocation::Restore { config, snapshot }),
        (None, None) => Ok(Invocation::Run(config)),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [keeper, marker, cgroups @ ..] = args.as_slice()
        && keeper == fleet_unit_manager::native::KEEPER_ARGUMENT
        && cgroups.len() <= 1
    {
        fleet_unit_manager::native::run_keeper(marker, cgroups.first().map(std::path::Path::new));
        return ExitCode::SUCCESS;
    }
    let (config_path, restore) = match parse_args(&args) {
        Ok(Invocation::Run(path)) => (path, None),
        Ok(Invocation::Restore { config, snapshot }) => (config, Some(snapshot)),
        Ok(Invocation::Version) => {
            println!("{}", fleet_build_info::describe("fleetd"));
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Help) => {
            print!("{}", fleetd::config_docs::help_text(USAGE, fleetd::manual::FLAGS));
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Manual) => {
            print!("{}", fleetd::manual::manual_page(fleetd::VERSION));
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::SampleConfig) => {
            print!("{}", fleetd::config_docs::sample_config());
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::MakeCertificates { dir, hosts }) => return make_certificates::run(&dir, &hosts),
        Ok(Invocation::RotateSecretsKey { file, drop_old }) => return rotate_secrets_key::run(&file, drop_old),
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let environment: BTreeMap<String, String> = std::env::vars().collect();
    let config = match Config::load(config_path.as_deref(), &environment) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("fleetd: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(snapshot) = restore {
        return match restore::run(&config, &snapshot) {
            Ok(restored) => {
                let format =
                    restored.summary.format.map_or("unrecorded".to_string(), |stored| stored.format.to_string());
                println!(
                    "restored {} units and {} machines (store format {format}) into {}",
                    restored.summary.units,
                    restored.summary.machines,
                    restored.store.display()
                );
                if let Some(kept) = restored.kept {
                    println!("the store it replaced is kept in {}", kept.display());
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("fleetd: {error:#}");
                ExitCode::FAILURE
            }
        };
    }
    let filter = if config.verbosity > 0 { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEETD_LOG").unwrap_or_else(|_| filter.into());
    if log_priority::stderr_is_journal() {
        let format = tracing_subscriber::fmt::format().without_time().with_ansi(false);
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(log_priority::PriorityPrefix(format))
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    match process_setup::prepare_process() {
        Ok(open_files) => tracing::debug!(open_files, "open-file limit"),
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
    // The nonce an earlier image of this fleetd replaced itself with, if it did.
    let handover_nonce = in_place::handover_nonce();
    // Before any thread starts: the sockets systemd passed, read from the environment.
    let activated = match fleet_api::listen::activated_listeners() {
        Ok(activated) => activated,
        Err(error) => {
            eprintln!("fleetd: reading sockets passed by systemd: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("fleetd: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    stall_watch::start(runtime.handle());
    match runtime.block_on(run::run(config, config_path, activated, handover_nonce)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("fleetd: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Invocation, String> {
        parse_args(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn go_style_flags() {
        assert!(
            matches!(parse(&["-config", "/x"]), Ok(Invocation::Run(Some(p))) if p.as_path() == std::path::Path::new("/x"))
        );
        assert!(
            matches!(parse(&["--config=/y"]), Ok(Invocation::Run(Some(p))) if p.as_path() == std::path::Path::new("/y"))
        );
        assert!(matches!(parse(&["-version"]), Ok(Invocation::Version)));
        assert!(matches!(parse(&["version"]), Ok(Invocation::Version)));
        assert_eq!(
            parse(&["list-units"]).err().unwrap(),
            "fleetd takes no arguments. Did you mean to invoke fleetctl instead?"
        );
        assert!(parse(&["-bogus"]).is_err());
        assert!(parse(&["-config"]).is_err());
        assert!(matches!(
            parse(&["-make-certificates", "/tls", "-hosts", "a.example,10.0.0.5"]),
            Ok(Invocation::MakeCertificates { dir, hosts }) if dir.as_path() == std::path::Path::new("/tls")
                && hosts == ["a.example", "10.0.0.5"]
        ));
        assert!(parse(&["-hosts", "a.example"]).is_err(), "-hosts alone makes nothing");
    }
}
