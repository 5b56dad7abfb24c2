//! Leases: one per machine, carrying its presence and unit states, and one for the engine
//! leader key. A machine's lease is kept alive in the background; if it expires anyway (a
//! partition longer than `agent_ttl`), the machine registers again under a new lease and
//! writes its states again.

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use fleet_core::MachineState;
use fleet_core::backoff::Backoff;

use super::EtcdRegistry;
use super::connection::{Connection, unavailable};
use fleet_registry::codec::encode;
use fleet_registry::{RegistryError, Result};

/// An open keepalive stream for one lease.
pub type Keeper = (LeaseKeeper, LeaseKeepAliveStream);

/// Grants a lease of `ttl` (at least one second).
pub async fn grant(connection: &Connection, ttl: Duration) -> Result<i64> {
    grant_lease(connection, ttl).await.map(|granted| granted.id)
}

/// A lease etcd granted, with the time to live it gave (whole seconds, and no less than its
/// minimum: not always the one asked for).
pub struct GrantedLease {
    pub id: i64,
    pub ttl: Duration,
}

/// Grants a lease of `ttl` (whole seconds, at least one), saying what etcd gave.
pub async fn grant_lease(connection: &Connection, ttl: Duration) -> Result<GrantedLease> {
    let seconds = ttl.as_secs().max(1) as i64;
    let mut client = connection.client();
    let granted = connection.within("lease_grant", connection.timeout, client.lease_grant(seconds, None)).await?;
    let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
    Ok(GrantedLease { id: granted.id(), ttl })
}

pub async fn revoke(connection: &Connection, lease: i64) -> Result<()> {
    revoke_at(connection, lease).await.map(|_| ())
}

/// Revokes `lease`; the revision at which the keys it carried were deleted.
pub async fn revoke_at(connection: &Connection, lease: i64) -> Result<i64> {
    let mut client = connection.client();
    let reply = connection.within("lease_revoke", connection.timeout, client.lease_revoke(lease)).await?;
    Ok(reply.header().map_or(0, |header| header.revision()))
}

/// How soon a first failed renewal is tried again.
pub(super) const RENEWAL_RETRY: Duration = Duration::from_secs(1);

/// A number that differs between machines and moments, to spread retries (not a secret).
pub(super) fn jitter_sample() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.subsec_nanos())
}

/// The lease recorded in `path` (this fleetd's machine lease, or a manager's agents' lease),
/// if the file holds one; a symbolic link there is not followed.
pub(super) fn recorded_lease(path: &std::path::Path) -> Option<i64> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut fleet_fs::open_no_follow(path).ok()?, &mut text).ok()?;
    text.trim().parse::<i64>().ok()
}

/// How long a renewal of a lease that lives `ttl` waits for etcd's answer: the request
/// timeout, but no more than a quarter of the lease's life, so that a renewal stalled on one
/// connection (a lost packet's retransmissions on a lossy link) leaves time for others
/// before the lease ends.
pub(super) fn renewal_patience(request_timeout: Duration, ttl: Duration) -> Duration {
    request_timeout.min(ttl / 4)
}

/// Renews `lease` once, waiting at most `patience` for etcd's answer; `false` when etcd says
/// it has expired. A renewal that got no answer drops its stream: the next one opens another,
/// which need not wait behind what stalled this one.
pub async fn renew(
    connection: &Connection,
    lease: i64,
    keeper: &mut Option<Keeper>,
    patience: Duration,
) -> Result<bool> {
    if keeper.as_ref().is_none_or(|(open, _)| open.id() != lease) {
        // Opening the stream renews once and reads etcd's answer itself.
        let mut client = connection.client();
        let call = async {
            match client.lease_keep_alive(lease).await {
                Ok(opened) => Ok(Some(opened)),
                Err(etcd_client::Error::LeaseKeepAliveError(message)) if message.contains("not found") => Ok(None),
                Err(error) => Err(error),
            }
        };
        return match connection.within("lease_keepalive", patience, call).await? {
            Some(opened) => {
                *keeper = Some(opened);
                Ok(true)
            }
            None => Ok(false),
        };
    }
    let Some((sender, replies)) = keeper.as_mut() else {
        return Err(unavailable("no keepalive stream"));
    };
    let answer = async {
        sender.keep_alive().await?;
        replies.message().await
    };
    match connection.within("lease_keepalive", patience, answer).await {
        Ok(Some(reply)) => Ok(reply.ttl() > 0),
        Ok(None) => {
            *keeper = None;
            Err(unavailable("etcd closed the keepalive stream"))
        }
        Err(error) => {
            *keeper = None;
            Err(error)
        }
    }
}

/// A registered machine: its lease, and what it wrote under it.
pub struct MachineSession {
    pub machine: Mutex<MachineState>,
    lease: AtomicI64,
    /// The states this machine reported (key → encoded state), to write again under a new lease.
    pub states: Mutex<BTreeMap<String, Vec<u8>>>,
    /// The states it had reported when its lease expired, not written again yet: only those
    /// of units still here are, once its copy of its work has caught up with its return (the
    /// engine may have moved the others meanwhile, and their states would show them twice).
    pub to_restore: Mutex<BTreeMap<String, Vec<u8>>>,
    keepalive: Mutex<Option<tokio::task::AbortHandle>>,
    /// When the last renewal that succeeded was sent: the lease lives at least `agent_ttl`
    /// from then (etcd started counting when it received it, later).
    renewed: Mutex<tokio::time::Instant>,
    /// Whether this is this fleetd's own machine (whose lease is recorded in the lease file),
    /// rather than a pull agent's that this fleetd holds as its manager.
    own: bool,
    /// The store revision at which the machine registered again after its lease expired (0:
    /// it never did; [`LAPSED`] while it has not yet). Its work is read only from a copy
    /// whose every range has seen that revision: an older copy may still hold units the
    /// engine moved away while the lease was gone.
    rejoined_at: AtomicI64,
}

/// [`MachineSession::rejoined_at`] from the moment etcd says the lease expired until the
/// machine has registered again: no copy is current since then.
const LAPSED: i64 = i64::MAX;

impl MachineSession {
    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::SeqCst)
    }

    pub fn rejoined_at(&self) -> i64 {
        self.rejoined_at.load(Ordering::SeqCst)
    }

    /// As if the machine registered again at `revision`.
    #[cfg(test)]
    pub fn note_rejoined_at(&self, revision: i64) {
        self.rejoined_at.store(revision, Ordering::SeqCst);
    }

    /// Whether this is this fleetd's own machine rather than a pull agent's.
    pub fn own(&self) -> bool {
        self.own
    }

    pub fn machine_id(&self) -> String {
        self.machine.locked().id.clone()
    }

    /// Notes that etcd said the lease expired: no copy shows what is still this machine's
    /// until it has registered again. `false` if that was noted already.
    pub fn mark_lapsed(&self) -> bool {
        self.rejoined_at.swap(LAPSED, Ordering::SeqCst) != LAPSED
    }

    /// When the last renewal that succeeded was sent.
    pub fn renewed(&self) -> tokio::time::Instant {
        *self.renewed.locked()
    }

    fn mark_renewed(&self, sent: tokio::time::Instant) {
        *self.renewed.locked() = sent;
    }

    pub fn stop_keepalive(&self) {
        if let Some(task) = self.keepalive.locked().take() {
            task.abort();
        }
    }
}

impl EtcdRegistry {
    /// Writes the machine's presence under `lease` if no live fleetd holds its ID.
    /// Writes the machine's presence under `lease` if no one holds it; the revision it was
    /// written at.
    async fn claim_presence(&self, machine: &MachineState, lease: i64, own: bool) -> Result<i64> {
        let key = self.keys().machine(&machine.id);
        let mut writes = vec![TxnOp::put(key.as_str(), encode(machine), Some(PutOptions::new().with_lease(lease)))];
        if own {
            writes.push(self.member_binding(&machine.id));
        }
        let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then(writes);
        let reply = self.connection().txn(txn).await?;
        if reply.succeeded() {
            Ok(reply.header().map_or(0, |header| header.revision()))
        } else {
            Err(RegistryError::MachineInUse { machine_id: machine.id.clone() })
        }
    }

    /// A lease of this fleetd's that the machine's presence still hangs on, with the
    /// presence's creation revision: the one a previous fleetd on this machine recorded (it
    /// died and its lease lives on), or one whose claim got no answer but landed.
    async fn own_live_lease(&self, machine: &MachineState) -> Result<Option<(i64, i64)>> {
        let recorded = self.inner.lease_file.as_ref().and_then(|path| recorded_lease(path));
        let unconfirmed = self.unconfirmed_claim(&machine.id);
        if recorded.is_none() && unconfirmed.is_none() {
            return Ok(None);
        }
        let reply = self.connection().get(&self.keys().machine(&machine.id), None).await?;
        let held = reply.kvs().first().filter(|kv| Some(kv.lease()) == recorded || Some(kv.lease()) == unconfirmed);
        Ok(held.map(|kv| (kv.lease(), kv.create_revision())))
    }

    pub(super) fn unconfirmed_claim(&self, machine_id: &str) -> Option<i64> {
        self.inner.unconfirmed_claims.locked().get(machine_id).copied()
    }

    /// Notes that the claim under `lease` got no answer (`Some`), or that the machine's
    /// presence is settled (`None`).
    pub(super) fn note_unconfirmed_claim(&self, machine_id: &str, lease: Option<i64>) {
        let mut claims = self.inner.unconfirmed_claims.locked();
        match lease {
            Some(lease) => claims.insert(machine_id.to_string(), lease),
            None => claims.remove(machine_id),
        };
    }

    /// Claims the machine's presence under a new lease; the lease and the revision the
    /// presence was written at. A claim refused is given up (its lease revoked); one that got
    /// no answer may have landed, so its lease is kept for the next attempt to take over.
    /// With `own` (this fleetd's own machine, not a pull agent's) the lease is recorded before
    /// the claim is sent: a fleetd killed while its claim lands takes that presence back when
    /// it starts again, instead of being refused as a duplicate of itself until it expires.
    /// A pull agent's presence is claimed under the manager's lease for its agents
    /// ([`EtcdRegistry::agent_lease`]), which a refusal leaves alone.
    pub(super) async fn claim_new_presence(&self, machine: &MachineState, own: bool) -> Result<(i64, i64)> {
        let lease = match own {
            true => grant(self.connection(), self.inner.lifetimes.agent_ttl).await?,
            false => self.agent_lease().await?,
        };
        if own {
            self.record_lease(Some(lease));
        }
        match self.claim_presence(machine, lease, own).await {
            Ok(revision) => Ok((lease, revision)),
            Err(error) => {
                match error {
                    RegistryError::Unavailable(_) => self.note_unconfirmed_claim(&machine.id, Some(lease)),
                    _ if own => {
                        let _ = revoke(self.connection(), lease).await;
                    }
                    _ => {}
                }
                Err(error)
            }
        }
    }

    fn record_lease(&self, lease: Option<i64>) {
        let Some(path) = &self.inner.lease_file else { return };
        let result = match lease {
            Some(lease) => fleet_fs::write_private(path, lease.to_string().as_bytes()),
            None => std::fs::remove_file(path).or_else(|error| match error.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(error),
            }),
        };
        if let Err(error) = result {
            tracing::warn!(path = %path.display(), %error, "cannot record the machine lease");
        }
    }

    /// Starts a session for `machine`: a new lease and the presence (or the lease a crashed
    /// predecessor on this machine left alive), and the keepalive.
    pub(super) async fn open_session(&self, machine: &MachineState) -> Result<()> {
        // Thousands of machines registering at once keep etcd behind in applying, and etcd
        // then refuses every lease renewal, the engine's among them: a registration waits.
        self.wait_while_etcd_is_behind().await;
        let sent = tokio::time::Instant::now();
        let taken_over = match self.own_live_lease(machine).await? {
            Some((lease, _)) => {
                tracing::info!(lease, "taking over the machine lease this fleetd holds already");
                let key = self.keys().machine(&machine.id);
                let put = TxnOp::put(key.as_str(), encode(machine), Some(PutOptions::new().with_lease(lease)));
                // The dead fleetd's reports go with it: a unit it reported that no longer runs
                // (stopped by its keeper meanwhile) would otherwise show running here for as
                // long as the lease lives, and the engine waits for this machine to stop what
                // it took off it. The new agent reports what it holds on its first pass.
                let states = self.keys().state(&machine.id, "");
                let reports = TxnOp::delete(states.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix()));
                let still_ours = Compare::lease(key.as_str(), CompareOp::Equal, lease);
                let binding = self.member_binding(&machine.id);
                let held = self
                    .connection()
                    .txn(Txn::new().when([still_ours]).and_then([put, reports, binding]))
                    .await?
                    .succeeded();
                // The lease can expire between the read and the write: then the presence is
                // claimed afresh below, which refuses only if another fleetd holds it.
                held.then_some(lease)
            }
            None => None,
        };
        let (lease, renewed, claimed_at) = match taken_over {
            // A lease found alive may be about to expire (its last renewal was the dead
            // fleetd's): it counts as renewed only from a renewal of this fleetd's.
            Some(lease) => {
                let sent = tokio::time::Instant::now();
                if !renew(self.connection(), lease, &mut None, self.connection().timeout).await? {
                    return Err(RegistryError::unavailable("etcd", "the machine lease expired as it was taken over"));
                }
                (lease, sent, 0)
            }
            // A new presence: whatever still runs here from before (a fleetd that died and
            // stayed away past its lease) may have been placed elsewhere meanwhile, so the
            // work is read only from a copy that has seen this claim, as after a lapse.
            None => {
                self.stopped_before_fresh_claim(&machine.id).await?;
                let (lease, revision) = self.claim_new_presence(machine, true).await?;
                (lease, sent, revision)
            }
        };
        self.note_unconfirmed_claim(&machine.id, None);
        self.record_lease(Some(lease));
        self.start_session(machine, lease, BTreeMap::new(), true, renewed);
        if let Some(session) = self.session(&machine.id) {
            session.rejoined_at.store(claimed_at, Ordering::SeqCst);
        }
        if claimed_at > 0 {
            // A copy listed before the claim sees no event in its idle ranges after it (etcd
            // sends progress notices rarely): a fresh listing is current since the claim.
            self.work_mirror(&machine.id).relist();
            self.wake_agent(&machine.id);
        }
        Ok(())
    }

    /// Binds `machine_id` to this store member unless something holds it already: a member's
    /// ID stays its own while it is away, and no pull agent joins as it until an administrator
    /// revokes and forgets it (`machine_identity::admit_join`). A nested transaction of the
    /// claim of the member's presence, so that registering costs etcd one write besides the
    /// lease (two before, and 10,000 machines registered in 7.8 s); the join's own transaction
    /// compares the binding's revision, so a join and this binding cannot both win.
    fn member_binding(&self, machine_id: &str) -> TxnOp {
        let key = self.keys().identity(machine_id);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
        let binding = encode(&fleet_registry::MachineIdentity::member(machine_id, now));
        let unbound = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
        TxnOp::txn(Txn::new().when([unbound]).and_then([TxnOp::put(key.as_str(), binding, None)]))
    }

    /// Before a fresh presence claim, the machine's agent stops what runs there (it may have
    /// moved while the machine was away): the first attempt signals a lapse and is refused
    /// with [`RegistryError::PresenceLapsed`]; once the agent said it stopped its units, the
    /// claim goes ahead. Without an agent following the lapses, it goes ahead at once.
    async fn stopped_before_fresh_claim(&self, machine_id: &str) -> Result<()> {
        let signal = self.lapse_signal(machine_id);
        if signal.receiver_count() == 0 {
            return Ok(());
        }
        // Asked already: the claim goes ahead once the agent said it stopped (the claim's own
        // compare refuses a presence another fleetd took meanwhile), so only the first
        // attempt reads the presence.
        if let Some(asked) = self.lapse_asked(machine_id) {
            return asked;
        }
        // Another fleetd's live presence is refused first: nothing here is stopped for it.
        let held = self.connection().get(&self.keys().machine(machine_id), None).await?;
        if !held.kvs().is_empty() {
            return Err(RegistryError::MachineInUse { machine_id: machine_id.to_string() });
        }
        let mut asked = self.inner.claim_lapses.locked();
        if !asked.contains_key(machine_id) {
            signal.send_modify(|lapses| *lapses += 1);
            asked.insert(machine_id.to_string(), *signal.borrow());
        }
        Err(RegistryError::PresenceLapsed)
    }

    /// Where a lapse was signalled before a fresh claim: `Ok` (and forgotten) once the agent
    /// handled it, `PresenceLapsed` until then; `None` when none was.
    fn lapse_asked(&self, machine_id: &str) -> Option<Result<()>> {
        let handled = *self.lapse_ack(machine_id).borrow();
        let mut asked = self.inner.claim_lapses.locked();
        match asked.get(machine_id) {
            Some(lapse) if handled >= *lapse => {
                asked.remove(machine_id);
                Some(Ok(()))
            }
            Some(_) => Some(Err(RegistryError::PresenceLapsed)),
            None => None,
        }
    }

    /// Records `machine`'s session under `lease`, kept alive from now on: by a keepalive of its
    /// own for this fleetd's machine (`own`), by the agents' lease for a pull agent's.
    /// `renewed`: when the request that granted or last renewed the lease was sent.
    pub(super) fn start_session(
        &self,
        machine: &MachineState,
        lease: i64,
        states: BTreeMap<String, Vec<u8>>,
        own: bool,
        renewed: tokio::time::Instant,
    ) {
        let session = Arc::new(MachineSession {
            machine: Mutex::new(machine.clone()),
            lease: AtomicI64::new(lease),
            states: Mutex::new(states),
            to_restore: Mutex::new(BTreeMap::new()),
            keepalive: Mutex::new(None),
            renewed: Mutex::new(renewed),
            own,
            rejoined_at: AtomicI64::new(0),
        });
        if own {
            let task = tokio::spawn(self.clone().keep_alive(session.clone())).abort_handle();
            *session.keepalive.locked() = Some(task);
        }
        let previous = self.inner.sessions.locked().insert(machine.id.clone(), session);
        if let Some(previous) = previous {
            previous.stop_keepalive();
        }
    }

    /// Stops renewing `machine_id`'s presence and forgets it, as when its fleetd dies: its
    /// lease expires after `agent_ttl` and the engine moves its units. (The benchmarks lose
    /// simulated machines this way; their agents must be stopped first.)
    pub fn abandon_machine(&self, machine_id: &str) {
        if let Some(session) = self.take_session(machine_id) {
            session.stop_keepalive();
        }
    }

    pub(super) fn session(&self, machine_id: &str) -> Option<Arc<MachineSession>> {
        self.inner.sessions.locked().get(machine_id).cloned()
    }

    pub(super) fn take_session(&self, machine_id: &str) -> Option<Arc<MachineSession>> {
        self.inner.sessions.locked().remove(machine_id)
    }

    /// Forgets `session` if it is still `machine_id`'s (not replaced meanwhile).
    pub(super) fn forget_session(&self, machine_id: &str, session: &Arc<MachineSession>) {
        let mut sessions = self.inner.sessions.locked();
        if sessions.get(machine_id).is_some_and(|held| Arc::ptr_eq(held, session)) {
            sessions.remove(machine_id);
        }
    }

    /// Renews the machine's lease every half of `agent_ttl`, as the original fleet beats its
    /// heart; registers again if it expired.
    ///
    /// Every renewal costs etcd 3.4 a copy of its uncommitted writes (the answer's header
    /// reads the current revision through a new read view), and at 10,000 machines the
    /// renewals are a sixth of etcd's work: a third of `agent_ttl` would cost half as much
    /// again. The half left is spent on retries: a failed renewal is tried again within a
    /// second, then less and less often (up to a quarter of `agent_ttl`, jittered), so three
    /// or four attempts fit before the lease would expire; an etcd busy applying writes
    /// refuses renewals for a while. A failed registration after an expiry backs off further
    /// (up to a third of `agent_ttl`): thousands of machines registering again every second
    /// would keep that etcd busy.
    async fn keep_alive(self, session: Arc<MachineSession>) {
        let agent_ttl = self.inner.lifetimes.agent_ttl;
        let period = agent_ttl / 2;
        let mut keeper = None;
        let mut renewal_retry = Backoff::new(RENEWAL_RETRY.min(agent_ttl / 4), agent_ttl / 4);
        let mut rejoin_retry = Backoff::new(RENEWAL_RETRY.min(agent_ttl / 3), agent_ttl / 3);
        let patience = renewal_patience(self.connection().timeout, agent_ttl);
        let mut wait = period;
        loop {
            tokio::time::sleep(wait).await;
            let lease = session.lease();
            let sent = tokio::time::Instant::now();
            wait = match renew(self.connection(), lease, &mut keeper, patience).await {
                Ok(true) => {
                    session.mark_renewed(sent);
                    renewal_retry.reset();
                    rejoin_retry.reset();
                    period
                }
                Ok(false) => {
                    let machine_id = session.machine_id();
                    if session.mark_lapsed() {
                        tracing::warn!(machine_id, "machine lease expired; registering again");
                        // From now on no copy shows what is still this machine's: its agent
                        // is told at once, whatever its backoff, and stops what it runs.
                        self.wake_agent(&machine_id);
                        self.lapse_signal(&machine_id).send_modify(|lapses| *lapses += 1);
                    }
                    self.lapse_handled(&machine_id).await;
                    match self.reopen(&session).await {
                        Ok(()) => {
                            renewal_retry.reset();
                            rejoin_retry.reset();
                            period
                        }
                        Err(error) => {
                            tracing::warn!(%error, "registering again failed; retrying");
                            rejoin_retry.next_delay_jittered(jitter_sample())
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot renew the machine lease; retrying");
                    renewal_retry.next_delay_jittered(jitter_sample())
                }
            };
        }
    }

    /// Returns once the machine's agent has stopped what ran there after its last lapse, or
    /// at once when no agent follows the lapses. Registering again first would make the
    /// machine present in etcd's view while units the engine may have moved elsewhere still
    /// run on it (a fleetd frozen between the two would run them twice for the freeze).
    async fn lapse_handled(&self, machine_id: &str) {
        let signal = self.lapse_signal(machine_id);
        let lapses = *signal.borrow();
        let mut acks = self.lapse_ack(machine_id).subscribe();
        tokio::select! {
            _ = acks.wait_for(|handled| *handled >= lapses) => {}
            () = signal.closed() => {}
        }
    }

    /// A new lease for a session whose lease expired: the presence written again, and the
    /// states kept to be written once the machine's copy of its work shows which units are
    /// still its own ([`EtcdRegistry::restore_states`]). The presence does not count as renewed until the new lease is (the next keepalive):
    /// meanwhile an agent that stops its units when cut off stops them, since the engine may
    /// have placed them elsewhere while the lease was gone (a fleetd frozen past its lease
    /// would otherwise wake, re-register at once, and never see the lapse). And the machine's
    /// work is read only from a copy that has seen the new presence ([`MachineSession::rejoined_at`]).
    pub(super) async fn reopen(&self, session: &MachineSession) -> Result<()> {
        // Leases lapse in numbers when etcd is overloaded: their registrations wait rather than
        // keep it so.
        self.wait_while_etcd_is_behind().await;
        let machine = session.machine.locked().clone();
        // A claim of an earlier attempt that got no answer may have landed: it is this one.
        let landed = match self.unconfirmed_claim(&machine.id) {
            Some(_) => self.own_live_lease(&machine).await?.filter(|(lease, _)| *lease != session.lease()),
            None => None,
        };
        let (lease, rejoined_at) = match landed {
            Some(claimed) => claimed,
            None => self.claim_new_presence(&machine, session.own).await?,
        };
        self.note_unconfirmed_claim(&machine.id, None);
        {
            let mut recorded = session.states.locked();
            let mut to_restore = session.to_restore.locked();
            to_restore.append(&mut recorded);
        }
        session.lease.store(lease, Ordering::SeqCst);
        session.rejoined_at.store(rejoined_at, Ordering::SeqCst);
        // The engine may have moved this machine's units while the lease was gone, and the
        // watch that would say so can lag behind (it may hang on a member that lost its
        // leader while other members answered the registration): a fresh listing is read
        // through a member that answers, and wakes the agent.
        self.work_mirror(&machine.id).relist();
        self.wake_agent(&machine.id);
        if session.own {
            self.record_lease(Some(lease));
        }
        Ok(())
    }

    /// Ends a session: the presence and every unit state go, at once (with the lease, for
    /// this fleetd's own machine).
    pub(super) async fn close_session(&self, session: &MachineSession) -> Result<()> {
        if !session.own {
            return self.give_up_agent(session).await;
        }
        session.stop_keepalive();
        let revision = revoke_at(self.connection(), session.lease()).await?;
        // The presence went with the lease: this fleetd's lists wait until they show it gone.
        let presence = self.keys().machine(&session.machine.locked().id);
        self.wrote_at(revision, std::iter::once(presence.as_str()));
        self.record_lease(None);
        Ok(())
    }
}
