//! One probe of a unit's health check, bounded by the check's timeout: an HTTP(S) GET on a
//! connection kept from the unit's last probe (`http`), a TCP connect, a command
//! (`fleet_unit_manager::check_command`), or a look at systemd's watchdog.

mod answer;
mod http;
#[cfg(test)]
mod tests;
mod tls;

use std::time::Duration;

use fleet_core::health::{Outcome, Probe};
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::check_command::{RunAs, run_check};
use tokio::net::TcpStream;

/// One unit's prober: what it keeps between probes (an HTTP check's open connection).
#[derive(Default)]
pub struct Prober {
    kept: Option<http::Connection>,
}

impl Prober {
    /// Probes `unit` once, within `timeout`. A probe cut off by its timeout leaves no
    /// connection kept: what was on it is unknown.
    pub async fn probe(
        &mut self,
        probe: &Probe,
        unit: &str,
        run_as: &RunAs,
        timeout: Duration,
        manager: &dyn UnitManager,
    ) -> Outcome {
        let result = match probe {
            // Bounded by its own timeout, which also kills what it left.
            Probe::Exec { argv } => run_check(argv, run_as, manager.check_cgroup(unit).await, timeout).await,
            other => match tokio::time::timeout(timeout, self.probe_network(other, unit, manager)).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {}s", timeout.as_secs_f64())),
            },
        };
        match result {
            Ok(()) => Outcome::Pass,
            Err(why) => Outcome::Fail(why),
        }
    }

    async fn probe_network(&mut self, probe: &Probe, unit: &str, manager: &dyn UnitManager) -> Result<(), String> {
        match probe {
            Probe::Tcp { host, port } => connect(host, *port).await.map(drop),
            Probe::Http { tls: false, host, port, path } => http::get(&mut self.kept, None, host, *port, path).await,
            Probe::Http { tls: true, host, port, path } => {
                http::get(&mut self.kept, Some(&tls::config()?), host, *port, path).await
            }
            Probe::Watchdog => match manager.watchdog_trouble(unit).await {
                Ok(None) => Ok(()),
                Ok(Some(why)) => Err(why),
                Err(error) => Err(error.to_string()),
            },
            Probe::Exec { .. } => Err("not a network probe".to_string()),
        }
    }
}

/// Connects to `host:port`. The connection is reset when dropped rather than closed: a probe
/// has what it came for by then, and neither side keeps a closing socket around for minutes
/// (thousands of probes a second would fill both sides with them).
async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|error| format!("connecting to {}: {error}", authority(host, port)))?;
    let _ = stream.set_zero_linger();
    Ok(stream)
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}
