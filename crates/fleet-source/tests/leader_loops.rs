//! The engine leader's source syncer and rollout driver, in process on paused time over the
//! embedded store: they read nothing while this fleetd does not lead, nothing while idle
//! (no source due, no rollout running), and wake when a source changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use fleet_core::{DesiredState, UnitFile, UnitState};
use fleet_registry::{
    ChangeSignal, RegistryError, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus, UnitView, Writer,
};
use fleet_runtime::Lifecycle;
use fleet_source::{LeaderStore, RolloutDriver, SourceSyncer, SyncerConfig};
use fleet_store_embedded::EmbeddedRegistry;
use tokio::sync::watch;

type Result<T> = std::result::Result<T, RegistryError>;

/// The embedded store, counting the reads the loops make (a signal moves with each).
struct Counting {
    store: Arc<EmbeddedRegistry>,
    reads: watch::Sender<usize>,
    writes: AtomicUsize,
}

impl Counting {
    fn read(&self) {
        self.reads.send_modify(|reads| *reads += 1);
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
    async fn rollouts(&self) -> Result<Vec<RolloutRecord>> {
        self.read();
        self.store.rollouts().await
    }
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.store.put_rollout(record).await
    }
    async fn units(&self) -> Result<Vec<UnitView>> {
        self.read();
        LeaderStore::units(&self.store).await
    }
    async fn unit_states(&self) -> Result<Vec<UnitState>> {
        self.read();
        LeaderStore::unit_states(&self.store).await
    }
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::put_unit_as(&self.store, name, file, desired, writer).await
    }
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::set_desired_state_as(&self.store, name, desired, writer).await
    }
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        LeaderStore::destroy_unit_as(&self.store, name, writer).await
    }
    fn source_changes(&self) -> ChangeSignal {
        self.store.source_changes()
    }
}

/// A syncer and a rollout driver over a counting store, told by `leads` whether they lead.
struct Leader {
    store: Arc<Counting>,
    reads: watch::Receiver<usize>,
    leads: watch::Sender<bool>,
    lifecycle: watch::Sender<Lifecycle>,
    _dir: tempfile::TempDir,
}

fn start(leading: bool) -> Leader {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store"));
    let (reads_sender, reads) = watch::channel(0);
    let store = Arc::new(Counting { store, reads: reads_sender, writes: AtomicUsize::new(0) });
    let (leads, leads_watch) = watch::channel(leading);
    let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    let config = SyncerConfig {
        cache_dir: dir.path().join("sources"),
        credentials_dir: dir.path().join("credentials"),
        tick: Duration::from_millis(250),
        max_units: 100,
    };
    let syncer = SourceSyncer::new(config, store.clone());
    tokio::spawn(syncer.run(leads_watch.clone(), lifecycle_watch.clone()));
    let driver = RolloutDriver::new(store.clone(), Duration::from_millis(500));
    tokio::spawn(driver.run(leads_watch, lifecycle_watch));
    Leader { store, reads, leads, lifecycle, _dir: dir }
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
/// statuses, the driver the rollouts.
const FIRST_PASSES: usize = 3;

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

#[tokio::test(start_paused = true)]
async fn a_new_source_wakes_the_syncer_which_records_its_sync() {
    let mut leader = start(true);
    leader.reads_reach(FIRST_PASSES).await;
    let source = SourceRecord { interval_seconds: 3600, ..SourceRecord::new("web", "file:///nonexistent/fleet-units") };
    leader.store.store.put_source(&source).await.expect("store");
    // The change wakes both loops: the syncer reads the sources and their statuses again.
    leader.reads_reach(FIRST_PASSES + 2).await;
    let status = async || leader.store.store.source_statuses().await.expect("statuses");
    while status().await.is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let statuses = status().await;
    assert_eq!(statuses[0].0, "web");
    assert!(statuses[0].1.error.is_some(), "the fetch of a repository that does not exist fails: {statuses:?}");
}
