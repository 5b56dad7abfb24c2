//! Free loopback ports for servers started by tests.

use fleet_core::unpoisoned::Locked;
use std::net::TcpListener;
use std::sync::Mutex;

/// Ports are drawn below the kernel's ephemeral range (32768–60999 by default), from which
/// every outgoing connection takes its local port: a port probed free there could be taken by
/// any connection made before the server binds it (a parallel test's fleetd failed to start
/// with "Address already in use" under load that way).
const LOWEST: u16 = 10_000;
const HIGHEST: u16 = 32_000;

/// The last port this process handed out: each process walks up from a start of its own.
static LAST: Mutex<Option<u16>> = Mutex::new(None);

/// A loopback TCP port nothing listens on now and this process has not handed out before.
pub fn free_port() -> u16 {
    let mut last = LAST.locked();
    let span = u32::from(HIGHEST - LOWEST);
    // Processes started one after another (a test each) start 97 ports apart.
    let start = last.unwrap_or_else(|| LOWEST + u16::try_from(std::process::id().wrapping_mul(97) % span).unwrap_or(0));
    let mut port = start;
    loop {
        port = if port >= HIGHEST { LOWEST } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *last = Some(port);
            return port;
        }
        assert_ne!(port, start, "no free loopback port between {LOWEST} and {HIGHEST}");
    }
}

/// The local addresses of the connections established to local `port`, as their clients see
/// them, sorted: which connections a client holds (their number, or whether one was made
/// again).
pub fn connections_to(port: u16) -> Vec<String> {
    let filter = format!("( dport = :{port} )");
    let out =
        std::process::Command::new("ss").args(["-Htn", "state", "established", &filter]).output().expect("ss runs");
    let mut locals: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_string))
        .collect();
    locals.sort();
    locals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        for port in ports {
            assert!((LOWEST..=HIGHEST).contains(&port), "{port}");
            TcpListener::bind(("127.0.0.1", port)).expect("nothing listens on a port handed out");
        }
    }
}
