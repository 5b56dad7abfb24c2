//! The engine leader's source syncer and rollout driver, in process on paused time over the
//! embedded store: they read nothing while this fleetd does not lead, nothing while idle
//! (no source due, no rollout running), and wake when a source changes; a due source is
//! fetched and its units written as the source; a running rollout reads only its own units
//! and their states, and is carried along by their changes; a drain lets units go in waves
//! as they run elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::drain::Drain;
use fleet_core::rollout::{MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step};
use fleet_core::{DesiredState, MachineState, StateReport, SystemdState, UnitFile, UnitState};
use fleet_leader::{DrainDriver, LeaderStore, ReaderConfig, RolloutDriver, SourceReader, SourceSyncer, SyncerConfig};
use fleet_registry::{
    AgentRegistry, ApiRegistry, ChangeSignal, RegistryError, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus,
    UnitChange, UnitChanged, UnitView, Writer,
};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use tokio::sync::watch;

type Result<T> = std::result::Result<T, RegistryError>;

/// The embedded store, counting the reads the loops make (a signal moves with each).
struct Counting {
    store: Arc<EmbeddedRegistry>,
    reads: watch::Sender<usize>,
    writes: AtomicUsize,
    /// Every unit name the loops asked for by name.
    asked: Mutex<BTreeSet<String>>,
    /// How long each unit write and rollout write takes (a store that answers slowly).
    write_delay: Duration,
}

impl Counting {
    fn read(&self) {
        self.reads.send_modify(|reads| *reads += 1);
    }

    fn ask(&self, names: &BTreeSet<String>) {
        self.read();
        self.asked.lock().expect("asked").extend(names.iter().cloned());
    }
}

#[async_trait]
impl LeaderStore for Counting {
    async fn sources(&self) -> Result<Vec<SourceRecord>> {
        self.read();
        self.store.sources().await
    }
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>> {
        self.read();
        self.store.source_statuses().await
    }
    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.store.set_source_status(name, status).await
    }
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>> {
        self.read();
        self.store.rollouts().await
    }
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.write_delay).await;
        self.store.put_rollout(record).await
    }
    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.write_delay).await;
        self.store.put_rollout_over(record, before).await
    }
    async fn units_named(&self, names: &BTreeSet<String>) -> Result<Vec<UnitView>> {
        self.ask(names);
        LeaderStore::units_named(&self.store, names).await
    }
    async fn units_copied(&self) -> Result<Vec<UnitView>> {
        self.read();
        LeaderStore::units_copied(&self.store).await
    }
    async fn drains(&self) -> Result<Vec<(String, Drain)>> {
        self.read();
        LeaderStore::drains(&self.store).await
    }
    async fn machines(&self) -> Result<Vec<fleet_core::MachineState>> {
        self.read();
        LeaderStore::machines(&self.store).await
    }
    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::step_drain(&self.store, machine_id, drain).await
    }
    async fn states_of(&self, names: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>> {
        self.ask(names);
        LeaderStore::states_of(&self.store, names).await
    }
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::put_unit_as(&self.store, name, file, desired, writer).await
    }
    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>> {
        self.writes.fetch_add(changes.len(), Ordering::SeqCst);
        tokio::time::sleep(self.write_delay).await;
        LeaderStore::change_units_as(&self.store, changes, writer).await
    }
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::set_desired_state_as(&self.store, name, desired, writer).await
    }
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::destroy_unit_as(&self.store, name, writer).await
    }
    async fn set_secret_pins(&self, name: &str, pins: &fleet_core::secrets::SecretPins) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::set_secret_pins(&self.store, name, pins).await
    }
    fn source_changes(&self) -> ChangeSignal {
        self.store.source_changes()
    }
    fn unit_changes(&self) -> ChangeSignal {
        self.store.unit_changes()
    }
}

/// A syncer and a rollout driver over a counting store, told by `leads` whether they lead.
struct Leader {
    store: Arc<Counting>,
    reads: watch::Receiver<usize>,
    leads: watch::Sender<bool>,
    lifecycle: watch::Sender<Lifecycle>,
    dir: tempfile::TempDir,
}

fn start(leading: bool) -> Leader {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let (reads_sender, reads) = watch::channel(0);
    let store = Arc::new(Counting {
        store,
        reads: reads_sender,
        writes: AtomicUsize::new(0),
        asked: Mutex::default(),
        write_delay: Duration::ZERO,
    });
    let (leads, leads_watch) = watch::channel(leading);
    let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    let reading = ReaderConfig {
        cache_dir: dir.path().join("sources"),
        credentials_dir: dir.path().join("credentials"),
        max_units: 100,
    };
    let config = SyncerConfig { tick: Duration::from_millis(250) };
    let syncer = SourceSyncer::new(config, store.clone(), Arc::new(SourceReader::new(reading)));
    tokio::spawn(syncer.run(leads_watch.clone(), lifecycle_watch.clone()));
    let driver = RolloutDriver::new(store.clone());
    tokio::spawn(driver.run(leads_watch.clone(), lifecycle_watch.clone()));
    tokio::spawn(DrainDriver::new(store.clone()).run(leads_watch, lifecycle_watch));
    Leader { store, reads, leads, lifecycle, dir }
}

impl Leader {
    async fn reads_reach(&mut self, count: usize) {
        self.reads.wait_for(|reads| *reads >= count).await.expect("the store lives");
    }

    fn reads(&self) -> usize {
        *self.reads.borrow()
    }
}

/// What a leader's first passes read with nothing to do: the syncer the sources and their
/// statuses, the rollout driver the rollouts, the drain driver the machines.
const FIRST_PASSES: usize = 4;

#[tokio::test(start_paused = true)]
async fn an_idle_leader_reads_nothing_after_its_first_passes() {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(leader.reads(), FIRST_PASSES, "an hour idle reads nothing");
    assert_eq!(leader.store.writes.load(Ordering::SeqCst), 0);
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}

#[tokio::test(start_paused = true)]
async fn a_fleetd_that_does_not_lead_reads_nothing_until_it_leads() {
    let mut leader = start(false);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(leader.reads(), 0, "a standby reads nothing");
    leader.leads.send_replace(true);
    leader.reads_reach(FIRST_PASSES).await;
}

/// A source's fetch runs on a blocking thread under a real-time limit, so what fetches runs on
/// the real clock: on paused time the limit would pass while the fetch is still under way.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_source_wakes_the_syncer_which_records_its_sync() {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    let source = SourceRecord { interval_seconds: 3600, ..SourceRecord::new("web", "file:///nonexistent/fleet-units") };
    leader.store.store.put_source(&source).await.expect("store");
    // The change wakes both loops: the syncer reads the sources and their statuses again.
    leader.reads_reach(FIRST_PASSES + 2).await;
    let statuses = synced(&leader.store.store, |status| status.error.is_some()).await;
    assert_eq!(statuses[0].0, "web");
    let error = statuses[0].1.error.clone().unwrap_or_default();
    assert!(!error.contains("took over"), "the fetch itself failed, not its time limit: {error}");
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}

/// The sources' statuses once the first of them shows `done`, woken by each change.
async fn synced(store: &EmbeddedRegistry, done: impl Fn(&SourceStatus) -> bool) -> Vec<(String, SourceStatus)> {
    let mut changes = store.source_changes();
    loop {
        let statuses = store.source_statuses().await.expect("statuses");
        if statuses.first().is_some_and(|(_, status)| done(status)) {
            return statuses;
        }
        changes.changed().await.expect("the store lives");
    }
}

/// A leader, and source "apps" of one unit (`units/web.service`) in a git repository of its own,
/// synced at its first commit: the source, the repository, and the sources' statuses then.
async fn leader_with_a_source() -> (Leader, SourceRecord, fleet_testkit::GitRepo, Vec<(String, SourceStatus)>) {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    let store = leader.store.store.clone();
    let repo = fleet_testkit::GitRepo::new();
    let first = repo.commit(&[("units/web.service", Some("[Service]\nExecStart=/bin/sleep 1000\n"))], "first");
    let source =
        SourceRecord { paths: vec!["units".into()], interval_seconds: 3600, ..SourceRecord::new("apps", &repo.url()) };
    store.put_source(&source).await.expect("store");
    let statuses = synced(&store, |status| status.commit.as_deref() == Some(first.as_str())).await;
    (leader, source, repo, statuses)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_is_synced_into_units_written_as_the_source_and_follows_its_commits() {
    let (leader, source, repo, statuses) = leader_with_a_source().await;
    let store = leader.store.store.clone();
    assert_eq!(statuses[0].1.error, None);
    let unit = store.unit("web.service").await.expect("read").expect("the source's unit");
    assert_eq!(unit.source.as_deref(), Some("apps"), "written as the source");
    assert_eq!(unit.desired, DesiredState::Launched);
    let refused = store.destroy_unit("web.service").await;
    assert!(matches!(refused, Err(RegistryError::Owned { .. })), "a hand write is refused: {refused:?}");
    // A new commit, synced when the source is asked to (as its webhook or `source sync` do).
    let second = repo.commit(&[("units/web.service", Some("[Service]\nExecStart=/bin/sleep 2000\n"))], "second");
    store.put_source(&SourceRecord { generation: 1, ..source }).await.expect("ask");
    synced(&store, |status| status.commit.as_deref() == Some(second.as_str())).await;
    let unit = store.unit("web.service").await.expect("read").expect("the unit");
    let text = unit.file.serialize();
    assert!(text.contains("/bin/sleep 2000"), "the new commit's content: {text}");
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_removed_leaves_no_clone_behind() {
    let (leader, _source, _repo, _) = leader_with_a_source().await;
    let store = leader.store.store.clone();
    // One an earlier fleetd left of a source removed while it was away.
    let left = leader.dir.path().join("sources").join("gone-before");
    std::fs::create_dir_all(left.join("objects")).expect("a clone left behind");
    let clone = leader.dir.path().join("sources").join("apps");
    assert!(clone.is_dir(), "the source is cloned under the cache directory");
    assert!(store.remove_source("apps").await.expect("remove"), "the source was there");
    // The removal wakes the syncer, whose pass lets the clone go.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while clone.exists() || left.exists() {
        assert!(std::time::Instant::now() < deadline, "the clone of a removed source is still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(leader.dir.path().join("sources").is_dir(), "the cache directory itself stays");
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}

fn unit(exec: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("a unit file")
}

/// What machine m1 reports of `name`: active on `file`.
async fn report_active(store: &EmbeddedRegistry, name: &str, file: &UnitFile) {
    report_active_on(store, "m1", name, file).await;
}

async fn report_active_on(store: &EmbeddedRegistry, machine: &str, name: &str, file: &UnitFile) {
    let state = UnitState {
        run: None,
        name: name.into(),
        machine_id: machine.into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    store.report_states(machine, &[StateReport::Set(state)]).await.expect("report");
}

/// Units `names` on m1, each running `old` as reported, and a running rollout "web" taking
/// them to `new`, `max_unavailable` at a time, stored in `store`.
async fn store_rollout(
    store: &EmbeddedRegistry,
    names: &[&str],
    old: &UnitFile,
    new: &UnitFile,
    max_unavailable: usize,
) {
    for name in names {
        store.put_unit(name, old, DesiredState::Launched).await.expect("unit");
        report_active(store, name, old).await;
    }
    let rollout = Rollout {
        units: names
            .iter()
            .map(|name| RolloutUnit { name: name.to_string(), from: old.hash(), to: new.hash(), step: Step::Waiting })
            .collect(),
        max_unavailable: MaxUnavailable::Count(max_unavailable),
        min_ready: 0,
        deadline: 3600,
        state: RolloutState::Running,
        undo: false,
        canary: None,
        auto_revert: false,
        reverted: None,
        held: None,
    };
    let bodies = BTreeMap::from([(new.hash().to_string(), new.serialize())]);
    let record = RolloutRecord {
        name: "web".into(),
        rollout,
        bodies,
        created: 0,
        source_commit: None,
        secret: None,
        started_by: None,
    };
    store.put_rollout(&record).await.expect("rollout");
}

#[tokio::test(start_paused = true)]
async fn a_running_rollout_reads_only_its_units_and_moves_on_their_states() {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    let store = leader.store.store.clone();
    let (old, new) = (unit("/bin/sleep 1000"), unit("/bin/sleep 2000"));
    store.register_machine(&MachineState { id: "m1".into(), ..Default::default() }).await.expect("register");
    let names = ["web@1.service", "web@2.service"];
    store.put_unit("other.service", &unit("/bin/true"), DesiredState::Launched).await.expect("unit");
    let started = tokio::time::Instant::now();
    store_rollout(&store, &names, &old, &new, 1).await;
    let mut changes = store.unit_changes();
    // The machine plays its part: each unit given the new content runs it.
    let mut reported = BTreeSet::new();
    loop {
        let record = store.rollouts().await.expect("rollouts").pop().expect("the rollout");
        if record.rollout.state == RolloutState::Done {
            break;
        }
        assert_eq!(record.rollout.state, RolloutState::Running);
        for name in names {
            let view = store.unit(name).await.expect("read").expect("the unit");
            if view.hash == new.hash() && reported.insert(name) {
                report_active(&store, name, &new).await;
            }
        }
        changes.changed().await.expect("the store lives");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "carried by the changes, not by the fallback timer: {:?}",
        started.elapsed()
    );
    let asked = leader.store.asked.lock().expect("asked").clone();
    assert_eq!(asked, names.iter().map(|name| name.to_string()).collect(), "only the rollout's units are read");
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}

#[tokio::test(start_paused = true)]
async fn a_rollout_pass_gathers_the_next_burst_for_as_long_as_it_worked_not_as_long_as_it_waited_on_writes() {
    use fleet_runtime::LeaderPass;
    let dir = tempfile::tempdir().expect("dir");
    let embedded = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let (reads, _) = watch::channel(0);
    let write_delay = Duration::from_millis(150);
    let store = Arc::new(Counting {
        store: embedded.clone(),
        reads,
        writes: AtomicUsize::new(0),
        asked: Mutex::default(),
        write_delay,
    });
    let (old, new) = (unit("/bin/sleep 1000"), unit("/bin/sleep 2000"));
    embedded.register_machine(&MachineState { id: "m1".into(), ..Default::default() }).await.expect("register");
    let names = ["web@1.service", "web@2.service"];
    store_rollout(&embedded, &names, &old, &new, 2).await;
    let mut driver = RolloutDriver::new(store.clone());
    let began = tokio::time::Instant::now();
    driver.pass().await.expect("a pass");
    let took = began.elapsed();
    // The wave and the record were written, each waited on for the store's delay.
    assert_eq!(store.writes.load(Ordering::SeqCst), names.len() + 1);
    assert!(took >= write_delay * 2, "the pass waited on both writes: {took:?}");
    // On paused time the pass did no work the clock saw: only the least gathering is left.
    assert_eq!(driver.settle(took), RolloutDriver::SETTLE);
    // A pass that waited on no write gathers as long as it took, within the bound.
    let fresh = RolloutDriver::new(store);
    assert_eq!(fresh.settle(Duration::from_millis(100)), Duration::from_millis(100));
    assert_eq!(fresh.settle(Duration::from_secs(5)), Duration::from_millis(250));
}

/// The engine's part, played by the test: moves `unit` from `from` (if it is placed) to `to`.
async fn move_unit(store: &EmbeddedRegistry, unit: &str, from: Option<&str>, to: &str) {
    use fleet_core::schedule::{Decision, UnscheduleReason};
    use fleet_registry::EngineRegistry;
    let lease = store.acquire_leadership("m1").await.expect("leadership").expect("the only engine");
    let leaves = from.map(|from| Decision::Unschedule {
        unit: unit.into(),
        machine: from.into(),
        reason: UnscheduleReason::Drained,
    });
    let decisions: Vec<Decision> =
        leaves.into_iter().chain([Decision::Schedule { unit: unit.into(), machine: to.into() }]).collect();
    store.apply(&lease, &decisions, &[]).await.expect("a schedule write");
}

#[tokio::test(start_paused = true)]
async fn a_drain_lets_units_go_one_wave_at_a_time_as_they_run_elsewhere() {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    let store = leader.store.store.clone();
    for machine in ["m1", "m2"] {
        store.register_machine(&MachineState { id: machine.into(), ..Default::default() }).await.expect("register");
    }
    let file = unit("/bin/sleep 1000");
    let names = ["a.service", "b.service", "c.service"];
    for name in names {
        store.put_unit(name, &file, DesiredState::Launched).await.expect("unit");
        move_unit(&store, name, None, "m1").await;
        report_active(&store, name, &file).await;
    }
    let started = tokio::time::Instant::now();
    store.set_drain("m1", Some(&Drain::new(MaxUnavailable::Count(1), 0))).await.expect("drain");
    let mut changes = store.unit_changes();
    let mut moved = BTreeSet::new();
    loop {
        let machines = ApiRegistry::machines(&*store).await.expect("machines");
        let drain = machines.iter().find(|machine| machine.id == "m1").and_then(|m| m.drain.clone()).expect("drained");
        if drain.moved == names.len() {
            assert!(drain.released.is_empty());
            break;
        }
        let not_running_elsewhere = drain.released.keys().filter(|unit| !moved.contains(*unit)).count();
        assert!(drain.released.len() <= 1, "one unit at a time: {:?}", drain.released);
        for unit in drain.released.keys().filter(|unit| !moved.contains(*unit)).cloned().collect::<Vec<_>>() {
            move_unit(&store, &unit, Some("m1"), "m2").await;
            report_active_on(&store, "m2", &unit, &file).await;
            moved.insert(unit);
        }
        if not_running_elsewhere == 0 {
            changes.changed().await.expect("the store lives");
        }
    }
    assert_eq!(moved.len(), names.len());
    assert!(started.elapsed() < Duration::from_secs(60), "carried by the changes: {:?}", started.elapsed());
    leader.lifecycle.send_replace(Lifecycle::ShuttingDown);
}
