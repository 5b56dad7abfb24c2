//! (g) Health-gated rollouts of every bench unit: new content with a TCP health check against
//! a listener of this process goes out with a 1% canary baking 5 s and at most 10% of the
//! units down or unhealthy at once; then content whose check points at a closed port, with
//! auto-revert, must be stopped at its canary and undone. Prints the rollouts' times beyond
//! their bake and deadline, and what 10,000 checks cost the simulated machines' process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_e2e::{Fleetd, cpu_seconds};
use fleet_testkit::free_port;
use serde_json::{Value, json};

use crate::etcd_metrics;

const BAKE_SECONDS: u64 = 5;
/// The failing version's deadline: its gate fails this long after its canary began.
const DEADLINE_SECONDS: u64 = 5;
/// The working version's: no unit of it should ever reach it, and the time measured does not
/// depend on it; a debug build on a busy machine may take seconds to restart a unit, which
/// must not read as a failed gate.
const GOOD_DEADLINE_SECONDS: u64 = 120;
/// The longest a rollout is waited for.
const PATIENCE: Duration = Duration::from_secs(600);

/// The content of every unit at `version`, checked by a TCP connection to `port`.
fn content(version: u32, port: u16) -> Value {
    let options = [
        ("Unit", "Description", format!("bench unit, version {version}")),
        ("Service", "ExecStart", format!("/bin/sleep 10000{version}")),
        ("X-Fleet", "MachineMetadata", "role=worker".to_string()),
        ("X-Fleet", "HealthCheck", format!("tcp://127.0.0.1:{port}")),
        ("X-Fleet", "HealthCheckThreshold", "1".to_string()),
    ];
    options.iter().map(|(section, name, value)| json!({"section": section, "name": name, "value": value})).collect()
}

/// Accepts connections on a free loopback port for as long as the bench runs, counting them.
async fn listener(accepted: Arc<AtomicU64>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            accepted.fetch_add(1, Ordering::Relaxed);
        }
    });
    port
}

fn body_of(answer: &str) -> Value {
    answer.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()).unwrap_or(Value::Null)
}

/// Starts rollout `name` of `units` to `options` through the API, each unit given `deadline`
/// seconds to become healthy on it.
fn start(fleetd: &Fleetd, name: &str, units: &[String], options: Value, deadline: u64) {
    let request = json!({
        "units": units,
        "options": options,
        "maxUnavailable": "10%",
        "minReadySeconds": 0,
        "deadlineSeconds": deadline,
        "canary": "1%",
        "bakeSeconds": BAKE_SECONDS,
        "autoRevert": true,
    });
    let answer = fleetd.api("PUT", &format!("/fleet/v1/rollouts/{name}"), &request.to_string());
    assert!(answer.starts_with("HTTP/1.0 201") || answer.starts_with("HTTP/1.1 201"), "{answer}");
}

/// What the bench follows of a rollout while it runs: its state and why it reverted.
#[derive(serde::Deserialize)]
struct Progress {
    state: String,
    reverted: Option<String>,
    /// Why it paused, if it did.
    reason: Option<String>,
    /// How many units are at each step.
    #[serde(default)]
    steps: std::collections::BTreeMap<String, usize>,
}

/// Reads the progress of rollout `name` (`?units=false`, as `fleetctl rollout status --wait`
/// does: the bench shares the machine it measures) every 100 ms until `until` holds of it;
/// returns that progress and when `until` was seen to hold.
async fn watch(fleetd: &Fleetd, name: &str, until: impl Fn(&Progress) -> bool) -> (Progress, Instant) {
    let started = Instant::now();
    let path = format!("/fleet/v1/rollouts/{name}?units=false");
    loop {
        let answer = tokio::task::block_in_place(|| fleetd.api("GET", &path, ""));
        let progress: Option<Progress> = serde_json::from_value(body_of(&answer)).ok();
        let state = match progress {
            Some(progress) if until(&progress) => return (progress, Instant::now()),
            Some(progress) => progress.state,
            None => "unreadable".to_string(),
        };
        assert!(started.elapsed() < PATIENCE, "rollout {name} stuck: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs (g) with the bench units `units` through the API of `fleetd` (the engine leader).
pub async fn run(fleetd: &Fleetd, etcd_pid: u32, etcd_metrics_address: &str, units: &[String], idle_seconds: u64) {
    let accepted = Arc::new(AtomicU64::new(0));
    let port = listener(accepted.clone()).await;
    let closed = free_port();
    let count = units.len();

    // A version that works: the canary bakes, then waves of 10%.
    let began = Instant::now();
    let cpu = || [cpu_seconds(fleetd.pid()), cpu_seconds(etcd_pid), cpu_seconds(std::process::id())];
    let cpu_before = cpu();
    let counters_before = etcd_metrics::read(etcd_metrics_address);
    let agent = &fleet_metrics::metrics().agent;
    let (passes_before, probes_before) = (agent.passes.get(), agent.health_probes.get());
    let report_passes_before = agent.report_passes.get();
    start(fleetd, "bench-good", units, content(2, port), GOOD_DEADLINE_SECONDS);
    let answered = began.elapsed();
    let (_, canary_done) = watch(fleetd, "bench-good", |r| r.state == "canary" || r.state == "done").await;
    let (done, finished) = watch(fleetd, "bench-good", |r| r.state != "running" && r.state != "canary").await;
    assert_eq!(done.state, "done", "the good version completes: {:?} {:?}", done.reason, done.reverted);
    let total = finished - began;
    let [engine_cpu, etcd_cpu, bench_cpu] = std::array::from_fn(|index| cpu()[index] - cpu_before[index]);
    println!(
        "  (g) health-gated rollout of {count} units (canary 1% baking {BAKE_SECONDS} s, max-unavailable 10%, a TCP check each): done in {:.2} s, the canary done after {:.2} s; beyond the bake: {:.2} s (target under 5 s)",
        total.as_secs_f64(),
        (canary_done - began).as_secs_f64(),
        total.as_secs_f64() - BAKE_SECONDS as f64
    );
    let since_epoch = |at: Instant| {
        let ago = at.elapsed();
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |now| (now - ago).as_secs_f64())
    };
    println!(
        "      the start request answered after {:.3} s; started at {:.3}, seen done at {:.3} (seconds since the epoch, to line up with fleetd's log)",
        answered.as_secs_f64(),
        since_epoch(began),
        since_epoch(finished)
    );
    let busy = total.as_secs_f64() - BAKE_SECONDS as f64;
    println!(
        "      CPU over it: the engine fleetd {engine_cpu:.2} s, etcd {etcd_cpu:.2} s, the simulated machines' process {bench_cpu:.2} s; {:.0}% of this machine's cores outside the bake",
        (engine_cpu + etcd_cpu + bench_cpu) * 100.0
            / (busy * std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64))
    );
    let counters = etcd_metrics::delta(&counters_before, &etcd_metrics::read(etcd_metrics_address));
    let moved: Vec<String> = counters.iter().map(|(name, moved)| format!("{name} {moved:.0}")).collect();
    println!("      etcd over it: {}", moved.join(", "));
    println!(
        "      the simulated agents over it: {} passes ({} of them woken by a health flip alone, which only reported), {} health probes",
        agent.passes.get() - passes_before,
        agent.report_passes.get() - report_passes_before,
        agent.health_probes.get() - probes_before
    );

    // Every unit now runs a check: what 10,000 of them cost while nothing changes.
    let (bench_before, accepted_before) = (cpu_seconds(std::process::id()), accepted.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    let cpu = cpu_seconds(std::process::id()) - bench_before;
    let probes = accepted.load(Ordering::Relaxed) - accepted_before;
    println!(
        "      then idle {idle_seconds} s with {count} checks every 10 s: {probes} probes ({:.0}/s); the simulated machines' process CPU {cpu:.2} s ({:.2}% of a core, the listener's accepts included)",
        probes as f64 / idle_seconds as f64,
        cpu * 100.0 / idle_seconds as f64
    );

    // A version whose check fails: its canary never turns healthy, the gate fails at the
    // deadline, and the rollout undoes itself.
    let began = Instant::now();
    start(fleetd, "bench-bad", units, content(3, closed), DEADLINE_SECONDS);
    let (failing, gate_failed) = watch(fleetd, "bench-bad", |r| r.reverted.is_some()).await;
    let (reverted, back) = watch(fleetd, "bench-bad", |r| r.state == "reverted").await;
    // The undo holds every unit; those it had to take back were not done when it began.
    let touched = failing.steps.values().sum::<usize>() - failing.steps.get("done").copied().unwrap_or(0);
    println!(
        "  (g) a failing version: the gate failed {:.2} s after the start (deadline {DEADLINE_SECONDS} s): {}; every unit it touched back on the old content {:.2} s later (target under 10 s); units the failing version reached: {touched}; state then {}",
        (gate_failed - began).as_secs_f64(),
        failing.reverted.as_deref().unwrap_or("-"),
        (back - gate_failed).as_secs_f64(),
        reverted.state
    );
}
