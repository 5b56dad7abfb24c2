//! A request's way out of HTTP: the connection that a protocol it upgrades to (a pull agent's
//! change stream) takes over, with what that protocol keeps of the connection it leaves.

use fleet_core::unpoisoned::Locked;
use std::sync::{Arc, Mutex};

use axum::http::Extensions;
use hyper::upgrade::OnUpgrade;
use tokio::sync::{OwnedSemaphorePermit, watch};

/// What a connection lends the protocol that takes it over: its place among its listener's
/// connections (held until that protocol ends, so upgraded connections count against the same
/// bound) and the server's stop signal.
#[derive(Clone)]
pub(crate) struct ConnectionHold {
    pub slot: Arc<OwnedSemaphorePermit>,
    pub stop: watch::Receiver<bool>,
}

/// The upgrade a request offers, taken at most once: none on HTTP/2, or where the client
/// asked for none (hyper offers one only for `Connection: upgrade`).
#[derive(Default)]
pub(crate) struct Upgrade(Mutex<Option<(OnUpgrade, ConnectionHold)>>);

impl Upgrade {
    /// The upgrade `extensions` offer, taken out of them.
    pub fn take_from(extensions: &mut Extensions) -> Self {
        let offered = extensions.remove::<OnUpgrade>();
        let hold = extensions.remove::<ConnectionHold>();
        Self(Mutex::new(offered.zip(hold)))
    }

    /// The connection to take over once the answer is sent, and what it keeps.
    pub fn take(&self) -> Option<(OnUpgrade, ConnectionHold)> {
        self.0.locked().take()
    }
}
