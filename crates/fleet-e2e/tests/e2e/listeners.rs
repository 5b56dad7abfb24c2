//! The API on TCP (`api_listen`) and on sockets passed by systemd socket activation.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_e2e::binary;

use fleet_testkit::free_port;

/// One HTTP/1.0 GET; the whole answer as text.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

#[test]
fn tcp_and_unix_listeners_serve_the_same_api() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fleet.sock");
    let config = dir.path().join("fleet.conf");
    std::fs::write(
        &config,
        format!(
            "machine_id = e2e0tcp000000001\nstate_dir = {}\napi_listen = unix://{},127.0.0.1:{port}\napi_anonymous_role = viewer\n",
            dir.path().join("state").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(binary("fleetd")).arg("-config").arg(&config).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        if let Some(answer) = http_get(port, "/fleet/v1/machines") {
            break answer;
        }
        assert!(Instant::now() < deadline, "no answer on TCP");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("server: fleetd/") || answer.contains("Server: fleetd/"), "{answer}");
    assert!(answer.contains("e2e0tcp000000001"), "{answer}");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "the Unix socket is for owner and group only");
    let ran = Command::new(binary("fleetctl"))
        .arg(format!("--endpoint=http://127.0.0.1:{port}"))
        .args(["list-machines", "--no-legend", "--fields", "machine"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "e2e0tcp0...\n");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn sockets_passed_by_systemd_are_used() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.conf");
    std::fs::write(
        &config,
        format!(
            "machine_id = e2e0activated001\nstate_dir = {}\napi_listen = unix://{}\napi_anonymous_role = viewer\n",
            dir.path().join("state").display(),
            dir.path().join("unused.sock").display()
        ),
    )
    .unwrap();
    let mut child = Command::new("systemd-socket-activate")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg(binary("fleetd"))
        .arg("-config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("systemd-socket-activate (Debian's systemd package) must be installed");
    // The activator accepts on our behalf only once fleetd runs: retry until it answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        if let Some(answer) = http_get(port, "/fleet/v1/machines").filter(|a| a.contains("e2e0activated001")) {
            break answer;
        }
        assert!(Instant::now() < deadline, "no answer on the activated socket");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answer.contains("200"), "{answer}");
    assert!(!dir.path().join("unused.sock").exists(), "passed sockets replace api_listen");
    // SAFETY: as above; systemd-socket-activate execs fleetd in its own process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}
