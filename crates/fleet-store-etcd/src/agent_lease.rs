//! The one lease a manager holds its pull agents' presences under. An etcd machine keeps its
//! own lease alive; a pull agent has no store connection, and its manager used to keep a
//! lease alive for each one: at 10,000 agents, 10,000 keepalive streams and a renewal every
//! millisecond or so, for agents that did nothing. Now every agent a manager holds hangs on
//! one lease of that manager's, renewed like any other (every half of `agent_ttl`): the store's
//! idle work grows with the number of managers, not of agents.
//!
//! - An agent silent for `agent_ttl` is given up by deleting its presence and states, on the
//!   condition that they still hang on this manager's lease: another manager may hold them
//!   by now ([`EtcdRegistry::give_up_agent`]).
//! - A manager that dies leaves its agents' presences until its lease expires, `agent_ttl`
//!   after its last renewal: an agent that reconnects to another manager meanwhile is taken
//!   over there (its presence and states moved under that manager's lease) and never leaves
//!   the cluster, so its units do not move.
//! - A manager restarted while its lease lives (it records the lease in its state directory)
//!   holds its agents on that lease again: their presences and states stay as they were, an
//!   agent announcing itself again costs the store no write, and one that does not come back
//!   within `agent_ttl` is given up.
//! - A manager cut off from etcd past `agent_ttl` loses the lease and every presence with it:
//!   it claims each agent it still holds again under a new lease, as an etcd machine does
//!   after a lapse ([`EtcdRegistry::reclaim_agents`]); one that another manager took
//!   meanwhile is let go.

use fleet_core::unpoisoned::Locked;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use fleet_core::backoff::Backoff;

use super::EtcdRegistry;
use super::session::{MachineSession, RENEWAL_RETRY, grant, renew, renewal_patience};
use fleet_registry::{RegistryError, Result};

/// The manager's lease for its pull agents, granted on the first agent it holds.
#[derive(Default)]
pub struct AgentLease {
    /// The lease now; 0 before the first grant and while a new one is due.
    lease: AtomicI64,
    /// When the last renewal that succeeded (or the grant) was sent.
    renewed: Mutex<Option<tokio::time::Instant>>,
    /// One grant at a time: a thousand agents joining together share one lease.
    granting: tokio::sync::Mutex<()>,
    keepalive: Mutex<Option<tokio::task::AbortHandle>>,
    /// Wakes the keepalive before its time: a write found the lease gone.
    wake: Arc<tokio::sync::Notify>,
}

impl AgentLease {
    fn current(&self) -> i64 {
        self.lease.load(Ordering::SeqCst)
    }

    /// When the renewal that keeps `lease` was last sent, if `lease` is the one held now.
    pub fn renewed(&self, lease: i64) -> Option<tokio::time::Instant> {
        if lease == 0 || lease != self.current() {
            return None;
        }
        *self.renewed.locked()
    }

    fn mark_renewed(&self, sent: tokio::time::Instant) {
        *self.renewed.locked() = Some(sent);
    }

    /// `lease` expired: no lease is held until the next grant. Whether it was the one held.
    fn forget(&self, lease: i64) -> bool {
        lease != 0 && self.lease.compare_exchange(lease, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// etcd answered a write under `lease` that it has no such lease (it expired while etcd
    /// refused the renewals, too busy to apply them): no lease is held until the next grant,
    /// and the keepalive claims the agents that hung on it again now, not at its next turn.
    fn lost(&self, lease: i64) {
        if self.forget(lease) {
            tracing::warn!(lease, "the pull agents' lease is gone from etcd; claiming them again under a new one");
            self.wake.notify_one();
        }
    }

    /// Stops renewing (the manager dies, for the tests): the lease expires after `agent_ttl`.
    pub fn stop_keepalive(&self) {
        if let Some(task) = self.keepalive.locked().take() {
            task.abort();
        }
    }
}

impl Drop for AgentLease {
    fn drop(&mut self) {
        self.stop_keepalive();
    }
}

impl EtcdRegistry {
    /// The lease pull agents' presences hang on, granted (and kept alive from then on) if
    /// there is none.
    pub(super) async fn agent_lease(&self) -> Result<i64> {
        let shared = &self.inner.agent_lease;
        let held = shared.current();
        if held != 0 {
            return Ok(held);
        }
        let _granting = shared.granting.lock().await;
        let held = shared.current();
        if held != 0 {
            return Ok(held);
        }
        let sent = tokio::time::Instant::now();
        let lease = match self.recorded_agent_lease().await {
            Some(lease) => {
                tracing::info!(
                    lease,
                    "holding pull agents' presences under the lease held before this manager restarted"
                );
                self.give_up_agents_not_back(lease);
                lease
            }
            None => {
                let lease = grant(self.connection(), self.inner.lifetimes.agent_ttl).await?;
                self.record_agent_lease(lease);
                tracing::info!(lease, "holding pull agents' presences under a new lease");
                lease
            }
        };
        shared.mark_renewed(sent);
        shared.lease.store(lease, Ordering::SeqCst);
        self.keep_agent_lease_alive();
        Ok(lease)
    }

    /// The agents' lease this manager recorded, if etcd still holds it (renewed now): a
    /// manager restarted within `agent_ttl` finds its agents' presences and states on it.
    async fn recorded_agent_lease(&self) -> Option<i64> {
        let path = self.inner.agent_lease_file.as_ref()?;
        let lease = super::session::recorded_lease(path)?;
        match renew(self.connection(), lease, &mut None, self.connection().timeout).await {
            Ok(true) => Some(lease),
            Ok(false) => None,
            Err(error) => {
                tracing::info!(%error, lease, "cannot renew the pull agents' lease recorded before; granting another");
                None
            }
        }
    }

    fn record_agent_lease(&self, lease: i64) {
        let Some(path) = &self.inner.agent_lease_file else { return };
        if let Err(error) = fleet_fs::write_private(path, lease.to_string().as_bytes()) {
            tracing::warn!(path = %path.display(), %error, "cannot record the pull agents' lease");
        }
    }

    /// An agent whose presence hangs on a `lease` taken over from this manager's previous
    /// life and that has not announced itself here within `agent_ttl` is given up, as an agent
    /// silent that long is (another manager that holds it now keeps it).
    fn give_up_agents_not_back(&self, lease: i64) {
        let registry = Arc::downgrade(&self.inner);
        let agent_ttl = self.inner.lifetimes.agent_ttl;
        tokio::spawn(async move {
            tokio::time::sleep(agent_ttl).await;
            let Some(inner) = registry.upgrade() else { return };
            let registry = EtcdRegistry { inner };
            if let Err(error) = registry.give_up_presences_not_back(lease).await {
                tracing::warn!(%error, "cannot give up the pull agents that did not come back after a restart");
            }
        });
    }

    async fn give_up_presences_not_back(&self, lease: i64) -> Result<()> {
        let machines = self.keys().machines();
        let options = etcd_client::GetOptions::new().with_prefix().with_keys_only();
        let reply = self.connection().get(&machines, Some(options)).await?;
        let not_back: Vec<String> = reply
            .kvs()
            .iter()
            .filter(|kv| kv.lease() == lease)
            .filter_map(|kv| self.keys().name_in(&machines, &String::from_utf8_lossy(kv.key())).map(str::to_string))
            .filter(|id| self.session(id).is_none())
            .collect();
        if !not_back.is_empty() {
            tracing::info!(agents = not_back.len(), "giving up pull agents that did not come back after a restart");
        }
        for machine_id in not_back {
            self.delete_presence_held_by(&machine_id, lease).await?;
        }
        Ok(())
    }

    /// Starts the agents' lease keepalive if it is not running. The task holds the registry
    /// only weakly: it ends when the registry is dropped.
    fn keep_agent_lease_alive(&self) {
        let mut keepalive = self.inner.agent_lease.keepalive.locked();
        if keepalive.is_none() {
            let registry = Arc::downgrade(&self.inner);
            let wake = self.inner.agent_lease.wake.clone();
            let task = keep_agents_alive(registry, self.inner.lifetimes.agent_ttl, wake);
            *keepalive = Some(tokio::spawn(task).abort_handle());
        }
    }

    /// The pull agents this manager holds whose presence does not hang on the live lease
    /// (it expired): gone from the cluster's view, each is claimed again under a new lease
    /// (its agent is told its presence lapsed meanwhile); one whose presence another manager
    /// holds now is let go. What fails is tried again on the next call.
    pub(super) async fn reclaim_agents(&self) -> Result<()> {
        let live = self.inner.agent_lease.current();
        let lapsed: Vec<Arc<MachineSession>> = {
            let sessions = self.inner.sessions.locked();
            sessions.values().filter(|session| !session.own() && session.lease() != live).cloned().collect()
        };
        if lapsed.is_empty() {
            return Ok(());
        }
        tracing::warn!(agents = lapsed.len(), "pull agents' presences expired with their lease; claiming them again");
        for session in &lapsed {
            if session.mark_lapsed() {
                self.wake_agent(&session.machine_id());
            }
        }
        let mut failed = None;
        for session in lapsed {
            let machine_id = session.machine_id();
            match self.reopen(&session).await {
                Ok(()) => {}
                Err(RegistryError::MachineInUse { .. }) => {
                    tracing::info!(machine_id, "another manager holds this pull agent now; letting it go");
                    self.forget_session(&machine_id, &session);
                }
                Err(error) => failed = Some(error),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// A pull agent this manager holds reads its work here, but its presence hangs on another
    /// manager's lease: that manager wrote it after the agent left it (an announcement that
    /// reached it late), and would give it up once the agent has been silent there for
    /// `agent_ttl`, taking the machine out of the cluster. The agent talks to this manager,
    /// so this manager takes its presence back first.
    pub(super) async fn hold_agent_talking_here(&self, machine_id: &str) -> Result<()> {
        let Some(session) = self.session(machine_id).filter(|session| !session.own()) else { return Ok(()) };
        match self.presence_lease_in_copy(machine_id) {
            Some(lease) if lease != session.lease() && session.lease() == self.inner.agent_lease.current() => {
                tracing::info!(machine_id, "another manager wrote this pull agent's presence since; taking it back");
                let machine = session.machine.locked().clone();
                self.take_over_session(&machine).await
            }
            _ => Ok(()),
        }
    }

    /// Gives up a pull agent's presence and states, if they still hang on this manager's
    /// lease: the cluster treats it as a lost machine. Another manager that holds it now
    /// keeps it.
    pub(super) async fn give_up_agent(&self, session: &MachineSession) -> Result<()> {
        let machine_id = session.machine_id();
        // The copy shows it under another lease: no write (a transaction that compares and
        // does nothing is still one etcd must agree on). The copy may lag; the compare below
        // does not.
        let ours = self.presence_lease_in_copy(&machine_id).is_none_or(|lease| lease == session.lease())
            && self.delete_presence_held_by(&machine_id, session.lease()).await?;
        if !ours {
            tracing::info!(machine_id, "another manager holds this pull agent's presence; leaving it");
        }
        Ok(())
    }

    /// Deletes `machine_id`'s presence and states if the presence hangs on `lease`; whether it
    /// did.
    async fn delete_presence_held_by(&self, machine_id: &str, lease: i64) -> Result<bool> {
        let keys = self.keys();
        let (machine_key, states) = (keys.machine(machine_id), keys.state(machine_id, ""));
        let held = Compare::lease(machine_key.as_str(), CompareOp::Equal, lease);
        let delete = [
            TxnOp::delete(machine_key.as_str(), None),
            TxnOp::delete(states.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix())),
        ];
        Ok(self.connection().txn(Txn::new().when([held]).and_then(delete)).await?.succeeded())
    }

    /// Whether this manager holds `machine`'s presence as announced already: its session here
    /// hangs on the agents' live lease, and the store holds this very record under that lease
    /// (read, not taken from the copy, which may lag a deletion). An agent that announces
    /// again (a request of its timed out on a loaded manager, say) then costs the store one
    /// read: rewriting its presence and states would move its work signal, wake the leader's
    /// loops that read every machine, and load the store further.
    pub(super) async fn holds_presence_as_announced(&self, machine: &fleet_core::MachineState) -> Result<bool> {
        let Some(session) = self.session(&machine.id).filter(|session| !session.own()) else { return Ok(false) };
        let lease = session.lease();
        if lease == 0 || lease != self.inner.agent_lease.current() {
            return Ok(false);
        }
        if *session.machine.locked() != *machine {
            return Ok(false);
        }
        let reply = self.connection().get(&self.keys().machine(&machine.id), None).await?;
        let encoded = fleet_registry::codec::encode(machine);
        Ok(reply.kvs().first().is_some_and(|kv| kv.lease() == lease && kv.value() == encoded.as_slice()))
    }

    /// `result`, of a write under the agents' `lease`; when etcd says it has no such lease,
    /// the lease is dropped at once ([`AgentLease::lost`]), so that the agents' next
    /// announcements and reports go under a new one instead of failing until the next renewal.
    pub(super) fn noting_agent_lease<T>(&self, lease: i64, result: Result<T>) -> Result<T> {
        if let Err(RegistryError::Unavailable(text)) = &result
            && text.contains(LEASE_NOT_FOUND)
        {
            self.inner.agent_lease.lost(lease);
        }
        result
    }

    /// The lease `machine_id`'s presence hangs on, as this manager's copy shows it.
    fn presence_lease_in_copy(&self, machine_id: &str) -> Option<i64> {
        let key = self.keys().machine(machine_id);
        self.work_mirror(machine_id).read().entries.get(&key).map(|entry| entry.lease)
    }
}

impl EtcdRegistry {
    /// Renews the agents' lease once, and claims again the agents whose presence is not
    /// under the live lease (it expired now or before).
    async fn renew_agent_lease(&self, keeper: &mut Option<super::session::Keeper>) -> Result<()> {
        let shared = &self.inner.agent_lease;
        let lease = shared.current();
        let sent = tokio::time::Instant::now();
        let renewed = match lease {
            0 => false,
            lease => {
                let patience = renewal_patience(self.connection().timeout, self.inner.lifetimes.agent_ttl);
                renew(self.connection(), lease, keeper, patience).await?
            }
        };
        match renewed {
            true => shared.mark_renewed(sent),
            // Gone: the next agent claimed or taken over gets a new one.
            false => {
                shared.forget(lease);
            }
        }
        self.reclaim_agents().await
    }
}

/// etcd's message for a request naming a lease it does not have (expired or revoked).
const LEASE_NOT_FOUND: &str = "requested lease not found";

/// Renews the agents' lease every half of `agent_ttl` while the registry lives, and at once
/// when `wake` says a write found it gone. Failures are tried again within a second, then
/// less often (up to a quarter of `agent_ttl`), as a machine's own lease is.
async fn keep_agents_alive(
    registry: std::sync::Weak<super::Inner>,
    agent_ttl: Duration,
    wake: Arc<tokio::sync::Notify>,
) {
    let period = agent_ttl / 2;
    let mut keeper = None;
    let mut retry = Backoff::new(RENEWAL_RETRY.min(agent_ttl / 4), agent_ttl / 4);
    let mut wait = period;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
        let Some(inner) = registry.upgrade() else { return };
        wait = match (EtcdRegistry { inner }).renew_agent_lease(&mut keeper).await {
            Ok(()) => {
                retry.reset();
                period
            }
            Err(error) => {
                tracing::warn!(%error, "cannot keep the pull agents' presences; retrying");
                retry.next_delay_jittered(super::session::jitter_sample())
            }
        };
    }
}

#[cfg(test)]
pub(crate) mod tests;
