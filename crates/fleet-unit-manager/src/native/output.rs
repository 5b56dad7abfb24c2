//! Copying a unit process's output into its unit's log, a line at a time, and draining it:
//! when the process exits, what it wrote last is in its pipes already, and goes into the log
//! before the supervisor says the process ended (a run's log is read then, and its last lines
//! are the ones that say why it failed).

use std::os::fd::RawFd;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot};

use super::unit_log::{LogSink, MAX_LINE_BYTES};

/// The read buffer of a unit's output stream until a read fills it.
pub(super) const QUIET_READ_BYTES: usize = 512;
/// The read buffer of a stream that filled the quiet one.
const BUSY_READ_BYTES: usize = 16 * 1024;

/// Asks the copiers of one process's output streams to take in what their pipes hold now.
#[derive(Clone, Debug, Default)]
pub struct OutputDrain {
    copiers: Vec<mpsc::Sender<oneshot::Sender<()>>>,
}

/// The longest a drain waits for its copiers. Taking in what a pipe holds takes
/// microseconds; a copier that has not answered by then (its thread starved, or a fault not
/// foreseen) must not hold a unit's start or its end for ever: the runner goes on without
/// the last lines, and says so.
pub const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

impl OutputDrain {
    /// Returns once every stream's copier has written what its pipe held when asked (at
    /// once for a copier that has ended: its stream reached its end), or after
    /// [`DRAIN_LIMIT`]: false then.
    pub async fn drain(&self) -> bool {
        tokio::time::timeout(DRAIN_LIMIT, self.drain_all()).await.is_ok()
    }

    async fn drain_all(&self) {
        let mut asked = Vec::new();
        for copier in &self.copiers {
            let (ack, acked) = oneshot::channel();
            if copier.send(ack).await.is_ok() {
                asked.push((copier, acked));
            }
        }
        for (copier, acked) in asked {
            answered(copier, acked).await;
        }
    }
}

/// Resolves once a copier answered an ask, or ended. An ask can reach the copier's channel
/// just as the copier ends (its stream's end comes with the process's exit, on another
/// thread): the channel's room was taken before the copier let go of it, the ask put in
/// after, and there it stays, neither answered nor dropped while the drain holds the
/// channel. Waiting for the answer alone then waited out the drain's limit (a stress run's
/// two timed-out drains of `/bin/sleep`), and before there was a limit, for ever.
async fn answered(copier: &mpsc::Sender<oneshot::Sender<()>>, acked: oneshot::Receiver<()>) {
    tokio::select! {
        _ = acked => {}
        () = copier.closed() => {}
    }
}

/// Starts copying the pipes `streams` (with their descriptors) into `sink`.
pub fn copy_streams<S>(streams: Vec<(S, RawFd)>, sink: &LogSink, ident: &str, pid: Option<u32>) -> OutputDrain
where
    S: AsyncRead + Unpin + Send + 'static,
{
    let mut drain = OutputDrain::default();
    for (stream, fd) in streams {
        let (asks, asked) = mpsc::channel(1);
        drain.copiers.push(asks);
        tokio::spawn(copy_lines(stream, sink.clone(), ident.to_string(), pid, Some((fd, asked))));
    }
    drain
}

/// Cuts a stream's bytes into lines for the log; a line longer than [`MAX_LINE_BYTES`] is
/// split, so output without newlines never grows fleetd's memory.
struct Lines {
    sink: LogSink,
    ident: String,
    pid: Option<u32>,
    pending: Vec<u8>,
}

impl Lines {
    fn emit(&self, line: &[u8]) {
        self.sink.line(&self.ident, self.pid, String::from_utf8_lossy(line).trim_end_matches('\r'));
    }

    fn feed(&mut self, bytes: &[u8]) {
        for piece in bytes.split_inclusive(|byte| *byte == b'\n') {
            let (text, ends_line) = match piece.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (piece, false),
            };
            let mut text = text;
            while self.pending.len() + text.len() >= MAX_LINE_BYTES {
                let take = MAX_LINE_BYTES - self.pending.len();
                self.pending.extend_from_slice(&text[..take]);
                self.emit(&self.pending);
                self.pending.clear();
                text = &text[take..];
            }
            self.pending.extend_from_slice(text);
            if ends_line {
                self.emit(&self.pending);
                self.pending.clear();
            }
        }
    }

    /// Writes a line begun without its newline.
    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.emit(&self.pending);
            self.pending.clear();
        }
    }
}

/// The most one drain takes in: more than a pipe holds (64 KiB by default, 1 MiB at most for
/// a process that is not root), so what the exited process wrote is all in, while a child of
/// it that keeps writing cannot hold the drain (and the runtime's thread) for ever.
const MOST_DRAINED: usize = 2 * 1024 * 1024;

/// Reads what the pipe `fd` holds now, without waiting, into `lines` (at most
/// [`MOST_DRAINED`] bytes); false once the pipe reached its end (or failed).
fn read_held(fd: RawFd, buffer: &mut [u8], lines: &mut Lines) -> bool {
    let mut drained = 0;
    while drained < MOST_DRAINED {
        // SAFETY: `fd` is the open, non-blocking read end of a pipe that the stream this task
        // owns holds open; `buffer` is valid for `buffer.len()` bytes of writing.
        let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        match usize::try_from(read) {
            Ok(0) => return false,
            Ok(read) => {
                drained += read;
                lines.feed(&buffer[..read]);
            }
            Err(_) if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            // Empty for now (EAGAIN): what was written is in. (A failing pipe: the stream's
            // own read finds it out.)
            Err(_) => return true,
        }
    }
    true
}

/// Copies a process's output stream into its unit's log a line at a time until its end;
/// with `drain`, the stream's descriptor and the asks to take in what its pipe holds now.
pub async fn copy_lines(
    mut stream: impl AsyncRead + Unpin,
    sink: LogSink,
    ident: String,
    pid: Option<u32>,
    mut drain: Option<(RawFd, mpsc::Receiver<oneshot::Sender<()>>)>,
) {
    let _open = sink.attach();
    let mut lines = Lines { sink, ident, pid, pending: Vec::new() };
    // Small while the stream is quiet, as most units' are: two of these per unit, held for
    // as long as it runs (16 KiB each made 3,000 units 96 MiB of fleetd, and every fork of
    // fleetd slower). A read that fills it gives the stream the large one.
    let mut buffer = vec![0u8; QUIET_READ_BYTES];
    loop {
        let asked = async {
            match drain.as_mut() {
                Some((_, asks)) => asks.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            ack = asked => {
                let Some(ack) = ack else {
                    // Nobody can ask any more: copy to the end as a stream without asks.
                    drain = None;
                    continue;
                };
                let open = drain.as_ref().is_some_and(|(fd, _)| read_held(*fd, &mut buffer, &mut lines));
                lines.flush();
                let _ = ack.send(());
                if !open {
                    return;
                }
            }
            read = stream.read(&mut buffer) => {
                let read = match read {
                    Ok(0) | Err(_) => break,
                    Ok(read) => read,
                };
                let filled = read == buffer.len();
                lines.feed(&buffer[..read]);
                if filled && buffer.len() < BUSY_READ_BYTES {
                    buffer.resize(BUSY_READ_BYTES, 0);
                }
            }
        }
    }
    lines.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::unit_log::{LogLimits, tail};

    /// Output copied through the small buffer of a quiet stream, then the large one once a read
    /// filled it, comes out as the lines it was: a line across reads is joined, one over
    /// [`MAX_LINE_BYTES`] is split, the last without a newline kept.
    #[tokio::test]
    async fn lines_come_out_whole_whatever_the_reads_that_carried_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let sink = LogSink::new(&path, "host", LogLimits { max_bytes: 1 << 30, files: 1 });
        let long = "y".repeat(QUIET_READ_BYTES * 3);
        let huge = "z".repeat(MAX_LINE_BYTES + 10);
        let output = format!("short\n{long}\n{huge}\nlast without a newline");
        copy_lines(output.as_bytes(), sink, "u".into(), Some(7), None).await;
        let logged = tail(&path, 10, LogLimits::default()).unwrap();
        let said: Vec<&str> =
            logged.lines().map(|line| line.split_once("u[7]: ").map_or("", |(_, text)| text)).collect();
        let expected =
            ["short", long.as_str(), &huge[..MAX_LINE_BYTES], &huge[MAX_LINE_BYTES..], "last without a newline"];
        assert_eq!(said, expected);
    }

    /// What a process wrote before it exited is in the log when the drain returns, though
    /// the copier had not run since (one thread: it runs only when this test yields).
    #[tokio::test]
    async fn a_drain_returns_once_what_the_pipe_held_is_in_the_log() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.log");
        let sink = LogSink::new(&path, "host", LogLimits::default());
        let (reader, mut writer) = std::io::pipe().unwrap();
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into()).unwrap();
        let fd = reader.as_raw_fd();
        let drain = copy_streams(vec![(reader, fd)], &sink, "u", Some(7));
        for n in 0..1000 {
            writeln!(writer, "line {n}").unwrap();
        }
        write!(writer, "the last words, without a newline").unwrap();
        assert!(drain.drain().await, "every copier answered");
        let logged = tail(&path, 2000, LogLimits::default()).unwrap();
        assert_eq!(logged.lines().count(), 1001, "{logged}");
        assert!(logged.ends_with("u[7]: the last words, without a newline\n"), "{logged}");
        // The pipe's end: the copier ends, and a drain asked then returns at once.
        drop(writer);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !drain.copiers.iter().all(tokio::sync::mpsc::Sender::is_closed) {
            assert!(std::time::Instant::now() < deadline, "the copier never ended");
            tokio::task::yield_now().await;
        }
        assert!(drain.drain().await, "a drain of an ended copier returns at once");
    }

    /// A copier that never answers holds a drain no longer than [`DRAIN_LIMIT`] (a unit
    /// replaced under load once stayed in its start for minutes, never failing; the drain is
    /// the one wait there without a timeout).
    #[tokio::test(start_paused = true)]
    async fn a_copier_that_never_answers_holds_a_drain_no_longer_than_its_limit() {
        let (asks, _never_read) = mpsc::channel(1);
        let drain = OutputDrain { copiers: vec![asks] };
        let began = tokio::time::Instant::now();
        assert!(!drain.drain().await, "the drain says it did not finish");
        assert_eq!(began.elapsed(), DRAIN_LIMIT);
    }

    /// An ask put into a copier's channel after the copier let go of it (the room taken before,
    /// as `send` does) is never answered nor dropped; the drain returns at once all the same.
    #[tokio::test(start_paused = true)]
    async fn an_ask_that_reached_a_copier_as_it_ended_holds_nothing() {
        let (asks, copier) = mpsc::channel(1);
        let room = asks.reserve().await.expect("the copier is there");
        drop(copier);
        let (ack, acked) = oneshot::channel();
        room.send(ack);
        let began = tokio::time::Instant::now();
        let returned = tokio::time::timeout(DRAIN_LIMIT, answered(&asks, acked)).await;
        assert!(returned.is_ok(), "the drain waited for an answer that could not come");
        assert_eq!(began.elapsed(), std::time::Duration::ZERO);
    }

    /// A child that goes on writing after its parent exited cannot hold a drain for ever.
    #[tokio::test]
    async fn a_drain_returns_while_something_keeps_writing() {
        let dir = tempfile::tempdir().unwrap();
        let sink = LogSink::new(&dir.path().join("u.log"), "host", LogLimits { max_bytes: 1 << 20, files: 1 });
        let mut child = tokio::process::Command::new("/usr/bin/yes")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stdout);
        let drain = copy_streams(vec![(stdout, fd)], &sink, "yes", None);
        // Once it writes (the copier has taken some in), the pipe never runs dry.
        let log = dir.path().join("u.log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::fs::metadata(&log).map_or(0, |m| m.len()) == 0 {
            assert!(std::time::Instant::now() < deadline, "yes never wrote");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tokio::time::timeout(std::time::Duration::from_secs(60), drain.drain()).await.expect("the drain returned");
        child.kill().await.unwrap();
    }
}
