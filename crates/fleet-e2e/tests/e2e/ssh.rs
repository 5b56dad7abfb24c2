//! `fleetctl ssh` and `--tunnel` against a real OpenSSH server on a loopback port, with keys
//! made by the test and an ssh-agent, as the original's SSH tests do.

use std::path::Path;
use std::process::{Command, Stdio};

use fleet_e2e::sshd::{SshAgent, SshServer};
use fleet_e2e::{Fleetd, binary, examples_dir};

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn fleetctl(endpoint: &str, agent: &SshAgent, known_hosts: &Path, args: &[&str]) -> Ran {
    let ran = Command::new(binary("fleetctl"))
        .arg(format!("--endpoint={endpoint}"))
        .args(["--ssh-username", "root", "--ssh-timeout", "5"])
        .arg(format!("--known-hosts-file={}", known_hosts.display()))
        .args(args)
        .env("SSH_AUTH_SOCK", agent.socket())
        .env_remove("FLEETCTL_ENDPOINT")
        .stdin(Stdio::null())
        .output()
        .expect("run fleetctl");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
    Ran { code: ran.status.code().unwrap_or(-1), stdout: text(&ran.stdout), stderr: text(&ran.stderr) }
}

fn endpoint(fleet: &Fleetd) -> String {
    format!("unix://{}", fleet.socket().display())
}

#[test]
fn ssh_reaches_machines_and_the_machines_of_units() {
    let (agent, fleet) = (SshAgent::start(), Fleetd::start("55555555e2e00001", &[]));
    let server = SshServer::start(&agent);
    let dir = tempfile::tempdir().expect("scratch dir");
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(&known_hosts, server.known_hosts_line()).expect("known_hosts");
    let port = server.port.to_string();
    let ssh = |args: &[&str]| {
        let args: Vec<&str> = ["ssh", "--ssh-port", port.as_str()].iter().chain(args).copied().collect();
        fleetctl(&endpoint(&fleet), &agent, &known_hosts, &args)
    };

    let by_machine = ssh(&["55555555", "echo", "foo"]);
    assert_eq!((by_machine.code, by_machine.stdout.as_str()), (0, "foo\n"), "{}\n{}", by_machine.stderr, server.log());
    fleet.ok(&["start", &examples_dir().join("hello.service").display().to_string()]);
    let by_unit = ssh(&["hello.service", "echo", "foo"]);
    assert_eq!((by_unit.code, by_unit.stdout.as_str()), (0, "foo\n"), "{}", by_unit.stderr);
    let flagged = ssh(&["--unit", "hello", "--", "echo", "bar"]);
    assert_eq!((flagged.code, flagged.stdout.as_str()), (0, "bar\n"), "{}", flagged.stderr);
    assert_eq!(ssh(&["55555555", "exit 3"]).code, 3, "the remote command's exit code");
    let forwarded = ssh(&["-A", "55555555", "test -S \"$SSH_AUTH_SOCK\" && echo forwarded"]);
    assert_eq!(forwarded.stdout, "forwarded\n", "{}", forwarded.stderr);
    let unforwarded = ssh(&["55555555", "test -S \"$SSH_AUTH_SOCK\" && echo forwarded"]);
    assert_eq!(unforwarded.stdout, "");

    let missing = ssh(&["nothing-here", "true"]);
    assert_eq!(
        (missing.code, missing.stderr.as_str()),
        (1, "Unable to proceed: could not find matching unit or machine\n")
    );
    let both = ssh(&["--machine", "55555555", "--unit", "hello.service"]);
    assert_eq!(both.code, 1, "{}", both.stderr);
}

#[test]
fn host_keys_are_checked_against_the_known_hosts_file() {
    let (agent, fleet) = (SshAgent::start(), Fleetd::start("55555555e2e00002", &[]));
    let server = SshServer::start(&agent);
    let dir = tempfile::tempdir().expect("scratch dir");
    let known_hosts = dir.path().join("fleetctl/known_hosts");
    let port = server.port.to_string();
    let ssh = |extra: &[&str]| {
        let args: Vec<&str> =
            extra.iter().copied().chain(["ssh", "--ssh-port", port.as_str(), "55555555", "echo", "in"]).collect();
        fleetctl(&endpoint(&fleet), &agent, &known_hosts, &args)
    };
    // Strict (the default) and no terminal to ask on: an unknown host is refused.
    let unknown = ssh(&[]);
    assert_eq!(unknown.code, 255, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("Host key verification failed"), "{}", unknown.stderr);
    // Without strict checking the key is taken, and remembered.
    let lax = ssh(&["--strict-host-key-checking=false"]);
    assert_eq!((lax.code, lax.stdout.as_str()), (0, "in\n"), "{}", lax.stderr);
    assert!(std::fs::read_to_string(&known_hosts).is_ok_and(|text| text.contains("ssh-ed25519")));
    assert_eq!(ssh(&[]).stdout, "in\n", "a remembered key passes strict checking");
    // A changed key is refused.
    let other = SshServer::start(&agent);
    let forged = other.known_hosts_line().replace(&format!(":{} ", other.port), &format!(":{} ", server.port));
    std::fs::write(&known_hosts, forged).expect("forge known_hosts");
    let changed = ssh(&[]);
    assert_eq!(changed.code, 255, "{}", changed.stderr);
    assert!(changed.stderr.contains("HOST IDENTIFICATION HAS CHANGED"), "{}", changed.stderr);
}

#[test]
fn the_api_is_reached_through_an_ssh_tunnel() {
    let agent = SshAgent::start();
    let api_port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{api_port}");
    let fleet = Fleetd::start("55555555e2e00003", &[("api_listen", listen.as_str()), ("api_anonymous_role", "viewer")]);
    let server = SshServer::start(&agent);
    let dir = tempfile::tempdir().expect("scratch dir");
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(&known_hosts, server.known_hosts_line()).expect("known_hosts");
    let bastion = format!("127.0.0.1:{}", server.port);

    // To the API's Unix socket on the bastion.
    let through_socket = fleetctl(&endpoint(&fleet), &agent, &known_hosts, &["--tunnel", &bastion, "list-machines"]);
    assert_eq!(through_socket.code, 0, "{}\n{}", through_socket.stderr, server.log());
    assert!(through_socket.stdout.contains("55555555..."), "{}", through_socket.stdout);
    let socket = fleet.socket().display().to_string();
    assert!(server.log().contains(&socket), "sshd forwarded to {socket}:\n{}", server.log());

    // To a TCP endpoint as the bastion sees it.
    let http = format!("http://127.0.0.1:{api_port}");
    let through_tcp = fleetctl(&http, &agent, &known_hosts, &["--tunnel", &bastion, "list-machines", "--no-legend"]);
    assert_eq!(through_tcp.code, 0, "{}", through_tcp.stderr);
    assert!(server.log().contains(&format!("port {api_port}")), "sshd forwarded to the TCP port:\n{}", server.log());

    // A bastion that does not answer: a clear error.
    let closed = format!("127.0.0.1:{}", fleet_testkit::free_port());
    let refused = fleetctl(&endpoint(&fleet), &agent, &known_hosts, &["--tunnel", &closed, "list-machines"]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("Unable to initialize client: the SSH tunnel closed"), "{}", refused.stderr);
}

#[test]
fn fd_forward_carries_a_request_to_the_socket_and_the_answer_back() {
    use std::io::Write;
    let fleet = Fleetd::start("55555555e2e00004", &[]);
    let mut forward = Command::new(binary("fleetctl"))
        .args(["fd-forward", &fleet.socket().display().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run fleetctl fd-forward");
    forward
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"GET /fleet/v1/machines HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send the request");
    let answer = forward.wait_with_output().expect("fd-forward ends");
    let text = String::from_utf8_lossy(&answer.stdout);
    assert!(text.starts_with("HTTP/1.0 200") && text.contains("55555555e2e00004"), "{text}");
}
