//! Benchmark: units on a calendar all due at the same second, on simulated machines over a
//! real etcd, their runs claimed and placed by a real fleetd engine.
//!
//! Many machines run in this one process, each a real `fleet_agent::Agent` on its own fake
//! unit manager (a run "ends" as soon as this bench sees it started). Every unit says
//! `Schedule=*-*-* HH:MM:SS` for one second far enough ahead for the submission. Prints how
//! long after that elapse every unit had been started once, and had its run's end recorded,
//! and the engine fleetd's CPU over the elapse. It checks what it measures: each unit started
//! exactly once, each record holding one run for that elapse, so a debug build of a small size
//! runs in CI as a correctness test (`scripts/test.sh`).
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-calendar [MACHINES] [UNITS]`

use fleet_e2e::argument;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::UnitFile;
use fleet_core::job::runs::Outcome;
use fleet_e2e::cluster_bench::{registered_machines, simulated_machine, submit};
use fleet_e2e::{EtcdServer, Fleetd, cpu_seconds, metric_value};
use fleet_registry::ApiRegistry;
use fleet_store_etcd::{EtcdOptions, EtcdRegistry, Lifetimes};
use fleet_testkit::FakeUnitManager;
use fleet_unit_manager::UnitManager;
use tokio::sync::watch;

/// etcd connections the simulated machines share.
const CONNECTIONS: usize = 4;
const PREFIX: &str = "/_coreos.com/fleet/";
/// How long the bench waits for any one step before it gives up.
const LIMIT: Duration = Duration::from_secs(900);

fn wait_for_leader(fleetd: &Fleetd) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric_value(&fleetd.metrics(), "fleet_engine_leader") != Some(1.0) {
        assert!(Instant::now() < deadline, "no engine leadership: {}", fleetd.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock after 1970")
}

/// The unit file of every bench unit: a oneshot due at `elapse` (seconds since the epoch, UTC).
fn calendar_file(elapse: u64) -> UnitFile {
    let of_day = elapse % 86_400;
    let (hour, minute, second) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    UnitFile::parse(&format!(
        "[Service]\nType=oneshot\nExecStart=/bin/true\n\n[X-Fleet]\nSchedule=*-*-* {hour:02}:{minute:02}:{second:02}\nMachineMetadata=role=worker\n"
    ))
    .expect("the bench unit parses")
}

fn main() {
    let machines = argument(1, 1000);
    let units = argument(2, 10_000);
    let etcd = EtcdServer::start_for_scale();
    let config =
        [("etcd_servers", etcd.endpoint()), ("metadata", "role=engine".into()), ("etcd_request_timeout", "5".into())];
    let config: Vec<(&str, &str)> = config.iter().map(|(key, value)| (*key, value.as_str())).collect();
    let engine = Fleetd::start("e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0", &config);
    wait_for_leader(&engine);
    let options = EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: PREFIX.into(),
        request_timeout: Duration::from_secs(5),
        ..EtcdOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // Borrowed, not moved in: the fleetd is stopped before its etcd when main ends (dropped in
    // the reverse order they were made). Moved into the block, etcd could stop first, and the
    // fleetd's engine pass then waits on it past fleetd's 30 s to exit.
    let (etcd, engine) = (&etcd, &engine);
    runtime.block_on(async move {
        let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(30), engine_lease_ttl: Duration::from_secs(10) };
        let mut registries = Vec::new();
        for _ in 0..CONNECTIONS {
            registries.push(EtcdRegistry::connect(&options, lifetimes).await.expect("connect to etcd"));
        }
        let api = registries[0].clone();
        println!("bench-calendar: {machines} simulated machines, {units} units on a calendar due at one second, one fleetd engine");
        let (_lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
        let mut managers = Vec::new();
        for index in 0..machines {
            let config = AgentConfig {
                machine: simulated_machine(index, false),
                reconcile_interval: Duration::from_secs(5),
                debounce: Duration::from_millis(10),
                presence_ttl: None,
                stop_units_when_cut_off: false,
            };
            let manager = Arc::new(FakeUnitManager::new());
            let agent = Agent::new(config, Arc::new(registries[index % CONNECTIONS].clone()), manager.clone());
            tokio::spawn(agent.run(lifecycle_watch.clone()));
            managers.push(manager);
        }
        let mut counter = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("connect to etcd");
        let joining = Instant::now();
        while registered_machines(&mut counter, PREFIX).await < machines + 1 {
            assert!(joining.elapsed() < LIMIT, "the machines did not all register");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // The elapse: a whole second far enough ahead for the submission (2 ms a unit, and 5 s).
        let lead = Duration::from_secs(5) + Duration::from_millis(2 * units as u64);
        let elapse = (unix_now() + lead).as_secs() + 1;
        let file = calendar_file(elapse);
        let submitted = submit(&api, (0..units).map(|index| (format!("tick{index}.service"), file.clone()))).await;
        let before_elapse = Duration::from_secs(elapse).saturating_sub(unix_now());
        println!("  {units} units submitted in {:.2} s, {:.2} s before their elapse", submitted.as_secs_f64(), before_elapse.as_secs_f64());
        assert!(before_elapse > Duration::ZERO, "the submission took longer than its lead: the elapse passed");
        tokio::time::sleep(before_elapse.saturating_sub(Duration::from_millis(500))).await;
        let cpu_before = cpu_seconds(engine.pid());

        // Every run started (a fake manager's start), then ended at once by this bench.
        let started_after = loop {
            let mut started = 0;
            for manager in &managers {
                started += manager.starts();
                for (name, held) in manager.units().await.unwrap_or_default() {
                    if held.state.active == "active" {
                        let _ = manager.end_run(&name, Outcome::Succeeded);
                    }
                }
            }
            let since = unix_now().saturating_sub(Duration::from_secs(elapse));
            if started >= units {
                break since;
            }
            assert!(since < LIMIT, "{started} of {units} units started {since:?} after their elapse");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let cpu_started = cpu_seconds(engine.pid()) - cpu_before;
        println!(
            "  every unit started {:.2} s after its elapse (the engine fleetd's CPU until then: {cpu_started:.2} s)",
            started_after.as_secs_f64()
        );
        let ended_after = loop {
            let records = api.all_job_records().await.expect("the job records");
            let ended = records.iter().filter(|stored| stored.record.runs.iter().any(|run| run.outcome.is_some())).count();
            let since = unix_now().saturating_sub(Duration::from_secs(elapse));
            if ended >= units {
                break (since, records);
            }
            assert!(since < LIMIT, "{ended} of {units} runs' ends recorded {since:?} after their elapse");
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let (ended_after, records) = ended_after;
        println!(
            "  every run's end recorded {:.2} s after its elapse (the engine fleetd's CPU from the elapse: {:.2} s, {:.2} ms a unit)",
            ended_after.as_secs_f64(),
            cpu_seconds(engine.pid()) - cpu_before,
            (cpu_seconds(engine.pid()) - cpu_before) * 1000.0 / units as f64
        );
        let elapse_micros = i64::try_from(elapse).expect("an elapse") * 1_000_000;
        for stored in &records {
            let runs: Vec<_> = stored.record.runs.iter().filter_map(|run| run.elapse).collect();
            assert_eq!(runs, vec![elapse_micros], "{} ran once, for its elapse: {:?}", stored.unit, stored.record);
        }
        let starts: usize = managers.iter().map(|manager| manager.starts()).sum();
        assert_eq!(starts, units, "every unit started exactly once");
        println!("  checked: each of the {units} units started once, its record holding one run for the elapse");
    });
}
