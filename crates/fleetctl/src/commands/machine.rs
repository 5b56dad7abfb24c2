//! `fleetctl machine revoke|forget|drain|undrain|taint|untaint|status`: what an administrator
//! does to one machine.

use fleet_api_schema::{DrainRequest, MachineDrain, PlanRequest};

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
                "Draining machine {machine}: {to_move} {} to move, at most {} down at once; {} stay",
                if to_move == 1 { "unit" } else { "units" },
                drain.max_unavailable,
                drain.stays.len()
            );
            let stuck = unmovable(context, machine).await;
            if !stuck.is_empty() {
                let names: Vec<&str> = stuck.iter().map(String::as_str).collect();
                eprintln!("{}", nowhere_to_go(&names));
            }
            eprintln!("Follow it with: fleetctl machine status {machine}");
            Outcome::Success
        }
        Err(error) => {
            eprintln!("Error draining machine {machine}: {error}");
            Outcome::Failure
        }
    }
}

/// The units of a drained `machine` that can go to no other machine now, as fleetd's planner
/// sees the cluster (what the engine leader says of them at its next pass). Best effort: a
/// plan refused (busy, or a fleetd without plans) names none.
async fn unmovable(context: &Context, machine: &str) -> Vec<String> {
    let request = PlanRequest { drain: vec![machine.to_string()], ..PlanRequest::default() };
    let Ok(plan) = context.client.plan(&request).await else { return Vec::new() };
    plan.units
        .into_iter()
        .filter(|unit| {
            unit.action == "stays"
                && unit.waiting.as_deref().is_some_and(|why| why.starts_with(fleet_core::schedule::CANNOT_LEAVE))
        })
        .map(|unit| unit.name)
        .collect()
}

/// The line on a drain's units that can go to no other machine now (they keep running).
fn nowhere_to_go(stuck: &[&str]) -> String {
    const NAMED: usize = 5;
    let mut names = stuck.iter().take(NAMED).copied().collect::<Vec<_>>().join(", ");
    if stuck.len() > NAMED {
        names.push_str(&format!(" and {} more", stuck.len() - NAMED));
    }
    let (count, them) = match stuck.len() {
        1 => ("1 unit".to_string(), "it"),
        many => (format!("{many} units"), "them"),
    };
    format!("{count} can go to no other machine now and keep running here until one may take {them}: {names}")
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

#[cfg(test)]
mod tests {
    #[test]
    fn units_that_can_go_nowhere_are_counted_and_the_first_five_named() {
        assert_eq!(
            super::nowhere_to_go(&["db.service"]),
            "1 unit can go to no other machine now and keep running here until one may take it: db.service"
        );
        let many = ["a.service", "b.service", "c.service", "d.service", "e.service", "f.service", "g.service"];
        assert!(
            super::nowhere_to_go(&many).ends_with(": a.service, b.service, c.service, d.service, e.service and 2 more")
        );
        assert!(super::nowhere_to_go(&many).starts_with("7 units can go"));
    }
}
