//! Which processes are a unit's, and how to signal all of them: its cgroup where there is
//! one (nothing a unit does takes a process out of it), else the process group of its main
//! process and the supervisor marker in the environment (what a unit that tries can evade).

use std::time::Duration;

use super::process::{ExecContext, group_alive, marked_with, signal_group};

impl ExecContext {
    /// Sends `signal` to the process group `pgid` and to everything in the unit's cgroup.
    pub fn signal_unit(&self, pgid: u32, signal: i32) {
        signal_group(pgid, signal);
        if let Some(cgroup) = &self.cgroup {
            cgroup.signal(signal);
        }
    }

    /// Kills the process group `pgid` and everything in the unit's cgroup.
    pub fn kill_unit(&self, pgid: u32) {
        signal_group(pgid, libc::SIGKILL);
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// Whether any process of the unit is left.
    pub fn unit_alive(&self, pgid: u32) -> bool {
        match &self.cgroup {
            Some(cgroup) => cgroup.populated(),
            None => group_alive(pgid),
        }
    }

    /// Waits up to `bound` for the unit's processes to be gone.
    pub async fn unit_gone(&self, pgid: u32, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while self.unit_alive(pgid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether `pid` (read from a PID file the unit may write) is one of this unit's
    /// processes, so fleetd, as root, may signal it: in the unit's cgroup, or else in its
    /// process group or carrying this supervisor's marker.
    pub fn owns(&self, pid: u32, pgid: u32) -> bool {
        if pid <= 1 {
            return false;
        }
        match &self.cgroup {
            Some(cgroup) => cgroup.contains(pid),
            None => {
                // SAFETY: getpgid has no memory-safety preconditions.
                let group = unsafe { libc::getpgid(pid as i32) };
                group == pgid as i32 || marked_with(pid, &self.marker)
            }
        }
    }
}
