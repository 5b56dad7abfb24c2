//! Benchmark: a cluster of simulated machines on a real etcd, scheduled by a real fleetd.
//!
//! Many machines run in this one process, each a real `fleet_agent::Agent` with its own
//! lease and its own schedule watch on the etcd store; only systemd is simulated (units
//! "run" at once). One real fleetd process (metadata `role=engine`) is the engine, a second
//! one stands by; every
//! unit asks for `role=worker`, so all of them go to the simulated machines. Prints:
//!
//! (a) `fleetctl start --no-block --from-file` of every unit (instances of ten templates),
//!     and the time from its end until every unit reports launched;
//! (d) `fleetctl list-unit-files` and `list-units` of them all, and the peak memory of the
//!     engine fleetd and of the bench process;
//! (b) how many agents one schedule change wakes;
//! (c) an idle cluster: etcd requests by kind, and CPU of the fleetd engine and of the
//!     simulated machines over the idle period;
//! (e) one machine in ten lost at once (their agents stop, their leases expire together):
//!     the time until every unit is launched on a live machine;
//! (f) the engine leader killed: how soon the standby engine fleetd leads, and how many
//!     units it unscheduled (none should move).
//!
//! Every step also checks what it measures (every unit listed, one agent woken, every unit
//! running on a live machine, nothing moved by a new leader), so a debug build of a small
//! size runs in CI as a correctness test (`scripts/test.sh`).
//!
//! With `reserve` after the numbers, every unit reserves memory and CPU
//! (`cluster_bench::BENCH_RESERVATION`) and every simulated machine states a capacity
//! (`cluster_bench::SIMULATED_CAPACITY`): the planner's room checks on every placement.
//! With `health`, (g) follows: health-gated rollouts of every unit ([`health_rollouts`]).
//! With `via-standby`, (a) submits through the standby engine fleetd: the leader then learns
//! the units through its watch only. With `dependent`, one unit in five waits for another
//! (`bench1@N` `Requires=` and `bench2@N` comes `After=` `bench0@N`,
//! `cluster_bench::template_with`): the engine keeps them off until their counterpart runs, and
//! records where it runs for each.
//!
//! etcd runs with the settings README recommends for a large cluster on etcd 3.4
//! (`fleet_testkit::LARGE_CLUSTER_SETTINGS`), the header line says which; with
//! `etcd-defaults`, with etcd's own defaults.
//!
//! With `lists-only`, it ends after (d) (CI's small run beside the large one, whose lists'
//! cost per row `scripts/list-linearity.sh` compares).
//!
//! With `events=N`, N followers read the engine fleetd's event stream during (a)
//! ([`event_followers`]): how soon after the units were launched each was told of every
//! placement, and the engine fleetd's CPU over (a) with them (compare a run without).
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-cluster [MACHINES] [UNITS] [IDLE_SECONDS] [reserve] [health] [via-standby] [dependent] [etcd-defaults] [events=N] [lists-only]`

mod etcd_metrics;
mod event_followers;
mod health_rollouts;

use fleet_e2e::argument;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::{DesiredState, UnitFile};
use fleet_e2e::cluster_bench::{
    TEMPLATES, every_unit, registered_machines, simulated_machine, template_reserving, unit_list, unit_name,
    wait_all_launched,
};
use fleet_e2e::launched_units::LaunchedUnits;
use fleet_e2e::{
    EtcdServer, Fleetd, LARGE_CLUSTER_SETTINGS, binary, cpu_seconds, metric_value, peak_resident_mib,
    waited_children_cpu_seconds,
};
use fleet_registry::{AgentRegistry, ApiRegistry, ChangeSignal};
use fleet_store_etcd::{EtcdOptions, EtcdRegistry, Lifetimes};
use fleet_testkit::FakeUnitManager;
use tokio::sync::watch;

/// etcd connections the simulated machines share (each machine still has its own lease
/// and its own watch stream).
const CONNECTIONS: usize = 8;
/// Where fleet keeps its keys in etcd (fleetd's default).
const PREFIX: &str = "/_coreos.com/fleet/";
const AGENT_TTL: Duration = Duration::from_secs(30);
/// A fleetd's etcd lease grants and revocations.
const LEASE_GRANTS: &str = "fleet_store_request_duration_seconds_count{store=\"etcd\",operation=\"lease_grant\"}";

/// (c) again with one unit on a calendar that does not fall due in the window: the engine
/// fleetd's CPU, which should stay what it is without one. The unit is destroyed after.
async fn idle_with_a_calendar_unit(api: &EtcdRegistry, engine: &Fleetd, idle_seconds: u64) {
    let text = "[Unit]\nDescription=bench calendar unit\n\n[Service]\nType=oneshot\nExecStart=/bin/true\n\n[X-Fleet]\nSchedule=*-01-01 00:00:00\nMachineMetadata=role=worker\n";
    let file = UnitFile::parse(text).expect("the calendar unit parses");
    api.put_unit("calendar-probe.service", &file, DesiredState::Launched).await.expect("submit the calendar unit");
    // Past its first passes: its record written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let engine_before = cpu_seconds(engine.pid());
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    let engine_cpu = cpu_seconds(engine.pid()) - engine_before;
    println!(
        "      with one unit on a calendar besides (not due): fleetd engine CPU {engine_cpu:.2} s ({:.2}%)",
        engine_cpu * 100.0 / idle_seconds as f64
    );
    api.destroy_unit("calendar-probe.service").await.expect("destroy the calendar unit");
}

fn main() {
    let machines = argument(1, 1000);
    let units = argument(2, 10_000);
    let idle_seconds = argument(3, 60) as u64;
    let options: Vec<String> = std::env::args().skip(4).collect();
    let reserving = options.iter().any(|option| option == "reserve");
    let health = options.iter().any(|option| option == "health");
    let via_standby = options.iter().any(|option| option == "via-standby");
    let etcd_defaults = options.iter().any(|option| option == "etcd-defaults");
    let dependent = options.iter().any(|option| option == "dependent");
    let lists_only = options.iter().any(|option| option == "lists-only");
    let followers: usize =
        options.iter().find_map(|option| option.strip_prefix("events=")).and_then(|n| n.parse().ok()).unwrap_or(0);
    // The simulated machines' own log (their renewals, registrations, passes), on stderr when
    // asked for: `RUST_LOG=fleet_registry=info`.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // etcd as README recommends for a cluster of this size, unless asked for its defaults.
    let (etcd, etcd_settings) = if etcd_defaults {
        (EtcdServer::start(), "its defaults".to_string())
    } else {
        let (flag, (variable, value)) = LARGE_CLUSTER_SETTINGS;
        let value = std::env::var(variable).unwrap_or_else(|_| value.to_string());
        (EtcdServer::start_for_scale(), format!("{flag} {variable}={value}"))
    };
    let options = EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: PREFIX.into(),
        request_timeout: Duration::from_secs(5),
        ..EtcdOptions::default()
    };
    let engine_config =
        [("etcd_servers", etcd.endpoint()), ("metadata", "role=engine".into()), ("etcd_request_timeout", "5".into())];
    let engine_config: Vec<(&str, &str)> = engine_config.iter().map(|(key, value)| (*key, value.as_str())).collect();
    // With followers, the engine fleetd also listens on HTTPS, where viewer tokens are taken.
    let listener = (followers > 0).then(fleet_e2e::https_listener::Listener::new);
    let listening = listener.as_ref().map(fleet_e2e::https_listener::Listener::config).unwrap_or_default();
    let mut leader_config = engine_config.clone();
    leader_config.extend(listening.iter().map(|(key, value)| (key.as_str(), value.as_str())));
    let mut engine = Fleetd::start("e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0", &leader_config);
    wait_for_leader(&engine);
    // A second engine fleetd, standing by: it takes over when the leader is killed (f).
    let mut standby = Fleetd::start("e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1", &engine_config);
    // An agent-only fleetd that no unit asks for: what it holds should not grow with the cluster.
    let agent_only_config = [
        ("etcd_servers", etcd.endpoint()),
        ("metadata", "role=spare".into()),
        ("disable_engine", "true".into()),
        ("etcd_request_timeout", "5".into()),
    ];
    let agent_only_config: Vec<(&str, &str)> =
        agent_only_config.iter().map(|(key, value)| (*key, value.as_str())).collect();
    let agent_only = Fleetd::start_unlisted("a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0", &agent_only_config);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let lifetimes = Lifetimes { agent_ttl: AGENT_TTL, engine_lease_ttl: Duration::from_secs(10) };
        let mut registries = Vec::new();
        for _ in 0..CONNECTIONS {
            registries.push(EtcdRegistry::connect(&options, lifetimes).await.expect("connect to etcd"));
        }
        let api = registries[0].clone();
        let reserve = if reserving { ", every unit reserving memory and CPU" } else { "" };
        let waits = if dependent { ", one in five waiting for another" } else { "" };
        println!("bench-cluster: {machines} simulated machines, {units} units{reserve}{waits}, one fleetd engine, etcd 3.4 with {etcd_settings}");
        let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
        let metrics_address = etcd.endpoint().trim_start_matches("http://").to_string();
        let registration_counters = etcd_metrics::read(&metrics_address);
        let etcd_pid = etcd.pid().unwrap_or(0);
        let registration_cpu = [cpu_seconds(etcd_pid), cpu_seconds(std::process::id()), cpu_seconds(engine.pid())];
        let joined = Instant::now();
        let mut agents = Vec::new();
        for index in 0..machines {
            let registry = registries[index % CONNECTIONS].clone();
            let config = AgentConfig {
                machine: simulated_machine(index, reserving),
                reconcile_interval: Duration::from_secs(5),
                debounce: Duration::from_millis(10),
                presence_ttl: None,
                stop_units_when_cut_off: false,
            };
            let id = config.machine.id.clone();
            let agent = Agent::new(config, Arc::new(registry.clone()), Arc::new(FakeUnitManager::new()));
            let task = tokio::spawn(agent.run(lifecycle_watch.clone())).abort_handle();
            agents.push((id, registry, task));
        }
        // Counted, not listed: a listing of every machine ten times a second was itself a
        // load on etcd in the very rush it measures.
        let mut counter = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("connect to etcd");
        while registered_machines(&mut counter, PREFIX).await < machines + 3 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        println!("  {machines} machines registered in {:.2} s", joined.elapsed().as_secs_f64());
        // What a registration costs etcd, whatever the machine's speed: each lease grant and
        // each transaction that writes is a proposal etcd commits and applies in turn.
        let counters = etcd_metrics::delta(&registration_counters, &etcd_metrics::read(&metrics_address));
        let per_machine = |name: &str| counters.get(name).copied().unwrap_or(0.0) / machines as f64;
        println!(
            "      etcd requests per machine registered: {:.2} lease grants, {:.2} transactions, {:.2} reads; {:.2} puts, {:.2} raft entries",
            per_machine("grpc LeaseGrant"),
            per_machine("grpc Txn"),
            per_machine("grpc Range"),
            per_machine("etcd_mvcc_put_total"),
            per_machine(etcd_metrics::PROPOSALS)
        );
        println!(
            "      CPU over the registration: etcd {:.1} s, the simulated machines' process {:.1} s, the engine fleetd {:.1} s",
            cpu_seconds(etcd_pid) - registration_cpu[0],
            cpu_seconds(std::process::id()) - registration_cpu[1],
            cpu_seconds(engine.pid()) - registration_cpu[2]
        );
        println!("      {}", leaderships(&engine, &standby));
        print_leadership_moves(&engine, &standby);

        // (a) Submit every unit through fleetctl, then time until all report launched.
        let templates: Vec<UnitFile> = (0..TEMPLATES).map(|index| template_reserving(index, reserving)).collect();
        let list_dir = tempfile::tempdir().expect("a directory for the unit list");
        let list = unit_list(list_dir.path(), units, reserving, dependent);
        let submission_counters = etcd_metrics::read(&metrics_address);
        let cpu_before = cpu_seconds(engine.pid());
        let (etcd_cpu_before, bench_cpu_before) = (cpu_seconds(etcd_pid), cpu_seconds(std::process::id()));
        let (standby_cpu_before, fleetctl_cpu_before) =
            (cpu_seconds(standby.pid()), waited_children_cpu_seconds(std::process::id()));
        let presence_before = presence_requests();
        let held_before = writes_held(&engine);
        let launched = LaunchedUnits::follow(&etcd.endpoint(), PREFIX).await;
        let following = listener.as_ref().map(|listener| event_followers::Followers::start(&engine, listener, followers));
        let submitting = Instant::now();
        // `via-standby`: the units go through the standby fleetd's API, so the leader learns
        // them only through its watch, as it does when the submitting fleetd does not lead.
        let socket = if via_standby { standby.socket() } else { engine.socket() };
        let started = fleetctl(&socket, list_dir.path(), &["start", "--no-block", "--from-file", &list.display().to_string()]).await;
        println!(
            "  fleetctl start --no-block --from-file: {} units in {:.2} s ({:.0} units/s)",
            started.lines().filter(|line| line.starts_with("Triggered unit")).count(),
            submitting.elapsed().as_secs_f64(),
            units as f64 / submitting.elapsed().as_secs_f64()
        );
        let until_launched = wait_all_launched(&launched, units, || engine.log()).await;
        println!(
            "  (a) from the last submission until all {units} report launched: {:.2} s (from the first: {:.2} s; fleetd engine CPU over both: {:.2} s)",
            until_launched.as_secs_f64(),
            submitting.elapsed().as_secs_f64(),
            cpu_seconds(engine.pid()) - cpu_before
        );
        if let Some(following) = &following {
            let told = following.wait_for(units as u64, Duration::from_secs(300));
            let (fewest, most) = following.told();
            match told {
                Some(after) => println!(
                    "      events: {followers} followers each told of all {units} placements {:.2} s after all were launched (told {fewest}..{most}); their fleetctl CPU {:.1} s",
                    after.as_secs_f64(),
                    following.cpu_seconds()
                ),
                None => panic!("events: not every follower was told of the {units} placements within 300 s (told {fewest}..{most})"),
            }
        }
        let counters = etcd_metrics::delta(&submission_counters, &etcd_metrics::read(&metrics_address));
        let seconds = submitting.elapsed().as_secs_f64();
        let rates: Vec<String> =
            counters.iter().map(|(name, moved)| format!("{name} {moved:.0} ({:.0}/s)", moved / seconds)).collect();
        println!("      etcd over (a): {}", rates.join(", "));
        let per_unit = |name: &str| counters.get(name).copied().unwrap_or(0.0) / units as f64;
        println!(
            "      etcd puts per unit: {:.2} (keys written); raft entries per unit: {:.2} (write requests, each applied in turn)",
            per_unit("etcd_mvcc_put_total"),
            per_unit(etcd_metrics::PROPOSALS)
        );
        println!(
            "      the engine fleetd's unit writes held while etcd was behind in applying: {:.1} s in all",
            writes_held(&engine) - held_before
        );
        let presence = presence_requests();
        println!(
            "      the simulated machines over (a): {:.0} leases granted (a machine registering again), {:.0} lease renewals failed",
            presence.0 - presence_before.0,
            presence.1 - presence_before.1
        );
        println!("      {}", leaderships(&engine, &standby));
        print_leadership_moves(&engine, &standby);
        println!(
            "      CPU over (a): etcd {:.1} s, the simulated machines' process {:.1} s, the standby engine fleetd {:.1} s, fleetctl {:.1} s (the engine fleetd above)",
            cpu_seconds(etcd_pid) - etcd_cpu_before,
            cpu_seconds(std::process::id()) - bench_cpu_before,
            cpu_seconds(standby.pid()) - standby_cpu_before,
            waited_children_cpu_seconds(std::process::id()) - fleetctl_cpu_before
        );

        // (d) Lists through fleetctl, every page.
        for command in ["list-unit-files", "list-units"] {
            let listing = Instant::now();
            let rows = fleetctl(&socket, list_dir.path(), &[command, "--no-legend"]).await.lines().count();
            println!("  (d) fleetctl {command}: {rows} rows in {:.2} s", listing.elapsed().as_secs_f64());
            assert_eq!(rows, units, "fleetctl {command} shows every unit");
        }
        // (d) A plan of up to 10,000 new instances (one request): where each would go.
        let planned = units.min(10_000);
        let names: Vec<String> =
            (units..units + planned).map(|index| unit_name(index, dependent)).collect();
        let plan_list = list_dir.path().join("planned.list");
        std::fs::write(&plan_list, names.join("\n")).expect("write the planned units' list");
        let planning = Instant::now();
        let plan = fleetctl(&socket, list_dir.path(), &["plan", "start", "-o", "json", "--from-file", &plan_list.display().to_string()]).await;
        let plan_seconds = planning.elapsed().as_secs_f64();
        let plan: serde_json::Value = serde_json::from_str(&plan).expect("the plan as JSON");
        let placed = plan["units"]
            .as_array()
            .map_or(0, |units| units.iter().filter(|unit| unit["action"] == "create" && unit["machine"].is_string()).count());
        println!("  (d) fleetctl plan start of {planned} new units: {plan_seconds:.2} s ({placed} placed; nothing written)");
        println!(
            "  memory (VmHWM): fleetd engine {:.0} MiB; an agent-only fleetd with no units {:.0} MiB; the bench process ({machines} agents, their etcd copies) {:.0} MiB; etcd {:.0} MiB",
            peak_resident_mib(engine.pid()),
            peak_resident_mib(agent_only.pid()),
            peak_resident_mib(std::process::id()),
            peak_resident_mib(etcd_pid),
        );

        let store = etcd_metrics::store_size(etcd.endpoint().trim_start_matches("http://"));
        let store: Vec<String> = store.iter().map(|(name, value)| format!("{name} {value:.0}")).collect();
        println!("  etcd after the submission: {}", store.join(", "));
        if lists_only {
            // CI's small run for the lists' linearity guard: (a) and (d) are all it reads.
            let _ = lifecycle.send(Lifecycle::Reloading);
            return;
        }

        // (b) One more unit: how many agents wake?
        let mut signals: Vec<(String, ChangeSignal)> =
            agents.iter().map(|(id, registry, _)| (id.clone(), registry.machine_changes(id))).collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (_, signal) in &mut signals {
            signal.mark_unchanged();
        }
        api.put_unit("probe@1.service", &templates[0], DesiredState::Launched).await.expect("submit the probe");
        wait_all_launched(&launched, units + 1, || engine.log()).await;
        let woken: Vec<&str> = signals
            .iter()
            .filter(|(_, signal)| signal.has_changed().unwrap_or(false))
            .map(|(id, _)| id.as_str())
            .collect();
        let target = api.unit("probe@1.service").await.ok().flatten().and_then(|unit| unit.machine_id);
        println!(
            "  (b) agents woken by one schedule change: {} of {machines} (target {}, woken {:?})",
            woken.len(),
            target.as_deref().unwrap_or("-"),
            woken
        );
        assert_eq!(woken, [target.as_deref().unwrap_or("-")], "one change wakes its machine only");

        // (c) Idle.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let counters_before = etcd_metrics::read(&metrics_address);
        let (engine_before, agents_before) = (cpu_seconds(engine.pid()), cpu_seconds(std::process::id()));
        tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
        let counters = etcd_metrics::delta(&counters_before, &etcd_metrics::read(&metrics_address));
        let engine_cpu = cpu_seconds(engine.pid()) - engine_before;
        let agents_cpu = cpu_seconds(std::process::id()) - agents_before;
        println!("  (c) idle for {idle_seconds} s with {machines} machines and {} units:", units + 1);
        for (name, moved) in &counters {
            println!("      etcd {name}: {moved} ({:.1}/s)", moved / idle_seconds as f64);
        }
        println!(
            "      fleetd engine CPU: {engine_cpu:.2} s ({:.2}%); simulated machines' process CPU: {agents_cpu:.2} s ({:.2}%)",
            engine_cpu * 100.0 / idle_seconds as f64,
            agents_cpu * 100.0 / idle_seconds as f64
        );
        idle_with_a_calendar_unit(&api, &engine, idle_seconds).await;

        // (e) One machine in ten lost at once: their leases expire together.
        let lost: HashSet<String> = agents.iter().step_by(10).map(|(id, _, _)| id.clone()).collect();
        let on_lost = placed_on(&api, &lost).await;
        for (id, registry, task) in agents.iter().step_by(10) {
            task.abort();
            registry.abandon_machine(id);
        }
        let losing = Instant::now();
        let total = units + 1;
        let mut expired: Option<Duration> = None;
        loop {
            if expired.is_none() && lost_gone(&api, &lost).await {
                expired = Some(losing.elapsed());
            }
            let (running, stranded) = running_elsewhere(&api, &lost).await;
            if running == total && stranded == 0 {
                break;
            }
            assert!(losing.elapsed() < AGENT_TTL * 4, "stuck: {running}/{total} launched, {stranded} on lost machines");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let expired = expired.unwrap_or_else(|| losing.elapsed());
        println!(
            "  (e) {} machines lost at once, with {on_lost} units: every unit launched on a live machine {:.1} s later (agent_ttl {} s; target agent_ttl + 10 s); the last of their leases had expired after {:.1} s, so fleet took {:.1} s",
            lost.len(),
            losing.elapsed().as_secs_f64(),
            AGENT_TTL.as_secs(),
            expired.as_secs_f64(),
            (losing.elapsed() - expired).as_secs_f64()
        );

        // (f) The engine leader killed: the other engine fleetd takes over, moving nothing.
        println!("      {}", leaderships(&engine, &standby));
        let first_leads = metric(&tokio::task::block_in_place(|| engine.metrics()), "fleet_engine_leader") == 1.0;
        let (killed, survivor) = if first_leads { (&mut engine, &standby) } else { (&mut standby, &engine) };
        let unscheduled = "fleet_engine_decisions_total{decision=\"unschedule\"}";
        let unscheduled_before = metric(&tokio::task::block_in_place(|| survivor.metrics()), unscheduled);
        let killing = Instant::now();
        killed.stop_with(libc::SIGKILL);
        tokio::task::block_in_place(|| wait_for_leader(survivor));
        let took_over = killing.elapsed();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let moved = metric(&tokio::task::block_in_place(|| survivor.metrics()), unscheduled) - unscheduled_before;
        let (running, _) = running_elsewhere(&api, &lost).await;
        println!(
            "  (f) engine leader killed: the other engine fleetd led {:.1} s later (engine lease 5 × engine_reconcile_interval = 10 s; target under agent_ttl); units it unscheduled: {moved}; launched afterwards: {running}/{total}",
            took_over.as_secs_f64()
        );
        assert_eq!((moved, running), (0.0, total), "a new engine leader moves nothing");

        if health {
            let names: Vec<String> =
                every_unit(&api).await.into_iter().map(|unit| unit.name).filter(|name| name.starts_with("bench")).collect();
            health_rollouts::run(survivor, etcd_pid, &metrics_address, &names, idle_seconds).await;
        }
        let _ = lifecycle.send(Lifecycle::Reloading);
        drop(engine);
        drop(standby);
        drop(agent_only);
    });
}

/// Waits until `fleetd`'s engine says it leads.
fn wait_for_leader(fleetd: &Fleetd) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&fleetd.metrics(), "fleet_engine_leader") < 1.0 {
        assert!(Instant::now() < deadline, "no engine leadership: {}", fleetd.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The lease grants and the failed lease renewals of this process's simulated machines so
/// far: a machine whose lease lapsed (etcd refusing its renewals under load) registers again
/// with a new one.
fn presence_requests() -> (f64, f64) {
    let text = fleet_metrics::render();
    let failed = "fleet_store_request_errors_total{store=\"etcd\",operation=\"lease_keepalive\"}";
    (metric(&text, LEASE_GRANTS), metric(&text, failed))
}

/// One sample's value in a metrics text, 0 when absent.
fn metric(text: &str, sample: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(sample)?.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

/// How many units are placed on the machines in `lost`.
async fn placed_on(api: &EtcdRegistry, lost: &HashSet<String>) -> usize {
    every_unit(api).await.iter().filter(|unit| unit.machine_id.as_ref().is_some_and(|id| lost.contains(id))).count()
}

/// How often each engine fleetd took the leadership so far, by its log.
fn leaderships(first: &Fleetd, second: &Fleetd) -> String {
    format!(
        "engine leaderships taken so far: the first engine fleetd {}, the second {}",
        leaderships_taken(first),
        leaderships_taken(second)
    )
}

/// How often `fleetd` took the engine leadership so far: its engine logs each time it does.
/// (Its etcd leases granted less those revoked counted a machine's own lease granted again
/// after a lapse under load as a leadership.)
fn leaderships_taken(fleetd: &Fleetd) -> usize {
    fleetd.log().matches("Engine leadership acquired").count()
}

/// The engine fleetds' log lines about their leadership and their failed passes, when it was
/// taken more than once: why it moved (a lease that lapsed, a renewal that failed).
fn print_leadership_moves(first: &Fleetd, second: &Fleetd) {
    if leaderships_taken(first) + leaderships_taken(second) <= 1 {
        return;
    }
    let about_leadership =
        |line: &&str| ["eadership", "engine lease", "engine reconcile failed"].iter().any(|word| line.contains(word));
    for (which, fleetd) in [("first", first), ("second", second)] {
        for line in fleetd.log().lines().filter(about_leadership) {
            println!("      {which} engine fleetd: {line}");
        }
    }
}

/// Whether none of the machines in `lost` is present any more (their leases expired).
async fn lost_gone(api: &EtcdRegistry, lost: &HashSet<String>) -> bool {
    api.machines().await.is_ok_and(|machines| machines.iter().all(|machine| !lost.contains(&machine.id)))
}

/// How many units report launched on a machine outside `lost`, and how many are still
/// placed on one in `lost`.
async fn running_elsewhere(api: &EtcdRegistry, lost: &HashSet<String>) -> (usize, usize) {
    let all = every_unit(api).await;
    let on_lost = |unit: &fleet_registry::UnitView| unit.machine_id.as_ref().is_some_and(|id| lost.contains(id));
    let running = all.iter().filter(|unit| unit.current == Some(DesiredState::Launched) && !on_lost(unit)).count();
    (running, all.iter().filter(|unit| on_lost(unit)).count())
}

/// Runs fleetctl against the fleetd at `socket` from `dir`, off the runtime's threads;
/// returns its standard output, or stops the benchmark with its error.
async fn fleetctl(socket: &std::path::Path, dir: &std::path::Path, args: &[&str]) -> String {
    let mut command = std::process::Command::new(binary("fleetctl"));
    command.current_dir(dir).arg(format!("--endpoint=unix://{}", socket.display())).args(args);
    let output =
        tokio::task::spawn_blocking(move || command.output()).await.expect("fleetctl task").expect("run fleetctl");
    assert!(output.status.success(), "fleetctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// How long `fleetd`'s writes have waited in all for etcd to catch up with applying.
fn writes_held(fleetd: &Fleetd) -> f64 {
    let text = tokio::task::block_in_place(|| fleetd.metrics());
    metric_value(&text, "fleet_store_writes_held_seconds_total").unwrap_or(0.0)
}
