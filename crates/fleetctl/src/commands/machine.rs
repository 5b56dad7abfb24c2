//! `fleetctl machine revoke|forget|drain|undrain|taint|untaint|status`: what an administrator
//! does to one machine.

use fleet_api_schema::{DrainRequest, MachineDrain};

use crate::context::Context;
use crate::table::tab_table;
use crate::{MachineCommand, Outcome};

pub async fn run(context: &Context, command: MachineCommand) -> Outcome {
    match command {
        MachineCommand::Revoke { machine } => {
            let done = context.client.revoke_machine(&machine).await;
            said(done, &machine, "revoking", format!("Revoked machine {machine}"))
        }
        MachineCommand::Forget { machine } => {
            let done = context.client.forget_machine(&machine).await;
            let line = format!("Forgot machine {machine}: its ID may join again, with another key");
            said(done, &machine, "forgetting", line)
        }
        MachineCommand::Drain { machine, max_unavailable } => drain(context, &machine, max_unavailable).await,
        MachineCommand::Undrain { machine } => match context.client.undrain_machine(&machine).await {
            Ok(true) => {
                eprintln!("Machine {machine} takes units again");
                Outcome::Success
            }
            Ok(false) => {
                eprintln!("Machine {machine} is not drained");
                Outcome::Failure
            }
            Err(error) => {
                eprintln!("Error undraining machine {machine}: {error}");
                Outcome::Failure
            }
        },
        MachineCommand::Taint { machine, taint } => set_taint(context, &machine, &taint, true).await,
        MachineCommand::Untaint { machine, key } => set_taint(context, &machine, &key, false).await,
        MachineCommand::Status { machine, no_legend } => match context.client.machine_drain(&machine).await {
            Ok(Some(drain)) => {
                print_drain(&machine, &drain, no_legend);
                Outcome::Success
            }
            Ok(None) => {
                println!("Machine {machine} is not drained");
                Outcome::Success
            }
            Err(error) => {
                eprintln!("Error retrieving the drain of machine {machine}: {error}");
                Outcome::Failure
            }
        },
    }
}

/// Sets (`taint` as written: `gpu=yes:evict`) or removes (`taint` a key) a taint of the
/// machine named by its ID or short ID.
async fn set_taint(context: &Context, machine: &str, taint: &str, setting: bool) -> Outcome {
    let (key, after_key) = if setting {
        match fleet_core::taint::parse_taint(taint) {
            Ok((key, parsed)) => {
                let after = fleet_core::taint::written_after_key(&key, &parsed);
                (key, Some(after))
            }
            Err(error) => {
                eprintln!("Error tainting machine {machine}: {error}");
                return Outcome::Usage;
            }
        }
    } else {
        (taint.to_string(), None)
    };
    let doing = if setting { "tainting" } else { "untainting" };
    let machines = match context.client.machines().await {
        Ok(machines) => machines,
        Err(error) => {
            eprintln!("Error {doing} machine {machine}: {error}");
            return Outcome::Failure;
        }
    };
    let found: Vec<&str> = machines
        .iter()
        .map(|known| known.id.as_str())
        .filter(|id| *id == machine || (machine.len() == 8 && id.starts_with(machine)))
        .collect();
    let [id] = found[..] else {
        eprintln!("Error {doing} machine {machine}: no machine, or more than one, has that ID");
        return Outcome::Failure;
    };
    let done = context.client.set_taint(id, &key, after_key.as_deref()).await;
    let line = match &after_key {
        Some(_) => format!("Machine {machine} is tainted {taint}: it takes only units that tolerate it"),
        None => format!("Machine {machine} no longer has taint {key}"),
    };
    said(done, machine, doing, line)
}

fn said(done: Result<(), fleet_client::ClientError>, machine: &str, doing: &str, line: String) -> Outcome {
    match done {
        Ok(()) => {
            eprintln!("{line}");
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error {doing} machine {machine}: {error}");
            Outcome::Failure
        }
    }
}

async fn drain(context: &Context, machine: &str, max_unavailable: Option<String>) -> Outcome {
    match context.client.drain_machine(machine, &DrainRequest { max_unavailable }).await {
        Ok(drain) => {
            let to_move = drain.left.len() + drain.moving.len();
            eprintln!(
                "Draining machine {machine}: {to_move} units to move, at most {} down at once; {} stay",
                drain.max_unavailable,
                drain.stays.len()
            );
            eprintln!("Follow it with: fleetctl machine status {machine}");
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error draining machine {machine}: {error}");
            Outcome::Failure
        }
    }
}

/// The drain's state line, then one row per unit it concerns: moving (with why it cannot
/// leave, when it cannot), left, or staying (with why).
fn print_drain(machine: &str, drain: &MachineDrain, no_legend: bool) {
    println!(
        "Machine {machine} is {}: {} moved, {} moving, {} left, {} stay (max-unavailable {})",
        drain.state,
        drain.moved,
        drain.moving.len(),
        drain.left.len(),
        drain.stays.len(),
        drain.max_unavailable
    );
    if let Some(held) = &drain.held {
        println!("Held: {held}");
    }
    let mut table: Vec<Vec<String>> = Vec::new();
    if !no_legend {
        table.push(vec!["UNIT".into(), "DRAIN".into(), "REASON".into()]);
    }
    let reason = |reason: &Option<String>| reason.clone().unwrap_or_else(|| "-".to_string());
    table.extend(drain.moving.iter().map(|unit| vec![unit.name.clone(), "moving".into(), reason(&unit.reason)]));
    table.extend(drain.left.iter().map(|unit| vec![unit.clone(), "left".into(), "-".into()]));
    table.extend(drain.stays.iter().map(|unit| vec![unit.name.clone(), "stays".into(), reason(&unit.reason)]));
    if table.len() > usize::from(!no_legend) {
        print!("{}", tab_table(&table));
    }
}
