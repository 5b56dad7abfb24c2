//! Reading `GET /fleet/v1/events`: its server-sent events parsed as they come, and, while
//! following, the stream opened again after the last index read when it breaks or goes
//! silent, so a follower misses nothing the cluster keeps.

use std::time::Duration;

use fleet_api_schema::ClusterEvent;

use super::{Client, ClientError, Result, encode_component};

/// What a reader asks of the stream.
#[derive(Clone, Debug, Default)]
pub struct EventQuery {
    /// Events after this index (0: from the oldest kept).
    pub since: u64,
    /// Only events of this moment or later (RFC 3339).
    pub from: Option<String>,
    pub unit: Option<String>,
    pub machine: Option<String>,
    pub kinds: Vec<String>,
    /// Keep reading as events come.
    pub follow: bool,
}

/// The server sends a comment every 15 s: silence this long means a dead connection.
const SILENCE: Duration = Duration::from_secs(45);
/// How long a follower waits before it opens the stream again.
const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// One server-sent event as it is read: its type and data.
#[derive(Debug, Default, PartialEq, Eq)]
struct Sent {
    kind: String,
    data: String,
}

/// Cuts complete events off the front of `buffer`.
fn complete_events(buffer: &mut String) -> Vec<Sent> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut sent = Sent::default();
        for line in block.lines() {
            if let Some(kind) = line.strip_prefix("event: ") {
                sent.kind = kind.to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                sent.data.push_str(data);
            }
        }
        if !sent.data.is_empty() {
            events.push(sent);
        }
    }
    events
}

impl EventQuery {
    fn path(&self, since: u64) -> String {
        let mut path = format!("events?since={since}&follow={}", self.follow);
        if let Some(unit) = &self.unit {
            path.push_str(&format!("&unit={}", encode_component(unit)));
        }
        if let Some(machine) = &self.machine {
            path.push_str(&format!("&machine={}", encode_component(machine)));
        }
        if !self.kinds.is_empty() {
            path.push_str(&format!("&kind={}", encode_component(&self.kinds.join(","))));
        }
        if let Some(from) = &self.from {
            path.push_str(&format!("&from={}", encode_component(from)));
        }
        path
    }
}

/// How one connection to the stream ended.
enum Ended {
    /// The server ended it (not following: everything kept was sent).
    Done,
    /// It broke or went silent: a follower opens it again.
    Broken(String),
}

impl Client {
    /// Reads the events `query` asks for, handing each to `each` in index order; returns
    /// when the stream ends (not following), or `each` says to stop.
    pub async fn events(&self, query: &EventQuery, mut each: impl FnMut(ClusterEvent) -> bool) -> Result<()> {
        let mut since = query.since;
        loop {
            match self.read_events(query, &mut since, &mut each).await? {
                Ended::Done => return Ok(()),
                // Opened again after the last index read: nothing kept is missed.
                Ended::Broken(_) if query.follow => tokio::time::sleep(AGAIN_AFTER).await,
                Ended::Broken(why) => return Err(ClientError::Transport(why)),
            }
        }
    }

    async fn read_events(
        &self,
        query: &EventQuery,
        since: &mut u64,
        each: &mut impl FnMut(ClusterEvent) -> bool,
    ) -> Result<Ended> {
        let url = format!("{}/fleet/v1/{}", self.base, query.path(*since));
        // The stream lasts as long as it is read; silence is what ends a dead one.
        let mut response = match self.http.get(url).timeout(Duration::from_secs(u64::from(u32::MAX))).send().await {
            Ok(response) => response,
            Err(error) if query.follow && *since > 0 => return Ok(Ended::Broken(error.to_string())),
            Err(error) => {
                let failure = super::unreachable::failure(&error);
                let why = super::describe_transport(&error);
                return Err(ClientError::Transport(super::unreachable::explain(
                    &self.endpoint,
                    failure,
                    self.timeout,
                    &why,
                )));
            }
        };
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            let bytes = response.bytes().await.map_err(|error| ClientError::Transport(error.to_string()))?;
            let message =
                serde_json::from_slice::<super::ErrorBody>(&bytes).map(|body| body.error.message).unwrap_or_default();
            return Err(ClientError::Api { code: status.as_u16(), message });
        }
        let mut buffer = String::new();
        loop {
            let chunk = match tokio::time::timeout(SILENCE, response.chunk()).await {
                Err(_) => return Ok(Ended::Broken(format!("no word from the server for {}s", SILENCE.as_secs()))),
                Ok(Err(error)) => return Ok(Ended::Broken(error.to_string())),
                Ok(Ok(None)) => return Ok(Ended::Done),
                Ok(Ok(Some(chunk))) => chunk,
            };
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            for sent in complete_events(&mut buffer) {
                if sent.kind == "gone" {
                    return Err(ClientError::Api {
                        code: 410,
                        message: format!(
                            "events after {since} were trimmed before they were read; read again with --since 0"
                        ),
                    });
                }
                let event: ClusterEvent =
                    serde_json::from_str(&sent.data).map_err(|error| ClientError::Decode(error.to_string()))?;
                *since = event.index;
                if !each(event) {
                    return Ok(Ended::Done);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_off_whole_and_comments_are_skipped() {
        let mut buffer = String::from(": keepalive\n\nid: 5\nevent: placed\ndata: {\"index\":5}\n\nid: 6\nevent: sta");
        let events = complete_events(&mut buffer);
        assert_eq!(events, [Sent { kind: "placed".into(), data: "{\"index\":5}".into() }]);
        assert_eq!(buffer, "id: 6\nevent: sta");
    }

    #[test]
    fn a_query_is_written_as_the_api_reads_it() {
        let query = EventQuery {
            since: 0,
            unit: Some("web@*.service".into()),
            machine: Some("ab12".into()),
            kinds: vec!["placed".into(), "moved".into()],
            from: Some("2026-12-07T07:00:00+01:00".into()),
            follow: true,
        };
        assert_eq!(
            query.path(7),
            "events?since=7&follow=true&unit=web@%2A.service&machine=ab12&kind=placed%2Cmoved&from=2026-12-07T07:00:00%2B01:00"
        );
    }
}
