//! When a manager last heard from each pull agent. A pull agent has no lease of its own: its
//! manager holds its presence in the store for it, and gives it up when the agent has been
//! silent for `agent_ttl`, so the cluster treats it as a lost machine exactly like an etcd
//! machine whose lease ran out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The most pull agents one manager holds presence for: beyond it, a new agent is told the
/// manager is full (and tries another) rather than growing the table without bound.
pub const MOST_AGENTS: usize = 250_000;

/// A new agent came to a manager that already holds [`MOST_AGENTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this manager serves {MOST_AGENTS} pull agents already; try another")]
pub struct Full;

pub struct AgentPresence {
    heard: Mutex<HashMap<String, Instant>>,
    /// How long an agent may be silent before it is lost (`agent_ttl`).
    ttl: Duration,
}

impl Default for AgentPresence {
    fn default() -> Self {
        Self::new(Duration::from_secs(30))
    }
}

/// The longest a long poll waits for a change.
const LONGEST_POLL: Duration = Duration::from_secs(25);

impl AgentPresence {
    pub fn new(ttl: Duration) -> Self {
        Self { heard: Mutex::new(HashMap::new()), ttl }
    }

    /// How long a long poll may wait: short enough that an idle agent, which is heard from at
    /// each poll, is heard from three times within `agent_ttl`.
    pub fn poll_wait(&self) -> Duration {
        LONGEST_POLL.min(self.ttl / 3)
    }

    /// Notes a request from `machine` (authenticated by its own certificate: nothing else
    /// may make a machine present).
    pub fn heard(&self, machine: &str) -> Result<(), Full> {
        let mut heard = self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = heard.get_mut(machine) {
            *at = Instant::now();
            return Ok(());
        }
        if heard.len() >= MOST_AGENTS {
            return Err(Full);
        }
        heard.insert(machine.to_string(), Instant::now());
        Ok(())
    }

    /// Whether `machine` is a pull agent this manager hears from.
    pub fn knows(&self, machine: &str) -> bool {
        self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains_key(machine)
    }

    /// How many pull agents this manager hears from.
    pub fn count(&self) -> usize {
        self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// Forgets `machine` (it left cleanly).
    pub fn forget(&self, machine: &str) {
        self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(machine);
    }

    /// The machines not heard from for `agent_ttl`: lost, and forgotten as they are returned.
    pub fn take_lost(&self) -> Vec<String> {
        self.take_silent(self.ttl)
    }

    /// The machines not heard from for `ttl`, forgotten as they are returned.
    fn take_silent(&self, ttl: Duration) -> Vec<String> {
        let mut heard = self.heard.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let silent: Vec<String> =
            heard.iter().filter(|(_, at)| at.elapsed() >= ttl).map(|(machine, _)| machine.clone()).collect();
        for machine in &silent {
            heard.remove(machine);
        }
        silent
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
}
