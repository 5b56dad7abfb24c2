//! What every command works with: the API client and a few caches.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use fleet_api_schema::Machine;
use fleet_client::{Client, ClientOptions};

use std::os::unix::fs::DirBuilderExt;

use crate::GlobalFlags;
use crate::ssh::{SshOptions, expand_home};
use crate::tunnel::Tunnel;

pub struct Context {
    pub client: Client,
    pub debug: bool,
    /// `--take-over`: unit writes, and sources added, take over units of other owners.
    pub take_over: bool,
    /// The SSH tunnel the client talks through (`--tunnel`), held open while fleetctl runs.
    _tunnel: Option<Tunnel>,
}

/// A flag's value, or the deprecated alias's when only that is set.
fn file_flag(value: &str, alias: &str) -> Option<PathBuf> {
    [value, alias].into_iter().find(|path| !path.is_empty()).map(PathBuf::from)
}

/// The credentials the flags name: a token (given, or read from a file) and TLS files.
fn client_options(flags: &GlobalFlags, timeout: Duration) -> Result<ClientOptions, String> {
    let token = if !flags.token.is_empty() {
        Some(flags.token.expose().trim().to_string())
    } else if !flags.token_file.is_empty() {
        let text = std::fs::read_to_string(&flags.token_file).map_err(|error| {
            format!("Unable to initialize client: cannot read --token-file {}: {error}", flags.token_file)
        })?;
        Some(text.trim().to_string())
    } else {
        None
    };
    Ok(ClientOptions {
        timeout,
        ca_file: file_flag(&flags.ca_file, &flags.etcd_cafile),
        cert_file: file_flag(&flags.cert_file, &flags.etcd_certfile),
        key_file: file_flag(&flags.key_file, &flags.etcd_keyfile),
        token: token.filter(|token| !token.is_empty()),
        through_socket: None,
        take_over: flags.take_over,
        if_unchanged: flags.if_unchanged,
    })
}

/// The original's SSH flags as ssh options.
pub fn ssh_options(flags: &GlobalFlags) -> Result<SshOptions, String> {
    let timeout = Duration::try_from_secs_f64(flags.ssh_timeout)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .ok_or_else(|| format!("invalid --ssh-timeout {}", flags.ssh_timeout))?;
    Ok(SshOptions {
        user: flags.ssh_username.clone(),
        known_hosts_file: known_hosts_file(&flags.known_hosts_file)?,
        strict_host_key_checking: flags.strict_host_key_checking,
        timeout,
    })
}

/// The known-hosts file, its directory made (0700) when it is missing.
fn known_hosts_file(flag: &str) -> Result<PathBuf, String> {
    let path = expand_home(flag);
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty() && !dir.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| format!("cannot make {}: {error}", dir.display()))?;
    }
    Ok(path)
}

impl Context {
    pub fn new(flags: &GlobalFlags) -> Result<Self, String> {
        if !flags.driver.eq_ignore_ascii_case("api") {
            return Err(format!("Unable to initialize client: unrecognized driver {:?}", flags.driver));
        }
        let timeout = Duration::try_from_secs_f64(flags.request_timeout)
            .ok()
            .filter(|timeout| !timeout.is_zero())
            .ok_or_else(|| format!("invalid --request-timeout {}", flags.request_timeout))?;
        let mut options = client_options(flags, timeout)?;
        let tunnel = if flags.tunnel.is_empty() {
            None
        } else {
            let ssh = ssh_options(flags).map_err(|error| format!("Unable to initialize client: {error}"))?;
            let (tunnel, socket) = Tunnel::open(&ssh, &flags.tunnel, &flags.endpoint)
                .map_err(|error| format!("Unable to initialize client: {error}"))?;
            options.through_socket = Some(socket);
            Some(tunnel)
        };
        let client = Client::with_options(&flags.endpoint, &options)
            .map_err(|error| format!("Unable to initialize client: {error}"))?;
        Ok(Self { client, debug: flags.debug, take_over: flags.take_over, _tunnel: tunnel })
    }

    /// Machines by ID, for legends; empty when they cannot be listed.
    pub async fn machines(&self) -> BTreeMap<String, Machine> {
        match self.client.machines_listed(true).await {
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
