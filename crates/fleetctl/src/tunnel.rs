//! `--tunnel HOST`: the API reached through SSH. An `ssh -N` child forwards a Unix socket in a
//! private directory (0700) to the endpoint as the bastion sees it, the API's socket path or
//! its `host:port`; fleetctl talks through that socket (TLS, when the endpoint is `https://`,
//! still names the endpoint). The child and the directory go when fleetctl ends.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ssh::{SshOptions, host_and_port, tunnel_arguments};

pub struct Tunnel {
    ssh: Child,
    dir: PathBuf,
}

/// What the bastion connects to for `endpoint`: a socket path, or `host:port`.
pub fn remote_end(endpoint: &str) -> Result<String, String> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        return Ok(path.to_string());
    }
    let (scheme, rest) = endpoint.split_once("://").ok_or_else(|| format!("invalid endpoint {endpoint:?}"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return Err(format!("cannot tunnel to {endpoint:?}")),
    };
    let (host, port) = host_and_port(authority, default_port)?;
    Ok(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

fn private_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!("fleetctl-tunnel-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

impl Tunnel {
    /// Opens the tunnel through `bastion` (`host[:port]`) to `endpoint`; returns it with the
    /// local socket to talk through once the forward answers.
    pub fn open(options: &SshOptions, bastion: &str, endpoint: &str) -> Result<(Self, PathBuf), String> {
        let (host, port) = host_and_port(bastion, 22)?;
        let remote = remote_end(endpoint)?;
        let dir = private_dir().map_err(|error| format!("cannot make a directory for the tunnel: {error}"))?;
        let local = dir.join("api.sock");
        let arguments = tunnel_arguments(options, &host, port, &local.display().to_string(), &remote);
        let ssh = Command::new("ssh")
            .args(&arguments)
            .stdin(Stdio::inherit())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let ssh = match ssh {
            Ok(ssh) => ssh,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("cannot run ssh: {error}"));
            }
        };
        let mut tunnel = Self { ssh, dir };
        tunnel.wait_until_open(&local, options.timeout + Duration::from_secs(5))?;
        Ok((tunnel, local))
    }

    fn wait_until_open(&mut self, local: &Path, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if std::os::unix::net::UnixStream::connect(local).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.ssh.try_wait() {
                return Err(format!("the SSH tunnel closed ({status})"));
            }
            if Instant::now() >= deadline {
                return Err(format!("the SSH tunnel did not open within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.ssh.kill();
        let _ = self.ssh.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bastion_connects_to_the_endpoint_as_it_sees_it() {
        assert_eq!(remote_end("unix:///var/run/fleet.sock"), Ok("/var/run/fleet.sock".into()));
        assert_eq!(remote_end("http://10.0.0.5:49153"), Ok("10.0.0.5:49153".into()));
        assert_eq!(remote_end("https://fleet.example:4002/"), Ok("fleet.example:4002".into()));
        assert_eq!(remote_end("https://fleet.example"), Ok("fleet.example:443".into()));
        assert_eq!(remote_end("http://[fd00::5]:49153"), Ok("[fd00::5]:49153".into()));
        assert!(remote_end("ftp://x").is_err());
    }
}
