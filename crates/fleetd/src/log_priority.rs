//! Logs for the journal: when fleetd's stderr is journald's stream (systemd says so in
//! `JOURNAL_STREAM`), every line starts with its syslog priority (`<3>` error, `<4>` warning,
//! `<6>` info, `<7>` debug), which journald stores as the entry's priority, and carries no
//! timestamp or colours (journald adds its own).

use std::os::unix::fs::MetadataExt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether `journal_stream` (the value of `JOURNAL_STREAM`, `device:inode`) names the file
/// that `stderr` is.
pub fn is_journal(journal_stream: Option<&str>, stderr: Option<std::fs::Metadata>) -> bool {
    let (Some(stream), Some(stderr)) = (journal_stream, stderr) else {
        return false;
    };
    let Some((device, inode)) = stream.split_once(':') else {
        return false;
    };
    device.parse::<u64>().is_ok_and(|device| device == stderr.dev())
        && inode.parse::<u64>().is_ok_and(|inode| inode == stderr.ino())
}

/// Whether this process's stderr goes to the journal.
pub fn stderr_is_journal() -> bool {
    let stream = std::env::var("JOURNAL_STREAM").ok();
    is_journal(stream.as_deref(), std::fs::metadata("/proc/self/fd/2").ok())
}

/// The syslog priority of a level.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Writes the priority prefix, then the event as `inner` formats it.
pub struct PriorityPrefix<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for PriorityPrefix<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(context, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_is_recognised_by_device_and_inode() {
        let file = tempfile::NamedTempFile::new().expect("a file");
        let metadata = || std::fs::metadata(file.path()).ok();
        let stream = metadata().map(|m| format!("{}:{}", m.dev(), m.ino()));
        assert!(is_journal(stream.as_deref(), metadata()));
        assert!(!is_journal(Some("1:2"), metadata()));
        assert!(!is_journal(Some("garbage"), metadata()));
        assert!(!is_journal(None, metadata()));
        assert_eq!((priority(&Level::ERROR), priority(&Level::WARN), priority(&Level::INFO)), (3, 4, 6));
    }
}
