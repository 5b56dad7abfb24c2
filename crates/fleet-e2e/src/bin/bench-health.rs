//! Benchmark: what health checks cost the machine that runs them. One agent's health watch
//! (`fleet_agent::health_watch`) follows UNITS units, each with an HTTP check every INTERVAL
//! seconds against one local server (`health-server`, a child process, so its CPU is not
//! counted); once every unit is healthy, the bench's own CPU is measured over WINDOW seconds,
//! with the probes made meanwhile. Prints the CPU as a share of one core.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-health [UNITS] [INTERVAL] [WINDOW]`

use fleet_e2e::argument;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_agent::health_watch::{HealthWatch, Running};
use fleet_core::UnitFile;
use fleet_core::health::HealthStatus;
use fleet_e2e::{binary, cpu_seconds};
use fleet_testkit::{FakeUnitManager, free_port};
use fleet_unit_manager::UnitManager;

fn main() {
    let units = usize::try_from(argument(1, 10_000)).unwrap_or(10_000);
    let interval = argument(2, 10);
    let window = argument(3, 60);
    let port = free_port();
    let server = Server(
        std::process::Command::new(binary("health-server"))
            .args([port.to_string(), "200".to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start health-server"),
    );
    let text = format!(
        "[Service]\nExecStart=/bin/true\n[X-Fleet]\nHealthCheck=http://127.0.0.1:{port}/health\nHealthCheckInterval={interval}s\nHealthCheckThreshold=1\n"
    );
    let file = UnitFile::parse(&text).expect("a unit");
    let hash = file.hash();
    let names: Vec<String> = (0..units).map(|n| format!("bench@{n}.service")).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    println!("bench-health: {units} units, an HTTP check every {interval}s each, one agent");
    runtime.block_on(async {
        // The server is up once it answers.
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "health-server does not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let manager: Arc<dyn UnitManager> = Arc::new(FakeUnitManager::new());
        let mut watch = HealthWatch::default();
        let started = Instant::now();
        watch.follow(names.iter().map(|name| Running { name, hash, file: &file }), &manager);
        loop {
            let healthy =
                watch.reports().values().filter(|report| report.status == HealthStatus::Healthy).count();
            if healthy == units {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(interval * 3 + 60), "{healthy} of {units} healthy");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("  every unit healthy {:.2} s after it was followed", started.elapsed().as_secs_f64());
        let probes = || fleet_metrics::metrics().agent.health_probes.get();
        let (cpu_before, probes_before, window_start) = (cpu_seconds(std::process::id()), probes(), Instant::now());
        tokio::time::sleep(Duration::from_secs(window)).await;
        let elapsed = window_start.elapsed().as_secs_f64();
        let cpu = cpu_seconds(std::process::id()) - cpu_before;
        let made = probes() - probes_before;
        let unhealthy = watch.reports().values().filter(|report| report.status != HealthStatus::Healthy).count();
        println!(
            "  over {elapsed:.1} s: {made} probes ({:.0}/s), CPU {cpu:.2} s = {:.2}% of one core ({:.1} µs a probe); units not healthy at the end: {unhealthy}",
            made as f64 / elapsed,
            cpu / elapsed * 100.0,
            if made > 0 { cpu / made as f64 * 1e6 } else { 0.0 },
        );
        assert_eq!(unhealthy, 0, "every unit stays healthy");
        drop(watch);
    });
    drop(server);
}

/// The server, stopped with the bench however it ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
