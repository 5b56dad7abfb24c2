//! The system's OpenSSH client, with the original's SSH flags: `fleetctl ssh` runs it to a
//! machine, `--tunnel` runs it to forward the API to a local socket. The arguments are built
//! by a pure function, so what fleetctl asks of ssh is tested without a server.

use std::path::PathBuf;
use std::time::Duration;

/// The original's SSH flags, as ssh options.
#[derive(Clone, Debug, PartialEq)]
pub struct SshOptions {
    pub user: String,
    pub known_hosts_file: PathBuf,
    /// Verify host keys: an unknown one is asked about (on a terminal) and a changed one is
    /// refused; off, any key is accepted.
    pub strict_host_key_checking: bool,
    pub timeout: Duration,
}

/// Where to connect: `host` or `host:port` (IPv6 in brackets), with `default_port` when none.
pub fn host_and_port(target: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = match target.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port.parse::<u16>().map_err(|_| format!("invalid port in {target:?}"))?;
            (host.trim_start_matches('[').trim_end_matches(']'), port)
        }
        _ => (target.trim_start_matches('[').trim_end_matches(']'), default_port),
    };
    if host.is_empty() || host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c == '@') {
        return Err(format!("invalid host {target:?}"));
    }
    Ok((host.to_string(), port))
}

/// The arguments of `ssh` (without the program name) up to the host: options, then `--`
/// is not used because ssh takes the command after the host.
pub fn base_arguments(options: &SshOptions, port: u16) -> Vec<String> {
    let strict = if options.strict_host_key_checking { "ask" } else { "no" };
    let seconds = options.timeout.as_secs().max(1);
    vec![
        "-o".into(),
        format!("UserKnownHostsFile={}", options.known_hosts_file.display()),
        "-o".into(),
        format!("StrictHostKeyChecking={strict}"),
        "-o".into(),
        format!("ConnectTimeout={seconds}"),
        "-o".into(),
        "BatchMode=no".into(),
        "-p".into(),
        port.to_string(),
        "-l".into(),
        options.user.clone(),
    ]
}

/// `ssh` to `host` running `command` (a shell when empty), forwarding the agent when asked.
pub fn session_arguments(
    options: &SshOptions,
    host: &str,
    port: u16,
    forward_agent: bool,
    command: &[String],
) -> Vec<String> {
    let mut arguments = base_arguments(options, port);
    if forward_agent {
        arguments.push("-A".into());
    }
    arguments.push(host.to_string());
    arguments.extend(command.iter().cloned());
    arguments
}

/// `ssh` holding a forward from the local socket `local` to `remote` (a socket path, or
/// `host:port`) on `host`, and nothing else; it exits if the forward cannot be made.
pub fn tunnel_arguments(options: &SshOptions, host: &str, port: u16, local: &str, remote: &str) -> Vec<String> {
    let mut arguments = base_arguments(options, port);
    arguments.extend([
        "-N".into(),
        "-o".into(),
        "ExitOnForwardFailure=yes".into(),
        "-o".into(),
        "StreamLocalBindUnlink=yes".into(),
        "-L".into(),
        format!("{local}:{remote}"),
        host.to_string(),
    ]);
    arguments
}

/// `~/` at the start of a path is the user's home.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(strict: bool) -> SshOptions {
        SshOptions {
            user: "core".into(),
            known_hosts_file: "/home/core/.fleetctl/known_hosts".into(),
            strict_host_key_checking: strict,
            timeout: Duration::from_secs_f64(10.0),
        }
    }

    #[test]
    fn hosts_take_the_default_port_unless_they_name_one() {
        assert_eq!(host_and_port("10.0.0.1", 22), Ok(("10.0.0.1".into(), 22)));
        assert_eq!(host_and_port("bastion:2222", 22), Ok(("bastion".into(), 2222)));
        assert_eq!(host_and_port("[fd00::1]:2200", 22), Ok(("fd00::1".into(), 2200)));
        assert_eq!(host_and_port("fd00::1", 22), Ok(("fd00::1".into(), 22)));
        assert!(host_and_port("-oProxyCommand=x", 22).is_err(), "no option smuggled in as a host");
        assert!(host_and_port("a:b", 22).is_err());
        assert!(host_and_port("", 22).is_err());
    }

    #[test]
    fn sessions_carry_the_original_flags() {
        let arguments = session_arguments(&options(true), "10.0.0.1", 2222, true, &["echo".into(), "foo".into()]);
        assert_eq!(
            arguments.join(" "),
            "-o UserKnownHostsFile=/home/core/.fleetctl/known_hosts -o StrictHostKeyChecking=ask \
             -o ConnectTimeout=10 -o BatchMode=no -p 2222 -l core -A 10.0.0.1 echo foo"
        );
        assert!(session_arguments(&options(false), "h", 22, false, &[]).contains(&"StrictHostKeyChecking=no".into()));
    }

    #[test]
    fn tunnels_forward_one_local_socket_and_nothing_else() {
        let arguments =
            tunnel_arguments(&options(true), "bastion", 22, "/run/user/0/t/api.sock", "/var/run/fleet.sock");
        let text = arguments.join(" ");
        assert!(text.ends_with("-N -o ExitOnForwardFailure=yes -o StreamLocalBindUnlink=yes -L /run/user/0/t/api.sock:/var/run/fleet.sock bastion"), "{text}");
    }
}
