//! A fleetd in pull mode, as a process of its own (optionally started through a command
//! prefix such as `ip netns exec NS`): its fleet.conf, its log, its state directory.

use std::path::Path;
use std::process::{Child, Command};

pub struct PullFleetd {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
}

impl PullFleetd {
    /// Starts `fleetd` with machine ID `pullfleetd000001` pulling from `manager_url`,
    /// trusting `ca`, joining with `token` if given, in `dir` (a fresh one if none).
    pub fn start(
        manager_url: &str,
        ca: &Path,
        token: Option<&str>,
        dir: Option<tempfile::TempDir>,
        prefix: &[&str],
    ) -> Self {
        Self::start_with_env(manager_url, ca, token, dir, prefix, &[])
    }

    /// As [`PullFleetd::start`], with extra environment variables (`HTTPS_PROXY`, say).
    pub fn start_with_env(
        manager_url: &str,
        ca: &Path,
        token: Option<&str>,
        dir: Option<tempfile::TempDir>,
        prefix: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = dir.unwrap_or_else(|| tempfile::tempdir().expect("dir"));
        let mut config = format!(
            "machine_id = pullfleetd000001\nstate_dir = {}\nunit_manager = native\nmanager_url = {manager_url}\n\
             manager_ca_file = {}\npublic_ip = 127.0.0.8\n",
            dir.path().join("state").display(),
            ca.display()
        );
        if let Some(token) = token {
            config.push_str(&format!("registration_token = {token}\n"));
        }
        Self::start_configured(dir, &config, prefix, env)
    }

    /// Starts `fleetd` in `dir` with the fleet.conf `config`, as written (a pull agent or any
    /// other fleetd).
    pub fn start_configured(dir: tempfile::TempDir, config: &str, prefix: &[&str], env: &[(&str, &str)]) -> Self {
        std::fs::write(dir.path().join("fleet.conf"), config).expect("fleet.conf");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(dir.path().join("fleetd.log")).expect("log");
        let mut command = match prefix.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(crate::binary("fleetd"));
                command
            }
            None => Command::new(crate::binary("fleetd")),
        };
        let child = command
            .envs(env.iter().copied())
            .arg("-config")
            .arg(dir.path().join("fleet.conf"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("fleetd");
        Self { dir, child: Some(child) }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fleetd.log")).unwrap_or_default()
    }

    /// SIGTERM, and wait for the exit; returns the directory, to start again on it.
    pub fn stop(self) -> tempfile::TempDir {
        self.end_with(libc::SIGTERM)
    }

    /// SIGKILL (a crash), and wait for the exit; returns the directory, to start again on it.
    pub fn kill(self) -> tempfile::TempDir {
        self.end_with(libc::SIGKILL)
    }

    fn end_with(mut self, signal: i32) -> tempfile::TempDir {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as i32, signal) };
            let _ = child.wait();
        }
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("dir"))
    }
}

impl Drop for PullFleetd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
