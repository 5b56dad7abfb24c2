//! One fleetd's connection to the simulated store: the agents' and the engine's facets over
//! the [`World`], and the machine's session (its lease kept alive, registered again when it
//! expired), as `fleet-store-etcd` keeps it: every request waits while the fleetd
//! is frozen, a request that gets no answer fails after the request timeout, a write may
//! commit and still fail for want of an answer, and the machine's work is read from its copy,
//! which must have caught up with the machine's registering again after a lapse.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::job::runs::JobRecord;
use fleet_core::schedule::{Decision, SnapshotUnit};
use fleet_core::{Backoff, MachineState, UnitFile, UnitHash};
use fleet_registry::apply_rule::{Condition, unit_writes};
use fleet_registry::{
    AgentRegistry, ChangeSignal, EngineLease, EngineRegistry, EngineSnapshot, MachineWork, RegistryError, Renewal,
    Result, StateReport, StoredJob,
};
use fleet_testkit::Seeded;
use tokio::time::Instant;

use crate::gate::Gate;
use crate::world::World;

/// How long a request waits for an answer (`etcd_request_timeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// `rejoined_at` from the moment the store says the lease expired until the machine has
/// registered again.
const LAPSED: i64 = i64::MAX;

pub type SharedWorld = Arc<Mutex<World>>;

pub fn lock(world: &SharedWorld) -> MutexGuard<'_, World> {
    world.locked()
}

/// The machine's session, as this fleetd holds it.
#[derive(Clone, Copy, Debug)]
struct Session {
    lease: i64,
    /// When the last renewal that succeeded was sent.
    renewed: Instant,
    /// The revision it registered again at after a lapse (0: never; [`LAPSED`]: not yet).
    rejoined_at: i64,
}

/// A fleetd's handle on the store; clones share it.
#[derive(Clone)]
pub struct SimStore(Arc<Connection>);

impl std::ops::Deref for SimStore {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

pub struct Connection {
    world: SharedWorld,
    machine: MachineState,
    /// Whether this fleetd is frozen (SIGSTOP): its requests wait.
    frozen: Arc<Gate>,
    session: Mutex<Option<Session>>,
    keepalive: Mutex<Option<tokio::task::AbortHandle>>,
    /// The units (with the revision each last changed at) of the engine's last snapshot.
    planned_from: Mutex<BTreeMap<String, i64>>,
    /// Moves when the store says the lease expired.
    lapses: tokio::sync::watch::Sender<u64>,
    /// How many lapses the agent has handled (stopped its units for).
    lapse_acks: tokio::sync::watch::Sender<u64>,
    /// The lapse signalled before a fresh claim, which the claim waits for the agent to have
    /// handled.
    claim_lapse: Mutex<Option<u64>>,
    /// Whether a registration got no answer (it may have landed) and none was confirmed
    /// since, as the etcd store's unconfirmed claims.
    unconfirmed: std::sync::atomic::AtomicBool,
    /// Chooses which answered writes are lost on the way back.
    random: Mutex<Seeded>,
    /// How much slower than the store's this fleetd's clock runs (1.0: the same).
    clock_rate: f64,
    /// The chance in a thousand that a write's answer is lost though it committed.
    lost_answers: usize,
}

impl SimStore {
    pub fn new(
        world: SharedWorld,
        machine: MachineState,
        frozen: Arc<Gate>,
        seed: u64,
        clock_rate: f64,
        lost_answers: usize,
    ) -> Self {
        Self(Arc::new(Connection {
            world,
            machine,
            frozen,
            session: Mutex::new(None),
            keepalive: Mutex::new(None),
            planned_from: Mutex::new(BTreeMap::new()),
            lapses: tokio::sync::watch::channel(0).0,
            lapse_acks: tokio::sync::watch::channel(0).0,
            unconfirmed: std::sync::atomic::AtomicBool::new(false),
            claim_lapse: Mutex::new(None),
            random: Mutex::new(Seeded::new(seed)),
            clock_rate,
            lost_answers,
        }))
    }

    fn id(&self) -> &str {
        &self.machine.id
    }

    fn session(&self) -> Option<Session> {
        *self.session.locked()
    }

    fn update_session(&self, change: impl FnOnce(&mut Session)) {
        if let Some(session) = self.session.locked().as_mut() {
            change(session);
        }
    }

    /// Stops renewing (the fleetd died).
    pub fn stop(&self) {
        if let Some(task) = self.keepalive.locked().take() {
            task.abort();
        }
    }

    /// A sleep on this fleetd's clock.
    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration.mul_f64(self.clock_rate)).await;
    }

    async fn thawed(&self) {
        self.frozen.passed().await;
    }

    /// One request: `operation` on the world if the store answers, else a failure after the
    /// request timeout. A frozen fleetd sends nothing and hears nothing until it thaws.
    async fn request<T>(&self, what: &str, operation: impl FnOnce(&mut World) -> T) -> Result<T> {
        self.thawed().await;
        let answered = {
            let mut world = lock(&self.world);
            world.reachable(self.id()).then(|| operation(&mut world))
        };
        let result = match answered {
            Some(result) => result,
            None => {
                self.sleep(REQUEST_TIMEOUT).await;
                self.thawed().await;
                return Err(RegistryError::unavailable("simulated store", format!("{what}: no answer")));
            }
        };
        self.thawed().await;
        Ok(result)
    }

    /// A write: as [`SimStore::request`], but its answer may be lost after it committed.
    async fn write<T>(&self, what: &str, operation: impl FnOnce(&mut World) -> T) -> Result<T> {
        let result = self.request(what, operation).await?;
        let lost = self.random.locked().below(1000) < self.lost_answers;
        if lost {
            self.sleep(REQUEST_TIMEOUT).await;
            return Err(RegistryError::unavailable("simulated store", format!("{what}: committed, answer lost")));
        }
        Ok(result)
    }

    /// Takes over the lease this machine's previous fleetd recorded if it is alive, else
    /// claims the presence under a new lease; then keeps it alive.
    async fn open_session(&self) -> Result<()> {
        let machine = self.machine.clone();
        let sent = Instant::now();
        // As the etcd store: a fresh claim only once the agent stopped what ran here before.
        let cleared = self.cleared_for_fresh_claim();
        let (lease, claimed_at) = self
            .write("register", |world| {
                let recorded = world.lease_files.get(&machine.id).copied();
                if let Some(lease) = recorded
                    && world.renew(lease)
                    && world.claim_presence(&machine, lease).is_some()
                {
                    // As the etcd store: the dead fleetd's reports go with it.
                    let dead_fleetds = world.reports_where(|reporter, _| reporter == machine.id);
                    world.drop_reports(dead_fleetds);
                    world.state_signal.send_modify(|generation| *generation += 1);
                    return Ok((lease, 0));
                }
                if world.presences.contains_key(&machine.id) {
                    return Err(RegistryError::MachineInUse { machine_id: machine.id.clone() });
                }
                if !cleared {
                    return Err(RegistryError::PresenceLapsed);
                }
                let lease = world.grant();
                match world.claim_presence(&machine, lease) {
                    // A new presence: what runs here from before may have moved meanwhile.
                    Some(revision) => {
                        world.lease_files.insert(machine.id.clone(), lease);
                        Ok((lease, revision))
                    }
                    None => {
                        world.revoke(lease);
                        Err(RegistryError::MachineInUse { machine_id: machine.id.clone() })
                    }
                }
            })
            .await
            .inspect_err(|_| self.unconfirmed.store(true, std::sync::atomic::Ordering::SeqCst))?
            .inspect_err(|error| {
                if matches!(error, RegistryError::PresenceLapsed) {
                    self.ask_stop_before_fresh_claim();
                }
            })?;
        self.unconfirmed.store(false, std::sync::atomic::Ordering::SeqCst);
        self.claim_lapse.locked().take();
        *self.session.locked() = Some(Session { lease, renewed: sent, rejoined_at: claimed_at });
        let task = tokio::spawn(self.clone().keep_alive()).abort_handle();
        if let Some(previous) = self.keepalive.locked().replace(task) {
            previous.abort();
        }
        Ok(())
    }

    /// Whether a fresh claim may go ahead: no agent follows the lapses, or it handled the
    /// one signalled for this claim.
    fn cleared_for_fresh_claim(&self) -> bool {
        if self.lapses.receiver_count() == 0 {
            return true;
        }
        let handled = *self.lapse_acks.borrow();
        self.claim_lapse.locked().is_some_and(|lapse| handled >= lapse)
    }

    /// Signals the lapse a fresh claim waits for the agent to handle (once per claim).
    fn ask_stop_before_fresh_claim(&self) {
        let mut asked = self.claim_lapse.locked();
        if asked.is_none() {
            self.lapses.send_modify(|lapses| *lapses += 1);
            *asked = Some(*self.lapses.borrow());
        }
    }

    /// Renews the lease every half of its lifetime, retrying failures sooner; registers
    /// again when it expired.
    async fn keep_alive(self) {
        let ttl = lock(&self.world).lease_ttl;
        let period = ttl / 2;
        let mut renewal_retry = Backoff::new(Duration::from_secs(1).min(ttl / 4), ttl / 4);
        let mut wait = period;
        loop {
            self.sleep(wait).await;
            let Some(session) = self.session() else { return };
            let sent = Instant::now();
            wait = match self.request("renew", |world| world.renew(session.lease)).await {
                Ok(true) => {
                    self.update_session(|session| session.renewed = sent);
                    renewal_retry.reset();
                    period
                }
                Ok(false) => {
                    tracing::debug!(lease = session.lease, "the lease expired; registering again");
                    if session.rejoined_at != LAPSED {
                        self.update_session(|session| session.rejoined_at = LAPSED);
                        lock(&self.world).wake_agent(self.id());
                        self.lapses.send_modify(|lapses| *lapses += 1);
                    }
                    // As the etcd store: registered again only once the agent stopped
                    // what it ran (or when no agent follows the lapses).
                    let lapses = *self.lapses.borrow();
                    let mut acks = self.lapse_acks.subscribe();
                    tokio::select! {
                        biased;
                        _ = acks.wait_for(|handled| *handled >= lapses) => {}
                        () = self.lapses.closed() => {}
                    }
                    match self.reopen().await {
                        Ok(()) => {
                            renewal_retry.reset();
                            period
                        }
                        Err(_) => renewal_retry.next_delay(),
                    }
                }
                Err(_) => renewal_retry.next_delay(),
            };
        }
    }

    /// A new lease and presence after the old lease expired; the copy lists afresh.
    async fn reopen(&self) -> Result<()> {
        let machine = self.machine.clone();
        let (lease, revision) = self
            .write("register again", |world| {
                let lease = world.grant();
                match world.claim_presence(&machine, lease) {
                    Some(revision) => {
                        world.lease_files.insert(machine.id.clone(), lease);
                        if let Some(copy) = world.copies.get_mut(&machine.id) {
                            copy.relist = true;
                        }
                        world.wake_agent(&machine.id);
                        Ok((lease, revision))
                    }
                    None => {
                        world.revoke(lease);
                        Err(RegistryError::MachineInUse { machine_id: machine.id.clone() })
                    }
                }
            })
            .await??;
        self.update_session(|session| {
            session.lease = lease;
            session.rejoined_at = revision;
        });
        tracing::debug!(lease, revision, "registered again");
        Ok(())
    }
}

#[async_trait]
impl AgentRegistry for SimStore {
    async fn register_machine(&self, machine: &MachineState) -> Result<()> {
        debug_assert_eq!(machine.id, self.machine.id);
        if self.session().is_some() {
            return Ok(());
        }
        self.open_session().await
    }

    async fn unregister_machine(&self, _machine_id: &str) -> Result<()> {
        self.stop();
        let Some(session) = self.session.locked().take() else {
            return Ok(());
        };
        self.write("unregister", |world| world.revoke(session.lease)).await
    }

    async fn machine_work(&self, machine_id: &str) -> Result<MachineWork> {
        self.thawed().await;
        let world = lock(&self.world);
        let copy = world.copies.get(machine_id).filter(|copy| copy.synced).ok_or(RegistryError::NotListedYet)?;
        let rejoined_at = match self.session() {
            Some(session) => session.rejoined_at,
            // As the etcd store: a claim that got no answer may have landed.
            None if self.unconfirmed.load(std::sync::atomic::Ordering::SeqCst) => LAPSED,
            None => 0,
        };
        tracing::debug!(seen = copy.seen, rejoined_at, units = copy.scheduled.len(), "work read from the copy");
        if copy.seen < rejoined_at {
            return Err(RegistryError::PresenceLapsed);
        }
        Ok(MachineWork {
            machine: world.copied_machine(machine_id),
            scheduled: copy.scheduled.values().cloned().collect(),
            globals: Vec::new(),
        })
    }

    async fn unit_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        self.request("body", |world| world.body(hash)).await
    }

    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> Result<()> {
        let lease = self.session().map(|session| session.lease);
        self.write("report states", |world| {
            let Some(lease) = lease.filter(|lease| world.leases.contains_key(lease)) else {
                return Err(RegistryError::unavailable("simulated store", "requested lease not found"));
            };
            for report in reports {
                match report {
                    StateReport::Set(state) => {
                        let placed_on = world.schedule.get(&state.name).cloned();
                        let active = state.systemd.active == "active";
                        world.budget.reported(&state.name, machine_id, active, placed_on.as_ref());
                        world.dependencies.reported(&state.name, machine_id, active, placed_on.as_ref());
                        world.states.insert((state.name.clone(), machine_id.to_string()), (state.clone(), lease));
                    }
                    StateReport::Remove(name) => {
                        let placed_on = world.schedule.get(name).cloned();
                        world.budget.reported(name, machine_id, false, placed_on.as_ref());
                        world.dependencies.reported(name, machine_id, false, placed_on.as_ref());
                        world.states.remove(&(name.clone(), machine_id.to_string()));
                    }
                }
            }
            world.state_signal.send_modify(|generation| *generation += 1);
            Ok(())
        })
        .await?
    }

    fn machine_changes(&self, machine_id: &str) -> ChangeSignal {
        let mut world = lock(&self.world);
        world.copies.entry(machine_id.to_string()).or_default();
        world.agent_signal(machine_id).subscribe()
    }

    fn presence_lapse_handled(&self, _machine_id: &str) {
        self.lapse_acks.send_replace(*self.lapses.borrow());
    }

    fn presence_lapses(&self, _machine_id: &str) -> Option<ChangeSignal> {
        Some(self.lapses.subscribe())
    }

    /// As this fleetd's clock tells it: one that runs slow sees `agent_ttl` pass later.
    fn presence_renewed(&self, _machine_id: &str) -> Renewal {
        let Some(session) = self.session() else { return Renewal::NotHeld };
        let ttl = lock(&self.world).lease_ttl;
        let skew = ttl.mul_f64((self.clock_rate - 1.0).abs());
        let seen = if self.clock_rate >= 1.0 {
            session.renewed + skew
        } else {
            session.renewed.checked_sub(skew).unwrap_or(session.renewed)
        };
        Renewal::SentAt(seen)
    }
}

#[async_trait]
impl EngineRegistry for SimStore {
    async fn acquire_leadership(&self, machine_id: &str) -> Result<Option<EngineLease>> {
        let token = self.request("leadership", |world| world.acquire_leadership(machine_id)).await?;
        Ok(token.map(|token| EngineLease { machine_id: machine_id.to_string(), token }))
    }

    async fn release_leadership(&self, lease: &EngineLease) -> Result<()> {
        self.write("release leadership", |world| {
            if world.leads(&lease.machine_id, lease.token) {
                world.leader = None;
            }
        })
        .await
    }

    async fn snapshot(&self) -> Result<EngineSnapshot> {
        let snapshot = self
            .request("snapshot", |world| EngineSnapshot {
                revision: world.revision as u64,
                machines: world.presences.values().map(|presence| presence.machine.clone()).collect(),
                units: world
                    .units
                    .iter()
                    .map(|(name, unit)| SnapshotUnit {
                        name: name.clone(),
                        hash: unit.file.hash(),
                        desired: unit.desired,
                        machine_id: world.schedule.get(name).cloned(),
                    })
                    .collect(),
            })
            .await?;
        let world = lock(&self.world);
        *self.planned_from.locked() = snapshot
            .units
            .iter()
            .filter_map(|unit| Some((unit.name.clone(), world.units.get(&unit.name)?.modified)))
            .collect();
        Ok(snapshot)
    }

    async fn snapshot_revision(&self) -> Result<Option<u64>> {
        self.request("revision", |world| Some(world.revision as u64)).await
    }

    async fn unit_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        self.request("bodies", |world| hashes.iter().filter_map(|hash| Some((*hash, world.body(hash)?))).collect())
            .await
    }

    async fn apply(&self, lease: &EngineLease, decisions: &[Decision], unplaced: &[(String, String)]) -> Result<()> {
        let planned_from = self.planned_from.locked().clone();
        self.write("apply", |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            world.budget.writes_as(&lease.machine_id);
            world.dependencies.writes_as(&lease.machine_id);
            world.preemptions += decisions
                .iter()
                .filter(|decision| {
                    matches!(
                        decision,
                        Decision::Unschedule { reason: fleet_core::schedule::UnscheduleReason::PreemptedBy(_), .. }
                    )
                })
                .count();
            let preempted: BTreeSet<&str> = decisions
                .iter()
                .filter_map(|decision| match decision {
                    Decision::Unschedule {
                        unit,
                        reason: fleet_core::schedule::UnscheduleReason::PreemptedBy(_),
                        ..
                    } => Some(unit.as_str()),
                    _ => None,
                })
                .collect();
            let stored: Vec<(String, String)> = world.reasons.clone().into_iter().collect();
            let writes = unit_writes(decisions, unplaced, stored.iter().map(|(u, r)| (u.as_str(), r.as_str())));
            for write in writes {
                let holds = write.conditions().iter().all(|condition| match condition {
                    Condition::UnitUnchanged => {
                        world.units.get(&write.unit).map(|unit| unit.modified) == planned_from.get(&write.unit).copied()
                    }
                    Condition::UnitExists => world.units.contains_key(&write.unit),
                    Condition::PlacedOn(machine) => world.schedule.get(&write.unit) == Some(machine),
                    Condition::Unplaced => !world.schedule.contains_key(&write.unit),
                    Condition::MachineAbsent(machine) => !world.presences.contains_key(machine),
                });
                if !holds {
                    continue;
                }
                if write.leaves.is_some() {
                    world.unplace(&write.unit);
                    if preempted.contains(write.unit.as_str()) {
                        world.budget.preempted(&write.unit);
                    }
                    world.budget.moved(&write.unit);
                    world.dependencies.unplaced(&write.unit);
                }
                if let Some(machine) = &write.lands_on {
                    world.place(&write.unit, machine);
                    world.budget.moved(&write.unit);
                    world.dependencies.placed(&write.unit);
                }
                match &write.reason {
                    fleet_registry::apply_rule::ReasonWrite::Keep => {}
                    fleet_registry::apply_rule::ReasonWrite::Clear => {
                        world.reasons.remove(&write.unit);
                    }
                    fleet_registry::apply_rule::ReasonWrite::Set(reason) => {
                        world.reasons.insert(write.unit.clone(), reason.clone());
                    }
                }
            }
            Ok(())
        })
        .await?
    }

    async fn reported_states(&self, units: &BTreeSet<String>) -> Result<Vec<Arc<fleet_core::UnitState>>> {
        self.request("states", |world| {
            world
                .states
                .iter()
                .filter(|((unit, _), _)| units.contains(unit))
                .map(|(_, (state, _))| Arc::new(state.clone()))
                .collect()
        })
        .await
    }

    async fn job_records(&self) -> Result<Vec<StoredJob>> {
        self.request("jobs", |world| {
            world
                .jobs
                .iter()
                .map(|(unit, (record, version))| StoredJob {
                    unit: unit.clone(),
                    record: record.clone(),
                    version: *version,
                })
                .collect()
        })
        .await
    }

    async fn put_job_record(
        &self,
        lease: &EngineLease,
        unit: &str,
        record: Option<&JobRecord>,
        version: u64,
    ) -> Result<bool> {
        self.write("put job", |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            Ok(world.put_job(unit, record, version))
        })
        .await?
    }

    async fn run_tickets(&self) -> Result<BTreeMap<String, fleet_core::job::global_runs::RunTicket>> {
        self.request("run tickets", |world| world.run_tickets.clone()).await
    }

    async fn put_run_ticket(
        &self,
        lease: &EngineLease,
        unit: &str,
        ticket: Option<&fleet_core::job::global_runs::RunTicket>,
    ) -> Result<()> {
        self.write("put run ticket", |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            match ticket {
                Some(ticket) => world.run_tickets.insert(unit.to_string(), *ticket),
                None => world.run_tickets.remove(unit),
            };
            Ok(())
        })
        .await?
    }

    async fn recorded_out_of_touch(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        self.request("out of touch", |world| world.out_of_touch.clone()).await
    }

    async fn record_out_of_touch(&self, lease: &EngineLease, machines: &[fleet_core::OutOfTouch]) -> Result<()> {
        self.write("record out of touch", |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            world.out_of_touch = machines.to_vec();
            Ok(())
        })
        .await?
    }

    async fn recorded_required_places(&self) -> Result<Vec<fleet_registry::RequiredPlaces>> {
        self.request("required places", |world| world.required_places.values().cloned().collect()).await
    }

    async fn record_required_places(
        &self,
        lease: &EngineLease,
        places: &[fleet_registry::RequiredPlaces],
    ) -> Result<()> {
        let places = places.to_vec();
        self.write("record required places", move |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            world.record_required_places(&places);
            Ok(())
        })
        .await?
    }

    async fn recorded_silent_departures(&self) -> Result<Vec<fleet_registry::SilentDeparture>> {
        self.request("silent departures", |world| world.silent_departures.clone()).await
    }

    async fn record_silent_departures(
        &self,
        lease: &EngineLease,
        departures: &[fleet_registry::SilentDeparture],
    ) -> Result<()> {
        self.write("record silent departures", |world| {
            if !world.leads(&lease.machine_id, lease.token) {
                return Err(RegistryError::LeadershipLost);
            }
            world.silent_departures = departures.to_vec();
            Ok(())
        })
        .await?
    }

    fn engine_changes(&self) -> ChangeSignal {
        lock(&self.world).engine_signal()
    }

    fn state_changes(&self) -> ChangeSignal {
        lock(&self.world).state_signal.subscribe()
    }
}
