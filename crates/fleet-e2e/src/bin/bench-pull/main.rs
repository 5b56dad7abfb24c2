//! Benchmark: pull agents through one manager on one etcd.
//!
//! One real fleetd is the manager (etcd store, TLS, agent CA); another, started first and given
//! no agent, leads the engine (with `--joins`, the manager leads it). Many pull agents
//! run in this process (or its children, below), each the real agent code on its own `RemoteRegistry`: its own
//! registration, its own certificate, its own HTTPS (HTTP/2) connection and long poll; only
//! systemd is simulated. Every unit asks for `role=worker`, which only the pull agents have.
//! Prints:
//!
//! (a) the time from the last unit submitted until every unit reports launched, with the
//!     manager's CPU over that time;
//!     and the TLS handshakes the managers completed meanwhile, full and resumed;
//! then waits (up to two minutes) until every agent follows its changes on a change stream,
//! and prints how long that took;
//! (b) how many agents one schedule change wakes;
//! (c) the manager's CPU and memory idle, and what etcd does meanwhile: its CPU, the
//!     proposals it commits (every store write) and the lease renewals it receives, a second;
//!     and what one more manager, on the same store but given to no agent, grew by since
//!     before any agent joined: the cluster's data as a manager holds it, which the memory an
//!     agent costs its manager is then given beyond;
//! (e) a global unit, one change that reaches every agent on its stream: the time until every
//!     agent reports it active, the managers' CPU, their TLS handshakes (full and resumed) and
//!     what the streams carried (works out, states reports back);
//! (d) after the manager is killed and started again, the time until every agent has
//!     announced itself to the new one; with several managers, after one is killed (not
//!     started again), the time until every agent it held is held by the others, the fewest
//!     agents present meanwhile and the units that moved.
//!
//! With MANAGERS above 1, that many fleetds share the etcd and the agents (each starts on one
//! of the list at random). AGENT_TTL (seconds, 60 by default) sets how soon a lost agent or
//! manager is noticed (the connections' keepalive probes) and how often an agent beats while
//! its presence must be proven (three times in it; no bench unit asks it); IDLE_HEARTBEAT
//! (seconds, the default `agent_heartbeat` unless given) how often an idle agent beats.
//! Past PER_PROCESS agents (10,000 by default: a process may hold
//! 20,000 open files here, and an agent holds one or two connections), the agents run in child
//! processes of the bench, PER_PROCESS each; (b) then counts the works the managers' streams
//! carried. Each manager holds up to about 9,000 agents' connections for the same reason: give
//! 100,000 agents 12 managers.
//!
//! `bench-pull --joins COUNT [MANAGERS]` only joins COUNT agents, each with a connection of
//! its own that it closes (so past what a process may hold open), and prints the time and
//! the CPU a join costs the managers, etcd and the joining agents.
//!
//! `BENCH_PULL_LOGS=DIR` keeps every fleetd's log as it stands after (c) in DIR.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-pull [AGENTS] [UNITS] [IDLE_SECONDS] [MANAGERS] [AGENT_TTL] [PER_PROCESS] [IDLE_HEARTBEAT]`

use fleet_e2e::{argument, resident_mib};
use std::time::{Duration, Instant};

use fleet_core::{DesiredState, UnitFile};
use fleet_e2e::cluster_bench::{registered_machines, submit_units, template, wait_all_launched};
use fleet_e2e::launched_units::LaunchedUnits;
use fleet_e2e::pki::Authority;
use fleet_e2e::{EtcdServer, Fleetd, cpu_seconds, metric_value};
use fleet_registry::ApiRegistry;
use fleet_store_etcd::{EtcdOptions, EtcdRegistry, Lifetimes};

mod agent_hosts;
use agent_hosts::{AgentHosts, Reach};

/// The leases the agents' machine records hang on, read 10,000 keys at a time (keys only:
/// 40,000 records with their values pass gRPC's 4 MiB answer, and so do 100,000 keys).
async fn machine_leases(client: &mut etcd_client::Client) -> std::collections::HashMap<String, i64> {
    let prefix = "/_coreos.com/fleet/machines/pull";
    // Just past every key that starts with the prefix.
    let end = "/_coreos.com/fleet/machines/pulm";
    let mut leases = std::collections::HashMap::new();
    let mut from = prefix.to_string();
    loop {
        let options = etcd_client::GetOptions::new().with_range(end).with_limit(10_000).with_keys_only();
        let reply = client.get(from.as_str(), Some(options)).await.expect("read machines");
        for kv in reply.kvs() {
            leases.insert(String::from_utf8_lossy(kv.key()).into_owned(), kv.lease());
        }
        match reply.kvs().last() {
            Some(last) if reply.more() => from = format!("{}\0", String::from_utf8_lossy(last.key())),
            _ => return leases,
        }
    }
}

/// Past this many agents on one host, loopback's input queue must hold their bursts.
const AGENTS_A_SHORT_QUEUE_DROPS: usize = 20_000;

/// Says so when the host's loopback input queue (`net.core.netdev_max_backlog`) is short for
/// `agents`' connections: their keepalive probes and pushes come in bursts, a short queue drops
/// them, and the kernel then ends idle streams on timeouts, which moves their agents inside the
/// idle window (1,000, the default, dropped 251,000 packets in one 100,000-agent run). A host
/// setting, left to whoever runs the bench.
fn warn_of_a_short_loopback_queue(agents: usize) {
    let queue: usize = std::fs::read_to_string("/proc/sys/net/core/netdev_max_backlog")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0);
    if agents > AGENTS_A_SHORT_QUEUE_DROPS && queue < agents {
        println!(
            "  note: net.core.netdev_max_backlog is {queue}: loopback drops the bursts of {agents} agents' connections and idle streams end on timeouts; `sysctl -w net.core.netdev_max_backlog={agents}` for a clean idle window"
        );
    }
}

/// What etcd has done so far: proposals committed (every write goes through one) and lease
/// renewals received, from its metrics.
async fn etcd_counters(endpoint: &str) -> (f64, f64) {
    let text = match reqwest::get(format!("{endpoint}/metrics")).await {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let value = |line: &str| line.rsplit(' ').next().and_then(|value| value.parse::<f64>().ok()).unwrap_or(0.0);
    let proposals =
        text.lines().filter(|line| line.starts_with("etcd_server_proposals_committed_total ")).map(value).sum();
    let renewals = text
        .lines()
        .filter(|line| {
            line.starts_with("grpc_server_msg_received_total{") && line.contains("grpc_method=\"LeaseKeepAlive\"")
        })
        .map(value)
        .sum();
    (proposals, renewals)
}

/// How many agents hang on each lease (each manager's), most first.
fn agents_by_lease(leases: &std::collections::HashMap<String, i64>) -> Vec<(i64, usize)> {
    let mut counts: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for lease in leases.values() {
        *counts.entry(*lease).or_default() += 1;
    }
    let mut counts: Vec<(i64, usize)> = counts.into_iter().collect();
    counts.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    counts
}

/// The sums over `managers` of metric series, one each, from one scrape of each manager
/// (blocking: a scrape is a request, and costs a manager of 10,000 machines a few ms).
fn managers_metrics<const N: usize>(managers: &[Fleetd], series: [&str; N]) -> [f64; N] {
    tokio::task::block_in_place(|| {
        let mut sums = [0.0; N];
        for fleetd in managers {
            let text = fleetd.api("GET", "/metrics", "");
            for (sum, series) in sums.iter_mut().zip(series) {
                *sum += fleet_e2e::metric_value(&text, series).unwrap_or(0.0);
            }
        }
        sums
    })
}

/// The announcements of pull agents `manager` took since it started; 0 while it does not
/// answer.
fn announcements(manager: &Fleetd) -> f64 {
    let text = tokio::task::block_in_place(|| manager.try_api("GET", "/metrics", "").unwrap_or_default());
    fleet_e2e::metric_value(&text, "fleet_pull_agent_announcements_total").unwrap_or(0.0)
}

/// TLS handshakes the managers completed so far: (full, resumed).
/// How many agents follow a change stream on the managers, once all `agents` do or `limit`
/// after `since`.
async fn until_all_streaming(managers: &[Fleetd], agents: usize, since: Instant, limit: Duration) -> f64 {
    loop {
        let [streaming] = managers_metrics(managers, ["fleet_pull_agents_streaming"]);
        if streaming >= agents as f64 || since.elapsed() >= limit {
            return streaming;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn handshakes(managers: &[Fleetd]) -> (f64, f64) {
    let [full, resumed] = managers_metrics(
        managers,
        ["fleet_api_tls_handshakes_total{kind=\"full\"}", "fleet_api_tls_handshakes_total{kind=\"resumed\"}"],
    );
    (full, resumed)
}

/// What the change streams carried so far: (works out, states reports back).
fn stream_traffic(managers: &[Fleetd]) -> (f64, f64) {
    let [works, states] =
        managers_metrics(managers, ["fleet_pull_stream_works_total", "fleet_pull_stream_states_total"]);
    (works, states)
}

/// Runs `change`, then waits until `agents` machines report `unit` active: from a watch of
/// the states, so that the bench reads nothing meanwhile (reading every state four times a
/// second loaded etcd about as much as the agents' own reports). How long it took.
async fn until_active_everywhere(
    raw: &mut etcd_client::Client,
    unit: &str,
    agents: usize,
    change: impl std::future::Future<Output = ()>,
) -> Duration {
    let prefix = "/_coreos.com/fleet/states/";
    let mut events =
        raw.watch(prefix, Some(etcd_client::WatchOptions::new().with_prefix())).await.expect("watch the states");
    let started = Instant::now();
    change.await;
    let suffix = format!("/{unit}");
    let mut active = std::collections::HashSet::new();
    let mut last_report = Instant::now();
    while active.len() < agents {
        assert!(started.elapsed() < Duration::from_secs(600), "only {}/{agents} agents run {unit}", active.len());
        let Ok(Ok(Some(answer))) = tokio::time::timeout(Duration::from_secs(5), events.message()).await else {
            continue;
        };
        for event in answer.events() {
            let Some(kv) = event.kv().filter(|_| event.event_type() == etcd_client::EventType::Put) else { continue };
            let key = String::from_utf8_lossy(kv.key());
            if !key.ends_with(&suffix) {
                continue;
            }
            if let Ok(state) = serde_json::from_slice::<fleet_core::UnitState>(kv.value())
                && state.systemd.active == "active"
            {
                active.insert(state.machine_id);
            }
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            println!("    … {}/{agents} run it after {:.1} s", active.len(), started.elapsed().as_secs_f64());
            last_report = Instant::now();
        }
    }
    started.elapsed()
}

/// Which machine each unit's state says it runs on.
async fn placements(api: &EtcdRegistry) -> std::collections::HashMap<String, String> {
    let states = api.unit_states().await.expect("read the states");
    states.into_iter().map(|state| (state.name, state.machine_id)).collect()
}

/// `--joins`: `count` agents join through the managers, each a key pair, a signing request
/// and a TLS connection of its own (as a real agent's first request), and nothing more.
async fn joins(reach: &Reach, count: usize, managers: &[Fleetd], etcd: &EtcdServer) {
    println!("bench-pull: {count} joins through {} manager(s), one etcd", managers.len());
    let managers_cpu = || managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum::<f64>();
    let etcd_cpu = || cpu_seconds(etcd.pid().expect("etcd runs"));
    let (managers_before, etcd_before, bench_before) = (managers_cpu(), etcd_cpu(), cpu_seconds(std::process::id()));
    let joining = Instant::now();
    let joined = agent_hosts::join_only(reach, 0..count).await;
    let took = joining.elapsed().as_secs_f64();
    let per_join = |seconds: f64| seconds * 1000.0 / joined as f64;
    let (managers_spent, etcd_spent) = (managers_cpu() - managers_before, etcd_cpu() - etcd_before);
    let bench_spent = cpu_seconds(std::process::id()) - bench_before;
    let [signed, races] =
        managers_metrics(managers, ["fleet_pull_agent_joins_total", "fleet_pull_join_races_lost_total"]);
    println!(
        "  {joined} joined in {took:.2} s ({:.0} a second; the managers counted {signed}, and {races} batches of joins written again after losing a race)\n  CPU a join: managers {:.3} ms, etcd {:.3} ms, the joining agents (this process) {:.3} ms",
        joined as f64 / took,
        per_join(managers_spent),
        per_join(etcd_spent),
        per_join(bench_spent),
    );
}

/// The two fleetds beside the serving managers when agents run: the engine leader and the
/// witness, a manager no agent is given.
struct Bystanders {
    engine: Fleetd,
    witness: Fleetd,
}

impl Bystanders {
    /// The witness's RSS and the engine leader's, in MiB.
    fn resident_mib(&self) -> (f64, f64) {
        (resident_mib(self.witness.pid()), resident_mib(self.engine.pid()))
    }
}

fn main() {
    let mut arguments = std::env::args().skip(1);
    if arguments.next().as_deref() == Some("--agent-process") {
        let mut number = || arguments.next().and_then(|value| value.parse().ok()).expect("FIRST COUNT");
        let (first, count) = (number(), number());
        agent_hosts::run_agent_process(first, count);
        return;
    }
    // RUST_LOG=fleet_pull_agent=warn shows the agents' failovers and failures.
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    // The bench's own plain HTTP clients (etcd's metrics) take the tree's one provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `bench-pull --joins COUNT [MANAGERS]`: only joins, COUNT of them.
    let joins_only = std::env::args().nth(1).as_deref() == Some("--joins");
    let agents = argument(if joins_only { 2 } else { 1 }, 1000);
    let units = argument(2, 10_000);
    let idle_seconds = argument(3, 20) as u64;
    let manager_count = argument(if joins_only { 3 } else { 4 }, 1).max(1);
    let agent_ttl = Duration::from_secs(argument(5, 60) as u64);
    let per_process = argument(6, 10_000).max(1);
    let idle_heartbeat =
        Duration::from_secs(argument(7, fleet_pull_agent::DEFAULT_IDLE_HEARTBEAT.as_secs() as usize) as u64);
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let (api_ca, agent_ca) = (Authority::new("bench API CA"), Authority::new("bench agent CA"));
    let api_ca_file = api_ca.write(&dir.path().join("api-ca.pem"));
    let server = api_ca.server(dir.path(), "server");
    let agent_ca_file = agent_ca.write(&dir.path().join("agent-ca.pem"));
    let agent_ca_key = dir.path().join("agent-ca-key.pem");
    std::fs::write(&agent_ca_key, agent_ca.key_pem()).expect("agent CA key");
    let (cert, key) = (server.cert.display().to_string(), server.key.display().to_string());
    let (ca_cert, ca_key) = (agent_ca_file.display().to_string(), agent_ca_key.display().to_string());
    let connections = (if joins_only { 1024 } else { agents * 2 + 64 }).to_string();
    let ttl_setting = format!("{}s", agent_ttl.as_secs());
    let mut urls = Vec::new();
    let start_manager = |index: usize| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
        let listen = format!("unix://{{socket}},https://127.0.0.1:{port}");
        let manager = Fleetd::start(
            &format!("b{index:x}").repeat(16),
            &[
                ("etcd_servers", &etcd.endpoint()),
                ("etcd_request_timeout", "5"),
                ("metadata", "role=manager"),
                ("api_listen", &listen),
                ("api_tls_cert_file", &cert),
                ("api_tls_key_file", &key),
                ("agent_ca_cert_file", &ca_cert),
                ("agent_ca_key_file", &ca_key),
                ("api_max_connections", &connections),
                ("agent_ttl", &ttl_setting),
            ],
        );
        // By address: the agents here would otherwise each look `localhost` up, a cost of the
        // agents, not of the manager this measures.
        (manager, format!("https://127.0.0.1:{port}"))
    };
    // With agents, the engine leads from a fleetd of its own, started first and given no
    // agent: the serving managers and the witness (below) then differ only by their agents.
    let engine = (!joins_only).then(|| {
        let (engine, _) = start_manager(manager_count + 1);
        let leading = Instant::now();
        while metric_value(&engine.metrics(), "fleet_engine_leader") != Some(1.0) {
            assert!(leading.elapsed() < Duration::from_secs(60), "the first fleetd never led the engine");
            std::thread::sleep(Duration::from_millis(100));
        }
        engine
    });
    let mut managers: Vec<Fleetd> = (0..manager_count)
        .map(|index| {
            let (manager, url) = start_manager(index);
            urls.push(url);
            manager
        })
        .collect();
    // A manager like the others that no agent is given: what it grows by is the cluster's data
    // as a manager holds it, which (c) takes from what the serving managers grow by.
    let bystanders = engine.map(|engine| Bystanders { engine, witness: start_manager(manager_count).0 });
    let token = managers[0]
        // The agents announce role=worker: a pull agent announces no more than its token grants.
        // Bounded by time, not by uses: joins through several managers then never race on it.
        .ok(&["registration-token", "create", "--ttl", "24h", "--metadata", "role=worker", "bench"])
        .stdout
        .trim()
        .to_string();
    let options = EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: "/_coreos.com/fleet/".into(),
        request_timeout: Duration::from_secs(5),
        ..EtcdOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let lifetimes = Lifetimes { agent_ttl, engine_lease_ttl: Duration::from_secs(10) };
        let api = EtcdRegistry::connect(&options, lifetimes).await.expect("connect to etcd");
        let mut raw = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        let reach = Reach {
            urls: urls.join(","),
            ca_file: api_ca_file.clone(),
            token: token.clone(),
            // As a pull fleetd beats: three times in agent_ttl while its presence must be
            // proven, every IDLE_HEARTBEAT while idle.
            heartbeat: lifetimes.agent_ttl / 3,
            idle_heartbeat,
        };
        if joins_only {
            joins(&reach, agents, &managers, &etcd).await;
            return;
        }
        let processes = agents.div_ceil(per_process);
        warn_of_a_short_loopback_queue(agents);
        println!(
            "bench-pull: {agents} pull agents through {manager_count} manager(s), {units} units, one etcd, agent_ttl {} s, idle agents beating every {} s{}",
            agent_ttl.as_secs(),
            reach.idle_heartbeat.max(reach.heartbeat).as_secs(),
            if processes > 1 { format!(", agents in {processes} processes") } else { String::new() }
        );

        // What the managers hold before any agent joined: the cluster's data grows from here.
        let rss_before_agents: f64 = managers.iter().map(|fleetd| resident_mib(fleetd.pid())).sum();
        let bystanders_rss_before = bystanders.as_ref().map(Bystanders::resident_mib);
        // Join and start every agent.
        let join_cpu_before: f64 = managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum();
        let etcd_cpu_before = cpu_seconds(etcd.pid().expect("etcd runs"));
        let joining = Instant::now();
        let (mut hosts, joined_in) = AgentHosts::join_and_start(&reach, agents, per_process).await;
        println!(
            "  {agents} agents joined (certificates signed) in {:.2} s (managers' CPU {:.2} s, etcd's {:.2} s)",
            joined_in.as_secs_f64(),
            managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum::<f64>() - join_cpu_before,
            cpu_seconds(etcd.pid().expect("etcd runs")) - etcd_cpu_before,
        );
        let starting = joining + joined_in;
        let agents_cpu = |hosts: &AgentHosts| hosts.pids().into_iter().map(cpu_seconds).sum::<f64>();
        let announce_cpu_before: f64 = managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum();
        let announce_handshakes_before = handshakes(&managers);
        let announce_etcd_before = (cpu_seconds(etcd.pid().expect("etcd runs")), store_revision(&mut raw).await);
        while registered_machines(&mut raw, "/_coreos.com/fleet/").await < agents + manager_count + 2 * usize::from(bystanders.is_some()) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let announce_handshakes = handshakes(&managers);
        println!(
            "  {agents} agents announced in {:.2} s (managers' CPU {:.2} s, TLS handshakes {:.0} full and {:.0} resumed, etcd's {:.2} s and {} writes since the last join; the agents' processes {:.2} s since they started joining)",
            starting.elapsed().as_secs_f64(),
            managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum::<f64>() - announce_cpu_before,
            announce_handshakes.0 - announce_handshakes_before.0,
            announce_handshakes.1 - announce_handshakes_before.1,
            cpu_seconds(etcd.pid().expect("etcd runs")) - announce_etcd_before.0,
            store_revision(&mut raw).await - announce_etcd_before.1,
            agents_cpu(&hosts),
        );

        let managers_cpu = |managers: &[Fleetd]| managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).sum::<f64>();
        let managers_rss = |managers: &[Fleetd]| managers.iter().map(|fleetd| resident_mib(fleetd.pid())).sum::<f64>();
        let logs = |managers: &[Fleetd]| managers.iter().map(Fleetd::log).collect::<Vec<_>>().join("\n");

        // (a) Submit every unit, then time until all report launched.
        let cpu_before = managers_cpu(&managers);
        let handshakes_before = handshakes(&managers);
        let launched = LaunchedUnits::follow(&etcd.endpoint(), "/_coreos.com/fleet/").await;
        let submitting = Instant::now();
        submit_units(&api, units).await;
        println!("  submitted {units} units in {:.2} s", submitting.elapsed().as_secs_f64());
        let until_launched = wait_all_launched(&launched, units, || logs(&managers)).await;
        println!(
            "  (a) from the last submission until all {units} report launched: {:.2} s (from the first: {:.2} s; managers' CPU over both: {:.2} s, RSS {:.0} MiB)",
            until_launched.as_secs_f64(),
            submitting.elapsed().as_secs_f64(),
            managers_cpu(&managers) - cpu_before,
            managers_rss(&managers)
        );
        let handshakes_after = handshakes(&managers);
        println!(
            "  (a) TLS handshakes meanwhile: {:.0} full, {:.0} resumed",
            handshakes_after.0 - handshakes_before.0,
            handshakes_after.1 - handshakes_before.1
        );

        // Until every agent follows its changes on a stream: the steady state (b) and (c) measure.
        let settling = Instant::now();
        let streaming = until_all_streaming(&managers, agents, settling, Duration::from_secs(120)).await;
        println!(
            "  {streaming:.0} of {agents} agents on their change streams {:.2} s after (a)",
            settling.elapsed().as_secs_f64()
        );

        // (b) One more unit: how many agents wake (in-process agents: their change signals;
        // agents in other processes: the works their streams carried)?
        tokio::time::sleep(Duration::from_secs(1)).await;
        for signal in hosts.signals().into_iter().flatten() {
            signal.mark_unchanged();
        }
        let (works_before, _) = stream_traffic(&managers);
        api.put_unit("probe@1.service", &template(0), DesiredState::Launched).await.expect("submit the probe");
        wait_all_launched(&launched, units + 1, || logs(&managers)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let carried = stream_traffic(&managers).0 - works_before;
        match hosts.signals() {
            Some(signals) => {
                let woken = signals.iter().filter(|signal| signal.has_changed().unwrap_or(false)).count();
                println!("  (b) agents woken by one schedule change: {woken} of {agents} (streams carried {carried:.0} works)");
            }
            None => println!("  (b) agents sent a work by one schedule change: {carried:.0} of {agents}"),
        }

        // (c) Idle.
        let etcd_pid = etcd.pid().expect("etcd runs");
        let before: Vec<f64> = managers.iter().map(|fleetd| cpu_seconds(fleetd.pid())).collect();
        let etcd_before = cpu_seconds(etcd_pid);
        let witness_cpu_before = bystanders.as_ref().map(|fleetds| cpu_seconds(fleetds.witness.pid()));
        let [beats_before] = managers_metrics(&managers, ["fleet_pull_stream_heartbeats_total"]);
        let (proposals_before, renewals_before) = etcd_counters(&etcd.endpoint()).await;
        tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
        let [beats_after] = managers_metrics(&managers, ["fleet_pull_stream_heartbeats_total"]);
        let beats = beats_after - beats_before;
        let managers_idle_cpu: f64 =
            managers.iter().enumerate().map(|(index, fleetd)| cpu_seconds(fleetd.pid()) - before[index]).sum();
        let etcd_cpu = cpu_seconds(etcd_pid) - etcd_before;
        let (proposals, renewals) = etcd_counters(&etcd.endpoint()).await;
        let held = agents_by_lease(&machine_leases(&mut raw).await);
        for (index, fleetd) in managers.iter().enumerate() {
            let cpu = cpu_seconds(fleetd.pid()) - before[index];
            let rss = resident_mib(fleetd.pid());
            println!(
                "  (c) idle for {idle_seconds} s: manager {index} CPU {cpu:.2} s ({:.1}%), RSS {rss:.0} MiB ({:.1} KiB an agent of all {agents})",
                cpu * 100.0 / idle_seconds as f64,
                rss * 1024.0 / agents as f64,
            );
        }
        let rss_now: f64 = managers.iter().map(|fleetd| resident_mib(fleetd.pid())).sum();
        println!(
            "  (c) managers' RSS {rss_now:.0} MiB, {rss_before_agents:.0} MiB before any agent joined: {:.1} KiB an agent beyond that (the cluster's data included)",
            (rss_now - rss_before_agents) * 1024.0 / agents as f64
        );
        if let (Some(fleetds), Some((witness_before, engine_before)), Some(witness_cpu_before)) =
            (&bystanders, bystanders_rss_before, witness_cpu_before)
        {
            let (witness_now, engine_now) = fleetds.resident_mib();
            let cluster_data = witness_now - witness_before;
            let witness_cpu = cpu_seconds(fleetds.witness.pid()) - witness_cpu_before;
            println!(
                "  (c) a manager no agent is given grew {cluster_data:.0} MiB ({:.1} KiB an agent: the cluster's data as a manager holds it); the serving managers {:.1} KiB an agent beyond that; the engine leader grew {:.0} MiB",
                cluster_data * 1024.0 / agents as f64,
                (rss_now - rss_before_agents - cluster_data * manager_count as f64) * 1024.0 / agents as f64,
                engine_now - engine_before,
            );
            // Idle CPU beyond what a manager spends with no agent, a heartbeat (how many fall in
            // the window depends on when the agents began theirs): what 100,000 idle agents
            // beating at the default `agent_heartbeat` would cost one manager.
            let beyond = managers_idle_cpu - witness_cpu * manager_count as f64;
            let witness_share = witness_cpu * 100.0 / idle_seconds as f64;
            if beats > 0.0 {
                let per_beat = beyond / beats;
                let every = fleet_pull_agent::DEFAULT_IDLE_HEARTBEAT.as_secs_f64();
                println!(
                    "  (c) idle CPU of the manager no agent is given {witness_share:.2}%; the serving managers' beyond it {beyond:.2} s for {beats:.0} heartbeats, {:.0} µs each: one manager would idle at {:.1}% with 100,000 agents beating every {every:.0} s (the default agent_heartbeat)",
                    per_beat * 1e6,
                    witness_share + per_beat * 100_000.0 / every * 100.0,
                );
            } else {
                println!(
                    "  (c) idle CPU of the manager no agent is given {witness_share:.2}%; no heartbeat fell in the window to price (idle agents beat every {} s)",
                    reach.idle_heartbeat.max(reach.heartbeat).as_secs()
                );
            }
        }
        println!(
            "  (c) agents held per manager: {held:?}; etcd CPU {:.1}%, {:.1} proposals/s, {:.1} lease renewals/s",
            etcd_cpu * 100.0 / idle_seconds as f64,
            (proposals - proposals_before) / idle_seconds as f64,
            (renewals - renewals_before) / idle_seconds as f64,
        );
        // BENCH_PULL_LOGS=DIR keeps the fleetds' logs as they stand after (c) (they go with
        // the bench's temporary directory otherwise).
        if let Some(dir) = std::env::var_os("BENCH_PULL_LOGS") {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).expect("the logs' directory");
            let named = managers.iter().enumerate().map(|(index, fleetd)| (format!("manager-{index}"), fleetd));
            let bystanding = bystanders.iter().flat_map(|fleetds| {
                [("engine".to_string(), &fleetds.engine), ("witness".to_string(), &fleetds.witness)]
            });
            for (name, fleetd) in named.chain(bystanding) {
                std::fs::write(dir.join(format!("{name}.log")), fleetd.log()).expect("keep a log");
            }
        }

        // (e) One change that reaches every agent on its stream: a global unit.
        let cpu_before = managers_cpu(&managers);
        let handshakes_before = handshakes(&managers);
        let traffic_before = stream_traffic(&managers);
        let everywhere = UnitFile::parse(
            "[Service]\nExecStart=/bin/sleep 100000\n\n[X-Fleet]\nGlobal=true\nMachineMetadata=role=worker\n",
        )
        .expect("the global unit parses");
        let submit = async {
            api.put_unit("everywhere.service", &everywhere, DesiredState::Launched)
                .await
                .expect("submit the global unit");
        };
        let reached = until_active_everywhere(&mut raw, "everywhere.service", agents, submit).await;
        let handshakes_after = handshakes(&managers);
        let traffic_after = stream_traffic(&managers);
        println!(
            "  (e) a global unit reached all {agents} agents on their streams in {:.2} s (managers' CPU {:.2} s; TLS handshakes {:.0} full, {:.0} resumed; on the streams: {:.0} works out, {:.0} states reports back)",
            reached.as_secs_f64(),
            managers_cpu(&managers) - cpu_before,
            handshakes_after.0 - handshakes_before.0,
            handshakes_after.1 - handshakes_before.1,
            traffic_after.0 - traffic_before.0,
            traffic_after.1 - traffic_before.1,
        );

        let before = machine_leases(&mut raw).await;
        if manager_count == 1 {
            // (d) The manager is killed and started again: until every agent announced itself anew.
            let revision_before = store_revision(&mut raw).await;
            managers[0].stop_with(libc::SIGKILL);
            let restarting = Instant::now();
            // Started without waiting for its API (`launch` would block this thread until the
            // manager lists every machine, and no agent could be seen back before that).
            managers[0].relaunch();
            // When the first agent and half of them were back: how the time splits between the
            // manager coming up, the agents' retries reaching it, and their announcements. An
            // agent is back once the restarted manager took its announcement (the manager
            // holds its agents on the lease it held before, so no presence changes lease).
            let (mut first_back, mut half_back) = (None, None);
            loop {
                let moved = announcements(&managers[0]) as usize;
                if moved > 0 {
                    first_back.get_or_insert(restarting.elapsed());
                }
                if moved * 2 >= agents {
                    half_back.get_or_insert(restarting.elapsed());
                }
                if moved >= agents {
                    break;
                }
                assert!(restarting.elapsed() < Duration::from_secs(300), "only {moved}/{agents} agents came back");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            // The restarted manager counts from zero: its handshakes, its CPU since it started.
            let (full, resumed) = handshakes(&managers);
            let writes = store_revision(&mut raw).await - revision_before;
            println!(
                "  (d) manager killed and restarted: every agent announced to it again after {:.2} s (the first after {:.2} s, half after {:.2} s; the manager's CPU {:.2} s; TLS handshakes {full:.0} full, {resumed:.0} resumed; etcd writes meanwhile {writes})",
                restarting.elapsed().as_secs_f64(),
                first_back.unwrap_or_default().as_secs_f64(),
                half_back.unwrap_or_default().as_secs_f64(),
                cpu_seconds(managers[0].pid())
            );
            let streaming = until_all_streaming(&managers, agents, restarting, Duration::from_secs(300)).await;
            println!(
                "  (d) {streaming:.0} of {agents} agents on their change streams again after {:.2} s",
                restarting.elapsed().as_secs_f64()
            );
        } else {
            // (d) One manager is killed: until every agent it held is held by another, with
            // the fewest agents present meanwhile and the units that moved.
            let placed_before = placements(&api).await;
            let leases_before: std::collections::HashSet<i64> = before.values().copied().collect();
            managers[0].stop_with(libc::SIGKILL);
            let killed = Instant::now();
            let mut fewest = agents;
            let gone = loop {
                let now = machine_leases(&mut raw).await;
                fewest = fewest.min(now.len());
                let leases: std::collections::HashSet<i64> = now.values().copied().collect();
                // One lease fewer in use, none new: the killed manager's agents are all on the others.
                if now.len() == agents && leases.is_subset(&leases_before) && leases.len() < leases_before.len() {
                    break leases_before.difference(&leases).copied().collect::<Vec<i64>>();
                }
                assert!(killed.elapsed() < agent_ttl * 5, "the killed manager's agents did not all move\n{}", logs(&managers[1..]));
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            let moved_all = killed.elapsed();
            // Give the engine time to act on anything it saw lost.
            tokio::time::sleep(Duration::from_secs(15)).await;
            let placed_after = placements(&api).await;
            let moved = placed_before.iter().filter(|(unit, machine)| placed_after.get(*unit) != Some(*machine)).count();
            println!(
                "  (d) manager 0 of {manager_count} killed: its {} agents held by the others after {:.2} s; fewest agents present meanwhile {fewest} of {agents}; units moved {moved} of {}",
                held.iter().filter(|(lease, _)| gone.contains(lease)).map(|(_, count)| count).sum::<usize>(),
                moved_all.as_secs_f64(),
                placed_before.len()
            );
            assert_eq!(fewest, agents, "agents left the cluster while their manager's lease lived");
            assert_eq!(moved, 0, "units moved off agents that reconnected within agent_ttl");
        }
        drop(hosts);
    });
}

/// The store's revision: it moves once per write (a transaction, however many keys).
async fn store_revision(client: &mut etcd_client::Client) -> i64 {
    let reply = client.get("/", Some(etcd_client::GetOptions::new().with_count_only())).await;
    reply.ok().and_then(|reply| reply.header().map(|header| header.revision())).unwrap_or(0)
}
