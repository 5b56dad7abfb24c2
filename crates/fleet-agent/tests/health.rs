//! The agent's health checks against real listeners and commands, on the embedded store with
//! the fake unit manager, in real time (probes are real I/O): what is reported, when, and the
//! restarts a unit asked for.

use fleet_core::unpoisoned::Locked;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::health::{HealthReport, HealthStatus};
use fleet_core::schedule::Decision;
use fleet_core::state_report::StateReport;
use fleet_core::{DesiredState, MachineState, UnitFile, UnitHash};
use fleet_registry::{AgentRegistry, ApiRegistry, ChangeSignal, EngineRegistry, MachineWork};
use fleet_store_embedded::EmbeddedRegistry;
use fleet_testkit::{FakeUnitManager, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

const MACHINE: &str = "m1";

struct Setup {
    _dir: tempfile::TempDir,
    registry: EmbeddedRegistry,
    manager: Arc<FakeUnitManager>,
    lifecycle: watch::Sender<Lifecycle>,
    task: tokio::task::JoinHandle<()>,
    reported: Arc<Mutex<Vec<StateReport>>>,
    work_reads: Arc<AtomicUsize>,
}

/// The embedded store, keeping every state report the agent wrote through it, in order,
/// and counting its reads of the machine's work.
struct Recording {
    store: EmbeddedRegistry,
    reported: Arc<Mutex<Vec<StateReport>>>,
    work_reads: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl AgentRegistry for Recording {
    async fn register_machine(&self, machine: &MachineState) -> fleet_registry::Result<()> {
        self.store.register_machine(machine).await
    }
    async fn unregister_machine(&self, machine_id: &str) -> fleet_registry::Result<()> {
        self.store.unregister_machine(machine_id).await
    }
    async fn machine_work(&self, machine_id: &str) -> fleet_registry::Result<MachineWork> {
        self.work_reads.fetch_add(1, Ordering::Relaxed);
        self.store.machine_work(machine_id).await
    }
    async fn unit_body(&self, hash: &UnitHash) -> fleet_registry::Result<Option<UnitFile>> {
        self.store.unit_body(hash).await
    }
    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> fleet_registry::Result<()> {
        self.reported.locked().extend_from_slice(reports);
        self.store.report_states(machine_id, reports).await
    }
    fn machine_changes(&self, machine_id: &str) -> ChangeSignal {
        self.store.machine_changes(machine_id)
    }
}

impl Setup {
    fn start() -> Self {
        Self::waiting_for_first_verdicts(fleet_agent::health_watch::FIRST_VERDICT_WAIT)
    }

    /// An agent whose units' states wait `wait` for their checks' first verdicts.
    fn waiting_for_first_verdicts(wait: Duration) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("the store");
        let manager = Arc::new(FakeUnitManager::new());
        let config = AgentConfig {
            machine: MachineState { id: MACHINE.into(), public_ip: "127.0.0.1".into(), ..Default::default() },
            reconcile_interval: Duration::from_secs(30),
            debounce: Duration::from_millis(10),
            presence_ttl: None,
            stop_units_when_cut_off: false,
        };
        let (lifecycle, watch) = watch::channel(Lifecycle::Running);
        let reported = Arc::new(Mutex::new(Vec::new()));
        let work_reads = Arc::new(AtomicUsize::new(0));
        let recording =
            Recording { store: registry.clone(), reported: reported.clone(), work_reads: work_reads.clone() };
        let agent = Agent::new(config, Arc::new(recording), manager.clone()).with_first_verdict_wait(wait);
        let task = tokio::spawn(agent.run(watch));
        Self { _dir: dir, registry, manager, lifecycle, task, reported, work_reads }
    }

    /// The health of every state of `name` the agent reported, in order (`None`: no check).
    fn reported_health_of(&self, name: &str) -> Vec<Option<HealthStatus>> {
        let reported = self.reported.locked();
        reported
            .iter()
            .filter_map(|report| match report {
                StateReport::Set(state) if state.name == name => Some(state.health.as_ref().map(|h| h.status)),
                _ => None,
            })
            .collect()
    }

    /// Writes what the engine would: the unit, placed on this machine, launched.
    async fn run(&self, name: &str, x_fleet: &str) {
        let text = format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\n{x_fleet}");
        let file = UnitFile::parse(&text).expect("a unit");
        fleet_core::admission::admit_unit(name, &file).expect("a valid unit");
        self.registry.put_unit(name, &file, DesiredState::Launched).await.expect("stored");
        let lease = self.registry.acquire_leadership("engine").await.expect("store").expect("a lease");
        let decision = Decision::Schedule { unit: name.into(), machine: MACHINE.into() };
        self.registry.apply(&lease, &[decision], &[]).await.expect("scheduled");
    }

    async fn health(&self, name: &str) -> Option<HealthReport> {
        let states = self.registry.unit_states().await.expect("states");
        states.into_iter().find(|state| state.name == name).and_then(|state| state.health)
    }

    async fn wait_for(&self, name: &str, status: HealthStatus) -> HealthReport {
        eventually(&format!("{name} is reported {status}"), async || {
            self.health(name).await.is_some_and(|report| report.status == status)
        })
        .await;
        self.health(name).await.unwrap_or_default()
    }

    async fn stop(self) {
        let _ = self.lifecycle.send(Lifecycle::ShuttingDown);
        let _ = self.task.await;
    }
}

const FAST: &str = "HealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n";

#[tokio::test]
async fn a_tcp_check_reports_healthy_then_unhealthy_once_the_port_closes() {
    let setup = Setup::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    setup.run("db.service", &format!("HealthCheck=tcp://127.0.0.1:{port}\n{FAST}")).await;
    setup.wait_for("db.service", HealthStatus::Healthy).await;
    drop(listener);
    let report = setup.wait_for("db.service", HealthStatus::Unhealthy).await;
    assert!(report.failure.contains("connecting to 127.0.0.1"), "{report:?}");
    setup.run("plain.service", "").await;
    eventually("an unchecked unit is reported", async || {
        setup.registry.unit_states().await.expect("states").iter().any(|state| state.name == "plain.service")
    })
    .await;
    assert_eq!(setup.health("plain.service").await, None, "a unit without a check reports no health");
    setup.stop().await;
}

/// Regression (issue 68): instances of one template share their content, and the check of
/// the first one followed was probed for every instance (`%i` expanded once). Each instance
/// is probed on its own port: the one listening is healthy, the one not is unhealthy.
#[tokio::test]
async fn instances_of_one_template_are_each_probed_at_their_own_instance() {
    let setup = Setup::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let listening = listener.local_addr().expect("its address").port();
    let silent = fleet_testkit::free_port();
    let check = format!("HealthCheck=tcp://127.0.0.1:%i\n{FAST}");
    let (up, down) = (format!("chk@{listening}.service"), format!("chk@{silent}.service"));
    setup.run(&up, &check).await;
    setup.run(&down, &check).await;
    setup.wait_for(&up, HealthStatus::Healthy).await;
    let report = setup.wait_for(&down, HealthStatus::Unhealthy).await;
    assert!(report.failure.contains(&format!("127.0.0.1:{silent}")), "the silent instance's own port: {report:?}");
    assert_eq!(setup.health(&up).await.map(|report| report.status), Some(HealthStatus::Healthy));
    setup.stop().await;
}

/// A pass woken by a health flip alone, with nothing left undone before it, reports the
/// flip without reading the machine's work again: nothing it should run changed.
#[tokio::test]
async fn a_health_flip_alone_is_reported_without_reading_the_work_again() {
    let setup = Setup::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    setup.run("db.service", &format!("HealthCheck=tcp://127.0.0.1:{port}\n{FAST}")).await;
    setup.wait_for("db.service", HealthStatus::Healthy).await;
    let reads = setup.work_reads.load(Ordering::Relaxed);
    assert!(reads > 0, "the work was read to start the unit");
    drop(listener);
    setup.wait_for("db.service", HealthStatus::Unhealthy).await;
    assert_eq!(setup.work_reads.load(Ordering::Relaxed), reads, "the flip was reported without a read of the work");
    // A change to the work is still read at once.
    setup.run("plain.service", "").await;
    eventually("the new unit is reported", async || {
        setup.registry.unit_states().await.expect("states").iter().any(|state| state.name == "plain.service")
    })
    .await;
    assert!(setup.work_reads.load(Ordering::Relaxed) > reads);
    setup.stop().await;
}

/// A unit whose check passes at once is reported once, healthy: not first `unknown` and
/// again a moment later (a rollout of thousands of units would write each twice). The wait
/// is long here so that the test holds however slowly the first probe comes.
#[tokio::test]
async fn a_unit_that_passes_its_first_probe_is_reported_once_already_healthy() {
    let setup = Setup::waiting_for_first_verdicts(Duration::from_secs(600));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    setup.run("db.service", &format!("HealthCheck=tcp://127.0.0.1:{port}\n{FAST}")).await;
    setup.wait_for("db.service", HealthStatus::Healthy).await;
    assert_eq!(setup.reported_health_of("db.service"), [Some(HealthStatus::Healthy)]);
    setup.stop().await;
}

/// A unit whose first verdict does not come within the wait is reported `unknown` then, and
/// again with the verdict when it comes.
#[tokio::test]
async fn a_unit_whose_first_verdict_is_overdue_is_reported_unknown_meanwhile() {
    let setup = Setup::waiting_for_first_verdicts(Duration::from_millis(100));
    let flag = tempfile::tempdir().expect("a directory");
    let path = flag.path().join("go");
    // The check passes once the flag exists, and not before: its first verdict waits for it.
    let check = format!(
        "HealthCheck=exec:/bin/sh -c 'while ! test -e {}; do sleep 0.05; done'\nHealthCheckInterval=1h\nHealthCheckTimeout=10min\nHealthCheckThreshold=1\n",
        path.display()
    );
    setup.run("slow.service", &check).await;
    setup.wait_for("slow.service", HealthStatus::Unknown).await;
    std::fs::write(&path, "").expect("the flag");
    setup.wait_for("slow.service", HealthStatus::Healthy).await;
    assert_eq!(setup.reported_health_of("slow.service"), [Some(HealthStatus::Unknown), Some(HealthStatus::Healthy)]);
    setup.stop().await;
}

/// A server that answers every request with the status in `status`; the second value counts
/// the connections it took.
async fn http_server(status: Arc<AtomicU16>) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let served = Arc::new(AtomicUsize::new(0));
    let counted = served.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let code = status.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                let answer = format!("HTTP/1.1 {code} Whatever\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (port, served)
}

#[tokio::test]
async fn an_http_check_follows_the_status_code() {
    let setup = Setup::start();
    let status = Arc::new(AtomicU16::new(200));
    let (port, _) = http_server(status.clone()).await;
    setup.run("web@1.service", &format!("HealthCheck=http://127.0.0.1:{port}/health?instance=%i\n{FAST}")).await;
    setup.wait_for("web@1.service", HealthStatus::Healthy).await;
    status.store(503, Ordering::SeqCst);
    let report = setup.wait_for("web@1.service", HealthStatus::Unhealthy).await;
    assert_eq!(report.failure, "HTTP 503");
    status.store(302, Ordering::SeqCst);
    setup.wait_for("web@1.service", HealthStatus::Healthy).await;
    setup.stop().await;
}

#[tokio::test]
async fn a_unit_in_its_start_period_is_probed_again_soon_and_turns_healthy_once_it_listens() {
    let setup = Setup::start();
    let port = fleet_testkit::free_port();
    // An interval of an hour: only the start period's retries can see the port open.
    let check = format!(
        "HealthCheck=tcp://127.0.0.1:{port}\nHealthCheckInterval=1h\nHealthCheckTimeout=1s\nHealthCheckStartPeriod=10min\n"
    );
    setup.run("slow.service", &check).await;
    let probes = || fleet_metrics::metrics().agent.health_probes.get();
    eventually("two probes failed while nothing listens", async || probes() >= 2).await;
    let before = setup.health("slow.service").await.map(|report| report.status);
    assert_ne!(before, Some(HealthStatus::Healthy), "nothing listened yet");
    let _listener = TcpListener::bind(("127.0.0.1", port)).await.expect("the port");
    setup.wait_for("slow.service", HealthStatus::Healthy).await;
    setup.stop().await;
}

#[tokio::test]
async fn an_exec_check_passes_on_exit_zero_and_reports_what_a_failure_said() {
    let setup = Setup::start();
    let flag = tempfile::NamedTempFile::new().expect("a file");
    let path = flag.path().display().to_string();
    let check = format!("HealthCheck=exec:/bin/sh -c 'test -s {path} || {{ echo empty flag; exit 1; }}'\n{FAST}");
    setup.run("job.service", &check).await;
    let report = setup.wait_for("job.service", HealthStatus::Unhealthy).await;
    assert_eq!(report.failure, "exit status 1: empty flag");
    std::fs::write(flag.path(), "ok").expect("written");
    setup.wait_for("job.service", HealthStatus::Healthy).await;
    setup.stop().await;
}

#[tokio::test]
async fn an_unhealthy_unit_that_asks_is_restarted_until_its_budget_is_spent() {
    let setup = Setup::start();
    let (port, probes) = http_server(Arc::new(AtomicU16::new(500))).await;
    let check = format!("HealthCheck=http://127.0.0.1:{port}/\nHealthCheckRestart=yes\n{FAST}");
    setup.run("flaky.service", &check).await;
    eventually("the budget is spent", async || {
        setup.health("flaky.service").await.is_some_and(|report| report.given_up)
    })
    .await;
    let report = setup.health("flaky.service").await.unwrap_or_default();
    assert_eq!((report.status, report.restarts), (HealthStatus::Unhealthy, fleet_core::drift::LIMIT));
    let starts = setup.manager.starts();
    assert_eq!(starts, 1 + fleet_core::drift::LIMIT, "the first start and one per restart");
    // Given up: it stays as it is, however many more times its check fails.
    let before = setup.registry.unit_states().await.expect("states");
    let probed = probes.load(Ordering::SeqCst);
    eventually("three more failing probes", async || probes.load(Ordering::SeqCst) >= probed + 3).await;
    assert_eq!(setup.manager.starts(), starts, "no restart past the budget");
    assert_eq!(setup.registry.unit_states().await.expect("states"), before, "nothing new to report");
    setup.stop().await;
}
