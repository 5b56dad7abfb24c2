//! When a manager last heard from each pull agent. A pull agent has no lease of its own: its
//! manager holds its presence in the store for it, and gives it up when the agent has been
//! silent for `agent_ttl`, so the cluster treats it as a lost machine exactly like an etcd
//! machine whose lease ran out.
//!
//! An agent is heard at each request, and for as long as it holds a long poll open: a poll
//! may last minutes (an idle agent costs its manager a quiet connection, not a request every
//! few seconds). A poll cut off without an answer (the connection closed: the agent died, or
//! HTTP/2's keepalive found its network gone) counts as heard [`AgentPresence::cut_off_slack`]
//! before it ended: the longest its connection can have been dead unnoticed. So a lost agent
//! is noticed within `agent_ttl` of its last sign of life either way.

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The most pull agents one manager holds presence for: beyond it, a new agent is told the
/// manager is full (and tries another) rather than growing the table without bound.
pub const MOST_AGENTS: usize = 250_000;

/// A new agent came to a manager that already holds [`MOST_AGENTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this manager serves {MOST_AGENTS} pull agents already; try another")]
pub struct Full;

/// What the manager knows of one agent's life.
#[derive(Clone, Copy, Debug)]
struct Heard {
    at: Instant,
    /// Long polls it holds open now: while one is, it is present.
    open_polls: u32,
}

pub struct AgentPresence {
    heard: Mutex<HashMap<String, Heard>>,
    /// Each machine's change streams, numbered as they open: only the newest is served.
    streams: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// How long an agent may be silent before it is lost (`agent_ttl`).
    ttl: Duration,
}

impl Default for AgentPresence {
    fn default() -> Self {
        Self::new(Duration::from_secs(30))
    }
}

/// The longest a long poll of an agent that asks for no wait lasts (older agents).
const LONGEST_SHORT_POLL: Duration = Duration::from_secs(25);

/// The longest wait an agent may ask of a long poll.
pub const LONGEST_POLL: Duration = Duration::from_secs(600);

impl AgentPresence {
    pub fn new(ttl: Duration) -> Self {
        Self { heard: Mutex::new(HashMap::new()), streams: Mutex::new(HashMap::new()), ttl }
    }

    /// `machine` opens a change stream: its number, and what moves once a newer stream of the
    /// same machine opened (then this one ends). One machine holds one stream, so that one
    /// machine certificate cannot make its manager hold many (issue 67: 200 streams of one
    /// agent, each with a 1 MiB line under way, took a manager from 29 MB to 233 MB).
    pub fn stream_opened(&self, machine: &str) -> (u64, watch::Receiver<u64>) {
        let mut streams = self.streams.locked();
        streams.retain(|_, newest| newest.receiver_count() > 0);
        let newest = streams.entry(machine.to_string()).or_insert_with(|| watch::channel(0).0);
        newest.send_modify(|number| *number += 1);
        (*newest.borrow(), newest.subscribe())
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Heard>> {
        self.heard.locked()
    }

    /// How long a long poll waits when the agent asks for no wait: short enough that an agent
    /// heard only at each poll is heard three times within `agent_ttl`.
    pub fn poll_wait(&self) -> Duration {
        LONGEST_SHORT_POLL.min(self.ttl / 3)
    }

    /// How long a pull agent's connection may carry no request before it is pinged (HTTP/2
    /// keepalive): half of `agent_ttl`, and the answer may take a quarter, so a connection
    /// dead without a word is closed within three quarters of it. The agent pings too, three
    /// times in `agent_ttl` (`fleet_pull_agent::Manager::with_heartbeat`), to leave a manager
    /// gone silent; hyper does not count the agent's pings as hearing from it, so an idle
    /// connection carries both sides' pings (five in two `agent_ttl`).
    pub fn keepalive(&self) -> Duration {
        (self.ttl / 2).max(Duration::from_millis(250))
    }

    /// How long before a cut-off poll ended its agent may have been gone unnoticed: a
    /// keepalive and its answer's wait. (An agent whose connection closed at once, as when its
    /// fleetd restarts, has the last quarter of `agent_ttl` to be heard again.)
    pub fn cut_off_slack(&self) -> Duration {
        self.keepalive() * 3 / 2
    }

    /// Notes a request from `machine` (authenticated by its own certificate: nothing else
    /// may make a machine present).
    pub fn heard(&self, machine: &str) -> Result<(), Full> {
        let mut heard = self.table();
        if let Some(known) = heard.get_mut(machine) {
            known.at = Instant::now();
            return Ok(());
        }
        if heard.len() >= MOST_AGENTS {
            return Err(Full);
        }
        heard.insert(machine.to_string(), Heard { at: Instant::now(), open_polls: 0 });
        Ok(())
    }

    /// `machine` opens a long poll: it is present until the poll ends, and from then as
    /// [`OpenPoll`] says. (Its request was heard already, so it is known.)
    pub fn poll_opened(self: &Arc<Self>, machine: &str) -> OpenPoll {
        if let Some(known) = self.table().get_mut(machine) {
            known.open_polls += 1;
        }
        OpenPoll { presence: self.clone(), machine: machine.to_string(), heard: None }
    }

    /// A poll of `machine` ended, its agent heard last at `heard` (`None`: cut off, so
    /// [`AgentPresence::cut_off_slack`] ago).
    fn poll_closed(&self, machine: &str, heard: Option<Instant>) {
        if let Some(known) = self.table().get_mut(machine) {
            known.open_polls = known.open_polls.saturating_sub(1);
            let now = Instant::now();
            let heard = heard.unwrap_or_else(|| now.checked_sub(self.cut_off_slack()).unwrap_or(now));
            known.at = heard.min(now).max(known.at);
        }
    }

    /// Whether `machine` is a pull agent this manager hears from.
    pub fn knows(&self, machine: &str) -> bool {
        self.table().contains_key(machine)
    }

    /// How many pull agents this manager hears from.
    pub fn count(&self) -> usize {
        self.table().len()
    }

    /// Forgets `machine` (it left cleanly).
    pub fn forget(&self, machine: &str) {
        self.table().remove(machine);
    }

    /// The machines not heard from for `agent_ttl` and holding no poll open: lost, and
    /// forgotten as they are returned.
    pub fn take_lost(&self) -> Vec<String> {
        self.take_silent(self.ttl)
    }

    /// The machines not heard from for `ttl`, forgotten as they are returned.
    fn take_silent(&self, ttl: Duration) -> Vec<String> {
        let mut heard = self.table();
        let silent: Vec<String> = heard
            .iter()
            .filter(|(_, known)| known.open_polls == 0 && known.at.elapsed() >= ttl)
            .map(|(machine, _)| machine.clone())
            .collect();
        for machine in &silent {
            heard.remove(machine);
        }
        silent
    }
}

/// A long poll or a change stream held open: its agent is present until it ends. Answered,
/// the agent was heard then; ended at a known last sign of life, then; dropped otherwise (its
/// connection closed), it was heard last [`AgentPresence::cut_off_slack`] before.
pub struct OpenPoll {
    presence: Arc<AgentPresence>,
    machine: String,
    heard: Option<Instant>,
}

impl OpenPoll {
    pub fn answered(self) {
        self.last_heard(Instant::now());
    }

    /// Ends the poll, its agent heard last at `at`.
    pub fn last_heard(mut self, at: Instant) {
        self.heard = Some(at);
    }
}

impl Drop for OpenPoll {
    fn drop(&mut self) {
        self.presence.poll_closed(&self.machine, self.heard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_machines_are_returned_once() {
        let presence = AgentPresence::default();
        presence.heard("a").unwrap();
        presence.heard("b").unwrap();
        presence.forget("b");
        assert!(presence.take_silent(Duration::from_secs(60)).is_empty());
        assert_eq!(presence.take_silent(Duration::ZERO), vec!["a".to_string()]);
        assert!(presence.take_silent(Duration::ZERO).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_poll_keeps_its_agent_present_and_a_cut_off_one_dates_back() {
        let presence = Arc::new(AgentPresence::new(Duration::from_secs(40)));
        presence.heard("a").unwrap();
        presence.heard("b").unwrap();
        let poll_a = presence.poll_opened("a");
        let poll_b = presence.poll_opened("b");
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(presence.take_lost().is_empty(), "polls open for minutes keep their agents");
        poll_a.answered();
        drop(poll_b);
        // Answered: heard now. Cut off: heard 30 s ago (a keepalive of 20 s, its answer's 10 s).
        assert_eq!(presence.cut_off_slack(), Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(presence.take_lost().is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(presence.take_lost(), vec!["b".to_string()]);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(presence.take_lost(), vec!["a".to_string()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_ended_at_a_known_sign_of_life_dates_from_it() {
        let presence = Arc::new(AgentPresence::new(Duration::from_secs(40)));
        presence.heard("a").unwrap();
        let poll = presence.poll_opened("a");
        tokio::time::advance(Duration::from_secs(100)).await;
        let beat = Instant::now();
        tokio::time::advance(Duration::from_secs(25)).await;
        poll.last_heard(beat);
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(presence.take_lost().is_empty(), "heard 39 s ago");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(presence.take_lost(), vec!["a".to_string()], "heard 40 s ago: lost");
    }
}
