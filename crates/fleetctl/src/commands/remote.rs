//! `ssh` (OpenSSH to a machine, or to the machine running a unit) and `fd-forward` (standard
//! input and output to a Unix socket: what the original's `--tunnel` runs on a bastion).

use fleet_api_schema::Machine;
use fleet_core::unit_name::mangle;

use super::create::is_global;
use crate::Outcome;
use crate::context::Context;
use crate::ssh::{SshOptions, session_arguments};

/// What `fleetctl ssh` was asked to reach.
pub struct SshRequest {
    pub machine: Option<String>,
    pub unit: Option<String>,
    pub forward_agent: bool,
    pub port: u16,
    /// The target (unless --machine or --unit named it), then the remote command.
    pub arguments: Vec<String>,
}

const NOT_FOUND: &str = "Unable to proceed: could not find matching unit or machine";

/// The one machine whose ID starts with `prefix`.
fn machine_by_prefix<'a>(machines: &'a [Machine], prefix: &str) -> Result<Option<&'a Machine>, String> {
    let found: Vec<&Machine> = machines.iter().filter(|machine| machine.id.starts_with(prefix)).collect();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        _ if !prefix.is_empty() && found.iter().any(|machine| machine.id == prefix) => {
            Ok(found.into_iter().find(|machine| machine.id == prefix))
        }
        _ => Err(format!("Unable to proceed: {prefix} matches {} machines; give more of its ID", found.len())),
    }
}

/// The machine running unit `name`, when there is one.
async fn machine_of_unit<'a>(
    context: &Context,
    machines: &'a [Machine],
    name: &str,
) -> Result<Option<&'a Machine>, String> {
    let unit = match context.client.unit(&mangle(name)).await {
        Ok(Some(unit)) => unit,
        Ok(None) => return Ok(None),
        Err(error) => return Err(format!("Error retrieving Unit {name}: {error}")),
    };
    if is_global(&unit) {
        return Err(format!("Unable to proceed: {} is a global unit, which runs on many machines", unit.name));
    }
    let Some(id) = unit.machine_id.as_deref() else {
        return Err(format!("Unable to proceed: {} is not scheduled to a machine", unit.name));
    };
    Ok(machines.iter().find(|machine| machine.id == id))
}

pub async fn ssh(context: &Context, options: &SshOptions, request: SshRequest) -> Outcome {
    if request.machine.is_some() && request.unit.is_some() {
        eprintln!("Both machine and unit flags provided, please specify only one");
        return Outcome::Failure;
    }
    let mut arguments = request.arguments.into_iter();
    let (target, by) = match (request.machine, request.unit) {
        (Some(machine), None) => (machine, Some("machine")),
        (None, Some(unit)) => (unit, Some("unit")),
        _ => match arguments.next() {
            Some(target) => (target, None),
            None => {
                eprintln!("Provide one machine or unit.");
                return Outcome::Usage;
            }
        },
    };
    let command: Vec<String> = arguments.collect();
    let machines = match context.client.machines().await {
        Ok(machines) => machines,
        Err(error) => {
            eprintln!("Error retrieving list of active machines from fleet API ({error})");
            return Outcome::Failure;
        }
    };
    let as_machine = if by == Some("unit") { Ok(None) } else { machine_by_prefix(&machines, &target) };
    let as_unit = if by == Some("machine") { Ok(None) } else { machine_of_unit(context, &machines, &target).await };
    let machine = match (as_machine, as_unit) {
        (Ok(Some(_)), Ok(Some(_))) => {
            eprintln!("Unable to proceed: ambiguous argument, both machine and unit found for {target}");
            return Outcome::Failure;
        }
        (Ok(Some(machine)), _) | (_, Ok(Some(machine))) => machine,
        (Err(message), _) | (_, Err(message)) => {
            eprintln!("{message}");
            return Outcome::Failure;
        }
        (Ok(None), Ok(None)) => {
            eprintln!("{NOT_FOUND}");
            return Outcome::Failure;
        }
    };
    if machine.primary_ip.is_empty() {
        eprintln!("Unable to proceed: machine {} has no public IP", machine.id);
        return Outcome::Failure;
    }
    let arguments = session_arguments(options, &machine.primary_ip, request.port, request.forward_agent, &command);
    context.debug(&format!("ssh {}", arguments.join(" ")));
    match std::process::Command::new("ssh").args(&arguments).status() {
        // ssh's own exit code is the remote command's (255 for ssh's errors).
        Ok(status) => Outcome::Exit(status.code().map_or(1, |code| u8::try_from(code).unwrap_or(1))),
        Err(error) => {
            eprintln!("Unable to run ssh: {error}");
            Outcome::Failure
        }
    }
}

/// Copies standard input to the socket and the socket to standard output until the socket ends.
pub fn fd_forward(arguments: &[String]) -> Outcome {
    let [path] = arguments else {
        eprintln!("Provide a single argument");
        return Outcome::Usage;
    };
    let socket = match std::os::unix::net::UnixStream::connect(path) {
        Ok(socket) => socket,
        Err(error) => {
            eprintln!("Unable to connect to {path}: {error}");
            return Outcome::Failure;
        }
    };
    let Ok(mut reader) = socket.try_clone() else {
        eprintln!("Unable to use the socket {path}");
        return Outcome::Failure;
    };
    // The end of standard input does not half-close the socket (the API closes a connection
    // whose client half-closed before answering); the socket's end ends the forward.
    std::thread::spawn(move || {
        let mut writer = &socket;
        std::io::copy(&mut std::io::stdin().lock(), &mut writer)
    });
    let downstream = std::io::copy(&mut reader, &mut std::io::stdout().lock());
    match downstream {
        Ok(_) => Outcome::Success,
        Err(error) => {
            eprintln!("Error forwarding {path}: {error}");
            Outcome::Failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: &str) -> Machine {
        Machine { id: id.into(), primary_ip: "10.0.0.1".into(), ..Default::default() }
    }

    #[test]
    fn machines_are_found_by_a_unique_prefix() {
        let machines = [machine("3d1219c7aa"), machine("3d1219c7bb"), machine("ffff")];
        assert_eq!(machine_by_prefix(&machines, "ff").map(|m| m.map(|m| m.id.clone())), Ok(Some("ffff".into())));
        assert_eq!(machine_by_prefix(&machines, "00").map(|m| m.is_some()), Ok(false));
        assert!(machine_by_prefix(&machines, "3d12").is_err(), "two machines match");
        assert_eq!(
            machine_by_prefix(&machines, "3d1219c7aa").map(|m| m.map(|m| m.id.clone())),
            Ok(Some("3d1219c7aa".into()))
        );
    }
}
