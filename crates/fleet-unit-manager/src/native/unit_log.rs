//! Per-unit logs: what a unit's processes print and what the supervisor says about it,
//! one timestamped line at a time, kept under `state_dir` so `fleetctl journal` can read it.

use fleet_core::unpoisoned::Locked;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Formats a time the way journalctl's short output does (in UTC): `Nov 21 13:00:00`.
pub fn short_timestamp(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let civil = fleet_core::civil_time::CivilTime::from_unix(seconds);
    let month = MONTHS[(civil.month as usize).saturating_sub(1) % 12];
    format!("{month} {:02} {:02}:{:02}:{:02}", civil.day, civil.hour, civil.minute, civil.second)
}

/// How much log a unit may keep: its file is rotated when it reaches `max_bytes`, and `files`
/// files are kept (the current one included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    pub max_bytes: u64,
    pub files: u32,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self { max_bytes: 4 * 1024 * 1024, files: 3 }
    }
}

/// The longest line kept, in bytes of text (journald's `LineMax=`); longer output is split.
pub const MAX_LINE_BYTES: usize = 48 * 1024;

/// The most a tail reads, whatever it is asked for, so a reader's memory stays bounded.
const MAX_TAIL_BYTES: u64 = 16 * 1024 * 1024;

/// The starts a log remembers where they began in it (a unit restarting often keeps only its
/// newest ones; a run's log is read when it ends, long before this many more starts).
const STARTS_KEPT: usize = 32;

/// One unit's log file. It is open only while a process of the unit has output streams
/// attached (or for the one write of a supervisor message), so idle units hold no descriptor.
struct LogFile {
    path: PathBuf,
    limits: LogLimits,
    open: Option<(File, u64)>,
    writers: usize,
    failing: bool,
    /// Bytes written through this sink, across rotations.
    written: u64,
    /// When each of the unit's latest starts began (microseconds since the epoch), with
    /// [`Self::written`] at that moment: where its lines begin.
    starts: VecDeque<(i64, u64)>,
}

impl LogFile {
    fn write(&mut self, text: &[u8]) -> io::Result<()> {
        if self.open.is_none() {
            let file = fleet_fs::open_private_append(&self.path)?;
            let size = file.metadata()?.len();
            self.open = Some((file, size));
        }
        if let Some((_, size)) = &self.open
            && *size > 0
            && size.saturating_add(text.len() as u64) > self.limits.max_bytes
        {
            self.open = None;
            rotate(&self.path, self.limits.files)?;
            self.open = Some((fleet_fs::open_private_append(&self.path)?, 0));
        }
        if let Some((file, size)) = &mut self.open {
            file.write_all(text)?;
            *size += text.len() as u64;
            self.written += text.len() as u64;
        }
        if self.writers == 0 {
            self.open = None;
        }
        Ok(())
    }
}

/// The path of the `n`th older file of a log (`unit.log.1` is the newest rotated one).
fn rotated_path(path: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Shifts `unit.log` to `unit.log.1` and so on, dropping the oldest beyond `files`.
fn rotate(path: &Path, files: u32) -> io::Result<()> {
    if files <= 1 {
        return std::fs::remove_file(path);
    }
    for n in (1..files).rev() {
        match std::fs::rename(rotated_path(path, n - 1), rotated_path(path, n)) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Where one unit's lines go. Cheap to clone; lines from several writers never interleave.
#[derive(Clone)]
pub struct LogSink {
    file: Arc<Mutex<LogFile>>,
    hostname: Arc<str>,
}

/// Keeps a unit's log file open while a process stream is attached to it.
pub struct AttachedWriter {
    sink: LogSink,
}

impl Drop for AttachedWriter {
    fn drop(&mut self) {
        let mut file = self.sink.lock();
        file.writers = file.writers.saturating_sub(1);
        if file.writers == 0 {
            file.open = None;
        }
    }
}

impl LogSink {
    /// A sink for the log at `path`; nothing is opened until something is written.
    pub fn new(path: &Path, hostname: &str, limits: LogLimits) -> Self {
        let file = LogFile {
            path: path.to_path_buf(),
            limits,
            open: None,
            writers: 0,
            failing: false,
            written: 0,
            starts: VecDeque::new(),
        };
        Self { file: Arc::new(Mutex::new(file)), hostname: hostname.into() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogFile> {
        self.file.locked()
    }

    /// Keeps the file open until the returned value is dropped (a process's output stream).
    pub fn attach(&self) -> AttachedWriter {
        self.lock().writers += 1;
        AttachedWriter { sink: self.clone() }
    }

    /// Remembers that a start of the unit begins here: what is written from now on belongs to
    /// it (and to the starts after it), which [`Self::bytes_since`] tells a run's log by.
    pub fn mark_start(&self) {
        let now = fleet_runtime::wall_clock::now_micros();
        let mut file = self.lock();
        let written = file.written;
        file.starts.push_back((now, written));
        while file.starts.len() > STARTS_KEPT {
            file.starts.pop_front();
        }
    }

    /// The bytes written since the first start at or after `since` (microseconds since the
    /// epoch), or `None` when this sink saw no such start (it was made after it, by a later
    /// load or another fleetd, or the start was forgotten among many).
    pub fn bytes_since(&self, since: i64) -> Option<u64> {
        let file = self.lock();
        let (_, at) = file.starts.iter().find(|(started, _)| *started >= since)?;
        Some(file.written - at)
    }

    /// Appends `line`, said by `ident` (with `pid` when a process said it).
    pub fn line(&self, ident: &str, pid: Option<u32>, line: &str) {
        let source = match pid {
            Some(pid) => format!("{ident}[{pid}]"),
            None => ident.to_string(),
        };
        let text = format!("{} {} {source}: {line}\n", short_timestamp(SystemTime::now()), self.hostname);
        let mut file = self.lock();
        match file.write(text.as_bytes()) {
            Ok(()) => file.failing = false,
            // Said once per run of failures, not once per line.
            Err(error) if !file.failing => {
                file.failing = true;
                tracing::warn!(path = %file.path.display(), %error, "cannot write unit log");
            }
            Err(_) => {}
        }
    }
}

pub fn log_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{unit}.log"))
}

/// The last `lines` lines of a unit's log, its rotated files included, reading only their
/// ends and never more than [`MAX_TAIL_BYTES`] in all.
pub fn tail(path: &Path, lines: usize, limits: LogLimits) -> io::Result<String> {
    tail_within(path, lines, limits, MAX_TAIL_BYTES, false)
}

/// The last `lines` lines of the last `written` bytes of a unit's log (those a start wrote
/// since it began, [`LogSink::bytes_since`]), its rotated files included.
pub fn tail_of_last(path: &Path, lines: usize, limits: LogLimits, written: u64) -> io::Result<String> {
    tail_within(path, lines, limits, written.min(MAX_TAIL_BYTES), written <= MAX_TAIL_BYTES)
}

/// The last `lines` lines within the last `budget` bytes; `at_line_start`: those bytes begin
/// at the start of a line, so a window that reaches the budget's end has no cut first line.
fn tail_within(path: &Path, lines: usize, limits: LogLimits, budget: u64, at_line_start: bool) -> io::Result<String> {
    let mut found: Vec<String> = Vec::new();
    let mut budget = budget;
    for n in 0..limits.files {
        if found.len() >= lines || budget == 0 {
            break;
        }
        let (older, used, whole) = tail_of_file(&rotated_path(path, n), lines - found.len(), budget, at_line_start)?;
        budget -= used;
        found.splice(0..0, older);
        if !whole {
            break;
        }
    }
    Ok(found.into_iter().map(|line| line + "\n").collect())
}

/// The last `lines` complete lines of one file within its last `budget` bytes, the bytes read
/// for them, and whether the file was read to its start (so older files may add more).
fn tail_of_file(path: &Path, lines: usize, budget: u64, at_line_start: bool) -> io::Result<(Vec<String>, u64, bool)> {
    let mut file = match fleet_fs::open_no_follow(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0, true)),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    let mut window = (64 * 1024u64).min(budget);
    loop {
        let start = length.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        (&mut file).take(length - start).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().collect();
        // The first line of a window that starts mid-file may be cut: it does not count,
        // unless the window starts where the bytes asked for start (at a line's start).
        let whole_first = start == 0 || (at_line_start && length - start == budget);
        let complete = if whole_first { &all[..] } else { all.get(1..).unwrap_or(&[]) };
        if complete.len() >= lines || start == 0 || window >= budget {
            let from = complete.len().saturating_sub(lines);
            let taken = complete[from..].iter().map(|line| (*line).to_string()).collect();
            return Ok((taken, length - start, start == 0));
        }
        window = (window * 4).min(budget);
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
        let sink = LogSink::new(&path, "host", LogLimits { max_bytes: 1 << 30, files: 1 });
        for n in 0..5000 {
            sink.line("u", Some(7), &format!("line {n} {}", "x".repeat(40)));
        }
        let last = tail(&path, 3, LogLimits::default()).unwrap();
        let lines: Vec<&str> = last.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("host u[7]: line 4999 "), "{}", lines[2]);
        assert!(lines[0].contains("line 4997 "));
        assert_eq!(tail(&dir.path().join("missing.log"), 3, LogLimits::default()).unwrap(), "");
    }
}

#[cfg(test)]
mod rotation_tests {
    use super::*;

    /// Regression: logs were never rotated (545 MB in 20 s from `yes`).
    #[test]
    fn logs_rotate_by_size_and_keep_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let limits = LogLimits { max_bytes: 10_000, files: 3 };
        let sink = LogSink::new(&path, "host", limits);
        for n in 0..2_000 {
            sink.line("u", None, &format!("line {n}"));
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["u.log", "u.log.1", "u.log.2"]);
        for name in &names {
            assert!(std::fs::metadata(dir.path().join(name)).unwrap().len() <= 10_000, "{name}");
        }
        // A tail spans the rotated files, newest last.
        let last = tail(&path, 400, limits).unwrap();
        let lines: Vec<&str> = last.lines().collect();
        assert_eq!(lines.len(), 400);
        assert!(lines[399].ends_with("u: line 1999"), "{}", lines[399]);
        assert!(lines[0].ends_with("u: line 1600"), "{}", lines[0]);
    }

    /// Regression: a run's log (`fleetctl runs`) showed the lines of the runs before it.
    #[test]
    fn the_tail_of_a_start_holds_only_what_was_written_since_it_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let limits = LogLimits { max_bytes: 2_000, files: 3 };
        let sink = LogSink::new(&path, "host", limits);
        let now = || i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap();
        for n in 0..30 {
            sink.line("u", Some(1), &format!("first run {n}"));
        }
        let second = now();
        sink.mark_start();
        // Past a rotation: the second start's lines span two files.
        for n in 0..40 {
            sink.line("u", Some(2), &format!("second run {n}"));
        }
        assert!(path.with_extension("log.1").exists(), "the log rotated during the second run");
        let written = sink.bytes_since(second).expect("a start since then");
        let lines: Vec<String> = tail_of_last(&path, 100, limits, written).unwrap().lines().map(String::from).collect();
        assert_eq!(lines.len(), 40, "{lines:?}");
        assert!(lines[0].ends_with("u[2]: second run 0"), "{}", lines[0]);
        assert!(lines[39].ends_with("u[2]: second run 39"), "{}", lines[39]);
        // Fewer lines asked for than the start wrote: its last ones.
        let last = tail_of_last(&path, 2, limits, written).unwrap();
        assert!(last.lines().next().unwrap().ends_with("second run 38"), "{last}");
        // A start after every mark is not known: the caller reads the log's tail instead.
        assert_eq!(sink.bytes_since(now() + 1_000_000), None);
        // The first of several starts since a moment: its lines and the later starts'.
        let third = now();
        sink.mark_start();
        sink.line("u", Some(3), "third run");
        sink.mark_start();
        sink.line("u", Some(4), "fourth run");
        let both = tail_of_last(&path, 100, limits, sink.bytes_since(third).unwrap()).unwrap();
        assert_eq!(both.lines().count(), 2, "{both}");
    }

    #[test]
    fn idle_units_hold_no_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let sink = LogSink::new(&dir.path().join("u.log"), "host", LogLimits::default());
        sink.line("fleetd", None, "said once");
        assert!(sink.lock().open.is_none(), "closed after a supervisor message");
        let writer = sink.attach();
        sink.line("u", Some(1), "output");
        assert!(sink.lock().open.is_some(), "open while a process stream is attached");
        drop(writer);
        assert!(sink.lock().open.is_none(), "closed when the last stream goes");
    }
}
