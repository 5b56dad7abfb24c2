//! What every command works with: the API client and a few caches.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_api_schema::Machine;
use fleet_client::Client;

use crate::GlobalFlags;

pub struct Context {
    pub client: Client,
    pub debug: bool,
}

impl Context {
    pub fn new(flags: &GlobalFlags) -> Result<Self, String> {
        if !flags.driver.eq_ignore_ascii_case("api") {
            return Err(format!("Unable to initialize client: unrecognized driver {:?}", flags.driver));
        }
        if !flags.tunnel.is_empty() {
            return Err("Unable to initialize client: --tunnel is not supported by this fleetctl".to_string());
        }
        let timeout = Duration::try_from_secs_f64(flags.request_timeout)
            .ok()
            .filter(|timeout| !timeout.is_zero())
            .ok_or_else(|| format!("invalid --request-timeout {}", flags.request_timeout))?;
        let client =
            Client::new(&flags.endpoint, timeout).map_err(|error| format!("Unable to initialize client: {error}"))?;
        Ok(Self { client, debug: flags.debug })
    }

    /// Machines by ID, for legends; empty when they cannot be listed.
    pub async fn machines(&self) -> BTreeMap<String, Machine> {
        match self.client.machines().await {
            Ok(machines) => machines.into_iter().map(|machine| (machine.id.clone(), machine)).collect(),
            Err(error) => {
                self.debug(&format!("listing machines: {error}"));
                BTreeMap::new()
            }
        }
    }

    pub fn debug(&self, message: &str) {
        if self.debug {
            eprintln!("DEBUG: {message}");
        }
    }
}
