//! The simulated store: what etcd holds for fleet (units, schedule, presences under leases,
//! unit states, the engine leader key) with a revision, and what matters of how etcd serves
//! it: leases that expire when not renewed (and whose clocks restart when a new leader is
//! elected), an election during which no one gets an answer, and each machine's watch-fed
//! copy of its work, which follows the store's changes with a lag, stalls when its watch
//! breaks, and must list afresh when the history it would resume from was compacted.
//!
//! Everything here is plain data changed under one lock at one instant of the simulated
//! clock; waiting (request timeouts, retries) belongs to the callers in `store.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use fleet_core::drift::DriftPolicy;
use fleet_core::{DesiredState, MachineState, UnitFile, UnitHash, UnitState};
use fleet_registry::AssignedUnit;
use tokio::sync::watch;
use tokio::time::Instant;

/// How much history the store keeps for watches to resume from.
const HISTORY_KEPT: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub struct StoredUnit {
    pub file: UnitFile,
    pub desired: DesiredState,
    /// The revision the unit's record last changed at.
    pub modified: i64,
}

#[derive(Clone, Debug)]
pub struct Presence {
    pub machine: MachineState,
    pub lease: i64,
}

#[derive(Clone, Debug)]
pub struct Leader {
    pub machine: String,
    pub token: u64,
    pub expires: Instant,
}

/// A change a machine's copy follows.
#[derive(Clone, Debug)]
enum Change {
    Assigned { machine: String, unit: AssignedUnit },
    Unassigned { machine: String, unit: String },
    Presence { machine: String, present: bool },
}

/// One machine's watch-fed copy of its work.
#[derive(Debug, Default)]
pub struct Copy {
    pub synced: bool,
    /// Whether its watch is up (it follows the history) or broken (it waits to resume).
    pub streaming: bool,
    /// The revision up to which it has applied the history.
    pub seen: i64,
    pub scheduled: BTreeMap<String, AssignedUnit>,
    pub present: bool,
    /// How long after a change it applies it.
    pub lag: Duration,
    /// A relist was asked for (the machine registered again).
    pub relist: bool,
    /// Until when its watch is stuck (a member that lost its leader, say).
    pub stalled_until: Option<Instant>,
}

pub struct World {
    /// Units the engines took off a machine for one of a higher priority: the preemptions in
    /// the decisions leaders wrote (a decision the store then skipped included).
    pub preemptions: usize,
    pub revision: i64,
    pub units: BTreeMap<String, StoredUnit>,
    /// Unit → machine.
    pub schedule: BTreeMap<String, String>,
    pub reasons: BTreeMap<String, String>,
    pub presences: BTreeMap<String, Presence>,
    /// Lease → when it expires.
    pub leases: BTreeMap<i64, Instant>,
    next_lease: i64,
    pub lease_ttl: Duration,
    /// (unit, machine) → state, with the lease it was written under.
    pub states: BTreeMap<(String, String), (UnitState, i64)>,
    pub leader: Option<Leader>,
    pub engine_lease_ttl: Duration,
    history: VecDeque<(i64, Instant, Change)>,
    /// The newest revision compacted away.
    compacted: i64,
    pub copies: BTreeMap<String, Copy>,
    /// Machines cut off from the store.
    pub cut: BTreeSet<String>,
    /// An election: no member answers anyone.
    pub leaderless: bool,
    /// Machines whose fleetd is frozen: their copies stand still.
    pub frozen: BTreeSet<String>,
    /// Machines whose fleetd is not running (killed, not started again yet).
    pub dead: BTreeSet<String>,
    /// When each machine last came back in touch (see [`World::out_of_touch`]).
    pub absence_ended: BTreeMap<String, Instant>,
    /// When each machine's presence last went (its lease expired or was revoked).
    pub absence_began: BTreeMap<String, Instant>,
    /// When the last election ended.
    pub election_ended: Option<Instant>,
    /// The lease a machine's fleetd recorded on disk (it survives a restart).
    pub lease_files: BTreeMap<String, i64>,
    /// One signal per engine: a watch channel wakes several waiters in a random order.
    engine_signals: Vec<watch::Sender<u64>>,
    pub agent_signals: BTreeMap<String, watch::Sender<u64>>,
    /// Moves on every state report.
    pub state_signal: watch::Sender<u64>,
    /// Unit → its job record and the version its compare-and-swap names.
    pub jobs: BTreeMap<String, (fleet_core::job::runs::JobRecord, u64)>,
    /// The tickets of global units on a calendar (the simulation's workload has no global
    /// units: kept as a store keeps them, given to no machine).
    pub run_tickets: BTreeMap<String, fleet_core::job::global_runs::RunTicket>,
    /// The machines out of touch the leading engine recorded.
    pub out_of_touch: Vec<fleet_core::OutOfTouch>,
    /// Where what each placed unit requires runs, as the engine recorded it, by unit.
    pub required_places: BTreeMap<String, fleet_registry::RequiredPlaces>,
    /// The silent departures the leading engine recorded.
    pub silent_departures: Vec<fleet_registry::SilentDeparture>,
    /// The version the next job record write gets.
    next_job_version: u64,
    /// The disruption budget judge ([`World::budgeted_unit_preempted`]).
    pub budget: BudgetJudge,
    /// The judge of units that wait for units.
    pub dependencies: crate::dependency_judge::DependencyJudge,
}

/// The judge of the units with `DisruptionBudget=1` (`b@…`): a preemption of one that runs
/// while another is still on its way from its own (taken off, and not reported running on the
/// machine it is placed on since) takes two down, past the budget. Judged at the store, as each
/// preemption is written, against the reports the store holds: what the engine could know. A
/// unit counts as running only once the report is older than a copy's lag (a leader may not
/// have seen it yet, and a unit down costs nothing), and a leader's first second is excused
/// (its copy may not show its predecessor's last writes yet).
#[derive(Debug)]
pub struct BudgetJudge {
    began: Instant,
    /// Budgeted units preempted and not reported running where they are placed since.
    in_flight: BTreeSet<String>,
    /// Since when each budgeted unit is reported running where it is placed.
    up_since: BTreeMap<String, Instant>,
    /// The leading engine's machine, and since when it writes decisions.
    leader: Option<(String, Instant)>,
    pub preempted: usize,
    pub violations: Vec<String>,
}

/// Longer than a copy lags its store (300 ms at most) with an engine's pass on top.
const SEEN_BY_ALL: Duration = Duration::from_secs(1);

/// The names of the units with a disruption budget of 1 in the simulation.
pub const BUDGETED_PREFIX: &str = "b@";

impl BudgetJudge {
    fn new() -> Self {
        Self {
            began: Instant::now(),
            in_flight: BTreeSet::new(),
            up_since: BTreeMap::new(),
            leader: None,
            preempted: 0,
            violations: Vec::new(),
        }
    }

    /// The engine of `machine` writes decisions now.
    pub fn writes_as(&mut self, machine: &str) {
        if self.leader.as_ref().is_none_or(|(leader, _)| leader != machine) {
            self.leader = Some((machine.to_string(), Instant::now()));
        }
    }

    /// `unit` was taken off its machine by a preemption the store wrote just now.
    pub fn preempted(&mut self, unit: &str) {
        let elapsed = self.began.elapsed();
        if !unit.starts_with(BUDGETED_PREFIX) {
            return;
        }
        self.preempted += 1;
        let was_up = self.up_since.remove(unit).is_some_and(|since| since.elapsed() > SEEN_BY_ALL);
        let settled_leader = self.leader.as_ref().is_some_and(|(_, since)| since.elapsed() > SEEN_BY_ALL);
        if let Some(other) = self.in_flight.iter().find(|other| *other != unit).filter(|_| was_up && settled_leader) {
            self.violations.push(format!(
                "at {elapsed:?}: {unit} was preempted while {other}, preempted before, was not back (DisruptionBudget=1)"
            ));
        }
        self.in_flight.insert(unit.to_string());
    }

    /// `unit` was taken off its machine or placed on one: it runs where it is placed only once
    /// that machine says so.
    pub fn moved(&mut self, unit: &str) {
        self.up_since.remove(unit);
    }

    /// A machine reported `unit` there, active or not; `placed_on`: where it is placed.
    pub fn reported(&mut self, unit: &str, machine: &str, active: bool, placed_on: Option<&String>) {
        if !unit.starts_with(BUDGETED_PREFIX) || placed_on.is_none_or(|on| on != machine) {
            return;
        }
        if active {
            self.in_flight.remove(unit);
            self.up_since.entry(unit.to_string()).or_insert_with(Instant::now);
        } else {
            self.up_since.remove(unit);
        }
    }
}

impl World {
    pub fn new(lease_ttl: Duration, engine_lease_ttl: Duration) -> Self {
        Self {
            preemptions: 0,
            jobs: BTreeMap::new(),
            run_tickets: BTreeMap::new(),
            out_of_touch: Vec::new(),
            required_places: BTreeMap::new(),
            silent_departures: Vec::new(),
            next_job_version: 1,
            budget: BudgetJudge::new(),
            dependencies: Default::default(),
            revision: 1,
            units: BTreeMap::new(),
            schedule: BTreeMap::new(),
            reasons: BTreeMap::new(),
            presences: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: 1,
            lease_ttl,
            states: BTreeMap::new(),
            leader: None,
            engine_lease_ttl,
            history: VecDeque::new(),
            compacted: 0,
            copies: BTreeMap::new(),
            cut: BTreeSet::new(),
            leaderless: false,
            frozen: BTreeSet::new(),
            dead: BTreeSet::new(),
            absence_ended: BTreeMap::new(),
            absence_began: BTreeMap::new(),
            election_ended: None,
            lease_files: BTreeMap::new(),
            engine_signals: Vec::new(),
            agent_signals: BTreeMap::new(),
            state_signal: watch::channel(0).0,
        }
    }

    /// Whether `machine` is out of touch with the store: the store no longer counts it (its
    /// presence is gone: its lease expired, or it never claimed one). As the chaos run
    /// judges it from etcd's view: a fleetd frozen, cut off or dead whose presence holds is
    /// in touch, so a presence must never be claimed (or kept) with units running that may
    /// have moved.
    pub fn out_of_touch(&self, machine: &str) -> bool {
        !self.presences.contains_key(machine)
    }

    /// Notes that one of the conditions of [`World::out_of_touch`] ended for `machine`.
    pub fn back_in_touch(&mut self, machine: &str) {
        self.absence_ended.insert(machine.to_string(), Instant::now());
    }

    /// Whether `machine` gets answers from the store now.
    pub fn reachable(&self, machine: &str) -> bool {
        !self.leaderless && !self.cut.contains(machine)
    }

    pub fn agent_signal(&mut self, machine: &str) -> &watch::Sender<u64> {
        self.agent_signals.entry(machine.to_string()).or_insert_with(|| watch::channel(0).0)
    }

    pub fn wake_agent(&mut self, machine: &str) {
        self.agent_signal(machine).send_modify(|generation| *generation += 1);
    }

    /// A new engine's wake-up.
    pub fn engine_signal(&mut self) -> watch::Receiver<u64> {
        self.engine_signals.retain(|signal| signal.receiver_count() > 0);
        let (signal, receiver) = watch::channel(0);
        self.engine_signals.push(signal);
        receiver
    }

    fn wake_engines(&self) {
        for signal in &self.engine_signals {
            signal.send_modify(|generation| *generation += 1);
        }
    }

    /// Replaces `unit`'s job record if it is still at `version` (0: none stored).
    pub fn put_job(&mut self, unit: &str, record: Option<&fleet_core::job::runs::JobRecord>, version: u64) -> bool {
        let stored = self.jobs.get(unit).map_or(0, |(_, version)| *version);
        if stored != version {
            return false;
        }
        match record {
            Some(record) => {
                self.jobs.insert(unit.to_string(), (record.clone(), self.next_job_version));
                self.next_job_version += 1;
            }
            None => {
                self.jobs.remove(unit);
            }
        }
        true
    }

    fn record(&mut self, change: Change) {
        self.revision += 1;
        self.history.push_back((self.revision, Instant::now(), change));
    }

    pub fn assigned(&self, name: &str) -> Option<AssignedUnit> {
        let unit = self.units.get(name)?;
        Some(AssignedUnit {
            name: name.to_string(),
            hash: unit.file.hash(),
            desired: unit.desired,
            drift: DriftPolicy::default(),
            secrets: Default::default(),
            run: None,
            required_at: self
                .required_places
                .get(name)
                .filter(|record| self.schedule.get(name) == Some(&record.machine))
                .map(|record| record.places.clone())
                .unwrap_or_default(),
        })
    }

    /// Replaces the engine's record of where requirements run; the units whose places
    /// changed have their machine's work changed.
    pub fn record_required_places(&mut self, places: &[fleet_registry::RequiredPlaces]) {
        let wanted: BTreeMap<String, fleet_registry::RequiredPlaces> =
            places.iter().map(|record| (record.unit.clone(), record.clone())).collect();
        let changed: Vec<String> = wanted
            .keys()
            .chain(self.required_places.keys())
            .filter(|unit| wanted.get(*unit) != self.required_places.get(*unit))
            .cloned()
            .collect();
        self.required_places = wanted;
        for unit in changed {
            if let (Some(machine), Some(assigned)) = (self.schedule.get(&unit).cloned(), self.assigned(&unit)) {
                self.record(Change::Assigned { machine, unit: assigned });
            }
        }
    }

    // ---- leases

    pub fn grant(&mut self) -> i64 {
        let lease = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(lease, Instant::now() + self.lease_ttl);
        lease
    }

    /// Renews `lease`; `false` if it expired.
    pub fn renew(&mut self, lease: i64) -> bool {
        let ttl = self.lease_ttl;
        self.leases.get_mut(&lease).map(|expires| *expires = Instant::now() + ttl).is_some()
    }

    /// Puts `machine`'s presence under `lease` if no live lease holds it, or `lease` does;
    /// the revision written at.
    pub fn claim_presence(&mut self, machine: &MachineState, lease: i64) -> Option<i64> {
        if !self.leases.contains_key(&lease) {
            return None;
        }
        if let Some(held) = self.presences.get(&machine.id)
            && held.lease != lease
        {
            return None;
        }
        if self.presences.insert(machine.id.clone(), Presence { machine: machine.clone(), lease }).is_none() {
            self.back_in_touch(&machine.id);
        }
        self.record(Change::Presence { machine: machine.id.clone(), present: true });
        self.wake_engines();
        Some(self.revision)
    }

    pub fn revoke(&mut self, lease: i64) {
        self.leases.remove(&lease);
        self.drop_expired_keys();
    }

    /// Removes the presences and states whose lease is gone.
    fn drop_expired_keys(&mut self) {
        let gone: Vec<String> = self
            .presences
            .iter()
            .filter(|(_, presence)| !self.leases.contains_key(&presence.lease))
            .map(|(machine, _)| machine.clone())
            .collect();
        for machine in gone {
            self.presences.remove(&machine);
            self.absence_began.insert(machine.clone(), Instant::now());
            self.record(Change::Presence { machine, present: false });
            self.wake_engines();
        }
        let expired = self.reports_where(|_, lease| !self.leases.contains_key(&lease));
        self.drop_reports(expired);
    }

    /// The unit state reports `picked` picks by reporting machine and lease.
    pub fn reports_where(&self, picked: impl Fn(&str, i64) -> bool) -> Vec<(String, String)> {
        self.states
            .iter()
            .filter(|((_, machine), (_, lease))| picked(machine, *lease))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Removes the unit state reports `dropped` and tells the judges: a unit whose report went
    /// (with its machine's lease, or with the fleetd a restarted one took the lease over from)
    /// counts as down, as the engines then count it.
    pub fn drop_reports(&mut self, dropped: Vec<(String, String)>) {
        for (unit, machine) in dropped {
            let placed_on = self.schedule.get(&unit).cloned();
            self.budget.reported(&unit, &machine, false, placed_on.as_ref());
            self.dependencies.reported(&unit, &machine, false, placed_on.as_ref());
            self.states.remove(&(unit, machine));
        }
    }

    // ---- the engine leader

    pub fn acquire_leadership(&mut self, machine: &str) -> Option<u64> {
        let now = Instant::now();
        let expires = now + self.engine_lease_ttl;
        match &mut self.leader {
            Some(leader) if leader.machine == machine => {
                leader.expires = expires;
                Some(leader.token)
            }
            Some(_) => None,
            None => {
                self.revision += 1;
                let token = self.revision as u64;
                self.leader = Some(Leader { machine: machine.to_string(), token, expires });
                Some(token)
            }
        }
    }

    pub fn leads(&self, machine: &str, token: u64) -> bool {
        self.leader.as_ref().is_some_and(|leader| leader.machine == machine && leader.token == token)
    }

    // ---- what clients and the engine write

    pub fn put_unit(&mut self, name: &str, file: UnitFile, desired: DesiredState) {
        self.revision += 1;
        let modified = self.revision;
        self.units.insert(name.to_string(), StoredUnit { file, desired, modified });
        self.assignment_changed(name);
    }

    pub fn set_desired(&mut self, name: &str, desired: DesiredState) {
        self.revision += 1;
        let modified = self.revision;
        if let Some(unit) = self.units.get_mut(name) {
            unit.desired = desired;
            unit.modified = modified;
            self.assignment_changed(name);
        }
    }

    pub fn destroy(&mut self, name: &str) {
        self.revision += 1;
        self.units.remove(name);
        self.reasons.remove(name);
        if let Some(machine) = self.schedule.remove(name) {
            self.record(Change::Unassigned { machine, unit: name.to_string() });
        }
        self.wake_engines();
    }

    fn assignment_changed(&mut self, name: &str) {
        if let (Some(machine), Some(unit)) = (self.schedule.get(name).cloned(), self.assigned(name)) {
            self.record(Change::Assigned { machine, unit });
        }
        self.wake_engines();
    }

    pub fn place(&mut self, name: &str, machine: &str) {
        self.schedule.insert(name.to_string(), machine.to_string());
        if let Some(unit) = self.assigned(name) {
            self.record(Change::Assigned { machine: machine.to_string(), unit });
        }
    }

    pub fn unplace(&mut self, name: &str) {
        if let Some(machine) = self.schedule.remove(name) {
            self.record(Change::Unassigned { machine, unit: name.to_string() });
        }
    }

    // ---- time passing

    /// What happens at this instant: leases expire, history is compacted, copies follow.
    pub fn tick(&mut self) {
        let now = Instant::now();
        if !self.leaderless {
            let before = self.leases.len();
            self.leases.retain(|_, expires| *expires > now);
            if self.leases.len() != before {
                self.drop_expired_keys();
            }
            if self.leader.as_ref().is_some_and(|leader| leader.expires <= now) {
                self.leader = None;
                self.wake_engines();
            }
        }
        while let Some((revision, at, _)) = self.history.front() {
            if now.duration_since(*at) <= HISTORY_KEPT {
                break;
            }
            self.compacted = *revision;
            self.history.pop_front();
        }
        let machines: Vec<String> = self.copies.keys().cloned().collect();
        for machine in machines {
            if self.follow(&machine, now) {
                self.wake_agent(&machine);
            }
        }
    }

    /// A new leader was elected: etcd restarts every lease's clock.
    pub fn end_election(&mut self) {
        self.leaderless = false;
        self.election_ended = Some(Instant::now());
        let ttl = self.lease_ttl;
        let now = Instant::now();
        for expires in self.leases.values_mut() {
            *expires = (*expires).max(now + ttl);
        }
        if let Some(leader) = &mut self.leader {
            leader.expires = leader.expires.max(now + self.engine_lease_ttl);
        }
    }

    /// Brings `machine`'s copy along; whether it changed.
    fn follow(&mut self, machine: &str, now: Instant) -> bool {
        if self.frozen.contains(machine) {
            return false;
        }
        let reachable = self.reachable(machine);
        let Some(copy) = self.copies.get_mut(machine) else { return false };
        let stalled = copy.stalled_until.is_some_and(|until| until > now);
        if !reachable || stalled {
            copy.streaming = false;
            return false;
        }
        if !copy.synced || copy.relist || copy.seen < self.compacted {
            self.relist(machine);
            return true;
        }
        let Some(copy) = self.copies.get_mut(machine) else { return false };
        copy.streaming = true;
        let mut changed = false;
        for (revision, at, change) in &self.history {
            if *revision <= copy.seen {
                continue;
            }
            if now.duration_since(*at) < copy.lag {
                break;
            }
            copy.seen = *revision;
            match change {
                Change::Assigned { machine: on, unit } if on == machine => {
                    copy.scheduled.insert(unit.name.clone(), unit.clone());
                    changed = true;
                }
                Change::Unassigned { machine: on, unit } if on == machine => {
                    changed |= copy.scheduled.remove(unit).is_some();
                }
                Change::Presence { machine: on, present } if on == machine => {
                    copy.present = *present;
                    changed = true;
                }
                _ => {}
            }
        }
        if copy.seen < self.revision
            && self
                .history
                .back()
                .is_none_or(|(revision, at, _)| *revision <= copy.seen || now.duration_since(*at) >= copy.lag)
        {
            // A progress notice: nothing more for this copy up to the newest revision.
            copy.seen = self.revision;
        }
        changed
    }

    /// Lists `machine`'s work afresh into its copy.
    fn relist(&mut self, machine: &str) {
        let scheduled: BTreeMap<String, AssignedUnit> = self
            .schedule
            .iter()
            .filter(|(_, on)| *on == machine)
            .filter_map(|(name, _)| Some((name.clone(), self.assigned(name)?)))
            .collect();
        let present = self.presences.contains_key(machine);
        let revision = self.revision;
        let copy = self.copies.entry(machine.to_string()).or_default();
        copy.scheduled = scheduled;
        copy.present = present;
        copy.seen = revision;
        copy.synced = true;
        copy.streaming = true;
        copy.relist = false;
    }

    /// `machine`'s presence as its copy holds it.
    pub fn copied_machine(&self, machine: &str) -> Option<MachineState> {
        let copy = self.copies.get(machine)?;
        copy.present.then(|| self.presences.get(machine).map(|presence| presence.machine.clone())).flatten()
    }

    pub fn body(&self, hash: &UnitHash) -> Option<UnitFile> {
        self.units.values().find(|unit| unit.file.hash() == *hash).map(|unit| unit.file.clone())
    }
}
