//! The agent against the embedded store in a temporary directory and the fake unit manager,
//! with paused time: what it starts, stops, adopts and reports.

use std::sync::Arc;
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::schedule::{Decision, UnscheduleReason};
use fleet_core::{DesiredState, MachineState, SystemdState, UnitFile};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry};
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::{FakeUnitManager, eventually};
use tokio::sync::watch;

const MACHINE: &str = "m1";

fn sleeper() -> UnitFile {
    UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap()
}

fn running() -> Option<SystemdState> {
    Some(SystemdState::new("loaded", "active", "running"))
}

fn config() -> AgentConfig {
    AgentConfig {
        machine: MachineState { id: MACHINE.into(), public_ip: "127.0.0.1".into(), ..Default::default() },
        reconcile_interval: Duration::from_secs(5),
        debounce: Duration::from_millis(10),
        presence_ttl: None,
        stop_units_when_cut_off: false,
    }
}

/// Writes what the engine would: the unit, placed on this machine.
async fn schedule(registry: &EmbeddedRegistry, name: &str, desired: DesiredState) {
    registry.put_unit(name, &sleeper(), desired).await.unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let decision = Decision::Schedule { unit: name.into(), machine: MACHINE.into() };
    registry.apply(&lease, &[decision], &[]).await.unwrap();
}

struct Running {
    lifecycle: watch::Sender<Lifecycle>,
    task: tokio::task::JoinHandle<()>,
}

fn start(registry: &EmbeddedRegistry, manager: &Arc<FakeUnitManager>) -> Running {
    let (lifecycle, watch) = watch::channel(Lifecycle::Running);
    let agent = Agent::new(config(), Arc::new(registry.clone()), manager.clone());
    Running { lifecycle, task: tokio::spawn(agent.run(watch)) }
}

#[tokio::test(start_paused = true)]
async fn runs_what_is_scheduled_here_reports_it_and_stops_what_is_taken_away() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let agent = start(&registry, &manager);
    schedule(&registry, "a.service", DesiredState::Launched).await;
    eventually("a.service runs", async || manager.state("a.service") == running()).await;
    eventually("its state is reported", async || {
        registry
            .unit_states()
            .await
            .unwrap()
            .iter()
            .any(|state| state.name == "a.service" && state.systemd.active == "active")
    })
    .await;
    assert_eq!(registry.machines().await.unwrap().len(), 1, "the agent registered its machine");

    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let away = Decision::Unschedule {
        unit: "a.service".into(),
        machine: MACHINE.into(),
        reason: UnscheduleReason::TargetStateInactive,
    };
    registry.apply(&lease, &[away], &[]).await.unwrap();
    eventually("a.service is unloaded", async || manager.state("a.service").is_none()).await;

    agent.lifecycle.send(Lifecycle::ShuttingDown).unwrap();
    agent.task.await.unwrap();
    assert!(registry.machines().await.unwrap().is_empty(), "a clean shutdown leaves the cluster");
}

/// A pass with many units to load stops between two of them when fleetd stops: it does not
/// load the rest only for shutdown to unload them (100,000 units took fleetd 20-30 s to stop).
#[tokio::test(start_paused = true)]
async fn a_pass_with_many_units_to_load_stops_between_two_when_fleetd_stops() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let mut decisions = Vec::new();
    for n in 0..50 {
        let name = format!("u{n}.service");
        registry.put_unit(&name, &sleeper(), DesiredState::Loaded).await.unwrap();
        decisions.push(Decision::Schedule { unit: name, machine: MACHINE.into() });
    }
    registry.apply(&lease, &decisions, &[]).await.unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let (lifecycle, watch) = watch::channel(Lifecycle::Running);
    let stop = lifecycle.clone();
    manager.when_loaded(3, move || {
        stop.send_replace(Lifecycle::ShuttingDown);
    });
    let agent = Agent::new(config(), Arc::new(registry.clone()), manager.clone());
    agent.run(watch).await;
    assert_eq!(manager.loads(), 3, "no load after fleetd began to stop");
    assert!(
        (0..50).all(|n| manager.state(&format!("u{n}.service")).is_none()),
        "what was loaded is unloaded at shutdown"
    );
    assert!(registry.machines().await.unwrap().is_empty(), "a clean shutdown leaves the cluster");
    drop(lifecycle);
}

#[tokio::test(start_paused = true)]
async fn a_unit_that_fails_by_itself_is_reported_failed_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let agent = start(&registry, &manager);
    schedule(&registry, "a.service", DesiredState::Launched).await;
    let reported_as = async |active: &str| {
        registry
            .unit_states()
            .await
            .unwrap()
            .iter()
            .any(|state| state.name == "a.service" && state.systemd.active == active)
    };
    eventually("a.service runs and is reported", async || reported_as("active").await).await;
    // A pass with nothing to do reports from the manager's listing it looked at for drift.
    manager.fail_by_itself("a.service").unwrap();
    eventually("the failure is reported", async || reported_as("failed").await).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(manager.starts(), 1, "a unit that ended by itself is not started again");
    assert!(reported_as("failed").await, "the failure stays reported across idle passes");
    agent.lifecycle.send(Lifecycle::ShuttingDown).unwrap();
    agent.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_running_units_without_restarting_them() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    schedule(&registry, "a.service", DesiredState::Launched).await;
    let manager = Arc::new(FakeUnitManager::running("a.service", &sleeper()));
    let agent = start(&registry, &manager);
    eventually("the adopted unit's state is reported", async || {
        registry.unit_states().await.unwrap().iter().any(|state| state.name == "a.service" && state.launched)
    })
    .await;
    assert_eq!(manager.starts(), 0, "a unit already running is not started again");
    // A reload leaves units running for the next agent.
    agent.lifecycle.send(Lifecycle::Reloading).unwrap();
    agent.task.await.unwrap();
    assert_eq!(manager.state("a.service"), running());
}

/// The embedded store as a pull agent's manager keeps it: registering again keeps what the
/// machine reported before.
struct KeepingReports(EmbeddedRegistry);

#[async_trait::async_trait]
impl AgentRegistry for KeepingReports {
    async fn register_machine(&self, machine: &MachineState) -> fleet_registry::Result<()> {
        self.0.announce_for_agent(machine).await
    }
    async fn unregister_machine(&self, machine_id: &str) -> fleet_registry::Result<()> {
        self.0.unregister_machine(machine_id).await
    }
    async fn machine_work(&self, machine_id: &str) -> fleet_registry::Result<fleet_registry::MachineWork> {
        self.0.machine_work(machine_id).await
    }
    async fn unit_body(&self, hash: &fleet_core::UnitHash) -> fleet_registry::Result<Option<UnitFile>> {
        self.0.unit_body(hash).await
    }
    async fn report_states(
        &self,
        machine_id: &str,
        reports: &[fleet_registry::StateReport],
    ) -> fleet_registry::Result<()> {
        self.0.report_states(machine_id, reports).await
    }
    fn machine_changes(&self, machine_id: &str) -> fleet_registry::ChangeSignal {
        self.0.machine_changes(machine_id)
    }
}

/// An agent that starts again and finds a unit running that is no longer this machine's
/// (taken off it while no agent ran) stops it and takes its old report out of the store, even
/// where the store kept the reports of the agent before: a report left showing it running
/// would keep the engine from placing it anywhere else.
#[tokio::test(start_paused = true)]
async fn a_restarted_agent_takes_out_the_report_of_an_adopted_unit_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&config().machine).await.unwrap();
    let earlier = fleet_core::UnitState {
        run: None,
        name: "gone.service".into(),
        machine_id: MACHINE.into(),
        hash: sleeper().hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    registry.report_states(MACHINE, &[fleet_registry::StateReport::Set(earlier)]).await.unwrap();
    let manager = Arc::new(FakeUnitManager::running("gone.service", &sleeper()));
    let (lifecycle, watch) = watch::channel(Lifecycle::Running);
    let agent = Agent::new(config(), Arc::new(KeepingReports(registry.clone())), manager.clone());
    let task = tokio::spawn(agent.run(watch));
    eventually("the unit no longer this machine's is stopped", async || manager.state("gone.service").is_none()).await;
    eventually("and its old report is gone", async || registry.unit_states().await.unwrap().is_empty()).await;
    lifecycle.send(Lifecycle::ShuttingDown).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_loaded_unit_is_loaded_but_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let manager = Arc::new(FakeUnitManager::new());
    let _agent = start(&registry, &manager);
    schedule(&registry, "b.service", DesiredState::Loaded).await;
    eventually("b.service is loaded", async || manager.state("b.service").is_some()).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.state("b.service"), Some(SystemdState::new("loaded", "inactive", "dead")));
    assert_eq!(manager.starts(), 0);
}

/// The embedded store, with an outage that can be switched on: every read of the machine's
/// work fails while it lasts, and the attempts are counted; or only reads of unit bodies fail.
struct FlakyStore {
    store: EmbeddedRegistry,
    down: std::sync::atomic::AtomicBool,
    attempts: std::sync::atomic::AtomicUsize,
    bodies_down: std::sync::atomic::AtomicBool,
    /// Every read of the machine's work: one per agent pass.
    reads: std::sync::atomic::AtomicUsize,
    /// Whether the machine's presence lapsed and its work since is not read yet (etcd: its
    /// lease expired and its copy has not caught up with its registering again).
    lapsed: std::sync::atomic::AtomicBool,
    /// The agent's wake-up: the store's own, forwarded, or [`FlakyStore::wake`].
    changes: watch::Sender<u64>,
    /// How many registrations fail from now on; and every attempt, counted.
    registrations_failing: std::sync::atomic::AtomicUsize,
    registrations: std::sync::atomic::AtomicUsize,
    /// Whether a registration is refused with a lapse until the agent says it handled one, as
    /// etcd's store refuses a fresh presence until the agent stopped what ran here; and
    /// whether it has said so.
    lapse_before_registering: std::sync::atomic::AtomicBool,
    lapse_handled: std::sync::atomic::AtomicBool,
}

impl FlakyStore {
    /// Wakes the agent as a store does when what it may read changed though its copy did
    /// not (etcd: the presence lapsed).
    fn wake(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }
}

#[async_trait::async_trait]
impl fleet_registry::AgentRegistry for FlakyStore {
    async fn register_machine(&self, machine: &MachineState) -> fleet_registry::Result<()> {
        use std::sync::atomic::Ordering;
        self.registrations.fetch_add(1, Ordering::SeqCst);
        if self.lapse_before_registering.load(Ordering::SeqCst) && !self.lapse_handled.load(Ordering::SeqCst) {
            return Err(fleet_registry::RegistryError::PresenceLapsed);
        }
        let failing = self.registrations_failing.load(Ordering::SeqCst);
        if failing > 0 {
            self.registrations_failing.store(failing - 1, Ordering::SeqCst);
            return Err(fleet_registry::RegistryError::Unavailable("the manager is busy".into()));
        }
        self.store.register_machine(machine).await
    }
    async fn unregister_machine(&self, machine_id: &str) -> fleet_registry::Result<()> {
        self.store.unregister_machine(machine_id).await
    }
    async fn machine_work(&self, machine_id: &str) -> fleet_registry::Result<fleet_registry::MachineWork> {
        use std::sync::atomic::Ordering;
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            return Err(fleet_registry::RegistryError::unavailable("flaky store", "down for the test"));
        }
        if self.lapsed.load(Ordering::SeqCst) {
            return Err(fleet_registry::RegistryError::PresenceLapsed);
        }
        self.store.machine_work(machine_id).await
    }
    async fn unit_body(&self, hash: &fleet_core::UnitHash) -> fleet_registry::Result<Option<UnitFile>> {
        if self.bodies_down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(fleet_registry::RegistryError::unavailable("flaky store", "bodies down for the test"));
        }
        self.store.unit_body(hash).await
    }
    async fn report_states(
        &self,
        machine_id: &str,
        reports: &[fleet_registry::StateReport],
    ) -> fleet_registry::Result<()> {
        self.store.report_states(machine_id, reports).await
    }
    fn presence_lapse_handled(&self, _machine_id: &str) {
        self.lapse_handled.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    fn machine_changes(&self, machine_id: &str) -> fleet_registry::ChangeSignal {
        let mut store_changes = self.store.machine_changes(machine_id);
        let forward = self.changes.clone();
        tokio::spawn(async move {
            while store_changes.changed().await.is_ok() {
                forward.send_modify(|generation| *generation += 1);
            }
        });
        self.changes.subscribe()
    }
}

/// An agent on `store` behind a [`FlakyStore`] with nothing failing yet; the flaky store,
/// the unit manager and the agent's lifecycle (dropping it stops the agent).
fn start_on_flaky(store: &EmbeddedRegistry) -> (Arc<FlakyStore>, Arc<FakeUnitManager>, watch::Sender<Lifecycle>) {
    start_on_flaky_with(store, config())
}

/// As [`start_on_flaky`], with the agent configured as `config` says.
fn start_on_flaky_with(
    store: &EmbeddedRegistry,
    config: AgentConfig,
) -> (Arc<FlakyStore>, Arc<FakeUnitManager>, watch::Sender<Lifecycle>) {
    let flaky = Arc::new(FlakyStore {
        store: store.clone(),
        down: false.into(),
        attempts: 0.into(),
        bodies_down: false.into(),
        reads: 0.into(),
        lapsed: false.into(),
        changes: watch::channel(0).0,
        registrations_failing: 0.into(),
        registrations: 0.into(),
        lapse_before_registering: false.into(),
        lapse_handled: false.into(),
    });
    let manager = Arc::new(FakeUnitManager::new());
    let (lifecycle, watch) = watch::channel(Lifecycle::Running);
    tokio::spawn(Agent::new(config, flaky.clone(), manager.clone()).run(watch));
    (flaky, manager, lifecycle)
}

/// A pass lists the unit manager to report: the state changes that listing already shows
/// (the pass's own starts) call for no other pass, and a change after it still wakes the
/// agent at once, not at the fallback reconcile.
#[tokio::test(start_paused = true)]
async fn a_pass_is_not_woken_again_by_its_own_starts_but_is_by_later_changes() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let hour = AgentConfig { reconcile_interval: Duration::from_secs(3600), ..config() };
    let (flaky, manager, _agent) = start_on_flaky_with(&store, hour);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = flaky.reads.load(Ordering::SeqCst);
    schedule(&store, "a.service", DesiredState::Launched).await;
    eventually("a.service runs", async || manager.state("a.service") == running()).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let passes = flaky.reads.load(Ordering::SeqCst) - before;
    assert_eq!(passes, 1, "one pass loaded, started and reported a.service");
    let reported_failed = async || {
        store
            .unit_states()
            .await
            .unwrap()
            .iter()
            .any(|state| state.name == "a.service" && state.systemd.active == "failed")
    };
    manager.fail_by_itself("a.service").unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(reported_failed().await, "a change after the pass's listing wakes the agent");
    assert_eq!(flaky.reads.load(Ordering::SeqCst) - before, passes + 1);
}

/// A registration that failed (a manager busy with a rush of joins) is tried again on a
/// backoff, not at the next fallback reconcile: with a fallback of an hour, the machine is
/// registered within seconds, after a few spaced tries.
#[tokio::test(start_paused = true)]
async fn a_failed_registration_is_tried_again_on_a_backoff_not_at_the_fallback() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let hour = AgentConfig { reconcile_interval: Duration::from_secs(3600), ..config() };
    let (flaky, _manager, _agent) = start_on_flaky_with(&store, hour);
    // Set before the agent's task first runs (nothing has yielded to it yet).
    flaky.registrations_failing.store(3, Ordering::SeqCst);
    let registered = async || store.machines().await.unwrap().iter().any(|machine| machine.id == MACHINE);
    let began = tokio::time::Instant::now();
    eventually("the machine registers after three failures", async || registered().await).await;
    assert!(began.elapsed() < Duration::from_secs(60), "registered {:?} later", began.elapsed());
    let attempts = flaky.registrations.load(Ordering::SeqCst);
    assert_eq!(attempts, 4, "three spaced failures, then the registration");
}

/// A store that has the agent stop what runs here before a fresh presence (etcd's) is asked
/// again as soon as the agent has: registering costs no retry's wait (time is paused here, so
/// only a wait the agent chose moves the clock).
#[tokio::test(start_paused = true)]
async fn a_fresh_presence_is_registered_in_the_pass_that_handled_its_lapse() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let (flaky, _manager, _agent) = start_on_flaky(&store);
    // Set before the agent's task first runs (nothing has yielded to it yet).
    flaky.lapse_before_registering.store(true, Ordering::SeqCst);
    let began = tokio::time::Instant::now();
    let registered = async || store.machines().await.unwrap().iter().any(|machine| machine.id == MACHINE);
    eventually("the machine registers once its lapse is handled", async || registered().await).await;
    assert!(flaky.lapse_handled.load(Ordering::SeqCst), "the lapse was handled before the registration");
    assert_eq!(flaky.registrations.load(Ordering::SeqCst), 2, "refused once, then registered");
    assert!(began.elapsed() < Duration::from_millis(100), "registered {:?} later", began.elapsed());
}

/// A store outage never stops a running unit: the agent leaves its units alone and retries
/// with a backoff that doubles (not once per fallback period, not in a tight loop), and it
/// acts again as soon as the store is back.
#[tokio::test(start_paused = true)]
async fn a_store_outage_leaves_running_units_alone_and_is_retried_with_backoff() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    schedule(&store, "a.service", DesiredState::Launched).await;
    let (flaky, manager, _agent) = start_on_flaky(&store);
    eventually("a.service runs", async || manager.state("a.service") == running()).await;

    flaky.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(manager.state("a.service"), running(), "the outage stopped nothing");
    let attempts = flaky.attempts.load(Ordering::SeqCst);
    // 250 ms doubling to 30 s: about nine tries in a minute (a fixed 5 s period would be 12,
    // a tight loop thousands).
    assert!((6..=11).contains(&attempts), "{attempts} attempts in 60 s");

    flaky.down.store(false, Ordering::SeqCst);
    schedule(&store, "b.service", DesiredState::Launched).await;
    eventually("the agent acts again once the store is back", async || manager.state("b.service") == running()).await;
}

/// New content that cannot be read does not hold up the rest of a pass: what was taken away
/// from the machine stops at once, what runs keeps running, and the new unit starts once its
/// content can be read.
#[tokio::test(start_paused = true)]
async fn a_unit_taken_away_stops_even_while_new_content_cannot_be_read() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    schedule(&store, "a.service", DesiredState::Launched).await;
    schedule(&store, "kept.service", DesiredState::Launched).await;
    let (flaky, manager, _agent) = start_on_flaky(&store);
    eventually("both run", async || {
        manager.state("a.service") == running() && manager.state("kept.service") == running()
    })
    .await;

    flaky.bodies_down.store(true, Ordering::SeqCst);
    let other = UnitFile::parse("[Service]\nExecStart=/bin/sleep 2000\n").unwrap();
    store.put_unit("b.service", &other, DesiredState::Launched).await.unwrap();
    let lease = store.acquire_leadership("engine").await.unwrap().unwrap();
    let moves = [
        Decision::Unschedule {
            unit: "a.service".into(),
            machine: MACHINE.into(),
            reason: UnscheduleReason::TargetStateInactive,
        },
        Decision::Schedule { unit: "b.service".into(), machine: MACHINE.into() },
    ];
    store.apply(&lease, &moves, &[]).await.unwrap();
    eventually("a.service stops though b.service's content cannot be read", async || {
        manager.state("a.service").is_none()
    })
    .await;
    assert_eq!(manager.state("kept.service"), running(), "what still runs here is left alone");
    assert_eq!(manager.state("b.service"), None, "a unit whose content is unread waits");

    flaky.bodies_down.store(false, Ordering::SeqCst);
    eventually("b.service starts once its content can be read", async || manager.state("b.service") == running()).await;
    assert_eq!(manager.starts(), 3, "kept.service was never restarted");
}

/// A machine whose work cannot be read (its presence lapsed, and the store does not yet show
/// its work since it registered again) runs nothing meanwhile, and shows it: the gauge counts
/// it while it lasts (the chaos run's seed 1820719916 had a machine so for a minute, silent).
#[tokio::test(start_paused = true)]
async fn a_machine_whose_work_cannot_be_read_shows_it_until_it_can() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    schedule(&store, "a.service", DesiredState::Launched).await;
    let (flaky, manager, _agent) = start_on_flaky(&store);
    eventually("it runs", async || manager.state("a.service") == running()).await;
    let unreadable = || fleet_metrics::metrics().agent.work_unreadable.get();
    assert_eq!(unreadable(), 0);
    flaky.lapsed.store(true, Ordering::SeqCst);
    flaky.wake();
    eventually("the gauge counts the machine", async || unreadable() == 1).await;
    assert_eq!(manager.state("a.service"), None, "nothing runs meanwhile");
    let reads = flaky.reads.load(Ordering::SeqCst);
    eventually("more passes find the work unreadable", async || flaky.reads.load(Ordering::SeqCst) >= reads + 5).await;
    assert_eq!(unreadable(), 1, "counted once however many passes find it so");
    flaky.lapsed.store(false, Ordering::SeqCst);
    eventually("readable again, the gauge lets it go", async || unreadable() == 0).await;
    eventually("and the unit runs", async || manager.state("a.service") == running()).await;
}

/// A machine that learns its presence lapsed acts on it at once, however long its backoff
/// after an outage: it stops every unit (the engine may have placed any of them elsewhere),
/// and once its work can be read again it runs what is still its own, and only that.
#[tokio::test(start_paused = true)]
async fn a_lapsed_presence_stops_every_unit_at_once_until_the_work_shows_what_is_still_here() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    schedule(&store, "moved.service", DesiredState::Launched).await;
    schedule(&store, "kept.service", DesiredState::Launched).await;
    let (flaky, manager, _agent) = start_on_flaky(&store);
    eventually("both run", async || {
        manager.state("moved.service") == running() && manager.state("kept.service") == running()
    })
    .await;

    // An outage long enough that the agent's backoff has grown to many seconds.
    flaky.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(manager.state("moved.service"), running(), "the outage stopped nothing");

    // The lease expired meanwhile, and the engine took one unit away (as it moves a unit
    // whose machine went away; the store's apply rule wants that machine gone for that
    // reason, so here it is taken away as an inactive one is: the agent cannot tell).
    let lease = store.acquire_leadership("engine").await.unwrap().unwrap();
    let away = Decision::Unschedule {
        unit: "moved.service".into(),
        machine: MACHINE.into(),
        reason: UnscheduleReason::TargetStateInactive,
    };
    store.apply(&lease, &[away], &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Back in touch, the store learns the presence lapsed and wakes the agent.
    flaky.lapsed.store(true, Ordering::SeqCst);
    flaky.down.store(false, Ordering::SeqCst);
    let woken = tokio::time::Instant::now();
    flaky.wake();
    eventually("every unit stops", async || {
        manager.state("moved.service").is_none() && manager.state("kept.service").is_none()
    })
    .await;
    assert!(woken.elapsed() < Duration::from_secs(1), "stopped {:?} after the wake-up", woken.elapsed());
    // Unit by unit: the manager's stop_all is leaving (the native supervisor removes its
    // cgroups then, and could start nothing after; the chaos run found units running nowhere).
    assert_eq!(manager.stop_alls(), 0);

    flaky.lapsed.store(false, Ordering::SeqCst);
    eventually("what is still here runs again", async || manager.state("kept.service") == running()).await;
    assert_eq!(manager.state("moved.service"), None, "what moved away stays stopped");
}

/// A fleetd whose first pass cannot read the body of a scheduled unit given to its machine has
/// not caught up: the run it loads once it can was found given at start (an earlier fleetd may
/// have run it), so it is reported lost and not started. fleet-sim seed 796451714 found a
/// restarted fleetd starting such a run again.
#[tokio::test(start_paused = true)]
async fn a_run_found_at_start_whose_body_could_not_be_read_is_not_started_once_it_can_be() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let tick = UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=hourly\n").unwrap();
    registry.put_unit("tick.service", &tick, DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let decision = Decision::Schedule { unit: "tick.service".into(), machine: MACHINE.into() };
    registry.apply(&lease, &[decision], &[]).await.unwrap();
    let (flaky, manager, _lifecycle) = start_on_flaky(&registry);
    // Before its first pass runs: no body can be read.
    flaky.bodies_down.store(true, std::sync::atomic::Ordering::SeqCst);
    eventually("a pass read the work and failed on the body", async || {
        flaky.reads.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    assert!(manager.state("tick.service").is_none(), "nothing loaded without its body");
    flaky.bodies_down.store(false, std::sync::atomic::Ordering::SeqCst);
    let lost = |state: &fleet_core::UnitState| {
        state.run.as_ref().is_some_and(|run| matches!(run.outcome, Some(fleet_core::job::runs::Outcome::Lost { .. })))
    };
    eventually("the run is reported lost", async || {
        registry.unit_states().await.unwrap().iter().any(|state| state.name == "tick.service" && lost(state))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 0, "loaded, never started: whether it ran is not known");
    assert!(manager.state("tick.service").is_some());
}

/// A unit taken over from an earlier fleetd is given where what it requires runs now: its file
/// is read back, and when the places moved while no agent ran here (its db went to another
/// machine), the unit is restarted with the new file, as any move restarts it; one whose file
/// is current is left running.
#[tokio::test(start_paused = true)]
async fn a_taken_over_unit_whose_requirements_moved_meanwhile_is_restarted_with_where_they_run_now() {
    use fleet_core::required_places::{FILE_NAME, RequiredPlace, RequiredPlaces, file_content};
    use fleet_unit_manager::UnitManager;
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    registry.register_machine(&config().machine).await.unwrap();
    let app = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nRequires=db.service\n").unwrap();
    registry.put_unit("app.service", &app, DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("engine").await.unwrap().unwrap();
    let placed = Decision::Schedule { unit: "app.service".into(), machine: MACHINE.into() };
    registry.apply(&lease, &[placed], &[]).await.unwrap();
    let db_on = |machine: &str| RequiredPlace {
        unit: "db.service".into(),
        machine_id: machine.into(),
        public_ip: format!("10.0.0.{}", &machine[1..]),
    };
    let now = RequiredPlaces { unit: "app.service".into(), machine: MACHINE.into(), places: vec![db_on("m2")] };
    registry.record_required_places(&lease, &[now]).await.unwrap();

    // The earlier fleetd gave it the db on m3, where it ran then.
    let manager = Arc::new(FakeUnitManager::running("app.service", &app).delivering_credentials());
    manager.delivered("app.service", FILE_NAME, &file_content(&[db_on("m3")]));
    let agent = start(&registry, &manager);
    let file = || manager.delivered_credential("app.service", FILE_NAME).map(|file| file.value().to_vec());
    eventually("the unit is restarted with where the db runs now", async || {
        manager.starts() == 1 && file() == Some(file_content(&[db_on("m2")]))
    })
    .await;
    agent.lifecycle.send(Lifecycle::Reloading).unwrap();
    agent.task.await.unwrap();

    // The next fleetd finds the file current: nothing restarts.
    let agent = start(&registry, &manager);
    eventually("the unit is reported again", async || {
        registry.unit_states().await.unwrap().iter().any(|state| state.name == "app.service" && state.launched)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(manager.starts(), 1, "a unit whose file is current is left running");
    agent.lifecycle.send(Lifecycle::ShuttingDown).unwrap();
    agent.task.await.unwrap();
}
