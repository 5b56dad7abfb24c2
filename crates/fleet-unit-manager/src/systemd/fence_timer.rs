//! The keeper of `AtMostOnce=` units under systemd: a transient timer systemd itself holds
//! (`systemd-run --on-active`), which kills the fenced units at the deadline unless fleetd
//! arms a later one first. Systemd keeps it through a frozen or killed fleetd. Each arming
//! makes a new timer and only then stops the one before, so one is always armed; a fleetd
//! that starts stops the timers a predecessor left once its own is armed.

use std::time::Duration;

use tokio::time::Instant;

use super::run_tool;
use crate::Result;

/// The name every fence timer starts with.
const PREFIX: &str = "fleet-fence-";
/// Longer than this between reading the clock and systemd taking the timer (a fleetd frozen
/// in between, say), and the timer may fire late: it is made again.
const TRUSTED_DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
pub struct FenceTimers {
    /// The timer armed last, by this fleetd.
    current: Option<String>,
    generation: u64,
    /// Whether the timers of an earlier fleetd were stopped.
    cleaned: bool,
}

impl FenceTimers {
    /// Arms a timer that kills `units` at `deadline` (none: stops every fence timer).
    pub async fn arm(&mut self, user: bool, deadline: Instant, units: &[String]) -> Result<()> {
        if units.is_empty() {
            if let Some(current) = self.current.take() {
                stop(user, &current).await?;
            }
            return Ok(());
        }
        for _ in 0..3 {
            let read = Instant::now();
            let left = deadline.saturating_duration_since(read);
            self.generation += 1;
            let name = format!("{PREFIX}{}-{}", std::process::id(), self.generation);
            let on_active = format!("--on-active={}ms", left.as_millis().max(1));
            let systemctl_user = if user { "--user" } else { "--system" };
            let mut args = vec![
                "--quiet",
                "--collect",
                "--unit",
                name.as_str(),
                on_active.as_str(),
                "--timer-property=AccuracySec=10ms",
                "systemctl",
                systemctl_user,
                "kill",
                "--signal=SIGKILL",
                "--",
            ];
            args.extend(units.iter().map(String::as_str));
            systemd_run(user, &args).await?;
            if read.elapsed() > TRUSTED_DELAY {
                // Made late: it may fire late. The one before still holds; make another.
                stop(user, &name).await?;
                continue;
            }
            if let Some(previous) = self.current.replace(name.clone()) {
                stop(user, &previous).await?;
            }
            if !self.cleaned {
                self.stop_others(user, &name).await?;
                self.cleaned = true;
            }
            return Ok(());
        }
        Err(crate::UnitManagerError::Unsupported("systemd took too long to arm the fence timer".into()))
    }

    /// Stops every fence timer but `keep`: those an earlier fleetd left.
    async fn stop_others(&self, user: bool, keep: &str) -> Result<()> {
        let pattern = format!("{PREFIX}*.timer");
        let listed = run_tool("systemctl", user, &["list-units", "--all", "--plain", "--no-legend", &pattern]).await?;
        let keep = format!("{keep}.timer");
        for timer in listed.lines().filter_map(|line| line.split_whitespace().next()) {
            if timer != keep && timer.starts_with(PREFIX) {
                stop(user, timer.trim_end_matches(".timer")).await?;
            }
        }
        Ok(())
    }
}

/// Runs `systemd-run` with `args`; its failure is an error (the timer is not armed).
async fn systemd_run(user: bool, args: &[&str]) -> Result<()> {
    let mut command = tokio::process::Command::new("systemd-run");
    if user {
        command.arg("--user");
    }
    let output = command.args(args).output().await.map_err(|source| crate::UnitManagerError::Io {
        context: "running systemd-run for the fence timer".into(),
        source,
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(crate::UnitManagerError::Unsupported(format!(
        "systemd-run could not arm the fence timer: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

async fn stop(user: bool, name: &str) -> Result<()> {
    run_tool("systemctl", user, &["stop", &format!("{name}.timer")]).await.map(|_| ())
}
