//! Which processes are a unit's, and how to signal all of them: its cgroup where there is
//! one (nothing a unit does takes a process out of it), else the process group of its main
//! process and the supervisor marker in the environment (what a unit that tries can evade).

use std::time::Duration;

use super::process::{ExecContext, group_alive, marked_with, signal_group, signal_process, unit_marked_processes};

impl ExecContext {
    /// Sends `signal` to the process group `pgid` and to everything in the unit's cgroup, or
    /// without one to every process that carries the unit's marker (a `setsid` child that
    /// kept its environment: issue 67).
    pub fn signal_unit(&self, pgid: u32, signal: i32) {
        signal_group(pgid, signal);
        match &self.cgroup {
            Some(cgroup) => cgroup.signal(signal),
            None => {
                for pid in unit_marked_processes(&self.marker, &self.unit) {
                    signal_process(pid, signal);
                }
            }
        }
    }

    /// Kills the process group `pgid` and everything in the unit's cgroup, or without one
    /// every process that carries the unit's marker.
    pub fn kill_unit(&self, pgid: u32) {
        match &self.cgroup {
            Some(cgroup) => {
                signal_group(pgid, libc::SIGKILL);
                cgroup.kill_all();
            }
            None => self.signal_unit(pgid, libc::SIGKILL),
        }
    }

    /// Whether any process of the unit is left (in its cgroup, or without one in its process
    /// group or carrying its marker).
    pub fn unit_alive(&self, pgid: u32) -> bool {
        match &self.cgroup {
            Some(cgroup) => cgroup.populated(),
            None => group_alive(pgid) || !unit_marked_processes(&self.marker, &self.unit).is_empty(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::native::command::ExecCommand;
    use crate::native::process::spawn;
    use crate::native::unit_log::{LogLimits, LogSink};

    /// Regression (issue 67): without a cgroup (`native_without_cgroups = allow`), a `setsid`
    /// child that kept the unit's marker survived the unit's stop and destroy.
    #[tokio::test]
    async fn without_a_cgroup_a_child_that_left_the_group_but_kept_the_marker_is_killed() {
        let dir = tempfile::tempdir().expect("a dir");
        let context = ExecContext {
            environment: BTreeMap::new(),
            working_directory: None,
            account: None,
            gid: None,
            marker: format!("tracking-test-{}", std::process::id()),
            unit: "escape.service".into(),
            cgroup: None,
        };
        let command = ExecCommand {
            argv: ["/bin/sh", "-c", "setsid sleep 77123 & exec sleep 77124"].map(str::to_string).to_vec(),
            ignore_failure: false,
        };
        let sink = LogSink::new(&dir.path().join("escape.log"), "test", LogLimits::default());
        let mut child = spawn(&command, &context, &sink).expect("spawned").child;
        let pgid = child.id().expect("its pid");
        // Both sleeps run, one of them in a session (and group) of its own.
        let marked = || unit_marked_processes(&context.marker, &context.unit);
        while marked().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(context.unit_alive(pgid));
        context.kill_unit(pgid);
        // The main process is reaped, as the runner reaps it.
        let _ = child.wait().await;
        context.unit_gone(pgid, Duration::from_secs(30)).await;
        assert!(marked().is_empty(), "every process of the unit is gone: {:?}", marked());
        assert!(!context.unit_alive(pgid));
    }
}
