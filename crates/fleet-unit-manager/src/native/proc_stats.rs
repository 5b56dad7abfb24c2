//! What `/proc` and a cgroup say of a unit's processes, for its status report: their command
//! lines, the memory they hold and the CPU time they used. Whatever cannot be read (a process
//! that just exited) is left out.

use std::path::Path;

/// The longest command line a report shows, in bytes.
const LONGEST_COMMAND: usize = 160;

/// The PIDs a cgroup directory lists.
pub fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|line| line.trim().parse().ok()).collect())
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// The CPU time a cgroup's processes used, from its `cpu.stat`.
pub fn cgroup_cpu_micros(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    text.lines().find_map(|line| line.strip_prefix("usage_usec ")?.trim().parse().ok())
}

/// `pids` that are still there, with their command lines (`[name]` for one without).
pub fn command_lines(pids: &[u32]) -> Vec<(u32, String)> {
    pids.iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let words: Vec<String> = raw
                .split(|byte| *byte == 0)
                .filter(|word| !word.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            let command = if words.is_empty() {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                format!("[{}]", name.trim())
            } else {
                words.join(" ")
            };
            Some((*pid, shortened(command)))
        })
        .collect()
}

fn shortened(mut command: String) -> String {
    if command.len() > LONGEST_COMMAND {
        let mut end = LONGEST_COMMAND;
        while !command.is_char_boundary(end) {
            end -= 1;
        }
        command.truncate(end);
        command.push('…');
    }
    command
}

/// What `pids` hold resident in memory, summed.
pub fn resident_bytes(pids: &[u32]) -> Option<u64> {
    let mut total = None;
    for pid in pids {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
        if let Some(kib) = kib {
            total = Some(total.unwrap_or(0) + kib * 1024);
        }
    }
    total
}

/// The CPU time `pids` used themselves (user and system), summed: what a unit without a
/// cgroup can tell of its own (its exited processes' time is gone with them).
pub fn processes_cpu_micros(pids: &[u32]) -> Option<u64> {
    // SAFETY: sysconf reads a constant of the system.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|ticks| *ticks > 0)?;
    let mut total = None;
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command name in parentheses (which may hold spaces): state is field 3,
        // utime and stime fields 14 and 15.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(user), Some(system)) = (fields.get(11), fields.get(12)) else { continue };
        if let (Ok(user), Ok(system)) = (user.parse::<u64>(), system.parse::<u64>()) {
            total = Some(total.unwrap_or(0) + (user + system) * 1_000_000 / ticks);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_from_proc() {
        let me = std::process::id();
        let found = command_lines(&[me, u32::MAX]);
        assert_eq!(found.len(), 1, "a PID that is not there is left out");
        assert_eq!(found[0].0, me);
        assert!(resident_bytes(&[me]).is_some_and(|bytes| bytes > 0));
        assert!(processes_cpu_micros(&[me]).is_some());
        assert_eq!(resident_bytes(&[u32::MAX]), None);
        let long = "x".repeat(LONGEST_COMMAND + 10);
        assert_eq!(shortened(long).chars().count(), LONGEST_COMMAND + 1);
    }
}
