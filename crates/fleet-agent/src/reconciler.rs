//! The agent's loop: fetch this machine's work, plan, execute, report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::run_book::GlobalRunHere;
use crate::unreadable_work::UnreadableWork;
use fleet_core::agent_plan::{self, DesiredUnit, LoadedUnit, Places, Task};
use fleet_core::desired_units::{Assigned, desired_units};
use fleet_core::health::HealthStatus;
use fleet_core::job::global_runs::RunTicket;
use fleet_core::required_places::{self, RequiredPlace};
use fleet_core::secrets::SecretPins;
use fleet_core::{DesiredState, MachineState, UnitFile, UnitHash, UnitState};
use fleet_registry::{AgentRegistry, AssignedUnit, RegistryError, Renewal, StateReport, UnitSecrets};
use fleet_runtime::{Lifecycle, Next, Reconciler, Retry, TriggerId, Triggers};
use fleet_unit_manager::credentials::Credential;
use fleet_unit_manager::{HeldUnit, UnitManager, UnitManagerError};
use tokio::sync::watch;

use fleet_core::state_report::{
    HeldNow, HeldUnitNow, adopted_as_launched, apply_reports, apply_uncertain_reports, reports_of_changes,
};

use crate::drift_watch::DriftWatch;
use crate::health_watch::{HealthWatch, Running};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The machine as configured: ID, address, metadata.
    pub machine: MachineState,
    /// The fallback reconcile period.
    pub reconcile_interval: Duration,
    /// How long to let a burst of changes settle before acting on it.
    pub debounce: Duration,
    /// How long the machine's presence lives unrenewed (`agent_ttl`), where the store keeps
    /// it under a lease: once that long has passed on this machine's clock since its last
    /// renewal was sent, its `AtMostOnce=` units stop. `None`: its presence never lapses.
    pub presence_ttl: Option<Duration>,
    /// Stop every unit, not only the `AtMostOnce=` ones, once the presence may have lapsed
    /// (`stop_units_when_cut_off`). Otherwise a machine cut off keeps its other units.
    pub stop_units_when_cut_off: bool,
}

/// The longest a burst of changes is gathered, however slow the last pass was.
const MOST_SETTLING: Duration = Duration::from_secs(1);

/// How long to let a burst of changes settle before the next pass: `debounce`, or as long
/// as the last pass took (`pass`) when that was longer, at most [`MOST_SETTLING`]. When the
/// store answers slowly, each pass takes more changes and the store gets fewer requests.
pub fn settling_time(debounce: Duration, pass: Duration) -> Duration {
    debounce.max(pass.min(MOST_SETTLING))
}

/// What a machine whose presence was last renewed `silent` ago must do about its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Renewed recently: look again within this long.
    Held { lapses_in: Duration },
    /// Its lease may have expired: the units may run elsewhere.
    Lapsed,
}

/// Whether a presence renewed `silent` ago has lapsed after `ttl`.
pub fn presence(silent: Duration, ttl: Duration) -> Presence {
    match ttl.checked_sub(silent) {
        Some(left) if !left.is_zero() => Presence::Held { lapses_in: left },
        _ => Presence::Lapsed,
    }
}

pub struct Agent {
    config: AgentConfig,
    registry: Arc<dyn AgentRegistry>,
    manager: Arc<dyn UnitManager>,
    bodies: HashMap<UnitHash, UnitFile>,
    /// What this agent has loaded into the manager, and whether it started it.
    loaded: BTreeMap<String, LoadedUnit>,
    /// The states last written to the registry.
    reported: BTreeMap<String, UnitState>,
    /// Where its units' state and health changes go as events.
    events: fleet_registry::EventSink,
    /// Whether a report was stored since this agent started: the first only says what runs
    /// here (a restarted fleetd finds its units running), and makes no events.
    reported_once: bool,
    /// Whether the units were stopped because the presence lapsed (`stop_units_when_cut_off`).
    fenced: bool,
    /// Whether the presence may have lapsed, by this machine's clock.
    presence_lapsed: bool,
    /// The units loaded here whose loaded content asked to run at most once.
    at_most_once: BTreeSet<String>,
    /// The runs of scheduled units here.
    run_book: crate::run_book::RunBook,
    /// The fence handed to the unit manager last: its deadline and units.
    fence: Option<(tokio::time::Instant, Vec<String>)>,
    /// Whether the log said the unit manager has no fence for `AtMostOnce=` units.
    told_no_fence: bool,
    drift: DriftWatch,
    /// Retries a registration that failed, sooner than the fallback reconcile.
    register_retry: fleet_core::backoff::Backoff,
    health: HealthWatch,
    /// The machine's work changing, the manager's states, and health flips.
    triggers: Triggers,
    /// The manager's state changes among the triggers: a pass marks them seen as it lists the
    /// manager, so a change its own listing already shows (its own start, say) does not call
    /// for another.
    state_changes: TriggerId,
    /// Health flips among the triggers: a pass woken by them alone may only report.
    health_flips: TriggerId,
    /// Whether the last pass that reconciled did all it set out to (read every body it
    /// needed, carried out every task) and nothing since changed what is loaded here: a
    /// pass woken by a health flip alone then has nothing to reconcile.
    settled: bool,
    /// Moves when the store says the presence lapsed: a pass in progress is dropped for it.
    lapses: Option<watch::Receiver<u64>>,
    /// Whether the machine is registered (a pass registers it first).
    registered: bool,
    /// When the last pass found the presence due a look, whatever else happens: a failed
    /// pass is retried by then at the latest.
    presence_due: Option<Duration>,
    /// Since when the work could not be read (the presence lapsed, the store's copy not yet
    /// current since the machine registered again).
    unreadable: UnreadableWork,
    /// Where the values of the secrets units name come from; none: a unit that names one
    /// does not load.
    secrets: Option<Arc<dyn UnitSecrets>>,
    /// fleetd's lifecycle, once running: a pass carrying out many tasks (a machine given
    /// 100,000 units) stops between two of them when fleetd stops, instead of finishing
    /// work that shutdown undoes.
    lifecycle: Option<watch::Receiver<Lifecycle>>,
}

/// The credentials of `name`, which is loaded next from `file`: the values of the secrets
/// it names, under the names it gives them, and the version of each secret given; and for a
/// unit that waits for units, the file of where they run (`places`; none where the unit
/// manager delivers no credentials). Never a value in an error.
async fn credentials_of(
    secrets: Option<Arc<dyn UnitSecrets>>,
    machine_id: &str,
    (name, file): (&str, &UnitFile),
    pins: &SecretPins,
    places: Option<&[RequiredPlace]>,
) -> Result<(Vec<Credential>, BTreeMap<String, u64>), UnitManagerError> {
    let refused = |reason: String| UnitManagerError::Refused { unit: name.to_string(), reason };
    let references = fleet_core::secrets::references(file).map_err(refused)?;
    let mut credentials = Vec::new();
    if let Some(places) = places.filter(|_| fleet_core::dependency::waits(file.options())) {
        credentials.push(Credential::new(required_places::FILE_NAME, required_places::file_content(places)));
    }
    if references.is_empty() {
        return Ok((credentials, BTreeMap::new()));
    }
    let source = secrets.ok_or_else(|| refused("this machine cannot receive secrets".into()))?;
    let names: Vec<String> = references.iter().map(|reference| reference.secret.clone()).collect();
    let delivered = source
        .unit_secrets(machine_id, name, &names, pins)
        .await
        .map_err(|why| refused(format!("cannot have its secrets: {why}")))?;
    let versions = delivered.iter().map(|secret| (secret.name.clone(), secret.version)).collect();
    for reference in references {
        match delivered.iter().find(|secret| secret.name == reference.secret) {
            Some(secret) => credentials.push(Credential::new(reference.credential, secret.value.clone())),
            None => return Err(refused(format!("secret {} was not delivered", reference.secret))),
        }
    }
    Ok((credentials, versions))
}

/// What a unit that names no secret, or whose deliveries are not known, reports of them.
static NO_SECRETS: BTreeMap<String, u64> = BTreeMap::new();

const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl Agent {
    pub fn new(config: AgentConfig, registry: Arc<dyn AgentRegistry>, manager: Arc<dyn UnitManager>) -> Self {
        let mut triggers = Triggers::none().with(registry.machine_changes(&config.machine.id));
        let state_changes = triggers.add(manager.state_changes());
        let health = HealthWatch::default();
        let health_flips = triggers.add(health.flips());
        let lapses = registry.presence_lapses(&config.machine.id);
        Self {
            config,
            registry,
            manager,
            bodies: HashMap::new(),
            loaded: BTreeMap::new(),
            reported: BTreeMap::new(),
            events: fleet_registry::EventSink::discarding(),
            reported_once: false,
            fenced: false,
            presence_lapsed: false,
            at_most_once: BTreeSet::new(),
            run_book: crate::run_book::RunBook::default(),
            fence: None,
            told_no_fence: false,
            drift: DriftWatch::default(),
            health,
            register_retry: fleet_core::backoff::Backoff::new(RETRY_MIN, Duration::from_secs(30)),
            triggers,
            state_changes,
            health_flips,
            settled: false,
            unreadable: UnreadableWork::default(),
            lapses,
            registered: false,
            presence_due: None,
            secrets: None,
            lifecycle: None,
        }
    }

    /// Tells `events` of its units' state and health changes.
    pub fn with_events(mut self, events: fleet_registry::EventSink) -> Self {
        self.events = events;
        self
    }

    /// Where the values of the secrets units name come from.
    pub fn with_secrets(mut self, secrets: Arc<dyn UnitSecrets>) -> Self {
        self.secrets = Some(secrets);
        self
    }

    /// How long a unit that starts with a health check waits for its first verdict before it
    /// is reported `unknown` (`health_watch::FIRST_VERDICT_WAIT` unless set).
    pub fn with_first_verdict_wait(mut self, wait: Duration) -> Self {
        self.health.set_first_verdict_wait(wait);
        self
    }

    /// What the manager holds now. Every state change up to this listing is marked seen:
    /// the listing shows it.
    async fn held_units(&mut self) -> fleet_unit_manager::Result<BTreeMap<String, HeldUnit>> {
        self.triggers.mark_one_seen(self.state_changes);
        self.manager.units().await
    }

    fn machine_id(&self) -> &str {
        &self.config.machine.id
    }

    /// Whether fleetd is stopping or reloading.
    fn stopping(&self) -> bool {
        self.lifecycle.as_ref().is_some_and(|lifecycle| *lifecycle.borrow() != Lifecycle::Running)
    }

    /// Runs until `lifecycle` leaves [`Lifecycle::Running`]. On shutdown it stops every unit
    /// and leaves the cluster; on reload it returns with the units left running, for the
    /// next agent to adopt.
    pub async fn run(mut self, lifecycle: watch::Receiver<Lifecycle>) {
        self.lifecycle = Some(lifecycle.clone());
        self.adopt_running_units().await;
        fleet_runtime::run(self, lifecycle).await;
    }

    /// One pass: register if not yet, act on the presence, then reconcile what runs here
    /// with the machine's work. Says when to look again.
    async fn pass(&mut self) -> Result<Next, RegistryError> {
        fleet_metrics::metrics().agent.passes.inc();
        let registering = !self.registered;
        if registering {
            let mut registered = self.registry.register_machine(&self.config.machine).await;
            if let Err(RegistryError::PresenceLapsed) = registered {
                // A fresh presence: the store registers the machine once it stopped what runs
                // here from before (it may have moved while the machine was away). Stopped, it
                // asks again at once: every fresh start takes this turn, and a retry's wait
                // (125-250 ms) made each one that much later.
                self.stop_for_lapse("it registers afresh").await;
                registered = self.registry.register_machine(&self.config.machine).await;
            }
            match registered {
                Ok(()) => self.registered = true,
                Err(RegistryError::PresenceLapsed) => self.stop_for_lapse("it registers afresh").await,
                Err(error) => tracing::warn!(%error, "cannot register machine; retrying"),
            }
        }
        let fence_check = self.check_presence().await;
        self.presence_due = fence_check;
        if self.fenced {
            // Until the presence is renewed, nothing here is this machine's to run; nothing
            // runs here, so the store may register the machine again after a lapse.
            self.registry.presence_lapse_handled(self.machine_id());
            return Ok(Next::After(fence_check.unwrap_or(RETRY_MIN)));
        }
        // A pass waiting on a slow store does not hold up what a lapse calls for: it is
        // dropped when the store says the presence lapsed, or when it may have by this
        // machine's clock with units to stop for it.
        let lapse_at = self.own_lapse_moment();
        let mut lapses = self.lapses.take();
        let outcome = tokio::select! {
            biased;
            Some(()) = lapsed(lapses.as_mut()) => Err(RegistryError::PresenceLapsed),
            () = until(lapse_at) => Ok(()),
            outcome = self.reconcile_or_report(registering) => outcome,
        };
        self.lapses = lapses;
        let next = match outcome {
            Ok(()) => {
                if self.unreadable.readable() {
                    fleet_metrics::metrics().agent.work_unreadable.dec();
                }
                self.config.reconcile_interval
            }
            // Starting up: the copy wakes this loop once it has listed.
            Err(RegistryError::NotListedYet) => {
                tracing::debug!("the store's copy is not listed yet; waiting for it");
                RETRY_MIN
            }
            // None of what runs here can be shown to be this machine's any more: it stops
            // now, and what is still scheduled here starts again once the work can be read.
            // The copy wakes this loop when it can.
            Err(RegistryError::PresenceLapsed) => {
                self.stop_for_lapse("its presence lapsed").await;
                self.note_unreadable_work();
                RETRY_MIN
            }
            Err(error) => {
                self.arm_fence().await;
                return Err(error);
            }
        };
        // A unit this pass started that asked to run at most once is fenced at once.
        self.arm_fence().await;
        let mut next = fence_check.map_or(next, |lapses_in| next.min(lapses_in));
        // Not registered yet (the manager busy with a rush of joins, the store briefly out):
        // try again on a backoff, spread by machine, not at the fallback reconcile.
        if self.registered {
            self.register_retry.reset();
        } else {
            next = next.min(self.register_retry.next_delay_jittered(spread_of(self.machine_id())));
        }
        Ok(Next::After(next))
    }

    /// Acts on the machine's presence as its own clock sees it, counted from the last
    /// renewal it sent (the store counts from when it received it, later): once it may have
    /// lapsed, the `AtMostOnce=` units stop (every unit, with `stop_units_when_cut_off`), and
    /// none of them starts again until it is renewed. While it holds, the unit manager's
    /// fence of the `AtMostOnce=` units is kept a lease ahead. Returns how soon to look again,
    /// when it matters.
    async fn check_presence(&mut self) -> Option<Duration> {
        let ttl = self.config.presence_ttl?;
        let renewed = match self.registry.presence_renewed(self.machine_id()) {
            // Nothing here needs the presence proven (or the store keeps no lease): what a
            // lapse stopped may run again.
            Renewal::NotLeased => {
                self.presence_lapsed = false;
                self.fenced = false;
                return None;
            }
            // Not registered (yet): nothing says the presence holds.
            Renewal::NotHeld => None,
            Renewal::SentAt(sent) => Some(sent),
        };
        // The manager's fence may have fired while this fleetd was frozen: what it killed is
        // started afresh, not left failed.
        if self.fence.as_ref().is_some_and(|(deadline, _)| *deadline <= tokio::time::Instant::now()) {
            self.fence = None;
            let fenced: Vec<String> = self.at_most_once.iter().cloned().collect();
            self.stop_and_unload(&fenced, "its fence passed").await;
        }
        match renewed.map_or(Presence::Lapsed, |sent| presence(sent.elapsed(), ttl)) {
            Presence::Held { lapses_in } => {
                if self.presence_lapsed {
                    tracing::info!("the machine's presence is renewed: running its units again");
                    self.presence_lapsed = false;
                    self.fenced = false;
                }
                if let Some(sent) = renewed {
                    self.arm_fence_until(sent + ttl, &BTreeMap::new()).await;
                }
                // Looked at again before the fence would fire, to move it on.
                let early = (!self.at_most_once.is_empty()).then(|| lapses_in.saturating_sub(ttl / 4).max(RETRY_MIN));
                (self.config.stop_units_when_cut_off || early.is_some()).then(|| early.unwrap_or(lapses_in))
            }
            Presence::Lapsed => {
                let fenced: Vec<String> =
                    self.at_most_once.iter().filter(|name| self.loaded.contains_key(*name)).cloned().collect();
                // Every unit with `stop_units_when_cut_off`, once a presence held has lapsed.
                let every_unit = self.config.stop_units_when_cut_off && renewed.is_some() && !self.fenced;
                if !self.presence_lapsed && (renewed.is_some() || !fenced.is_empty()) {
                    tracing::warn!(
                        units = self.loaded.len(),
                        at_most_once = fenced.len(),
                        every_unit = self.config.stop_units_when_cut_off,
                        "the machine's presence may have lapsed (agent_ttl since its last renewal): stopping the units that may now run elsewhere"
                    );
                }
                self.presence_lapsed = true;
                if every_unit {
                    let all: Vec<String> = self.loaded.keys().cloned().collect();
                    self.stop_and_unload(&all, "cut off").await;
                    self.fenced = true;
                } else if !fenced.is_empty() {
                    self.stop_and_unload(&fenced, "its presence may have lapsed").await;
                }
                // A renewal answered later wakes nothing by itself (a manager that was frozen
                // may have no change for this machine once it answers): look again soon, so
                // that what was stopped runs again as soon as the presence holds.
                Some((ttl / 4).max(RETRY_MIN))
            }
        }
    }

    /// When the presence may lapse by this machine's clock, if there are units to stop then.
    fn own_lapse_moment(&self) -> Option<tokio::time::Instant> {
        let ttl = self.config.presence_ttl?;
        let Renewal::SentAt(sent) = self.registry.presence_renewed(self.machine_id()) else { return None };
        let stops_something = self.config.stop_units_when_cut_off || !self.at_most_once.is_empty();
        (stops_something && !self.presence_lapsed).then_some(sent + ttl)
    }

    /// Whether the presence holds by this machine's clock (or never lapses).
    fn presence_holds(&self) -> bool {
        let Some(ttl) = self.config.presence_ttl else { return true };
        match self.registry.presence_renewed(self.machine_id()) {
            Renewal::NotLeased => true,
            Renewal::NotHeld => false,
            Renewal::SentAt(sent) => matches!(presence(sent.elapsed(), ttl), Presence::Held { .. }),
        }
    }

    /// Hands the unit manager the fence of the `AtMostOnce=` units held here as of now.
    async fn arm_fence(&mut self) {
        self.arm_fence_for(&BTreeMap::new()).await;
    }

    /// As [`Agent::arm_fence`], covering the `AtMostOnce=` units of `desired` too (a pass
    /// may start them).
    async fn arm_fence_for(&mut self, desired: &BTreeMap<String, DesiredUnit>) {
        if let Some(ttl) = self.config.presence_ttl
            && !self.presence_lapsed
            && let Renewal::SentAt(sent) = self.registry.presence_renewed(self.machine_id())
        {
            self.arm_fence_until(sent + ttl, desired).await;
        }
    }

    /// Has the unit manager kill the `AtMostOnce=` units held here (or about to start, in
    /// `desired`) at `deadline` unless it is moved on before: they stop on time even if this
    /// fleetd is frozen, and a manager with such a fence starts none of them without it.
    /// Told only when the deadline or the units changed.
    async fn arm_fence_until(&mut self, deadline: tokio::time::Instant, desired: &BTreeMap<String, DesiredUnit>) {
        let mut units: BTreeSet<String> = self.asking(desired);
        units.extend(self.at_most_once.iter().cloned());
        let units: Vec<String> = units.into_iter().collect();
        if units.is_empty() && self.fence.is_none() {
            return;
        }
        if self.fence.as_ref().is_some_and(|(armed, fenced)| *armed == deadline && *fenced == units) {
            return;
        }
        tracing::debug!(?units, left = ?deadline.saturating_duration_since(tokio::time::Instant::now()), "fencing");
        match self.manager.fence(deadline, &units).await {
            Ok(true) => self.fence = (!units.is_empty()).then_some((deadline, units)),
            Ok(false) => {
                if !units.is_empty() && !self.told_no_fence {
                    self.told_no_fence = true;
                    tracing::warn!(
                        manager = self.manager.kind(),
                        units = units.len(),
                        "this unit manager has no keeper to stop the units that run at most once: fleetd stops them itself when its presence may have lapsed, which a frozen or killed fleetd cannot"
                    );
                }
                self.fence = None;
            }
            Err(error) => tracing::warn!(%error, "cannot fence the units that run at most once"),
        }
    }

    /// Notes a pass that could not read the work: counted in the gauge while it lasts, and
    /// told in the log when it lasts long.
    fn note_unreadable_work(&mut self) {
        let unreadable = self.unreadable.unreadable(tokio::time::Instant::now());
        if unreadable.began {
            fleet_metrics::metrics().agent.work_unreadable.inc();
        }
        if let Some(lasted) = unreadable.warn_after {
            tracing::warn!(
                ?lasted,
                "this machine's work cannot be read (its presence lapsed, and the store does not yet show its work since it registered again): it runs nothing meanwhile"
            );
        }
    }

    /// Stops every unit held here (none of them can be shown to be this machine's: `why`),
    /// then tells the store, which may register the machine again: nothing runs here that
    /// the engine may have moved.
    async fn stop_for_lapse(&mut self, why: &str) {
        if !self.loaded.is_empty() {
            tracing::warn!(
                units = self.loaded.len(),
                why,
                "stopping this machine's units until its work shows which are still its own"
            );
            self.stop_and_unload_all(why).await;
        }
        fleet_core::state_report::forget_after_lapse(&mut self.reported);
        self.registry.presence_lapse_handled(self.machine_id());
    }

    /// Stops and unloads every unit this agent holds (`why`, for the log).
    /// Unit by unit: the manager's `stop_all` is for leaving (the native supervisor then
    /// removes its cgroups, and could start nothing after).
    async fn stop_and_unload_all(&mut self, why: &str) {
        let names: Vec<String> = self.loaded.keys().cloned().collect();
        self.stop_and_unload(&names, why).await;
    }

    /// Stops and unloads `names` (`why`, for the log).
    async fn stop_and_unload(&mut self, names: &[String], why: &str) {
        // What is loaded here changed outside a reconcile: the next pass reconciles.
        self.settled = false;
        for name in names {
            if let Err(error) = self.manager.stop(name).await {
                tracing::warn!(unit = name, %error, why, "stopping a unit");
            }
            if let Err(error) = self.manager.unload(name).await {
                tracing::warn!(unit = name, %error, why, "unloading a unit");
            }
            self.loaded.remove(name);
            self.at_most_once.remove(name);
            self.run_book.set_aside(name, crate::run_book::now_micros());
        }
    }

    /// The units of `desired` whose content asks to run at most once.
    fn asking(&self, desired: &BTreeMap<String, DesiredUnit>) -> BTreeSet<String> {
        desired
            .iter()
            .filter(|(_, unit)| self.bodies.get(&unit.hash).is_some_and(fleet_core::requirements::asks_at_most_once))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Takes over what the manager already runs (a systemd that outlived fleetd), so a
    /// restart does not restart running units.
    ///
    /// What an earlier fleetd reported of them may still be stored (a pull agent's manager
    /// keeps its reports across the agent's restart): each counts as reported, as a state
    /// nothing here would report, so the first pass reports it again, and one this agent then
    /// unloads is taken out of the store instead of showing running on a machine that no
    /// longer runs it (the engine waits for a machine to stop what it took off it).
    async fn adopt_running_units(&mut self) {
        match self.manager.units().await {
            Ok(units) => {
                for (name, held) in units {
                    let launched = adopted_as_launched(&held.state);
                    // Which versions of its secrets it was given is not known: taken to be
                    // what it is pinned to once the work is read.
                    self.loaded
                        .insert(name.clone(), LoadedUnit { hash: held.hash, launched, secrets: None, places: None });
                    let unknown = UnitState {
                        run: None,
                        name: name.clone(),
                        machine_id: self.config.machine.id.clone(),
                        hash: held.hash,
                        systemd: fleet_core::SystemdState::new("", "", ""),
                        launched,
                        drift: None,
                        health: None,
                        secrets: Default::default(),
                    };
                    self.reported.insert(name, unknown);
                }
            }
            Err(error) => tracing::warn!(%error, "cannot list the units the manager holds"),
        }
    }

    /// A reconcile, or only a report of the states: a pass woken by a health flip alone
    /// (the first verdict of a unit just started, most often) after a pass that did all it set
    /// out to has nothing else to do, and need not read the machine's work again.
    async fn reconcile_or_report(&mut self, registering: bool) -> Result<(), RegistryError> {
        // A drift look that is due waits for the next pass that reconciles: drift is not
        // what a health flip is about.
        let nothing_else = self.settled && !registering && !self.presence_lapsed;
        if nothing_else && self.triggers.moved_alone(self.health_flips) {
            fleet_metrics::metrics().agent.report_passes.inc();
            return self.report_states(None).await;
        }
        self.reconcile().await
    }

    /// One pass: what should run here, the tasks to get there, and the states to report.
    async fn reconcile(&mut self) -> Result<(), RegistryError> {
        self.settled = false;
        let work = self.registry.machine_work(self.machine_id()).await?;
        let machine = work.machine.clone().unwrap_or_else(|| self.config.machine.clone());
        let (mut desired, unread) = self.desired_units(&machine, &work.scheduled, &work.globals).await;
        let asking = self.asking(&desired);
        // A unit adopted from a manager that outlived fleetd is known to ask only by the
        // content it is wanted with, when that is the content it runs.
        for name in &asking {
            if self.loaded.get(name).is_some_and(|held| desired.get(name).is_some_and(|unit| unit.hash == held.hash)) {
                self.at_most_once.insert(name.clone());
            }
        }
        // Told before anything here counts on it: a store that renews rarely while idle (a
        // pull agent's heartbeats) proves the presence from now on.
        let wanted = self.config.presence_ttl.is_some()
            && (self.config.stop_units_when_cut_off || !self.at_most_once.is_empty() || !asking.is_empty());
        self.registry.presence_wanted(self.machine_id(), wanted);
        if self.presence_lapsed {
            // They may run elsewhere now: none starts here until the presence is renewed.
            desired.retain(|name, _| !asking.contains(name) && !self.at_most_once.contains(name));
        }
        // A unit taken over from an earlier fleetd runs the versions of its secrets it is
        // pinned to, as far as anyone can tell: a pin that moves later is acted on.
        let manager = &self.manager;
        for (name, loaded) in &mut self.loaded {
            if let Some(wanted) = desired.get(name).filter(|wanted| wanted.hash == loaded.hash) {
                loaded.secrets.get_or_insert_with(|| wanted.secrets.versions.clone());
                // Its file says where what it requires ran when it was written (they may have
                // moved while no fleetd ran here): a move is then acted on as any other.
                loaded.places.get_or_insert_with(|| {
                    manager
                        .delivered_credential(name, required_places::FILE_NAME)
                        .map_or_else(|| wanted.places.at.clone(), |file| required_places::parse_file(file.value()))
                });
            }
        }
        // The fence covers what this pass may start before it starts anything.
        self.arm_fence_for(&desired).await;
        let tasks = agent_plan::plan(&desired, &self.loaded);
        let mut looked_at = None;
        let tasks = if !self.loaded.is_empty()
            && self.drift.due()
            && let Ok(held) = self.held_units().await
        {
            let drifted = self.drift.corrections(self.manager.as_ref(), &desired, &self.loaded, &held, &tasks).await;
            looked_at = Some(held);
            agent_plan::with_corrections(tasks, &drifted)
        } else {
            tasks
        };
        // A pass that does nothing reports from the look it took: one listing of the unit
        // manager per pass (a D-Bus call on systemd), not two.
        let held_now = if tasks.is_empty() { looked_at } else { None };
        let mut every_task_done = true;
        for task in tasks {
            if self.stopping() {
                // What is done so far is reported below; the rest is the next agent's.
                every_task_done = false;
                break;
            }
            every_task_done &= self.execute(task, &desired).await;
        }
        fleet_metrics::metrics().agent.units.set(i64::try_from(self.loaded.len()).unwrap_or(i64::MAX));
        self.report_states(held_now).await?;
        // Only a pass that read all of its work has caught up: a unit whose body it could not
        // read is still of the work this fleetd found when it started, which an earlier fleetd
        // may have run (seed 796451714: a restarted fleetd started such a run again).
        if unread.is_none() {
            self.run_book.caught_up();
        }
        self.settled = every_task_done && unread.is_none();
        // New content that could not be read is tried again soon, as a failed pass is.
        unread.map_or(Ok(()), Err)
    }

    /// Reads the bodies of `units` not held yet, all in one request.
    async fn fetch_new_bodies<'a>(
        &mut self,
        units: impl Iterator<Item = &'a AssignedUnit>,
    ) -> Result<(), RegistryError> {
        let mut missing: Vec<UnitHash> =
            units.map(|unit| unit.hash).filter(|hash| !self.bodies.contains_key(hash)).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            self.bodies.extend(self.registry.unit_bodies(&self.config.machine.id, &missing).await?);
        }
        Ok(())
    }

    /// What should run here, from the work and the bodies held or read now. When new
    /// content cannot be read, a unit held here keeps the content it runs (its desired state
    /// still applies) and a new one waits for a later pass: what was taken away from this
    /// machine is still stopped at once, without waiting on etcd for what was added.
    async fn desired_units(
        &mut self,
        machine: &MachineState,
        scheduled: &[AssignedUnit],
        globals: &[AssignedUnit],
    ) -> (BTreeMap<String, DesiredUnit>, Option<RegistryError>) {
        let globals: Vec<&AssignedUnit> =
            globals.iter().filter(|unit| unit.desired != DesiredState::Inactive).collect();
        let unread = self.fetch_new_bodies(scheduled.iter().chain(globals.iter().copied())).await.err();
        let scheduled: Vec<Assigned<'_>> = scheduled.iter().map(assigned).collect();
        let on_calendar: Vec<(&str, Option<&RunTicket>)> =
            globals.iter().map(|unit| (unit.name.as_str(), unit.run.as_ref())).collect();
        let globals: Vec<Assigned<'_>> = globals.into_iter().map(assigned).collect();
        let mut desired = desired_units(machine, &scheduled, &globals, &self.bodies, &self.loaded, unread.is_some());
        // A global unit on a calendar runs here only for a ticket it has not run: otherwise it
        // stays loaded, not started.
        let now = crate::run_book::now_micros();
        for (name, ticket) in on_calendar {
            let Some(wanted) = desired.get_mut(name).filter(|wanted| wanted.state == DesiredState::Launched) else {
                continue;
            };
            let Some(job) = self.bodies.get(&wanted.hash).and_then(|file| crate::run_book::global_job(name, file))
            else {
                continue;
            };
            let launched = self.loaded.get(name).is_some_and(|held| held.launched);
            match self.run_book.global_wanted(name, &job, ticket, launched, now) {
                GlobalRunHere::Running => {}
                GlobalRunHere::Idle => wanted.state = DesiredState::Loaded,
                // Started for the run before, which ended by itself: started again.
                GlobalRunHere::Start => {
                    if let Some(held) = self.loaded.get_mut(name) {
                        held.launched = false;
                    }
                }
            }
        }
        // What a unit that waits for units wants when they move, from its content.
        for (name, wanted) in desired.iter_mut().filter(|(_, wanted)| !wanted.places.at.is_empty()) {
            if let Some(file) = self.bodies.get(&wanted.hash) {
                let dependencies = fleet_core::dependency::dependencies_of(name, file.options());
                wanted.places.on_change = dependencies.map(|dependencies| dependencies.on_change).unwrap_or_default();
            }
        }
        // Keep only the bodies still in use.
        let in_use: std::collections::HashSet<UnitHash> = desired.values().map(|unit| unit.hash).collect();
        self.bodies.retain(|hash, _| in_use.contains(hash));
        (desired, unread)
    }

    /// Carries out one task; a failure is logged and the other units go on. Whether it was
    /// done.
    async fn execute(&mut self, task: Task, desired: &BTreeMap<String, DesiredUnit>) -> bool {
        let result = match &task {
            Task::Load(name) => {
                let Some(hash) = desired.get(name).map(|unit| unit.hash) else {
                    return false;
                };
                let Some(file) = self.bodies.get(&hash).cloned() else {
                    return false;
                };
                // Its credentials first, where its processes will find them (none: any it had
                // go); then the unit.
                let (pins, places) = wanted_credentials(desired, name);
                let result = match self.provide_credentials(name, &file, &pins, &places).await {
                    Ok(versions) => self.manager.load(name, &file).await.map(|()| versions),
                    Err(error) => Err(error),
                };
                result.map(|versions| {
                    self.loaded.insert(name.clone(), LoadedUnit::loaded(hash, versions, places));
                    self.run_book.loaded(name, &file);
                    if fleet_core::requirements::asks_at_most_once(&file) {
                        self.at_most_once.insert(name.clone());
                    } else {
                        self.at_most_once.remove(name);
                    }
                })
            }
            Task::Refresh(name) => {
                let Some(file) = self.loaded.get(name).and_then(|unit| self.bodies.get(&unit.hash)).cloned() else {
                    return false;
                };
                let (pins, places) = wanted_credentials(desired, name);
                self.provide_credentials(name, &file, &pins, &places).await.map(|versions| {
                    if let Some(unit) = self.loaded.get_mut(name) {
                        unit.secrets = Some(versions);
                        unit.places = Some(places);
                    }
                })
            }
            Task::Reload(name) => self.manager.reload(name).await,
            Task::Unload(name) => {
                let result = self.manager.unload(name).await;
                if result.is_ok() {
                    self.loaded.remove(name);
                    self.at_most_once.remove(name);
                    self.run_book.unloaded(name);
                }
                result
            }
            Task::ReloadUnitFiles => self.manager.reload_unit_files().await,
            Task::Stop(name) => {
                let result = self.manager.stop(name).await;
                if let Some(unit) = self.loaded.get_mut(name) {
                    unit.launched = false;
                }
                result
            }
            Task::Start(name) if self.at_most_once.contains(name) && !self.presence_holds() => {
                // Woken from a freeze in the middle of a pass, say: it may run elsewhere now.
                tracing::info!(unit = name, "not starting a unit that runs at most once: the presence may have lapsed");
                return false;
            }
            Task::Start(name)
                if !self.run_book.may_start(
                    name,
                    self.loaded.get(name).and_then(|unit| self.bodies.get(&unit.hash)),
                    crate::run_book::now_micros(),
                ) =>
            {
                // A scheduled unit runs once per load; one taken over from an earlier fleetd is
                // reported lost, never started again.
                if let Some(unit) = self.loaded.get_mut(name) {
                    unit.launched = true;
                }
                Ok(())
            }
            Task::Start(name) => {
                let asked = crate::run_book::now_micros();
                let result = self.manager.start(name).await;
                if let Some(unit) = self.loaded.get_mut(name) {
                    // The start was asked for; the manager's state says how it went. A start
                    // the fence refused was not: a later pass asks again.
                    unit.launched = !matches!(result, Err(UnitManagerError::Fenced { .. }));
                }
                match &result {
                    Ok(()) => self.run_book.started(name, asked),
                    Err(UnitManagerError::Fenced { .. }) => {}
                    Err(error) => self.run_book.refused(name, asked, &error.to_string()),
                }
                result
            }
        };
        let kind = match &task {
            Task::Load(_) => "load",
            Task::Refresh(_) => "refresh",
            Task::Reload(_) => "reload-unit",
            Task::Unload(_) => "unload",
            Task::ReloadUnitFiles => "reload",
            Task::Stop(_) => "stop",
            Task::Start(_) => "start",
        };
        let metrics = &fleet_metrics::metrics().agent;
        metrics.tasks.get_or_create(&fleet_metrics::TaskLabels { task: kind }).inc();
        match result {
            Ok(()) => {
                tracing::debug!(?task, "done");
                true
            }
            Err(error) => {
                metrics.task_failures.get_or_create(&fleet_metrics::TaskLabels { task: kind }).inc();
                tracing::warn!(?task, %error, "task failed");
                false
            }
        }
    }

    /// Writes the credentials of `name` (loaded from `file`) where its processes read them;
    /// at the versions `pins` (its work's) says; says which version of each secret they hold.
    async fn provide_credentials(
        &mut self,
        name: &str,
        file: &UnitFile,
        pins: &SecretPins,
        places: &[RequiredPlace],
    ) -> Result<BTreeMap<String, u64>, UnitManagerError> {
        let (secrets, manager, machine_id) =
            (self.secrets.clone(), self.manager.clone(), self.config.machine.id.clone());
        let places = manager.delivers_credentials().then_some(places);
        let (credentials, versions) = credentials_of(secrets, &machine_id, (name, file), pins, places).await?;
        manager.provide_credentials(name, file, &credentials).await?;
        Ok(versions)
    }

    async fn report_states(&mut self, held_now: Option<BTreeMap<String, HeldUnit>>) -> Result<(), RegistryError> {
        let held = match held_now {
            Some(held) => held,
            None => match self.held_units().await {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(%error, "cannot read unit states");
                    return Ok(());
                }
            },
        };
        self.follow_health(&held).await;
        let (manager, now) = (self.manager.clone(), crate::run_book::now_micros());
        self.run_book.follow(&*manager, &self.loaded, &self.bodies, now).await;
        let health = self.health.reports();
        let unhealthy = health.values().filter(|report| report.status == HealthStatus::Unhealthy).count();
        fleet_metrics::metrics().agent.units_unhealthy.set(i64::try_from(unhealthy).unwrap_or(i64::MAX));
        // What each unit held here says now; a state is built only for one whose report
        // changes (most passes change one unit or none).
        let held_now: Vec<HeldUnitNow<'_>> = self
            .loaded
            .iter()
            .filter_map(|(name, loaded)| {
                let unit = held.get(name)?;
                Some(HeldUnitNow {
                    name,
                    now: HeldNow {
                        run: self.run_book.report(name),
                        hash: loaded.hash,
                        systemd: &unit.state,
                        launched: loaded.launched,
                        drift: self.drift.report(name),
                        health: health.get(name),
                        secrets: loaded.secrets.as_ref().unwrap_or(&NO_SECRETS),
                    },
                    // A unit that just started with a check is reported with its first
                    // verdict (or as unknown once that is overdue).
                    awaiting_first_verdict: self.health.awaiting_first_verdict(name),
                })
            })
            .collect();
        let reports = reports_of_changes(&self.reported, self.machine_id(), &held_now);
        if reports.is_empty() {
            return Ok(());
        }
        let mut by_active_state: BTreeMap<String, u64> = BTreeMap::new();
        for unit in &held_now {
            *by_active_state.entry(unit.now.systemd.active.clone()).or_default() += 1;
        }
        fleet_metrics::publish_unit_states(by_active_state);
        if let Err(error) = self.registry.report_states(self.machine_id(), &reports).await {
            apply_uncertain_reports(&mut self.reported, reports);
            return Err(error);
        }
        if self.events.keeps() && std::mem::replace(&mut self.reported_once, true) {
            let at = fleet_registry::micros_now();
            for report in &reports {
                let name = match report {
                    StateReport::Set(state) => &state.name,
                    StateReport::Remove(name) => name,
                };
                self.events.note_all(fleet_core::events::state_changes(self.reported.get(name), report, at));
            }
        }
        apply_reports(&mut self.reported, reports);
        Ok(())
    }

    /// Has the health watch follow the units that run here now (launched and active), and
    /// restarts those that turned unhealthy and asked for it, within their budget.
    async fn follow_health(&mut self, held: &BTreeMap<String, HeldUnit>) {
        let running = self.loaded.iter().filter_map(|(name, loaded)| {
            let active = held.get(name).is_some_and(|unit| unit.state.active == "active");
            let file = self.bodies.get(&loaded.hash).filter(|_| loaded.launched && active)?;
            Some(Running { name, hash: loaded.hash, file })
        });
        self.health.follow(running, &self.manager);
        self.health
            .keep_budgets_of(self.loaded.iter().filter(|(_, unit)| unit.launched).map(|(name, _)| name.as_str()));
        for name in self.health.restarts_due() {
            tracing::warn!(unit = name, "restarting a unit its health check found unhealthy");
            if let Err(error) = self.manager.stop(&name).await {
                tracing::warn!(unit = name, %error, "stopping an unhealthy unit");
            }
            if let Err(error) = self.manager.start(&name).await {
                tracing::warn!(unit = name, %error, "starting an unhealthy unit again");
            }
            fleet_metrics::metrics().agent.health_restarts.inc();
            self.health.restarted(&name);
        }
    }

    /// A clean exit: stop every unit, withdraw the states, leave the cluster.
    async fn leave(self) {
        let leaving = tokio::time::Instant::now();
        if let Err(error) = self.manager.stop_all().await {
            tracing::warn!(%error, "stopping units at shutdown");
        }
        let names: Vec<String> = self.loaded.keys().cloned().collect();
        for name in &names {
            if let Err(error) = self.manager.unload(name).await {
                tracing::warn!(unit = name, %error, "unloading at shutdown");
            }
        }
        let unloaded = leaving.elapsed();
        let removals: Vec<StateReport> = self.reported.keys().cloned().map(StateReport::Remove).collect();
        if let Err(error) = self.registry.report_states(self.machine_id(), &removals).await {
            tracing::warn!(%error, "withdrawing unit states at shutdown");
        }
        tracing::info!(
            units = names.len(),
            stopped_and_unloaded_in = ?unloaded,
            states_withdrawn_in = ?leaving.elapsed().saturating_sub(unloaded),
            "units stopped and their states withdrawn"
        );
        if let Err(error) = self.registry.unregister_machine(self.machine_id()).await {
            tracing::warn!(%error, "leaving the cluster at shutdown");
        }
    }
}

impl Reconciler for Agent {
    type Error = RegistryError;
    const NAME: &'static str = "agent reconcile";
    const RETRY: Retry = Retry { min: RETRY_MIN, max: RETRY_MAX };

    async fn pass(&mut self) -> Result<Next, RegistryError> {
        Agent::pass(self).await
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }

    fn settle(&mut self, took: Duration) -> Duration {
        settling_time(self.config.debounce, took)
    }

    fn due_within(&self) -> Option<Duration> {
        self.presence_due
    }

    fn on_failure(&self) -> &'static str {
        "running units are left alone"
    }

    async fn finish(self, ending: Lifecycle) {
        if ending == Lifecycle::ShuttingDown {
            self.leave().await;
        }
    }
}

/// The secret versions and places `name` is to be given, as its work says.
fn wanted_credentials(desired: &BTreeMap<String, DesiredUnit>, name: &str) -> (SecretPins, Vec<RequiredPlace>) {
    desired.get(name).map(|unit| (unit.secrets.clone(), unit.places.at.clone())).unwrap_or_default()
}

/// A unit of the machine's work, as the agent's decision takes it.
fn assigned(unit: &AssignedUnit) -> Assigned<'_> {
    Assigned {
        name: &unit.name,
        wanted: DesiredUnit {
            hash: unit.hash,
            state: unit.desired,
            drift: unit.drift,
            secrets: unit.secrets.clone(),
            places: Places { at: unit.required_at.clone(), on_change: Default::default() },
        },
    }
}

/// Returns when `lapses` moves (marking it seen); never without one.
async fn lapsed(lapses: Option<&mut watch::Receiver<u64>>) -> Option<()> {
    match lapses {
        Some(lapses) => {
            lapses.changed().await.ok()?;
            lapses.mark_unchanged();
            Some(())
        }
        None => std::future::pending().await,
    }
}

/// Returns at `moment`; never without one.
async fn until(moment: Option<tokio::time::Instant>) {
    match moment {
        Some(moment) => tokio::time::sleep_until(moment).await,
        None => std::future::pending().await,
    }
}

/// A number that differs from machine to machine, to spread their retries.
fn spread_of(machine: &str) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    machine.hash(&mut hasher);
    u32::try_from(hasher.finish() % 1_000_000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presence_lapses_at_agent_ttl() {
        let ttl = Duration::from_secs(4);
        assert_eq!(presence(Duration::from_secs(1), ttl), Presence::Held { lapses_in: Duration::from_secs(3) });
        assert_eq!(presence(Duration::from_secs(4), ttl), Presence::Lapsed);
        assert_eq!(presence(Duration::from_secs(9), ttl), Presence::Lapsed);
    }

    #[test]
    fn a_slow_pass_gathers_changes_for_as_long_as_it_took_up_to_a_second() {
        let debounce = Duration::from_millis(10);
        assert_eq!(settling_time(debounce, Duration::from_millis(2)), debounce);
        assert_eq!(settling_time(debounce, Duration::from_millis(300)), Duration::from_millis(300));
        assert_eq!(settling_time(debounce, Duration::from_secs(7)), MOST_SETTLING);
        assert_eq!(settling_time(Duration::from_secs(2), Duration::from_secs(7)), Duration::from_secs(2));
    }
}
