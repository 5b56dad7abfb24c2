//! Per-unit logs: what a unit's processes print and what the supervisor says about it,
//! one timestamped line at a time, kept under `state_dir` so `fleetctl journal` can read it.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Formats a time the way journalctl's short output does (in UTC): `Nov 21 13:00:00`.
pub fn short_timestamp(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    format!("{} {:02} {:02}:{:02}:{:02}", MONTHS[(month - 1) as usize], day, rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Where one unit's lines go. Cheap to clone; lines from several writers never interleave.
#[derive(Clone)]
pub struct LogSink {
    file: Arc<Mutex<File>>,
    hostname: Arc<str>,
}

impl LogSink {
    pub fn open(path: &Path, hostname: &str) -> io::Result<Self> {
        let file = fleet_fs::open_private_append(path)?;
        Ok(Self { file: Arc::new(Mutex::new(file)), hostname: hostname.into() })
    }

    /// Appends `line`, said by `ident` (with `pid` when a process said it).
    pub fn line(&self, ident: &str, pid: Option<u32>, line: &str) {
        let source = match pid {
            Some(pid) => format!("{ident}[{pid}]"),
            None => ident.to_string(),
        };
        let text = format!("{} {} {source}: {line}\n", short_timestamp(SystemTime::now()), self.hostname);
        let mut file = self.file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(error) = file.write_all(text.as_bytes()) {
            tracing::warn!(%error, "cannot write unit log");
        }
    }
}

pub fn log_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{unit}.log"))
}

/// The last `lines` lines of a log (all of them when it is short), reading only its end.
pub fn tail(path: &Path, lines: usize) -> io::Result<String> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    let mut window = 64 * 1024u64;
    loop {
        let start = length.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().collect();
        // The first line of a window that starts mid-file may be cut: it does not count.
        let complete = if start == 0 { &all[..] } else { all.get(1..).unwrap_or(&[]) };
        if complete.len() >= lines || start == 0 {
            let from = complete.len().saturating_sub(lines);
            return Ok(complete[from..].iter().map(|line| format!("{line}\n")).collect());
        }
        window *= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_civil_dates() {
        assert_eq!(short_timestamp(UNIX_EPOCH), "Jan 01 00:00:00");
        // 2026-11-21 13:00:00 UTC
        assert_eq!(short_timestamp(UNIX_EPOCH + Duration::from_secs(1_795_266_000)), "Nov 21 13:00:00");
        // 2024-02-29 23:59:59 UTC
        assert_eq!(short_timestamp(UNIX_EPOCH + Duration::from_secs(1_709_251_199)), "Feb 29 23:59:59");
    }

    #[test]
    fn tail_reads_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let sink = LogSink::open(&path, "host").unwrap();
        for n in 0..5000 {
            sink.line("u", Some(7), &format!("line {n} {}", "x".repeat(40)));
        }
        let last = tail(&path, 3).unwrap();
        let lines: Vec<&str> = last.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("host u[7]: line 4999 "), "{}", lines[2]);
        assert!(lines[0].contains("line 4997 "));
        assert_eq!(tail(&dir.path().join("missing.log"), 3).unwrap(), "");
    }
}
