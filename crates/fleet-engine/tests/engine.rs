//! The engine against the embedded store in a temporary directory, with paused time: what it
//! places, where, and what it moves when a machine goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::{DesiredState, MachineState, UnitFile};
use fleet_engine::{Engine, EngineConfig};
use fleet_registry::{AgentRegistry, ApiRegistry};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::eventually;

use crate::common::{reason, running_on};
use tokio::sync::watch;

fn machine(id: &str, region: &str) -> MachineState {
    MachineState {
        id: id.into(),
        public_ip: "127.0.0.1".into(),
        metadata: BTreeMap::from([("region".into(), region.into())]),
        ..Default::default()
    }
}

fn unit(x_fleet: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\n{x_fleet}\n")).unwrap()
}

async fn placement(registry: &EmbeddedRegistry) -> BTreeMap<String, Option<String>> {
    registry.units().await.unwrap().into_iter().map(|view| (view.name, view.machine_id)).collect()
}

/// An embedded store in a new directory (kept while the guard lives) with `machines`
/// (id, region) registered.
async fn store_with(machines: &[(&str, &str)]) -> (tempfile::TempDir, EmbeddedRegistry) {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    for (id, region) in machines {
        registry.register_machine(&machine(id, region)).await.unwrap();
    }
    (dir, registry)
}

/// The engines' `agent_ttl`: an `AtMostOnce=` unit's hold on a machine gone is 5.4 s of it.
const AGENT_TTL: Duration = Duration::from_secs(4);
/// At most the hold of an `AtMostOnce=` unit.
const HOLD: Duration = Duration::from_secs(5);

fn start(registry: &EmbeddedRegistry) -> (watch::Sender<Lifecycle>, tokio::task::JoinHandle<()>) {
    start_over(Arc::new(registry.clone()))
}

/// An engine of machine m1 (a fallback period of 2 s) over `store`, running, and its stop.
fn start_over(
    store: Arc<dyn fleet_registry::EngineRegistry>,
) -> (watch::Sender<Lifecycle>, tokio::task::JoinHandle<()>) {
    let config = EngineConfig {
        machine_id: "m1".into(),
        reconcile_interval: Duration::from_secs(2),
        debounce: Duration::from_millis(10),
        agent_ttl: AGENT_TTL,
        strategy: Default::default(),
        preemption: false,
    };
    let (stop, stopped) = watch::channel(Lifecycle::Running);
    (stop, tokio::spawn(Engine::new(config, store).run(stopped)))
}

#[tokio::test(start_paused = true)]
async fn places_units_least_loaded_and_moves_them_off_a_machine_that_goes() {
    let (_dir, registry) = store_with(&[("m1", "eu"), ("m2", "eu")]).await;
    let (stop, engine) = start(&registry);
    registry.put_unit("a.service", &unit("Conflicts=b.service"), DesiredState::Launched).await.unwrap();
    registry.put_unit("b.service", &unit(""), DesiredState::Launched).await.unwrap();
    registry.put_unit("asia.service", &unit("MachineMetadata=region=asia"), DesiredState::Launched).await.unwrap();
    eventually("both units are placed, apart", async || {
        let placed = placement(&registry).await;
        matches!((&placed["a.service"], &placed["b.service"]), (Some(a), Some(b)) if a != b)
    })
    .await;
    let reason = registry.unit("asia.service").await.unwrap().unwrap().reason;
    assert_eq!(reason.as_deref(), Some("no machine has metadata region=asia"), "an unplaceable unit says why");

    let lost = placement(&registry).await["a.service"].clone().unwrap();
    registry.unregister_machine(&lost).await.unwrap();
    eventually("the lost machine's unit moves, and its conflict waits", async || {
        let placed = placement(&registry).await;
        placed["b.service"].as_deref() != Some(lost.as_str()) && placed["a.service"].as_deref() != Some(lost.as_str())
    })
    .await;
    let placed = placement(&registry).await;
    let survivor = if lost == "m1" { "m2" } else { "m1" };
    let on_survivor: Vec<&String> =
        placed.iter().filter(|(_, m)| m.as_deref() == Some(survivor)).map(|(u, _)| u).collect();
    assert_eq!(on_survivor.len(), 1, "the two conflicting units never share the machine: {placed:?}");
    let waiting = if on_survivor[0] == "a.service" { "b.service" } else { "a.service" };
    let reason = registry.unit(waiting).await.unwrap().unwrap().reason.unwrap();
    assert!(reason.starts_with("conflicts with"), "{reason}");

    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// Launches `units` (name, `[X-Fleet]` lines) on the only machine, m1; once they are placed
/// there, m2 joins and m1 goes. When m1 went.
async fn placed_on_m1_then_lost(registry: &EmbeddedRegistry, units: &[(&str, &str)]) -> tokio::time::Instant {
    for (name, x_fleet) in units {
        registry.put_unit(name, &unit(x_fleet), DesiredState::Launched).await.unwrap();
    }
    eventually("every unit is placed on m1", async || {
        placement(registry).await.values().all(|machine| machine.as_deref() == Some("m1"))
    })
    .await;
    registry.register_machine(&machine("m2", "eu")).await.unwrap();
    registry.unregister_machine("m1").await.unwrap();
    tokio::time::Instant::now()
}

/// An `AtMostOnce=` unit of a machine gone stays placed there for the hold (its machine may
/// still be stopping it), then moves; a unit without it moves at once.
#[tokio::test(start_paused = true)]
async fn an_at_most_once_unit_moves_off_a_lost_machine_only_after_the_hold() {
    let (_dir, registry) = store_with(&[("m1", "eu")]).await;
    let (stop, engine) = start(&registry);
    let lost = placed_on_m1_then_lost(&registry, &[("once.service", "AtMostOnce=true"), ("plain.service", "")]).await;
    eventually("the plain unit moves to m2", async || {
        placement(&registry).await["plain.service"].as_deref() == Some("m2")
    })
    .await;
    assert!(lost.elapsed() < HOLD, "the plain unit waited {:?}", lost.elapsed());
    assert_eq!(placement(&registry).await["once.service"].as_deref(), Some("m1"), "the at-most-once unit waits");
    eventually("the at-most-once unit moves after the hold", async || {
        placement(&registry).await["once.service"].as_deref() == Some("m2")
    })
    .await;
    assert!(lost.elapsed() >= HOLD, "it moved {:?} after its machine was lost", lost.elapsed());
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A unit with `LostAfter=20s` stays on its machine gone for 16 s (the 4 s of `agent_ttl` gone
/// by), saying so, with the machine recorded out of touch; then moves. One with `never` stays
/// until it is unloaded, and the record goes with the last unit that waits.
#[tokio::test(start_paused = true)]
async fn a_unit_waits_its_lost_after_for_a_machine_gone_and_with_never_until_unloaded() {
    let (_dir, registry) = store_with(&[("m1", "eu")]).await;
    let (stop, engine) = start(&registry);
    let units = [("db.service", "LostAfter=20s"), ("vault.service", "LostAfter=never")];
    let lost = placed_on_m1_then_lost(&registry, &units).await;
    eventually("both say they wait for m1 and m1 is recorded out of touch", async || {
        let recorded = registry.machines_out_of_touch().await.unwrap();
        reason(&registry, "db.service").await.is_some_and(|why| why.contains("unless it is back (LostAfter=20s)"))
            && reason(&registry, "vault.service").await.is_some_and(|why| why.ends_with("(LostAfter=never)"))
            && recorded.len() == 1
            && recorded[0].units == ["db.service", "vault.service"]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(placement(&registry).await["db.service"].as_deref(), Some("m1"), "15 s in, it still waits");
    eventually("db.service moves once its wait is over", async || {
        placement(&registry).await["db.service"].as_deref() == Some("m2")
    })
    .await;
    assert!(lost.elapsed() >= Duration::from_secs(16), "it moved {:?} after its machine was lost", lost.elapsed());
    assert_eq!(reason(&registry, "db.service").await, None, "placed: no reason left");
    assert_eq!(placement(&registry).await["vault.service"].as_deref(), Some("m1"), "never: it stays");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(placement(&registry).await["vault.service"].as_deref(), Some("m1"), "an hour on, it stays");
    registry.set_desired_state("vault.service", DesiredState::Inactive).await.unwrap();
    eventually("unloaded, it leaves the machine gone and nothing waits for m1", async || {
        placement(&registry).await["vault.service"].is_none()
            && registry.machines_out_of_touch().await.unwrap().is_empty()
    })
    .await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_inactive_unit_is_unscheduled() {
    let (_dir, registry) = store_with(&[("m1", "eu")]).await;
    let (stop, engine) = start(&registry);
    registry.put_unit("a.service", &unit(""), DesiredState::Launched).await.unwrap();
    eventually("a.service is placed", async || placement(&registry).await["a.service"].is_some()).await;
    registry.set_desired_state("a.service", DesiredState::Inactive).await.unwrap();
    eventually("a.service is unscheduled", async || placement(&registry).await["a.service"].is_none()).await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// New content that keeps a unit's requirements (a rollout's) needs no plan and moves
/// nothing; new content that changes them is planned, after it as before.
#[tokio::test(start_paused = true)]
async fn new_content_moves_a_unit_only_when_its_requirements_change() {
    let (_dir, registry) = store_with(&[("m1", "eu"), ("m2", "asia")]).await;
    let (stop, engine) = start(&registry);
    let version = |exec: &str, region: &str| {
        UnitFile::parse(&format!("[Service]\nExecStart={exec}\n[X-Fleet]\nMachineMetadata=region={region}\n")).unwrap()
    };
    registry.put_unit("a.service", &version("/bin/one", "eu"), DesiredState::Launched).await.unwrap();
    registry.put_unit("mars.service", &version("/bin/one", "mars"), DesiredState::Launched).await.unwrap();
    eventually("a.service is placed on m1, mars.service is not", async || {
        placement(&registry).await["a.service"].as_deref() == Some("m1")
            && reason(&registry, "mars.service").await.is_some()
    })
    .await;

    // Only this test changes contents alone, so the count of skipped plans moves for it.
    let skipped =
        || fleet_metrics::metrics().engine.plans.get_or_create(&fleet_metrics::PlanLabels { scope: "skipped" }).get();
    // The pass that wrote the placement may still be followed by one that plans what it wrote
    // (contents alone are passed over only after a plan that changed nothing): a unit of its
    // own is given new contents, each once the engine looked at the one before (a content
    // replaced while a pass reads it leaves that pass without its body: it plans), until one
    // is passed over. From then on each change of contents alone must be.
    let plans = |scope: &'static str| {
        fleet_metrics::metrics().engine.plans.get_or_create(&fleet_metrics::PlanLabels { scope }).get()
    };
    let passes = || plans("skipped") + plans("changed") + plans("full");
    let mut settling = 0;
    while skipped() == 0 {
        settling += 1;
        let before = passes();
        let exec = format!("/bin/settling-{settling}");
        registry.put_unit("settle.service", &version(&exec, "eu"), DesiredState::Launched).await.unwrap();
        eventually("the engine looks at the new contents", async || passes() > before).await;
        assert!(settling < 100, "the engine never passed over new contents alone");
    }
    for exec in ["/bin/two", "/bin/three"] {
        let before = skipped();
        registry.put_unit("a.service", &version(exec, "eu"), DesiredState::Launched).await.unwrap();
        registry.put_unit("mars.service", &version(exec, "mars"), DesiredState::Launched).await.unwrap();
        eventually("the engine passes over the new contents without a plan", async || skipped() > before).await;
    }
    // A unit the engine must place shows that it has looked at every change before it.
    registry.put_unit("b.service", &version("/bin/one", "asia"), DesiredState::Launched).await.unwrap();
    eventually("b.service is placed", async || placement(&registry).await["b.service"].is_some()).await;
    assert_eq!(placement(&registry).await["a.service"].as_deref(), Some("m1"), "new content alone moves nothing");
    assert_eq!(reason(&registry, "mars.service").await.as_deref(), Some("no machine has metadata region=mars"));

    registry.put_unit("a.service", &version("/bin/three", "asia"), DesiredState::Launched).await.unwrap();
    eventually("a.service follows its new requirements to m2", async || {
        placement(&registry).await["a.service"].as_deref() == Some("m2")
    })
    .await;
    registry.put_unit("mars.service", &version("/bin/three", "eu"), DesiredState::Launched).await.unwrap();
    eventually("mars.service, asking for eu now, is placed on m1", async || {
        placement(&registry).await["mars.service"].as_deref() == Some("m1")
    })
    .await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A unit taken off a machine that still reports it running (its fleetd down, frozen or cut
/// off while its presence holds) is placed again only once that machine stopped it: stop
/// before start, so it never runs on two machines that are both in touch.
#[tokio::test(start_paused = true)]
async fn a_unit_taken_off_a_machine_is_placed_again_only_once_that_machine_stopped_it() {
    let (_dir, registry) = store_with(&[("m1", "eu"), ("m2", "eu")]).await;
    let (stop, engine) = start(&registry);
    let file = unit("");
    registry.put_unit("a.service", &file, DesiredState::Launched).await.unwrap();
    eventually("a.service is placed", async || placement(&registry).await["a.service"].is_some()).await;
    let first = placement(&registry).await["a.service"].clone().unwrap();
    registry.report_states(&first, &[running_on("a.service", &first, &file)]).await.unwrap();
    registry.set_desired_state("a.service", DesiredState::Inactive).await.unwrap();
    eventually("a.service is unscheduled", async || placement(&registry).await["a.service"].is_none()).await;
    // Its machine has not stopped it: started again, it waits, and says for what.
    registry.set_desired_state("a.service", DesiredState::Launched).await.unwrap();
    let waits = format!("waits for machine {first} to stop it");
    eventually("a.service says it waits for its machine", async || {
        reason(&registry, "a.service").await.as_deref() == Some(waits.as_str())
    })
    .await;
    assert_eq!(placement(&registry).await["a.service"], None, "placed while {first} still runs it");
    registry.report_states(&first, &[fleet_registry::StateReport::Remove("a.service".into())]).await.unwrap();
    eventually("a.service is placed once its machine stopped it", async || {
        placement(&registry).await["a.service"].is_some()
    })
    .await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A move off a present machine (here its metadata no longer fits) is a stop there now and
/// a start elsewhere once it stopped; an engine that takes over learns what waits from the
/// machines' reports, and a machine that goes ends the wait.
#[tokio::test(start_paused = true)]
async fn a_move_waits_for_the_machine_it_leaves_even_across_a_new_leadership() {
    let (_dir, registry) = store_with(&[("m1", "eu")]).await;
    let (stop, engine) = start(&registry);
    let file = unit("MachineMetadata=region=eu");
    registry.put_unit("eu.service", &file, DesiredState::Launched).await.unwrap();
    eventually("eu.service is placed on m1", async || {
        placement(&registry).await["eu.service"].as_deref() == Some("m1")
    })
    .await;
    registry.report_states("m1", &[running_on("eu.service", "m1", &file)]).await.unwrap();
    registry.register_machine(&machine("m2", "eu")).await.unwrap();
    registry
        .change_metadata(&[fleet_registry::MetadataChange::Set {
            machine_id: "m1".into(),
            key: "region".into(),
            value: "asia".into(),
        }])
        .await
        .unwrap();
    eventually("eu.service is taken off m1 and waits for it", async || {
        reason(&registry, "eu.service").await.as_deref() == Some("waits for machine m1 to stop it")
    })
    .await;
    assert_eq!(placement(&registry).await["eu.service"], None, "started on m2 while m1 still runs it");
    // Another engine takes over: it knows nothing of the move but what m1 reports. A unit
    // submitted after it started is placed in a pass that had looked at eu.service first.
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
    let (stop, engine) = start(&registry);
    registry.put_unit("later.service", &unit(""), DesiredState::Launched).await.unwrap();
    eventually("the new leader places later.service", async || placement(&registry).await["later.service"].is_some())
        .await;
    assert_eq!(placement(&registry).await["eu.service"], None, "the new leader started it on m2 while m1 runs it");
    assert_eq!(reason(&registry, "eu.service").await.as_deref(), Some("waits for machine m1 to stop it"));
    registry.unregister_machine("m1").await.unwrap();
    eventually("eu.service moves to m2 once m1 is gone", async || {
        placement(&registry).await["eu.service"].as_deref() == Some("m2")
    })
    .await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// The embedded store with a rival engine that can take the leadership away, and whose
/// leadership calls can fail (`failing`); it notes when each was made. With `hanging`, a
/// snapshot never answers (a store gone, its requests waiting out their timeouts).
struct ContestedStore {
    store: EmbeddedRegistry,
    rival_leads: std::sync::atomic::AtomicBool,
    writes: std::sync::atomic::AtomicUsize,
    failing: std::sync::atomic::AtomicBool,
    hanging: std::sync::atomic::AtomicBool,
    attempts: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

impl ContestedStore {
    fn over(store: EmbeddedRegistry) -> Self {
        Self {
            store,
            rival_leads: false.into(),
            writes: 0.into(),
            failing: false.into(),
            hanging: false.into(),
            attempts: std::sync::Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl fleet_registry::EngineRegistry for ContestedStore {
    async fn acquire_leadership(
        &self,
        machine_id: &str,
    ) -> fleet_registry::Result<Option<fleet_registry::EngineLease>> {
        self.attempts.lock().unwrap().push(tokio::time::Instant::now());
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(fleet_registry::RegistryError::unavailable("etcd", "no answer within 2s"));
        }
        if self.rival_leads.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(None);
        }
        self.store.acquire_leadership(machine_id).await
    }
    async fn release_leadership(&self, lease: &fleet_registry::EngineLease) -> fleet_registry::Result<()> {
        self.store.release_leadership(lease).await
    }
    async fn snapshot(&self) -> fleet_registry::Result<fleet_registry::EngineSnapshot> {
        if self.hanging.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.store.snapshot().await
    }
    async fn unit_bodies(
        &self,
        hashes: &[fleet_core::UnitHash],
    ) -> fleet_registry::Result<std::collections::HashMap<fleet_core::UnitHash, UnitFile>> {
        fleet_registry::EngineRegistry::unit_bodies(&self.store, hashes).await
    }
    async fn apply(
        &self,
        lease: &fleet_registry::EngineLease,
        decisions: &[fleet_core::schedule::Decision],
        unplaced: &[(String, String)],
    ) -> fleet_registry::Result<()> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.apply(lease, decisions, unplaced).await
    }
    async fn reported_states(
        &self,
        units: &std::collections::BTreeSet<String>,
    ) -> fleet_registry::Result<Vec<Arc<fleet_core::UnitState>>> {
        self.store.reported_states(units).await
    }
    async fn job_records(&self) -> fleet_registry::Result<Vec<fleet_registry::StoredJob>> {
        self.store.job_records().await
    }
    async fn put_job_record(
        &self,
        lease: &fleet_registry::EngineLease,
        unit: &str,
        record: Option<&fleet_core::job::runs::JobRecord>,
        version: u64,
    ) -> fleet_registry::Result<bool> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.put_job_record(lease, unit, record, version).await
    }
    async fn run_tickets(
        &self,
    ) -> fleet_registry::Result<std::collections::BTreeMap<String, fleet_core::job::global_runs::RunTicket>> {
        self.store.run_tickets().await
    }
    async fn put_run_ticket(
        &self,
        lease: &fleet_registry::EngineLease,
        unit: &str,
        ticket: Option<&fleet_core::job::global_runs::RunTicket>,
    ) -> fleet_registry::Result<()> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.put_run_ticket(lease, unit, ticket).await
    }
    async fn recorded_out_of_touch(&self) -> fleet_registry::Result<Vec<fleet_core::OutOfTouch>> {
        self.store.recorded_out_of_touch().await
    }
    async fn record_out_of_touch(
        &self,
        lease: &fleet_registry::EngineLease,
        machines: &[fleet_core::OutOfTouch],
    ) -> fleet_registry::Result<()> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.record_out_of_touch(lease, machines).await
    }
    async fn recorded_silent_departures(&self) -> fleet_registry::Result<Vec<fleet_registry::SilentDeparture>> {
        self.store.recorded_silent_departures().await
    }
    async fn recorded_required_places(&self) -> fleet_registry::Result<Vec<fleet_registry::RequiredPlaces>> {
        self.store.recorded_required_places().await
    }
    async fn record_required_places(
        &self,
        lease: &fleet_registry::EngineLease,
        places: &[fleet_registry::RequiredPlaces],
    ) -> fleet_registry::Result<()> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.record_required_places(lease, places).await
    }
    async fn record_silent_departures(
        &self,
        lease: &fleet_registry::EngineLease,
        departures: &[fleet_registry::SilentDeparture],
    ) -> fleet_registry::Result<()> {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.record_silent_departures(lease, departures).await
    }
    fn engine_changes(&self) -> fleet_registry::ChangeSignal {
        self.store.engine_changes()
    }
    fn state_changes(&self) -> fleet_registry::ChangeSignal {
        fleet_registry::EngineRegistry::state_changes(&self.store)
    }
}

/// An engine that loses the leadership writes nothing until it has it again, then places
/// what arrived meanwhile.
#[tokio::test(start_paused = true)]
async fn only_the_leader_writes() {
    use std::sync::atomic::Ordering;
    let (_dir, store) = store_with(&[("m1", "eu")]).await;
    let contested = Arc::new(ContestedStore::over(store.clone()));
    let (stop, engine) = start_over(contested.clone());
    store.put_unit("a.service", &unit(""), DesiredState::Launched).await.unwrap();
    eventually("a.service is placed", async || placement(&store).await["a.service"].is_some()).await;

    contested.rival_leads.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = contested.writes.load(Ordering::SeqCst);
    store.put_unit("b.service", &unit(""), DesiredState::Launched).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(placement(&store).await["b.service"], None, "a follower places nothing");
    assert_eq!(contested.writes.load(Ordering::SeqCst), writes, "and writes nothing");

    contested.rival_leads.store(false, Ordering::SeqCst);
    eventually("the leader again places b.service", async || placement(&store).await["b.service"].is_some()).await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
}

/// A store that keeps failing never spaces the engine's passes out beyond its fallback
/// period: each pass renews the leadership, whose lease lasts only a few periods (under
/// latency and loss a backoff to seconds let leases expire).
#[tokio::test(start_paused = true)]
async fn failing_passes_are_retried_within_the_fallback_period() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let failing = Arc::new(ContestedStore::over(store));
    failing.failing.store(true, Ordering::SeqCst);
    let interval = Duration::from_secs(2);
    let (stop, engine) = start_over(failing.clone());
    tokio::time::sleep(Duration::from_secs(60)).await;
    failing.failing.store(false, Ordering::SeqCst);
    stop.send(Lifecycle::ShuttingDown).unwrap();
    engine.await.unwrap();
    let attempts = failing.attempts.lock().unwrap().clone();
    assert!(attempts.len() >= 25, "a minute of failures is retried: {} attempts", attempts.len());
    let longest = attempts.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap();
    assert!(longest <= interval + Duration::from_millis(10), "retried {longest:?} apart");
}

/// A fleetd asked to stop while its engine's pass waits on a store that does not answer stops
/// at once: the pass is cut short (its writes are fenced and each stands alone, and what a
/// successor needs is in the store). It waited out every read's retries before: up to 50 s.
#[tokio::test]
async fn a_stop_cuts_short_a_pass_that_waits_on_a_store_gone() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let hanging = Arc::new(ContestedStore::over(store));
    hanging.hanging.store(true, Ordering::SeqCst);
    let (stop, engine) = start_over(hanging.clone());
    eventually("the pass reaches the store that does not answer", async || {
        !hanging.attempts.lock().unwrap().is_empty()
    })
    .await;
    stop.send(Lifecycle::ShuttingDown).unwrap();
    tokio::time::timeout(Duration::from_secs(30), engine)
        .await
        .expect("the engine stops while its pass still waits")
        .unwrap();
}
