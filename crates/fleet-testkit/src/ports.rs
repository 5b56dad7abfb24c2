//! Free loopback ports for servers started by tests.

use std::net::TcpListener;
use std::sync::Mutex;

/// Ports handed out by this process, so that two servers started at once never get the same
/// one between the probe and the bind.
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A loopback TCP port nothing listens on now and this process has not handed out before.
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("binding a loopback port");
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}
