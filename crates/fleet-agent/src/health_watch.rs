//! The agent's health checks: every unit that runs here with a check (`fleet_core::health`)
//! has a task that probes it at its interval and keeps its state machine. A task touches the
//! agent only when a unit's status flips: it records the verdict and wakes the agent, whose
//! next pass reports it in the unit's state (and restarts the unit when it asked for that,
//! within its budget). Probes run beside the agent's passes and never hold them up.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_core::drift::{Corrections, DriftPolicy, Verdict};
use fleet_core::health::{HealthCheck, HealthReport, HealthStatus, Tracker, check_of};
use fleet_core::{UnitFile, UnitHash};
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::check_command::RunAs;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::probe::Prober;

/// The first probe of a newly followed unit comes within this long (spread by its name, so
/// that units started together are not probed at once, yet soon: a rollout waits for it),
/// and [`FIRST_PROBE_SPREAD_PER_UNIT`] longer for each unit that starts being followed with
/// it (an agent adopting thousands of units spreads their first probes over seconds).
const FIRST_PROBE_WITHIN: Duration = Duration::from_millis(50);
const FIRST_PROBE_SPREAD_PER_UNIT: Duration = Duration::from_micros(200);

/// How long, by default, a newly followed unit's state waits for its check's first verdict
/// before it is reported `unknown`: a unit that passes its first probe soon after it starts is reported
/// once, healthy, not once unknown and again healthy a moment later (in a rollout, that is a
/// write, an event to every watcher and a pass of the agent saved per unit).
pub const FIRST_VERDICT_WAIT: Duration = Duration::from_secs(1);

/// A unit's check, as read once per content.
#[derive(Clone, Debug)]
struct Declared {
    check: HealthCheck,
    run_as: RunAs,
}

/// What a unit's task last concluded.
#[derive(Clone, Debug, Default)]
struct LastVerdict {
    status: HealthStatus,
    failure: String,
}

/// A unit being followed, for the content it runs.
struct Followed {
    hash: UnitHash,
    task: JoinHandle<()>,
    since: Instant,
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Restarts a unit asked for when it turns unhealthy, counted against the drift budget.
#[derive(Default)]
struct Restarts {
    hash: Option<UnitHash>,
    budget: Corrections,
    /// The flip (counted since the unit's run started) the last restart answered, so that one
    /// flip restarts once.
    answered: u64,
}

pub struct HealthWatch {
    clock: Instant,
    /// Each running unit's check, read once per (unit, content): instances of one template
    /// share their content but not their check, whose specifiers (`%i`) are each instance's.
    checks: HashMap<(String, UnitHash), Option<Declared>>,
    followed: BTreeMap<String, Followed>,
    /// Written by the tasks: each unit's verdict, and how many times it flipped.
    verdicts: Arc<Mutex<BTreeMap<String, (LastVerdict, u64)>>>,
    restarts: BTreeMap<String, Restarts>,
    flips: watch::Sender<u64>,
    first_verdict_wait: Duration,
}

impl Default for HealthWatch {
    fn default() -> Self {
        Self {
            clock: Instant::now(),
            checks: HashMap::new(),
            followed: BTreeMap::new(),
            verdicts: Arc::default(),
            restarts: BTreeMap::new(),
            flips: watch::channel(0).0,
            first_verdict_wait: FIRST_VERDICT_WAIT,
        }
    }
}

/// A unit that runs here now, as [`HealthWatch::follow`] takes it.
pub struct Running<'a> {
    pub name: &'a str,
    pub hash: UnitHash,
    pub file: &'a UnitFile,
}

impl HealthWatch {
    /// How long a newly followed unit's state waits for its first verdict
    /// ([`FIRST_VERDICT_WAIT`] unless set).
    pub fn set_first_verdict_wait(&mut self, wait: Duration) {
        self.first_verdict_wait = wait;
    }

    /// Moves whenever a unit's health flips, and when a unit's first verdict is overdue.
    pub fn flips(&self) -> watch::Receiver<u64> {
        self.flips.subscribe()
    }

    /// Whether `name` was followed less than the first verdict's wait ago and its check has not
    /// concluded yet: its state is better reported with the verdict that is coming.
    pub fn awaiting_first_verdict(&self, name: &str) -> bool {
        let Some(followed) = self.followed.get(name) else { return false };
        followed.since.elapsed() < self.first_verdict_wait
            && self.verdicts.locked().get(name).is_some_and(|(_, flips)| *flips == 0)
    }

    /// Follows exactly the checked units of `running` (active now): a new one, or one with new
    /// content, gets a fresh task (its status unknown); the tasks of the others end.
    pub fn follow<'a>(&mut self, running: impl IntoIterator<Item = Running<'a>>, manager: &Arc<dyn UnitManager>) {
        let running: Vec<Running<'a>> = running.into_iter().collect();
        // Checks are read once per unit and content, and forgotten once the unit no longer
        // runs that content here.
        let running_now: std::collections::HashSet<(&str, UnitHash)> =
            running.iter().map(|unit| (unit.name, unit.hash)).collect();
        self.checks.retain(|(name, hash), _| running_now.contains(&(name.as_str(), *hash)));
        let new =
            running.iter().filter(|unit| self.followed.get(unit.name).is_none_or(|f| f.hash != unit.hash)).count();
        let spread = FIRST_PROBE_WITHIN + FIRST_PROBE_SPREAD_PER_UNIT * u32::try_from(new).unwrap_or(u32::MAX);
        let mut keep: BTreeMap<String, UnitHash> = BTreeMap::new();
        for unit in running {
            let declared =
                self.checks.entry((unit.name.to_string(), unit.hash)).or_insert_with(|| declared(unit.name, unit.file));
            let Some(declared) = declared.clone() else { continue };
            keep.insert(unit.name.to_string(), unit.hash);
            if self.followed.get(unit.name).is_some_and(|followed| followed.hash == unit.hash) {
                continue;
            }
            self.verdicts.locked().insert(unit.name.to_string(), Default::default());
            let first = first_probe_offset(unit.name, declared.check.interval.min(spread));
            let outlet = Outlet { verdicts: self.verdicts.clone(), flips: self.flips.clone() };
            let timing = Timing { first, clock: self.clock, first_verdict_wait: self.first_verdict_wait };
            let task = tokio::spawn(watch_unit(unit.name.to_string(), declared, manager.clone(), outlet, timing));
            self.followed.insert(unit.name.to_string(), Followed { hash: unit.hash, task, since: Instant::now() });
        }
        self.followed.retain(|name, _| keep.contains_key(name));
        self.verdicts.locked().retain(|name, _| keep.contains_key(name));
    }

    /// Keeps the restart budgets of the units `launched` here only: a unit stopped or gone
    /// starts afresh. (A unit restarting is not active for a while, but still launched.)
    pub fn keep_budgets_of<'a>(&mut self, launched: impl IntoIterator<Item = &'a str>) {
        let launched: std::collections::HashSet<&str> = launched.into_iter().collect();
        self.restarts.retain(|name, _| launched.contains(name.as_str()));
    }

    /// Forgets a unit's verdict (it is about to restart): its next run starts unknown.
    pub fn restarted(&mut self, name: &str) {
        self.followed.remove(name);
        if let Some(restarts) = self.restarts.get_mut(name) {
            restarts.answered = 0;
        }
        self.verdicts.locked().remove(name);
    }

    /// The units that turned unhealthy and asked to be restarted for it, within their budget
    /// (the drift budget: `drift::LIMIT` in `drift::WINDOW`); a unit past it is left
    /// unhealthy, marked given up, until its content changes.
    pub fn restarts_due(&mut self) -> Vec<String> {
        let now = self.clock.elapsed();
        let verdicts = self.verdicts.locked();
        let mut due = Vec::new();
        for (name, (verdict, flips)) in verdicts.iter() {
            let Some(followed) = self.followed.get(name) else { continue };
            let asks = self
                .checks
                .get(&(name.clone(), followed.hash))
                .and_then(Option::as_ref)
                .is_some_and(|declared| declared.check.restart);
            if !asks || verdict.status != HealthStatus::Unhealthy {
                continue;
            }
            let restarts = self.restarts.entry(name.clone()).or_default();
            if restarts.hash != Some(followed.hash) {
                *restarts = Restarts { hash: Some(followed.hash), ..Restarts::default() };
            }
            if restarts.answered == *flips {
                continue;
            }
            restarts.answered = *flips;
            if let Verdict::Correct { .. } = restarts.budget.decide(DriftPolicy::Correct, now) {
                due.push(name.clone());
            }
        }
        due
    }

    /// What to report of each followed unit's health.
    pub fn reports(&self) -> BTreeMap<String, HealthReport> {
        let now = self.clock.elapsed();
        let verdicts = self.verdicts.locked();
        verdicts
            .iter()
            .map(|(name, (verdict, _))| {
                let restarts = self.restarts.get(name);
                let report = HealthReport {
                    status: verdict.status,
                    failure: verdict.failure.clone(),
                    restarts: restarts.map_or(0, |restarts| restarts.budget.recent(now)),
                    given_up: restarts.is_some_and(|restarts| restarts.budget.given_up()),
                };
                (name.clone(), report)
            })
            .collect()
    }
}

/// The unit's check and who its command runs as; none for a unit without one (or with one
/// that cannot be read: such a unit is refused where it enters the cluster).
fn declared(name: &str, file: &UnitFile) -> Option<Declared> {
    let check = check_of(name, file.options()).ok()??;
    let last = |key: &str| file.values("Service", key).last().map(|value| value.to_string());
    Some(Declared { check, run_as: RunAs { user: last("User"), group: last("Group") } })
}

/// Where a unit's task leaves its verdicts, and the agent's wake.
struct Outlet {
    verdicts: Arc<Mutex<BTreeMap<String, (LastVerdict, u64)>>>,
    flips: watch::Sender<u64>,
}

/// When a unit's task probes: its first probe comes `first` after it starts; `clock` is the
/// watch's; its first verdict is overdue after `first_verdict_wait`.
struct Timing {
    first: Duration,
    clock: Instant,
    first_verdict_wait: Duration,
}

/// Probes one unit at its interval for as long as it is followed.
async fn watch_unit(name: String, declared: Declared, manager: Arc<dyn UnitManager>, outlet: Outlet, timing: Timing) {
    let Outlet { verdicts, flips } = outlet;
    let Timing { first, clock, first_verdict_wait } = timing;
    let check = &declared.check;
    let mut tracker = Tracker::new(check, clock.elapsed());
    let mut prober = Prober::default();
    let mut starting = Starting::new();
    let mut next = Instant::now() + first;
    // Until the first verdict, the agent holds back the unit's state: it is woken when the
    // verdict is overdue, to report the unit unknown.
    // (The wake comes whether the task is waiting for a probe or inside a slow one.)
    let mut overdue_at = Some(Instant::now() + first_verdict_wait);
    let overdue = async |at: &mut Option<Instant>| match *at {
        Some(moment) => {
            tokio::time::sleep_until(moment).await;
            *at = None;
            flips.send_modify(|count| *count += 1);
        }
        None => std::future::pending().await,
    };
    loop {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => break,
                () = overdue(&mut overdue_at) => {}
            }
        }
        let probing = prober.probe(&check.probe, &name, &declared.run_as, check.timeout, manager.as_ref());
        tokio::pin!(probing);
        let outcome = loop {
            tokio::select! {
                outcome = &mut probing => break outcome,
                () = overdue(&mut overdue_at) => {}
            }
        };
        fleet_metrics::metrics().agent.health_probes.inc();
        if tracker.observe(outcome, clock.elapsed()) {
            tracing::info!(unit = name, status = %tracker.status(), failure = tracker.failure(), "health changed");
            let verdict = LastVerdict { status: tracker.status(), failure: tracker.failure().to_string() };
            {
                let mut verdicts = verdicts.locked();
                let Some(slot) = verdicts.get_mut(&name) else { return };
                *slot = (verdict, slot.1 + 1);
            }
            overdue_at = None;
            flips.send_modify(|count| *count += 1);
        }
        next = match starting.next_wait(&tracker, clock.elapsed(), check.interval) {
            Some(wait) => Instant::now() + wait,
            // A probe that took longer than the interval is not followed by a burst to catch up.
            None => (next + check.interval).max(Instant::now()),
        };
    }
}

/// How soon a unit in its start period is probed again: failures there do not count, and a
/// rollout waits for its first pass, so it is tried again soon (after
/// [`STARTING_RETRY_FIRST`], doubling up to [`STARTING_RETRY_MOST`], never past the
/// interval) rather than a whole interval later.
const STARTING_RETRY_FIRST: Duration = Duration::from_millis(100);
const STARTING_RETRY_MOST: Duration = Duration::from_secs(1);

struct Starting {
    retry: Duration,
}

impl Starting {
    fn new() -> Self {
        Self { retry: STARTING_RETRY_FIRST }
    }

    /// The wait before the next probe while the unit is starting; none once it is not.
    fn next_wait(&mut self, tracker: &Tracker, now: Duration, interval: Duration) -> Option<Duration> {
        if !tracker.starting(now) {
            return None;
        }
        let wait = self.retry.min(interval);
        self.retry = (self.retry * 2).min(STARTING_RETRY_MOST);
        Some(wait)
    }
}

/// Where in `within` a unit's first probe falls, by its name.
fn first_probe_offset(name: &str, within: Duration) -> Duration {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    let millis = u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(hasher.finish() % millis)
}

#[cfg(test)]
mod tests {
    use fleet_core::health::{Outcome, Probe};

    use super::*;

    fn check(start_period: u64, interval: u64) -> HealthCheck {
        HealthCheck {
            probe: Probe::Tcp { host: "127.0.0.1".into(), port: 1 },
            interval: Duration::from_secs(interval),
            timeout: Duration::from_secs(1),
            threshold: 3,
            start_period: Duration::from_secs(start_period),
            restart: false,
        }
    }

    #[test]
    fn a_starting_unit_is_probed_again_soon_until_it_passes_or_its_start_period_ends() {
        let check = check(60, 10);
        let mut tracker = Tracker::new(&check, Duration::ZERO);
        let mut starting = Starting::new();
        let waits: Vec<u64> = (0..6)
            .map(|second| {
                tracker.observe(Outcome::Fail("refused".into()), Duration::from_secs(second));
                starting
                    .next_wait(&tracker, Duration::from_secs(second), check.interval)
                    .map_or(0, |w| w.as_millis() as u64)
            })
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(starting.next_wait(&tracker, Duration::from_secs(60), check.interval), None, "the period ended");
        tracker.observe(Outcome::Pass, Duration::from_secs(7));
        assert_eq!(starting.next_wait(&tracker, Duration::from_secs(7), check.interval), None, "it passed");
    }

    #[test]
    fn without_a_start_period_the_interval_rules_and_retries_never_pass_it() {
        let tracker = Tracker::new(&check(0, 10), Duration::ZERO);
        assert_eq!(Starting::new().next_wait(&tracker, Duration::ZERO, Duration::from_secs(10)), None);
        let short = Tracker::new(&check(60, 1), Duration::ZERO);
        let mut starting = Starting::new();
        let waits: Vec<Duration> =
            (0..5).filter_map(|_| starting.next_wait(&short, Duration::ZERO, Duration::from_millis(300))).collect();
        assert_eq!(waits.last(), Some(&Duration::from_millis(300)));
    }
}
