//! SIGUSR2: fleetd replaces itself in place with the binary it was started from (by then the
//! new release), keeping its PID, its units and its presence. First the new binary is run
//! once (`--version`): one that does not run on this machine is refused before anything
//! stops. Then the components stop as for a reload, the unit manager hands its units over and
//! calls `execve`; the new image takes the presence over and adopts the units as they run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::reexec::Reexec;

/// How long the new binary has to say its version.
const VERSION_WAIT: Duration = Duration::from_secs(10);

/// The binary and arguments fleetd was started with.
#[derive(Clone, Debug)]
pub struct InPlace {
    program: PathBuf,
    args: Vec<OsString>,
}

impl InPlace {
    /// What this fleetd was started as: its own path as invoked when that is absolute (a
    /// package replaces that file; a link it went through may be pointed elsewhere), else the
    /// binary the kernel ran.
    pub fn of_this_process() -> anyhow::Result<Self> {
        let mut args = std::env::args_os();
        let invoked = args.next().map(PathBuf::from).filter(|path| path.is_absolute());
        let program = match invoked {
            Some(path) => path,
            None => std::env::current_exe().context("locating the fleetd binary")?,
        };
        Ok(Self { program, args: args.collect() })
    }

    /// Runs the new binary once; its version line, or why it cannot run.
    pub async fn check_new_binary(&self) -> anyhow::Result<String> {
        let run = tokio::process::Command::new(&self.program)
            .arg("--version")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(VERSION_WAIT, run)
            .await
            .map_err(|_| anyhow::anyhow!("{} did not say its version within {VERSION_WAIT:?}", self.program.display()))?
            .with_context(|| format!("running {}", self.program.display()))?;
        if !output.status.success() {
            anyhow::bail!("{} --version failed ({})", self.program.display(), output.status);
        }
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(text.split('\n').filter(|line| !line.is_empty()).collect::<Vec<_>>().join(", "))
    }

    /// Hands the units over and replaces this process with the new binary; returns only if
    /// that failed, with why (the units are then supervised by this fleetd as before).
    pub async fn replace(&self, manager: &dyn UnitManager) -> anyhow::Error {
        let nonce = match nonce() {
            Ok(nonce) => nonce,
            Err(error) => return error,
        };
        let reexec = Reexec {
            program: self.program.clone(),
            args: self.args.clone(),
            environment: std::env::vars_os().collect(),
            nonce,
        };
        let error = manager.reexec(&reexec).await;
        anyhow::Error::new(error).context(format!("replacing fleetd with {}", self.program.display()))
    }
}

/// A fresh nonce for a handover: 128 random bits from the kernel.
fn nonce() -> anyhow::Result<String> {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").context("reading a random nonce")?;
    Ok(uuid.trim().replace('-', ""))
}

/// The nonce an earlier image of this fleetd started this one with, if any. It stays in the
/// environment (changing that is a data race once threads run); it is worth nothing once the
/// handover it names has been taken, and units start with an environment of their own.
pub fn handover_nonce() -> Option<String> {
    let nonce = std::env::var(fleet_unit_manager::reexec::REEXEC_VARIABLE).ok()?;
    (!nonce.is_empty() && nonce.len() <= 64 && nonce.bytes().all(|byte| byte.is_ascii_hexdigit())).then_some(nonce)
}
