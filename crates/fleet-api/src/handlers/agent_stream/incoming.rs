//! What an agent writes on its change stream, read line by line: heartbeats (lone `\n`) and,
//! on a second-version stream, its states lines. An idle stream holds a few dozen bytes for
//! it; a longer line is read in larger pieces and the room let go once it is taken.

use fleet_api_schema::{AgentStreamStates, MAX_STREAM_STATES_LINE};
use tokio::io::{AsyncRead, AsyncReadExt};

/// What the agent said.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Said {
    Beat,
    States(AgentStreamStates),
}

pub(super) struct Incoming {
    /// Read and not taken yet.
    read: Vec<u8>,
    /// Whether states lines belong to the stream's protocol.
    takes_states: bool,
}

/// The room kept for reading while nothing is half read.
const IDLE_ROOM: usize = 64;
/// The room added at a time while a line is half read.
const LINE_ROOM: usize = 16 * 1024;

impl Incoming {
    pub(super) fn new(takes_states: bool) -> Self {
        Self { read: Vec::new(), takes_states }
    }

    /// Reads what the agent sent next: false once it closed the stream. Safe to cancel.
    pub(super) async fn read<Io: AsyncRead + Unpin>(&mut self, io: &mut Io) -> std::io::Result<bool> {
        let room = if self.read.is_empty() { IDLE_ROOM } else { LINE_ROOM };
        if self.read.capacity() - self.read.len() < room.min(IDLE_ROOM) {
            self.read.reserve(room);
        }
        Ok(io.read_buf(&mut self.read).await? > 0)
    }

    /// The next whole thing the agent said, if one was read; an error names what breaks the
    /// protocol.
    pub(super) fn next(&mut self) -> Result<Option<Said>, String> {
        let Some(end) = self.read.iter().position(|byte| *byte == b'\n') else {
            if !self.read.is_empty() && !self.takes_states {
                return Err("the stream carries heartbeats only".into());
            }
            if self.read.len() > MAX_STREAM_STATES_LINE {
                return Err(format!("a line over {MAX_STREAM_STATES_LINE} bytes"));
            }
            if self.read.is_empty() && self.read.capacity() > 4 * IDLE_ROOM {
                self.read = Vec::new();
            }
            return Ok(None);
        };
        if end == 0 {
            self.read.drain(..1);
            return Ok(Some(Said::Beat));
        }
        if !self.takes_states {
            return Err("the stream carries heartbeats only".into());
        }
        let states = serde_json::from_slice::<AgentStreamStates>(&self.read[..end])
            .map_err(|error| format!("an unreadable states line: {error}"));
        self.read.drain(..=end);
        states.map(|states| Some(Said::States(states)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn said(takes_states: bool, sent: &[u8]) -> Vec<Result<Said, String>> {
        let mut incoming = Incoming::new(takes_states);
        let mut io = sent;
        let mut said = Vec::new();
        while incoming.read(&mut io).await.unwrap() {
            loop {
                match incoming.next() {
                    Ok(Some(one)) => said.push(Ok(one)),
                    Ok(None) => break,
                    Err(error) => {
                        said.push(Err(error));
                        return said;
                    }
                }
            }
        }
        said
    }

    #[tokio::test]
    async fn heartbeats_and_states_lines_are_told_apart_across_reads() {
        let states = AgentStreamStates { id: 3, ..AgentStreamStates::default() };
        let mut sent = b"\n\n".to_vec();
        sent.extend(serde_json::to_vec(&states).unwrap());
        sent.extend(b"\n\n");
        let said = said(true, &sent).await;
        assert_eq!(said, vec![Ok(Said::Beat), Ok(Said::Beat), Ok(Said::States(states)), Ok(Said::Beat)]);
    }

    #[tokio::test]
    async fn a_first_version_stream_takes_heartbeats_only() {
        let said = said(false, b"\n{\"id\":1,\"states\":{}}\n").await;
        assert_eq!(said[0], Ok(Said::Beat));
        assert_eq!(said[1], Err("the stream carries heartbeats only".into()));
    }

    #[tokio::test]
    async fn an_unreadable_or_endless_line_breaks_the_stream() {
        let unreadable = said(true, b"{\"id\":1,\"states\":{},\"more\":2}\n").await;
        assert!(
            matches!(&unreadable[0], Err(error) if error.starts_with("an unreadable states line")),
            "{unreadable:?}"
        );
        let endless = said(true, &vec![b'x'; MAX_STREAM_STATES_LINE + 2]).await;
        assert_eq!(endless.last(), Some(&Err(format!("a line over {MAX_STREAM_STATES_LINE} bytes"))));
    }
}
