//! The engine: a reconciler that, while it holds the leadership, turns the registry's
//! snapshot into schedule decisions with [`fleet_core::schedule::plan`] and writes them,
//! fenced by its lease. It wakes on changes to units and machines, with the periodic
//! reconcile as a fallback only.

#![forbid(unsafe_code)]

mod budget_view;
mod cluster_counts;
mod dependencies;
mod jobs;
pub use jobs::Clock;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleet_core::schedule::departures::{Departures, Reports};
use fleet_core::schedule::lost_machines::{Held, MachineAbsences, at_most_once_hold};
use fleet_core::schedule::preemption::Preemptor;
use fleet_core::schedule::{
    ClusterSnapshot, Decision, IncrementalPlanner, PlacementStrategy, PlanScope, RequirementsCache, SnapshotUnit,
    UnscheduleReason, contents_alone_changed,
};
use fleet_core::{MachineState, UnitHash};
use fleet_registry::{DisruptionLedger, EngineLease, EngineRegistry, EngineSnapshot, RegistryError, Shown};
use fleet_runtime::{Lifecycle, Next, Reconciler, TriggerId, Triggers};
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub machine_id: String,
    /// The fallback reconcile period (`engine_reconcile_interval`).
    pub reconcile_interval: Duration,
    pub debounce: Duration,
    /// How long a machine's presence outlives its last renewal (`agent_ttl`): what units
    /// with `LostAfter=` or `AtMostOnce=` count their stay on a machine gone from
    /// ([`fleet_core::schedule::lost_machines`]).
    pub agent_ttl: Duration,
    /// How a unit's machine is chosen among those it fits on (`placement_strategy`).
    pub strategy: PlacementStrategy,
    /// Whether a unit that fits nowhere may take the room of units of a lower priority
    /// (`preemption`).
    pub preemption: bool,
}

pub struct Engine {
    config: EngineConfig,
    registry: Arc<dyn EngineRegistry>,
    /// Parsed requirements of the units listed last time.
    requirements: RequirementsCache,
    /// Where the last plan left the cluster, so a burst is planned in proportion to it.
    planner: IncrementalPlanner,
    /// The reasons last written, so unchanged ones are not written again.
    reasons: Vec<(String, String)>,
    lease: Option<EngineLease>,
    /// The snapshot revision last planned and written in full: an unchanged snapshot needs
    /// no new plan (the periodic fallback then costs no planning).
    planned: Option<u64>,
    /// Told whether this engine leads, for what runs only on the leader (source syncs).
    leadership: Option<watch::Sender<bool>>,
    /// How long the last pass spent building its snapshot and planning.
    planning: Duration,
    /// When this engine first saw each machine gone that units are still placed on.
    absences: MachineAbsences,
    /// When the first stay of a unit on a machine gone ends: the engine plans again then.
    hold_ends: Option<tokio::time::Instant>,
    /// The machines of the last look, so a machine that goes is shown as it was.
    machines_before: Vec<MachineState>,
    /// The machines out of touch this leadership recorded last; `None` before it read what
    /// its predecessor recorded.
    out_of_touch_written: Option<Vec<fleet_core::OutOfTouch>>,
    /// Where what units require runs, as this leadership recorded it last; `None` before it
    /// read what its predecessor recorded.
    places_written: Option<Vec<fleet_registry::RequiredPlaces>>,
    /// Units taken off a machine that is still present, until it stopped them.
    departures: Departures,
    /// Units preempted and not placed since, with who took their room: their reason says so
    /// while this leadership lasts.
    preempted: BTreeMap<String, Preemptor>,
    /// Whether the next pass is this leadership's first look at the cluster: it asks the
    /// machines about the units it finds unplaced (its predecessor may have taken them off a
    /// machine that still runs them).
    first_look: bool,
    /// Whether a unit waits for the machine it left to stop it: the machines' reports wake
    /// the engine then (`state_changes`), and only then.
    departing: bool,
    /// The machines and units of the snapshot planned at `planned`, to tell a change of
    /// units' contents alone (a rollout's waves), which needs no plan when their requirements
    /// stay.
    last_planned: Option<(Vec<MachineState>, Vec<SnapshotUnit>)>,
    /// The store's changes to units and machines, and to the machines' reports.
    changes: Triggers,
    state_changes: TriggerId,
    /// The runs of scheduled units.
    jobs: jobs::Jobs,
    /// The wall clock elapses are read on (microseconds since the epoch).
    clock: Clock,
    /// The silent departures this leadership recorded last; `None` before it read what its
    /// predecessor recorded.
    silent_written: Option<Vec<fleet_core::schedule::departures::SilentDeparture>>,
    /// Whether a read of the cluster failed since the last pass that got through: the silences
    /// of machines a unit waits for, and the absences of machines gone, count again from the
    /// next.
    store_was_away: bool,
    /// When this engine last read the cluster (its leadership renewed).
    cluster_read: Option<std::time::Instant>,
    /// When this leadership last looked at the machines for the absences of those gone.
    machines_seen: Option<std::time::Instant>,
    /// Whether a pass failed, or took `agent_ttl` or more, since that look: changes it was
    /// woken for may have gone by unseen.
    looks_missed: bool,
    /// The disruptions this process decided: the leader's rollout and drain drivers take
    /// theirs from the same budgets.
    ledger: DisruptionLedger,
    /// Whether a disruption budget held back an eviction or a preemption in the last plan:
    /// the machines' reports wake the engine then, and each pass plans in full.
    budget_held: bool,
    /// The snapshot revision and the budgets the plan a budget held back was made from: a pass
    /// that finds both unchanged plans nothing.
    budgets_held_at: Option<(u64, Option<fleet_core::disruption_budget::Budgets>)>,
    /// The units that wait for units (`Requires=`, `After=`) and since when a running one's
    /// requirement is not met.
    dependencies: dependencies::DependencyGate,
    /// The snapshot revision, the units kept off waiting for units and where what units name
    /// runs, at the last pass, while some unit has dependencies: the machines' reports wake the
    /// engine, and a pass that finds all three unchanged plans nothing.
    waiting_at: Option<(u64, dependencies::Waiting, dependencies::UpPlaces)>,
    /// Where the decisions go as events.
    events: fleet_registry::EventSink,
    /// The machines (ID → address) of this leadership's last look, to tell those that joined
    /// and those lost since; `None` before its first look.
    machines_known: Option<BTreeMap<String, String>>,
}

impl Engine {
    pub fn new(config: EngineConfig, registry: Arc<dyn EngineRegistry>) -> Self {
        let mut changes = Triggers::none().with(registry.engine_changes());
        let state_changes = changes.add(registry.state_changes());
        changes.set_waking(state_changes, false);
        Self {
            config,
            changes,
            state_changes,
            registry,
            requirements: RequirementsCache::default(),
            planner: IncrementalPlanner::default(),
            reasons: Vec::new(),
            lease: None,
            planned: None,
            last_planned: None,
            leadership: None,
            planning: Duration::ZERO,
            absences: MachineAbsences::default(),
            hold_ends: None,
            machines_before: Vec::new(),
            out_of_touch_written: None,
            places_written: None,
            departures: Departures::default(),
            preempted: BTreeMap::new(),
            first_look: true,
            departing: false,
            jobs: jobs::Jobs::default(),
            clock: Arc::new(jobs::now_micros),
            store_was_away: false,
            cluster_read: None,
            machines_seen: None,
            looks_missed: false,
            silent_written: None,
            ledger: DisruptionLedger::default(),
            budget_held: false,
            budgets_held_at: None,
            dependencies: dependencies::DependencyGate::default(),
            waiting_at: None,
            events: fleet_registry::EventSink::discarding(),
            machines_known: None,
        }
    }

    /// Tells `events` what the engine decides: units placed, moved, unplaced and waiting,
    /// machines joined and lost.
    pub fn with_events(mut self, events: fleet_registry::EventSink) -> Self {
        self.events = events;
        self
    }

    /// The machines that joined and were lost since the last look, as events; a leadership's
    /// first look only learns them.
    fn note_machines(&mut self, machines: &[MachineState]) {
        if !self.events.keeps() {
            return;
        }
        let now: BTreeMap<String, String> =
            machines.iter().map(|machine| (machine.id.clone(), machine.public_ip.clone())).collect();
        if let Some(before) = &self.machines_known {
            self.events.note_all(fleet_core::events::machine_events(before, &now, (self.clock)()));
        }
        self.machines_known = Some(now);
    }

    /// Takes the engine's evictions and preemptions from the disruption budgets through
    /// `ledger`, the one the leader's other drivers use.
    pub fn with_disruption_ledger(mut self, ledger: DisruptionLedger) -> Self {
        self.ledger = ledger;
        self
    }

    /// Reads the wall clock through `clock` (a simulation's, whose time is its own).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Keeps `signal` told whether this engine leads.
    pub fn with_leadership_signal(mut self, signal: watch::Sender<bool>) -> Self {
        self.leadership = Some(signal);
        self
    }

    fn tell_leadership(&self) {
        if let Some(signal) = &self.leadership {
            signal.send_if_modified(|leads| {
                let changed = *leads != self.lease.is_some();
                *leads = self.lease.is_some();
                changed
            });
        }
    }

    /// Runs until `lifecycle` leaves `Running`, then gives up the leadership.
    pub async fn run(self, lifecycle: watch::Receiver<Lifecycle>) {
        fleet_runtime::run(self, lifecycle).await;
    }

    /// The fallback period, or sooner when a hold on an `AtMostOnce=` unit ends, a silent
    /// machine's departure may end, or a scheduled unit's next elapse is due.
    fn next_look(&self) -> Duration {
        let until_hold_ends = self
            .hold_ends
            .into_iter()
            .chain(self.departures.next_silence_end().map(tokio::time::Instant::from_std))
            .chain(self.dependencies.grace_ends.map(tokio::time::Instant::from_std))
            .min()
            .map(|ends| ends.saturating_duration_since(tokio::time::Instant::now()));
        let until_due = if self.lease.is_some() { self.jobs.due_in((self.clock)()) } else { None };
        [until_hold_ends, until_due].into_iter().flatten().fold(self.config.reconcile_interval, Duration::min)
    }

    /// Notes whether units wait for the machine they left: the machines' reports wake the
    /// engine while they do, and while a scheduled unit's run is active.
    fn set_departing(&mut self, departing: bool) {
        self.departing = departing;
        self.set_waking();
    }

    /// The machines' reports wake the engine while units wait for a machine to stop them,
    /// while a scheduled unit's run is active, and while a disruption budget holds a plan back.
    fn set_waking(&mut self) {
        let waiting = self.dependencies.watching;
        self.changes
            .set_waking(self.state_changes, self.departing || self.jobs.running() || self.budget_held || waiting);
    }

    /// With nothing else changed, whether a departure ended (its machine stopped the unit):
    /// the plan may place the unit now.
    async fn a_departure_ended(&mut self) -> Result<bool, RegistryError> {
        let reports = reports_of(&*self.registry, &self.departures.units()).await?;
        Ok(self.departures.settle_running(&reports, tokio::time::Instant::now().into_std()))
    }

    /// `cluster` without the units that wait for the present machine they left to stop them
    /// ([`Departures`]), and those units with that machine. The machines' reports are asked
    /// only for those units (and, on a leadership's first look, for the units it finds
    /// unplaced); with none, nothing is looked at.
    async fn without_departing_units(
        &mut self,
        lease: &EngineLease,
        cluster: ClusterSnapshot,
    ) -> Result<(ClusterSnapshot, BTreeMap<String, String>), RegistryError> {
        if self.departures.is_empty() && !self.first_look {
            self.set_departing(false);
            self.record_silent_departures(lease, None).await?;
            return Ok((cluster, BTreeMap::new()));
        }
        let now = tokio::time::Instant::now().into_std();
        // On a leadership's first look, the silent departures of the leader before: its
        // reports cannot show them.
        let recorded = if self.first_look { Some(self.registry.recorded_silent_departures().await?) } else { None };
        let mut asked = self.departures.units();
        if self.first_look {
            asked.extend(Departures::unknown_on_takeover(&cluster));
        }
        if let Some(recorded) = &recorded {
            asked.extend(Departures::adoptable(recorded, &cluster).map(|departure| departure.unit.clone()));
        }
        if !asked.is_empty() {
            let reports = reports_of(&*self.registry, &asked).await?;
            if let Some(recorded) = &recorded {
                let silent_until = now + at_most_once_hold(self.config.agent_ttl);
                self.departures.adopt_silent(recorded, &cluster, &reports, silent_until);
            }
            self.departures.settle(&reports, &cluster, self.first_look, now);
        }
        if let Some(recorded) = recorded {
            self.silent_written = Some(recorded);
        }
        self.first_look = false;
        self.record_silent_departures(lease, None).await?;
        let held = self.departures.held(&cluster);
        self.set_departing(!held.is_empty());
        if held.is_empty() {
            return Ok((cluster, held));
        }
        tracing::debug!(units = held.len(), "units wait for the machine they left to stop them");
        let units = cluster.units.into_iter().filter(|unit| !held.contains_key(&unit.name)).collect();
        Ok((ClusterSnapshot { units, ..cluster }, held))
    }

    /// `cluster` without the units whose machine is gone and whose stay there is not over
    /// (`LostAfter=`, `AtMostOnce=`): the plan leaves them where they are. Records the
    /// machines they wait for, as lists show them, when that changed.
    async fn without_held_units(
        &mut self,
        lease: &EngineLease,
        cluster: ClusterSnapshot,
    ) -> Result<(ClusterSnapshot, Held), RegistryError> {
        let now = tokio::time::Instant::now().into_std();
        let machines = cluster.machines.clone();
        // Likewise when a pass failed or dragged since it last looked at the machines, that long
        // ago, its store answering all along (seed 796460972: a write hung, then failed, while
        // a machine came back for 4 s and went again unseen, and a unit with LostAfter= moved
        // off it as if it had been gone all along). An engine that was not woken saw all.
        let missed = std::mem::take(&mut self.looks_missed);
        if missed && self.machines_seen.is_some_and(|seen| now.duration_since(seen) >= self.config.agent_ttl) {
            self.absences.count_again_from(now);
        }
        self.machines_seen = Some(now);
        self.absences.observe(&cluster, &self.machines_before, now, (self.clock)());
        self.machines_before = machines;
        if self.out_of_touch_written.is_none() {
            let recorded = self.registry.recorded_out_of_touch().await?;
            self.absences.adopt(&recorded);
            self.out_of_touch_written = Some(recorded);
        }
        let held = self.absences.held(&cluster, now, self.config.agent_ttl);
        self.hold_ends = held.next_end.map(tokio::time::Instant::from_std);
        let records = self.absences.records(&held);
        if self.out_of_touch_written.as_ref() != Some(&records) {
            if let Err(error) = self.registry.record_out_of_touch(lease, &records).await {
                return Err(self.failed_write(error));
            }
            self.out_of_touch_written = Some(records);
        }
        if held.units.is_empty() {
            return Ok((cluster, held));
        }
        tracing::debug!(units = held.units.len(), "units wait for their machine out of touch");
        let units = cluster.units.into_iter().filter(|unit| !held.units.contains_key(&unit.name)).collect();
        Ok((ClusterSnapshot { units, ..cluster }, held))
    }

    /// Whether `snapshot` differs from the one planned last only in units' contents that
    /// keep their requirements (then its plan is the last one, written already: the new
    /// contents are taken and nothing is planned). Not while anything else may call for a
    /// plan: units held or waiting for a machine to stop them, a leadership's first look.
    async fn same_plan_as_last(&mut self, snapshot: &EngineSnapshot) -> Result<bool, RegistryError> {
        let Some((machines, units)) = &self.last_planned else { return Ok(false) };
        if self.planned.is_none()
            || self.first_look
            || self.hold_ends.is_some()
            || !self.departures.is_empty()
            || *machines != snapshot.machines
        {
            return Ok(false);
        }
        let Some(changed) = contents_alone_changed(units, &snapshot.units) else { return Ok(false) };
        let mut hashes: Vec<UnitHash> = changed.iter().map(|unit| unit.hash).collect();
        hashes.sort_unstable();
        hashes.dedup();
        let bodies = if hashes.is_empty() { HashMap::new() } else { self.registry.unit_bodies(&hashes).await? };
        Ok(self.requirements.take_same_requirements(&changed, &bodies))
    }

    async fn reconcile(&mut self) -> Result<(), RegistryError> {
        let lease =
            self.registry.acquire_leadership(&self.config.machine_id).await.map_err(|error| self.unread(error))?;
        match (&self.lease, &lease) {
            (None, Some(_)) => tracing::info!("Engine leadership acquired"),
            (Some(_), None) => tracing::info!("Engine leadership lost"),
            _ => {}
        }
        if lease.is_none() || lease != self.lease {
            self.planned = None;
            self.last_planned = None;
            self.planner.forget();
            // What it saw gone while it led before may have come back meanwhile: a new
            // leadership counts absences from its own first sight.
            self.absences = MachineAbsences::default();
            self.machines_seen = None;
            self.out_of_touch_written = None;
            self.places_written = None;
            self.silent_written = None;
            self.departures = Departures::default();
            self.preempted.clear();
            self.budget_held = false;
            self.budgets_held_at = None;
            self.dependencies = dependencies::DependencyGate::default();
            self.waiting_at = None;
            self.machines_known = None;
            self.first_look = true;
            self.jobs = jobs::Jobs::default();
        }
        self.lease = lease;
        let Some(lease) = self.lease.clone() else {
            fleet_metrics::publish_cluster(None);
            return Ok(());
        };
        let now = tokio::time::Instant::now().into_std();
        if std::mem::take(&mut self.store_was_away) {
            self.departures.restart_silences(now + at_most_once_hold(self.config.agent_ttl));
            // A machine's presence lasts `agent_ttl` at least: one that came back and went
            // again unseen needs the engine blind that long.
            if self.cluster_read.is_none_or(|read| now.duration_since(read) >= self.config.agent_ttl) {
                self.absences.count_again_from(now);
            }
        }
        self.cluster_read = Some(now);
        // A unit that waited for the machine it left and no longer does calls for a plan.
        let mut must_plan = false;
        if self.departing && self.a_departure_ended().await? {
            self.planned = None;
            must_plan = true;
        }
        // Scheduled units' runs change with the clock, their records and the machines' reports:
        // a pass plans when one of those moved since the last step, as when the cluster did.
        if self.jobs.watching() && !self.jobs.settled(&*self.registry, (self.clock)()).await? {
            self.planned = None;
            must_plan = true;
        }
        if self.planned.is_some() {
            let revision = self.registry.snapshot_revision().await.map_err(|error| self.unread(error))?;
            if self.planned == revision {
                return Ok(());
            }
        }
        // Woken by the machines' reports while units wait for units, with the cluster as the
        // last pass found it: only the reports of what they name are read, and only the units
        // that name one whose standing moved are looked at again; when none of them changes,
        // there is nothing to plan (at 100,000 units, a full look per report is what it saves).
        let quiet = !must_plan && self.hold_ends.is_none() && !self.budget_held && !self.departing;
        if quiet && let Some(looked) = self.waiting_at.as_ref().map(|(revision, ..)| *revision) {
            let revision = self.registry.snapshot_revision().await.map_err(|error| self.unread(error))?;
            if revision == Some(looked) && !self.dependencies.reports_matter(&*self.registry, revision, now).await? {
                return Ok(());
            }
        }
        let planning = tokio::time::Instant::now();
        let snapshot = self.registry.snapshot().await.map_err(|error| self.unread(error))?;
        self.note_machines(&snapshot.machines);
        if self.planned == Some(snapshot.revision) {
            return Ok(());
        }
        if self.same_plan_as_last(&snapshot).await? {
            tracing::debug!("only units' contents changed, their requirements did not: nothing to plan");
            let skipped = fleet_metrics::PlanLabels { scope: "skipped" };
            fleet_metrics::metrics().engine.plans.get_or_create(&skipped).inc();
            self.planned = Some(snapshot.revision);
            self.last_planned = Some((snapshot.machines, snapshot.units));
            return Ok(());
        }
        self.last_planned = None;
        let missing = self.requirements.missing(&snapshot.units);
        if !missing.is_empty() {
            let bodies = self.registry.unit_bodies(&missing).await?;
            self.requirements.learn(&snapshot.units, &bodies);
        }
        let revision = snapshot.revision;
        let listed = (snapshot.machines.clone(), snapshot.units.clone());
        let mut cluster = self.requirements.cluster_snapshot(snapshot.machines, snapshot.units);
        cluster.strategy = self.config.strategy;
        cluster.preemption = self.config.preemption;
        cluster.preempted = self.still_preempted(&cluster);
        let cluster = match self.jobs.step(&*self.registry, &lease, cluster, (self.clock)()).await {
            Ok(cluster) => cluster,
            Err(error) => return Err(self.failed_write(error)),
        };
        self.set_waking();
        // Units that wait for units are kept off this plan, saying what they wait for.
        let (cluster, waiting, up_places) =
            self.dependencies.apply(&*self.registry, (cluster, revision), &listed.1, now).await?;
        let waits = self.dependencies.watching.then(|| (revision, waiting.clone(), up_places.clone()));
        // Counted over every unit, those about to be left out of the plan too (one waiting for
        // the machine it left is down, and counts).
        let budget_view = budget_view::read(&*self.registry, &cluster, &listed.1).await?;
        // While a budget holds a plan back, or units wait for units, every report wakes the
        // engine: a pass that finds the cluster, the budgets and the waits as the last plan found
        // them has nothing new to plan.
        let counted = budget_view.as_ref().map(fleet_registry::BudgetView::budgets);
        let looked = Some((revision, counted));
        let nothing_new = !must_plan
            && self.hold_ends.is_none()
            && (self.budget_held || self.waiting_at.is_some())
            && (!self.budget_held || self.budgets_held_at == looked)
            && self.waiting_at == waits;
        if nothing_new {
            return Ok(());
        }
        let (cluster, staying) = self.without_held_units(&lease, cluster).await?;
        let (mut cluster, held) = self.without_departing_units(&lease, cluster).await?;
        let (mut decided, scope) = match &budget_view {
            None => self.planner.plan(&cluster),
            // The plan takes its evictions and preemptions from the budgets while it holds the
            // ledger, and notes them before they are written.
            Some(view) => {
                let decision = self.ledger.decide(view);
                cluster.budgets = decision.budgets.clone();
                let planned = self.planner.plan(&cluster);
                decision.note_these(
                    planned.0.disrupted.iter().map(|(unit, machine)| (unit.clone(), Shown::Left(machine.clone()))),
                );
                planned
            }
        };
        // A plan a budget held back may differ once a unit comes back up, with nothing else
        // changed: the reports wake the engine, and the next plan is a full one.
        self.budget_held = decided.budget_held();
        if self.budget_held {
            self.planner.forget();
        }
        self.budgets_held_at = if self.budget_held { looked } else { None };
        self.set_waking();
        decided.wait_for_departures(held);
        // A unit the plan moves off a present machine is placed once that machine stopped it.
        if decided.defer_moves_off(&cluster) {
            self.planner.forget();
            self.set_departing(true);
        }
        // A snapshot planned while units are held is planned again when the hold ends; one
        // planned while units wait for the machine they left, when one of those ends.
        let planned = (self.hold_ends.is_none() && !self.budget_held && waits.is_none()).then_some(revision);
        self.waiting_at = waits;
        self.set_waking();
        self.planning = planning.elapsed();
        // Where requirements run, for the machines the plan leaves their dependents on, before
        // the plan is written: a unit placed now finds its file there when it is loaded.
        self.record_required_places(&lease, &up_places, &cluster, &decided).await?;
        // Services kept off every machine after a failure say why, as unplaced units do.
        decided.kept_off = self.jobs.off_reasons().iter().cloned().chain(waiting).collect();
        decided.staying = staying.units.into_iter().map(|(unit, held)| (unit, held.reason)).collect();
        let reasons = decided.reason_texts();
        fleet_metrics::publish_cluster(Some(cluster_counts::cluster_counts(&cluster, &decided)));
        let scope = match scope {
            PlanScope::Full => "full",
            PlanScope::Changed(_) => "changed",
        };
        fleet_metrics::metrics().engine.plans.get_or_create(&fleet_metrics::PlanLabels { scope }).inc();
        if !decided.changes_anything(&self.reasons) {
            self.planned = planned;
            self.last_planned = Some(listed);
            return Ok(());
        }
        for decision in &decided.decisions {
            tracing::debug!(?decision, "engine decision");
        }
        let placed =
            decided.decisions.iter().filter(|d| matches!(d, fleet_core::schedule::Decision::Schedule { .. })).count();
        if !decided.decisions.is_empty() {
            tracing::info!(scheduled = placed, unscheduled = decided.decisions.len() - placed, "engine decisions");
        }
        let by_unit: BTreeMap<&str, &str> = reasons.iter().map(|(u, r)| (u.as_str(), r.as_str())).collect();
        for (unit, reason) in &by_unit {
            if !self.reasons.iter().any(|(u, r)| u == unit && r == reason) {
                tracing::info!(unit, reason, "unit cannot be scheduled");
            }
        }
        self.planned = None;
        // What the machines report of the units taken off them, before they are: a machine
        // that had not reported one is not taken at its silence.
        let taken_off: BTreeSet<String> =
            Departures::taken_off(&decided.decisions, &cluster).into_iter().map(|(unit, _)| unit).collect();
        let before = match reports_of(&*self.registry, &taken_off).await {
            Ok(reports) => reports,
            Err(error) => return Err(self.failed_write(error)),
        };
        let decisions =
            match self.jobs.record_placements(&*self.registry, &lease, decided.decisions.clone(), &cluster).await {
                Ok(decisions) => decisions,
                Err(error) => return Err(self.failed_write(error)),
            };
        if decisions.len() != decided.decisions.len() {
            // Runs another write claimed meanwhile are not placed: planned again at once.
            self.planner.forget();
        }
        decided.decisions = decisions;
        // The silent departures these decisions make are recorded before they are written: a
        // leader taking over after the write holds them too.
        let mut noted = self.departures.clone();
        noted.note_decisions(&decided.decisions, &cluster, &before, tokio::time::Instant::now().into_std());
        self.record_silent_departures(&lease, Some(&noted)).await?;
        if let Err(error) = self.registry.apply(&lease, &decided.decisions, &reasons).await {
            return Err(self.failed_write(error));
        }
        let decisions = &fleet_metrics::metrics().engine.decisions;
        decisions.get_or_create(&fleet_metrics::DecisionLabels { decision: "schedule" }).inc_by(placed as u64);
        decisions
            .get_or_create(&fleet_metrics::DecisionLabels { decision: "unschedule" })
            .inc_by((decided.decisions.len() - placed) as u64);
        let silent_until = tokio::time::Instant::now().into_std() + at_most_once_hold(self.config.agent_ttl);
        self.departures.note_decisions(&decided.decisions, &cluster, &before, silent_until);
        for decision in &decided.decisions {
            if let Decision::Unschedule { unit, reason: UnscheduleReason::PreemptedBy(preemptor), .. } = decision {
                tracing::info!(unit, preemptor = %preemptor.unit, priority = preemptor.priority, "unit preempted");
                self.preempted.insert(unit.clone(), preemptor.clone());
            }
        }
        let at = (self.clock)();
        self.events.note_all(fleet_core::events::placement_events(&decided.decisions, at));
        self.events.note_all(fleet_core::events::waiting_events(&self.reasons, &reasons, at));
        self.reasons = reasons;
        self.planned = planned;
        // What is planned now is where the decisions just written leave the units, not
        // where the snapshot had them: the next snapshot is compared in full.
        Ok(())
    }
}

impl Engine {
    /// Records where what units require runs, when that is not what was recorded last (read
    /// from the store on a leadership's first record).
    async fn record_required_places(
        &mut self,
        lease: &EngineLease,
        up: &dependencies::UpPlaces,
        cluster: &ClusterSnapshot,
        plan: &fleet_core::schedule::Plan,
    ) -> Result<(), RegistryError> {
        if up.is_empty() && self.places_written.as_ref().is_some_and(Vec::is_empty) {
            return Ok(());
        }
        let before = match self.places_written.take() {
            Some(written) => written,
            None => self.registry.recorded_required_places().await?,
        };
        let records = dependencies::places_to_record(up, cluster, plan, &before);
        if records != before
            && let Err(error) = self.registry.record_required_places(lease, &records).await
        {
            self.places_written = Some(before);
            return Err(self.failed_write(error));
        }
        self.places_written = Some(records);
        Ok(())
    }

    /// Records the silent departures of `departures` (else this engine's own) when they are
    /// not what it recorded last; before it read what its predecessor recorded, nothing.
    async fn record_silent_departures(
        &mut self,
        lease: &EngineLease,
        departures: Option<&Departures>,
    ) -> Result<(), RegistryError> {
        let silent = departures.unwrap_or(&self.departures).silent();
        if self.silent_written.as_ref().is_none_or(|written| *written == silent) {
            return Ok(());
        }
        if let Err(error) = self.registry.record_silent_departures(lease, &silent).await {
            return Err(self.failed_write(error));
        }
        self.silent_written = Some(silent);
        Ok(())
    }

    /// The units this leadership preempted that still wait for a machine (placed again,
    /// stopped or gone, a unit is forgotten).
    fn still_preempted(&mut self, cluster: &ClusterSnapshot) -> BTreeMap<String, Preemptor> {
        let waiting: std::collections::HashSet<&str> = cluster
            .units
            .iter()
            .filter(|unit| unit.scheduled_on.is_none() && unit.desired != fleet_core::state::DesiredState::Inactive)
            .map(|unit| unit.name.as_str())
            .collect();
        self.preempted.retain(|unit, _| waiting.contains(unit.as_str()));
        self.preempted.clone()
    }

    /// A read of the cluster that failed: the engine did not see it for a while, so what it
    /// counts of machines' absences and silences counts again from its next look (a write
    /// whose answer was lost says nothing of that).
    fn unread(&mut self, error: RegistryError) -> RegistryError {
        if matches!(error, RegistryError::Unavailable(_)) {
            self.store_was_away = true;
        }
        error
    }

    /// A write that failed: what the planner assumed written is forgotten, and a lost
    /// leadership is given up.
    fn failed_write(&mut self, error: RegistryError) -> RegistryError {
        self.planner.forget();
        if matches!(error, RegistryError::LeadershipLost) {
            tracing::info!("Engine leadership lost");
            self.lease = None;
        }
        error
    }
}

impl Reconciler for Engine {
    type Error = RegistryError;
    const NAME: &'static str = "engine reconcile";
    /// A stop cuts a pass short: its writes are fenced by the leadership and each unit's
    /// stands alone, and what a successor needs of it (the silent departures) is written
    /// before the decisions. A pass waiting on a store gone held a stopping fleetd for up to
    /// every read's retries (50 s).
    const STOP_CUTS_PASS: bool = true;

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        let metrics = &fleet_metrics::metrics().engine;
        // tokio's clock, not std's: under the simulation's paused time a pass that dragged
        // (a write hung by a fault) is seen to, and one whose thread the machine merely starved
        // is not (seed 796593883 failed in one run of CI and passed when replayed).
        let started = tokio::time::Instant::now();
        let outcome = self.reconcile().await;
        let took = started.elapsed();
        if outcome.is_err() || took >= self.config.agent_ttl {
            self.looks_missed = true;
        }
        metrics.reconciles.inc();
        metrics.reconcile_duration.observe(took.as_secs_f64());
        metrics.leader.set(i64::from(self.lease.is_some()));
        self.tell_leadership();
        outcome.map(|()| Next::After(self.next_look()))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.changes
    }

    /// A failed pass is retried within the fallback period at the latest, however long the
    /// backoff: each pass renews the leadership, whose lease lasts a few periods.
    fn due_within(&self) -> Option<Duration> {
        Some(self.next_look())
    }

    /// A burst is gathered for at least as long as the last pass spent planning: under a
    /// stream of writes the engine plans in batches and takes at most about half a core.
    /// Time waiting on the store does not count, so a slow link never spaces out the
    /// leadership renewals.
    fn settle(&mut self, _took: Duration) -> Duration {
        self.config.debounce.max(std::mem::take(&mut self.planning))
    }

    async fn finish(mut self, _ending: Lifecycle) {
        fleet_metrics::metrics().engine.leader.set(0);
        fleet_metrics::publish_cluster(None);
        if let Some(lease) = self.lease.take()
            && let Err(error) = self.registry.release_leadership(&lease).await
        {
            tracing::warn!(%error, "releasing engine leadership");
        }
        self.tell_leadership();
    }
}

/// What the machines report of `units`.
async fn reports_of(registry: &dyn EngineRegistry, units: &BTreeSet<String>) -> Result<Reports, RegistryError> {
    if units.is_empty() {
        return Ok(Reports::default());
    }
    let states = registry.reported_states(units).await?;
    Ok(Reports::of(states.iter().map(|state| &**state)))
}
