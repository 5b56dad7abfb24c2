//! The native supervisor's `systemctl status`: what `fleetctl status` shows of a unit it runs
//! (its state and since when, its main process, its processes with their memory and CPU, and
//! the last lines of its log), written from facts gathered elsewhere.

use fleet_core::civil_time::CivilTime;

/// What a unit's status report says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusFacts {
    pub name: String,
    pub description: Option<String>,
    /// `loaded`, or `bad-setting` for a file the supervisor cannot run.
    pub load: String,
    pub active: String,
    pub sub: String,
    /// When the unit's active state last changed (microseconds since the epoch).
    pub since: Option<i64>,
    pub main_pid: Option<u32>,
    /// The unit's processes (PID, command line), in PID order.
    pub processes: Vec<(u32, String)>,
    /// What its processes hold in memory (resident), when they could be read.
    pub memory_bytes: Option<u64>,
    /// The CPU time its processes used (its cgroup's, or its live processes' own).
    pub cpu_micros: Option<u64>,
    /// Its cgroup, as a path in the hierarchy, when it has one.
    pub cgroup: Option<String>,
    /// The last lines of its log.
    pub journal: String,
}

/// The most processes a report lists.
const MOST_PROCESSES: usize = 32;

pub fn status_report(facts: &StatusFacts, now: i64) -> String {
    let mut text = match &facts.description {
        Some(description) => format!("● {} - {description}\n", facts.name),
        None => format!("● {}\n", facts.name),
    };
    text.push_str(&format!("     Loaded: {} (fleet's native supervisor)\n", facts.load));
    let since = facts.since.map(|since| format!(" since {}; {} ago", weekday_time(since), span(now - since)));
    text.push_str(&format!("     Active: {} ({}){}\n", facts.active, facts.sub, since.unwrap_or_default()));
    if let Some(pid) = facts.main_pid {
        let command = facts.processes.iter().find(|(process, _)| *process == pid).map(|(_, command)| program(command));
        match command {
            Some(program) => text.push_str(&format!("   Main PID: {pid} ({program})\n")),
            None => text.push_str(&format!("   Main PID: {pid}\n")),
        }
    }
    if !facts.processes.is_empty() {
        text.push_str(&format!("      Tasks: {}\n", facts.processes.len()));
        if let Some(bytes) = facts.memory_bytes {
            text.push_str(&format!("     Memory: {} (resident)\n", size(bytes)));
        }
    }
    if let Some(micros) = facts.cpu_micros {
        text.push_str(&format!("        CPU: {}\n", cpu_time(micros)));
    }
    if !facts.processes.is_empty() {
        let heading = facts.cgroup.as_deref().map_or("  Processes:".to_string(), |path| format!("     CGroup: {path}"));
        text.push_str(&heading);
        text.push('\n');
        let shown = facts.processes.len().min(MOST_PROCESSES);
        let width = facts.processes.iter().map(|(pid, _)| pid.to_string().len()).max().unwrap_or(0);
        for (index, (pid, command)) in facts.processes.iter().take(shown).enumerate() {
            let branch = if index + 1 == shown && shown == facts.processes.len() { "└─" } else { "├─" };
            text.push_str(&format!("             {branch}{pid:>width$} {command}\n"));
        }
        if shown < facts.processes.len() {
            text.push_str(&format!("             └─… {} more\n", facts.processes.len() - shown));
        }
    }
    if !facts.journal.is_empty() {
        text.push('\n');
        text.push_str(&facts.journal);
        if !facts.journal.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

/// A command line's program: its first word's file name.
fn program(command: &str) -> &str {
    let first = command.split(' ').next().unwrap_or(command);
    first.rsplit('/').next().unwrap_or(first)
}

/// `Mon 2026-12-07 06:32:10 UTC`, as systemctl writes a moment.
fn weekday_time(micros: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let time = CivilTime::from_unix(u64::try_from(micros.div_euclid(1_000_000)).unwrap_or(0));
    let days = micros.max(0).div_euclid(86_400_000_000);
    format!(
        "{} {:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        DAYS[days.rem_euclid(7) as usize],
        time.year,
        time.month,
        time.day,
        time.hour,
        time.minute,
        time.second
    )
}

/// A span as systemctl writes one ago: `3s`, `5min 3s`, `2h 5min`, `3 days 2h`.
fn span(micros: i64) -> String {
    let seconds = micros.max(0) / 1_000_000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}min {}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h {}min", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{} days {}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

/// Bytes as systemctl writes them: `812K`, `1.5M`, `2.0G`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes}B") } else { format!("{value:.1}{}", UNITS[unit]) }
}

/// CPU time as systemctl writes it: `35ms`, `2.852s`, `1min 3.123s`.
fn cpu_time(micros: u64) -> String {
    let millis = micros / 1000;
    match millis {
        0..1000 => format!("{millis}ms"),
        1000..60_000 => format!("{}.{:03}s", millis / 1000, millis % 1000),
        _ => format!("{}min {}.{:03}s", millis / 60_000, millis % 60_000 / 1000, millis % 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_unit_reads_as_systemctl_status_writes_it() {
        let since = fleet_core::civil_time::micros_of_rfc3339("2026-12-07T06:32:10Z").unwrap();
        let facts = StatusFacts {
            name: "hello.service".into(),
            description: Some("Hello World".into()),
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
            since: Some(since),
            main_pid: Some(7432),
            processes: vec![(7432, "/bin/sh -c while true; do sleep 1; done".into()), (19781, "sleep 1".into())],
            memory_bytes: Some(1_572_864),
            cpu_micros: Some(2_852_871),
            cgroup: Some("/fleet-units.a78a/hello.service".into()),
            journal: "Dec 07 06:32:10 vm fleetd: Started Hello World.\n".into(),
        };
        assert_eq!(
            status_report(&facts, since + 303_000_000),
            "● hello.service - Hello World\n\
             \x20    Loaded: loaded (fleet's native supervisor)\n\
             \x20    Active: active (running) since Mon 2026-12-07 06:32:10 UTC; 5min 3s ago\n\
             \x20  Main PID: 7432 (sh)\n\
             \x20     Tasks: 2\n\
             \x20    Memory: 1.5M (resident)\n\
             \x20       CPU: 2.852s\n\
             \x20    CGroup: /fleet-units.a78a/hello.service\n\
             \x20            ├─ 7432 /bin/sh -c while true; do sleep 1; done\n\
             \x20            └─19781 sleep 1\n\
             \n\
             Dec 07 06:32:10 vm fleetd: Started Hello World.\n"
        );
    }

    #[test]
    fn a_stopped_unit_has_no_process_lines_and_spans_and_sizes_read_well() {
        let facts = StatusFacts {
            name: "x.service".into(),
            load: "loaded".into(),
            active: "inactive".into(),
            sub: "dead".into(),
            ..StatusFacts::default()
        };
        assert_eq!(
            status_report(&facts, 0),
            "● x.service\n     Loaded: loaded (fleet's native supervisor)\n     Active: inactive (dead)\n"
        );
        assert_eq!([span(59_000_000), span(7_200_000_000), span(90_000_000_000)], ["59s", "2h 0min", "1 days 1h"]);
        assert_eq!([size(900), size(812 * 1024), size(3 << 30)], ["900B", "812.0K", "3.0G"]);
        assert_eq!([cpu_time(35_000), cpu_time(63_123_000)], ["35ms", "1min 3.123s"]);
        assert_eq!(weekday_time(0), "Thu 1970-01-01 00:00:00 UTC");
    }
}
