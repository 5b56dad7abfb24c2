//! A pull agent end to end, without NAT yet: the real agent code on the remote store
//! (`fleet_pull_agent::RemoteRegistry`) joins a real manager with a registration token, announces
//! itself, and runs what the engine schedules onto it (through a simulated unit manager),
//! reporting states that fleetctl shows like any other machine's; a clean stop takes it out
//! of the cluster. Every connection is opened by the agent.

use std::sync::Arc;
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::{MachineState, SystemdState};
use fleet_e2e::Fleetd;
use fleet_e2e::pki::{ManagerPki, pairs};
use fleet_e2e::pull::PullFleetd;
use fleet_registry::AgentRegistry;
use fleet_testkit::FakeUnitManager;
use tokio::sync::watch;

use fleet_testkit::free_port;

/// Two managers on one store, a registration token named `token_name`, and the agents' view
/// of both (`timeout` for a request): the managers' ports, in the members' order.
fn two_managers(
    token_name: &str,
    timeout: Duration,
) -> (fleet_e2e::Cluster, [u16; 2], String, fleet_pull_agent::Manager) {
    let pki = ManagerPki::local();
    let ports = [free_port(), free_port()];
    let cluster = fleet_e2e::Cluster::start(2, |index| pki.manager_config(&format!("127.0.0.1:{}", ports[index]), &[]));
    let token = cluster.members[0].ok(&["registration-token", "create", token_name]).stdout.trim().to_string();
    let urls = format!("https://localhost:{},https://localhost:{}", ports[0], ports[1]);
    let manager = fleet_pull_agent::Manager::new(&urls, Some(std::fs::read(&pki.api_ca_file).expect("CA")), timeout)
        .expect("manager");
    (cluster, ports, token, manager)
}

/// Runs the real agent code for `machine` on `runtime`, on a remote store through `manager`,
/// with simulated units.
fn spawn_agent(
    runtime: &tokio::runtime::Runtime,
    manager: &fleet_pull_agent::Manager,
    credentials: &fleet_pull_agent::MachineCredentials,
    machine: MachineState,
    reconcile_interval: Duration,
    units: &Arc<FakeUnitManager>,
    lifecycle: watch::Receiver<Lifecycle>,
) -> tokio::task::JoinHandle<()> {
    let _entered = runtime.enter();
    let registry = fleet_pull_agent::RemoteRegistry::new(manager, credentials, None).expect("remote store");
    fleet_pull_agent::start(&registry);
    let config = AgentConfig {
        machine,
        reconcile_interval,
        debounce: Duration::from_millis(10),
        presence_ttl: None,
        stop_units_when_cut_off: false,
    };
    runtime.spawn(Agent::new(config, registry, units.clone()).run(lifecycle))
}

#[test]
fn a_pull_agent_is_scheduled_onto_and_reports_like_any_machine() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[("metadata", "kind=manager")]);
    let fleetd = Fleetd::start("e2e0manager00004", &pairs(&config));
    let api_ca_file = pki.api_ca_file.clone();
    let token =
        fleetd.ok(&["registration-token", "create", "--metadata", "kind=pull", "pull"]).stdout.trim().to_string();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let manager = fleet_pull_agent::Manager::new(
        &format!("https://localhost:{port}"),
        Some(std::fs::read(&api_ca_file).expect("CA")),
        Duration::from_secs(10),
    )
    .expect("manager");
    let (credentials, metadata) = runtime.block_on(manager.join(&token, "pull-agent-1")).expect("join");
    let units = Arc::new(FakeUnitManager::new());
    let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    let machine = MachineState {
        id: credentials.machine_id.clone(),
        public_ip: "127.0.0.7".into(),
        metadata,
        version: "test".into(),
        disable_engine: true,
        connection: fleet_core::Connection::Pull,
        capacity: None,
        drain: None,
        taints: Default::default(),
    };
    let agent_task =
        spawn_agent(&runtime, &manager, &credentials, machine, Duration::from_secs(5), &units, lifecycle_watch);

    fleetd.wait_until("the pull agent shows in list-machines", Duration::from_secs(20), |fleetd| {
        let machines = fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout;
        machines.contains("pull-agent-1") && machines.contains("kind=pull")
    });
    let connections = fleetd.ok(&["list-machines", "--full", "--no-legend", "--fields", "machine,connection"]).stdout;
    assert!(
        connections.lines().any(|row| row.starts_with("pull-agent-1\t") && row.ends_with("\tpull")),
        "{connections}"
    );
    assert!(connections.lines().any(|row| row.ends_with("\tembedded")), "the manager's own machine: {connections}");
    let unit_dir = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        unit_dir.path(),
        "job.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=kind=pull\n",
    );
    fleetd.fleetctl_in(unit_dir.path(), &["start", "--no-block", "job.service"]);
    let running = Some(SystemdState::new("loaded", "active", "running"));
    fleetd.wait_until("the pull agent runs job.service", Duration::from_secs(20), |_| {
        units.state("job.service") == running
    });
    fleetd.wait_until("fleetctl shows it running there", Duration::from_secs(20), |fleetd| {
        let rows = fleetd.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,active"]).stdout;
        rows.lines().any(|row| row.starts_with("job.service") && row.contains("pull-agent-1") && row.contains("active"))
    });

    fleetd.ok(&["stop", "--no-block", "job.service"]);
    fleetd.wait_until("the pull agent stops it", Duration::from_secs(20), |_| {
        units.state("job.service").is_none_or(|state| state.active != "active")
    });

    // Content new to the agent comes in one request for all of it, not one per body.
    for (name, seconds) in
        [("one.service", 1001), ("two.service", 1002), ("three.service", 1003), ("quiet.service", 1004)]
    {
        let text = format!("[Service]\nExecStart=/bin/sleep {seconds}\n[X-Fleet]\nMachineMetadata=kind=pull\n");
        fleet_e2e::write_unit(unit_dir.path(), name, &text);
    }
    fleetd.fleetctl_in(unit_dir.path(), &["start", "--no-block", "one.service", "two.service", "three.service"]);
    fleetd.wait_until("the pull agent runs the three", Duration::from_secs(20), |_| {
        ["one.service", "two.service", "three.service"].iter().all(|name| units.state(name) == running)
    });
    let bodies_series =
        |path: &str| format!("fleet_api_requests_total{{endpoint=\"{path}\",method=\"GET\",code=\"200\"}}");
    let (batch, single) =
        (bodies_series("/fleet/v1/agents/{machine}/bodies"), bodies_series("/fleet/v1/agents/{machine}/bodies/{hash}"));
    let text = fleetd.metrics();
    assert!(fleet_e2e::metric_value(&text, &batch).unwrap_or(0.0) >= 1.0, "{text}");
    assert_eq!(fleet_e2e::metric_value(&text, &single), None, "no body was asked for alone: {text}");
    // Once nothing changes for a while, the agent follows its changes on a change stream, and
    // its long polls stop.
    let series = |path: &str, code: u16| {
        format!(
            "fleet_api_requests_total{{endpoint=\"/fleet/v1/agents/{{machine}}/{path}\",method=\"GET\",code=\"{code}\"}}"
        )
    };
    let (stream, polls) = (series("stream", 101), series("changes", 200));
    fleetd.wait_until("the idle agent follows a change stream", Duration::from_secs(60), |fleetd| {
        fleet_e2e::metric_value(&fleetd.metrics(), &stream).unwrap_or(0.0) >= 1.0
    });
    let text = fleetd.metrics();
    assert_eq!(fleet_e2e::metric_value(&text, "fleet_pull_agents_streaming"), Some(1.0), "{text}");
    // A change then travels whole on the stream: the work and the new body out, the unit's
    // state back; no connection is opened for it, no request made.
    let handshakes = |text: &str| {
        ["full", "resumed"]
            .iter()
            .map(|kind| {
                fleet_e2e::metric_value(text, &format!("fleet_api_tls_handshakes_total{{kind=\"{kind}\"}}"))
                    .unwrap_or(0.0)
            })
            .sum::<f64>()
    };
    let counted = |text: &str, series: &str| fleet_e2e::metric_value(text, series).unwrap_or(0.0);
    let (works, states) = ("fleet_pull_stream_works_total", "fleet_pull_stream_states_total");
    let (polled, handshakes_before, works_before, states_before) =
        (counted(&text, &polls), handshakes(&text), counted(&text, works), counted(&text, states));
    fleetd.fleetctl_in(unit_dir.path(), &["start", "--no-block", "quiet.service"]);
    fleetd.wait_until("the pull agent runs a unit it learnt of on the stream", Duration::from_secs(20), |_| {
        units.state("quiet.service") == running
    });
    fleetd.wait_until("its state came back on the stream", Duration::from_secs(20), |fleetd| {
        let rows = fleetd.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,active"]).stdout;
        rows.lines()
            .any(|row| row.starts_with("quiet.service") && row.contains("pull-agent-1") && row.contains("active"))
    });
    let text = fleetd.metrics();
    assert_eq!(counted(&text, &polls), polled, "no long poll meanwhile");
    assert_eq!(handshakes(&text), handshakes_before, "no connection opened: {text}");
    assert!(counted(&text, works) > works_before, "the work came on the stream: {text}");
    assert!(counted(&text, states) > states_before, "the state went back on it: {text}");
    let reader = {
        let _entered = runtime.enter();
        fleet_pull_agent::RemoteRegistry::new(&manager, &credentials, None).expect("remote store")
    };
    let work = runtime.block_on(reader.machine_work(&credentials.machine_id)).expect("work");
    let three = ["one.service", "two.service", "three.service"];
    let hashes: Vec<_> =
        work.scheduled.iter().filter(|unit| three.contains(&unit.name.as_str())).map(|unit| unit.hash).collect();
    assert_eq!(hashes.len(), 3, "{work:?}");
    let before = fleet_e2e::metric_value(&fleetd.metrics(), &batch).unwrap_or(0.0);
    let read = runtime.block_on(reader.unit_bodies(&credentials.machine_id, &hashes)).expect("bodies");
    assert_eq!(read.len(), 3);
    assert!(hashes.iter().all(|hash| read.get(hash).is_some_and(|file| file.hash() == *hash)));
    assert_eq!(fleet_e2e::metric_value(&fleetd.metrics(), &batch).unwrap_or(0.0), before + 1.0, "one request");
    // Requests a new store sends together, before it has a connection, share the one it opens:
    // one TLS handshake, not one each.
    let together = {
        let _entered = runtime.enter();
        fleet_pull_agent::RemoteRegistry::new(&manager, &credentials, None).expect("remote store")
    };
    // Counted as full handshakes: the new store has no session to resume, while the agent
    // running meanwhile resumes its own when it opens a connection (under load, one of its
    // idle connections closed and it opened another within this window: a flake).
    let full_handshakes =
        |text: &str| fleet_e2e::metric_value(text, "fleet_api_tls_handshakes_total{kind=\"full\"}").unwrap_or(0.0);
    let handshakes_before = full_handshakes(&fleetd.metrics());
    let read = runtime.block_on(async {
        let mut reads = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (store, machine, hashes) = (together.clone(), credentials.machine_id.clone(), hashes.clone());
            reads.spawn(async move { store.unit_bodies(&machine, &hashes).await.map(|bodies| bodies.len()) });
        }
        reads.join_all().await
    });
    assert!(read.iter().all(|bodies| matches!(bodies, Ok(3))), "{read:?}");
    assert_eq!(full_handshakes(&fleetd.metrics()), handshakes_before + 1.0, "one connection for the eight requests");
    fleetd.ok(&["destroy", "one.service", "two.service", "three.service", "quiet.service"]);

    // A global unit runs on the manager (a machine with a store) and on the pull agent alike.
    fleet_e2e::write_unit(
        unit_dir.path(),
        "everywhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nGlobal=true\n",
    );
    fleetd.fleetctl_in(unit_dir.path(), &["start", "--no-block", "everywhere.service"]);
    fleetd.wait_until("the global unit runs on both kinds of machine", Duration::from_secs(20), |fleetd| {
        let rows = fleetd.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,sub"]).stdout;
        let on = |machine: &str| {
            rows.lines()
                .any(|row| row.starts_with("everywhere.service") && row.contains(machine) && row.contains("running"))
        };
        on("pull-agent-1") && on("e2e0manager00004") && units.state("everywhere.service") == running
    });

    let _ = lifecycle.send(Lifecycle::ShuttingDown);
    runtime.block_on(agent_task).expect("the agent ends");
    fleetd.wait_until("a clean stop takes the pull agent out", Duration::from_secs(20), |fleetd| {
        !fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pull-agent-1")
    });
}

/// fleetd itself in pull mode: joins with the token from its fleet.conf, runs what is
/// scheduled onto it with the native supervisor, leaves on SIGTERM, and comes back without
/// the token (it kept its certificate, 0600).
#[test]
fn fleetd_in_pull_mode_joins_runs_units_and_comes_back_with_its_own_certificate() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[("metadata", "kind=manager")]);
    let fleetd = Fleetd::start("e2e0manager00005", &pairs(&config));
    let api_ca_file = pki.api_ca_file.clone();
    let token = fleetd.ok(&["registration-token", "create", "--max-uses", "1", "once"]).stdout.trim().to_string();
    let manager_url = format!("https://localhost:{port}");
    let pull = PullFleetd::start(&manager_url, &api_ca_file, Some(&token), None, &[]);
    let in_cluster =
        |fleetd: &Fleetd| fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001");
    fleetd.wait_until("the pull fleetd joins", Duration::from_secs(30), in_cluster);
    let credentials = pull.dir.path().join("state/machine-credentials.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&credentials).expect("kept").permissions());
    assert_eq!(mode & 0o777, 0o600);

    let units = tempfile::tempdir().expect("units");
    // Its health check, which the pull fleetd runs and reports through its manager.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let checked = listener.local_addr().expect("its address").port();
    fleet_e2e::write_unit(
        units.path(),
        "pulled.service",
        &format!(
            "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=pullfleetd000001\nHealthCheck=tcp://127.0.0.1:{checked}\nHealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n"
        ),
    );
    fleetd.fleetctl_in(units.path(), &["start", "--no-block", "pulled.service"]);
    let running_there = |fleetd: &Fleetd| {
        let rows = fleetd.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,active,sub"]).stdout;
        rows.lines()
            .any(|row| row.starts_with("pulled.service") && row.contains("pullfleetd000001") && row.contains("running"))
    };
    fleetd.wait_until("the pull fleetd runs pulled.service", Duration::from_secs(30), running_there);
    assert!(!pull.log().contains(&token[9..]), "the token reached the pull fleetd's log");
    let health_is = |want: &'static str| {
        move |fleetd: &Fleetd| {
            let rows = fleetd.ok(&["list-units", "--no-legend", "--fields", "unit,health"]).stdout;
            rows.lines().any(|row| {
                let words: Vec<&str> = row.split_whitespace().collect();
                words.first() == Some(&"pulled.service")
                    && words.get(1).map(|word| word.trim_end_matches(':')) == Some(want)
            })
        }
    };
    fleetd.wait_until("the pull fleetd reports pulled.service healthy", Duration::from_secs(30), health_is("healthy"));
    drop(listener);
    fleetd.wait_until("and unhealthy once its port closes", Duration::from_secs(30), health_is("unhealthy"));
    // The manager makes the events of what its pull agents report.
    fleetd.wait_until("the turn to unhealthy is an event", Duration::from_secs(30), |fleetd| {
        let events = fleetd.ok(&["events", "-o", "json", "--unit", "pulled.service", "--kind", "health"]).stdout;
        events
            .lines()
            .any(|line| line.contains("\"machineID\":\"pullfleetd000001\"") && line.contains("\"message\":\"unhealthy"))
    });
    let status = fleetd.fleetctl_in(units.path(), &["status", "pulled.service"]).stdout;
    assert!(status.contains(&format!("connecting to 127.0.0.1:{checked}")), "{status}");

    // SIGTERM: it stops its units and leaves.
    let kept = pull.stop();
    fleetd.wait_until("the pull fleetd left", Duration::from_secs(30), |fleetd| !in_cluster(fleetd));

    // Back without the token (used up anyway): its own certificate is enough.
    let back = PullFleetd::start(&manager_url, &api_ca_file, None, Some(kept), &[]);
    fleetd.wait_until("the pull fleetd is back", Duration::from_secs(30), in_cluster);
    fleetd.wait_until("and runs pulled.service again", Duration::from_secs(30), running_there);
    assert!(back.log().contains("starting as a pull agent"), "{}", back.log());
}

/// A pull agent that goes silent (its process dies, its network goes) is a lost machine
/// `agent_ttl` after its last sign of life, as an etcd machine is: its units move; back, it
/// announces itself again.
#[test]
fn a_silent_pull_agent_is_lost_after_agent_ttl_and_comes_back() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[("agent_ttl", "2s")]);
    let fleetd = Fleetd::start("e2e0manager00006", &pairs(&config));
    let api_ca_file = pki.api_ca_file.clone();
    let token = fleetd.ok(&["registration-token", "create", "t"]).stdout.trim().to_string();
    let manager = fleet_pull_agent::Manager::new(
        &format!("https://localhost:{port}"),
        Some(std::fs::read(&api_ca_file).expect("CA")),
        Duration::from_secs(10),
    )
    .expect("manager");
    let join_runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (credentials, _) = join_runtime.block_on(manager.join(&token, "silent-1")).expect("join");
    let units = Arc::new(FakeUnitManager::new());
    // One agent run, in a runtime of its own: dropping the runtime kills it mid-flight.
    let run_agent = || {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let (lifecycle, watch) = watch::channel(Lifecycle::Running);
        let machine = MachineState { id: "silent-1".into(), public_ip: "127.0.0.6".into(), ..Default::default() };
        spawn_agent(&runtime, &manager, &credentials, machine, Duration::from_millis(500), &units, watch);
        (runtime, lifecycle)
    };
    let in_cluster =
        |fleetd: &Fleetd| fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("silent-1");
    let (runtime, lifecycle) = run_agent();
    fleetd.wait_until("the agent is in the cluster", Duration::from_secs(20), in_cluster);
    let unit_dir = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        unit_dir.path(),
        "pinned.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=silent-1\n",
    );
    fleetd.fleetctl_in(unit_dir.path(), &["start", "--no-block", "pinned.service"]);
    let running = Some(SystemdState::new("loaded", "active", "running"));
    fleetd.wait_until("the agent runs pinned.service", Duration::from_secs(20), |_| {
        units.state("pinned.service") == running
    });

    // Silence: the agent dies without a word.
    drop(lifecycle);
    runtime.shutdown_background();
    let silenced = std::time::Instant::now();
    fleetd.wait_until("the silent agent is lost", Duration::from_secs(10), |fleetd| !in_cluster(fleetd));
    // Its open poll was cut off: it was last heard two keepalives (a quarter of agent_ttl
    // each) before that, the longest a dead connection goes unnoticed, and it is lost
    // agent_ttl after then.
    assert!(silenced.elapsed() >= Duration::from_millis(900), "lost only after agent_ttl from its last sign");
    assert!(fleetd.log().contains("pull agent silent for agent_ttl"), "{}", fleetd.log());
    assert_eq!(units.state("pinned.service"), running, "what it ran is not stopped from outside");

    // Back: it announces itself again and converges.
    let (_runtime, _lifecycle) = run_agent();
    fleetd.wait_until("the agent is back", Duration::from_secs(20), in_cluster);
    fleetd.wait_until("pinned.service is placed on it again", Duration::from_secs(20), |fleetd| {
        let rows = fleetd.ok(&["list-unit-files", "--full", "--no-legend", "--fields", "unit,tmachine"]).stdout;
        rows.lines().any(|row| row.starts_with("pinned.service") && row.contains("silent-1"))
    });
}

/// The manager goes away: the pull fleetd keeps its unit running; killed and restarted during
/// the outage, it brings the unit back up from the desired state it kept on disk; when the
/// manager returns, it reconnects by itself.
#[test]
fn a_pull_fleetd_runs_through_a_manager_outage_and_a_restart_during_it() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let mut fleetd = Fleetd::start("e2e0manager00007", &pairs(&config));
    let api_ca_file = pki.api_ca_file.clone();
    let token = fleetd.ok(&["registration-token", "create", "offline"]).stdout.trim().to_string();
    let manager_url = format!("https://localhost:{port}");
    let pull = PullFleetd::start(&manager_url, &api_ca_file, Some(&token), None, &[]);
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "steady.service",
        "[Service]\nExecStart=/bin/sleep 4242\n[X-Fleet]\nMachineID=pullfleetd000001\n",
    );
    fleetd.wait_until("the pull fleetd joins", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    fleetd.fleetctl_in(units.path(), &["start", "--no-block", "steady.service"]);
    let sleeper = ["/bin/sleep", "4242"];
    fleetd.wait_until("steady.service runs on the pull fleetd", Duration::from_secs(30), |_| {
        fleet_e2e::process_running(&sleeper)
    });

    // The manager goes away; the unit keeps running.
    fleetd.stop_with(libc::SIGKILL);
    std::thread::sleep(Duration::from_secs(2));
    assert!(fleet_e2e::process_running(&sleeper), "the unit runs through the outage");

    // The pull fleetd dies and restarts during the outage: the unit comes back from the copy.
    let kept = pull.kill();
    let no_context = String::new;
    fleet_e2e::poll_until(
        "the killed fleetd's unit ends with it",
        Duration::from_secs(15),
        || !fleet_e2e::process_running(&sleeper),
        no_context,
    );
    let back = PullFleetd::start(&manager_url, &api_ca_file, None, Some(kept), &[]);
    fleet_e2e::poll_until(
        "the unit comes back from the copy",
        Duration::from_secs(30),
        || fleet_e2e::process_running(&sleeper),
        || back.log(),
    );
    assert!(back.log().contains("running from the desired state kept on disk"), "{}", back.log());

    // The manager returns; the pull fleetd reconnects and is a machine of the cluster again.
    fleetd.launch();
    fleetd.wait_until("the pull fleetd is back in the cluster", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !back.log().contains("the manager is back") {
        assert!(std::time::Instant::now() < deadline, "{}", back.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fleet_e2e::process_running(&sleeper));
}

/// Two managers on one etcd: when the agent's manager dies, the agent moves to the other,
/// which takes its presence over; the machine never leaves the cluster and its unit never
/// moves, through twice `agent_ttl`.
#[test]
fn a_pull_agent_fails_over_between_two_managers_without_leaving_the_cluster() {
    let (mut cluster, _, token, manager) = two_managers("roaming", Duration::from_secs(3));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (credentials, _) = runtime.block_on(manager.join(&token, "roam-1")).expect("join");
    let units = Arc::new(FakeUnitManager::new());
    let (_lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    let machine = MachineState { id: "roam-1".into(), public_ip: "127.0.0.5".into(), ..Default::default() };
    spawn_agent(&runtime, &manager, &credentials, machine, Duration::from_millis(500), &units, lifecycle_watch);
    // The agent starts on either manager; the one that holds it took a lease for its agents.
    let holds_agents = |member: &Fleetd| member.log().contains("holding pull agents' presences under a new lease");
    // Whether `member` shows the agent in the cluster and its unit placed there.
    let survivor = |member: &Fleetd| -> bool {
        let machines = member.ok(&["list-machines", "--full", "--no-legend"]).stdout;
        let placed = member.ok(&["list-unit-files", "--full", "--no-legend", "--fields", "unit,tmachine"]).stdout;
        machines.contains("roam-1")
            && placed.lines().any(|row| row.starts_with("roaming.service") && row.contains("roam-1"))
    };
    let unit_dir = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        unit_dir.path(),
        "roaming.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=roam-1\n",
    );
    cluster.members[0].fleetctl_in(unit_dir.path(), &["start", "--no-block", "roaming.service"]);
    let running = Some(SystemdState::new("loaded", "active", "running"));
    cluster.wait_until("the agent runs roaming.service", Duration::from_secs(30), |cluster| {
        units.state("roaming.service") == running && survivor(&cluster.members[0])
    });

    // Its manager dies.
    let first = cluster.members.iter().position(&holds_agents).expect("a manager holds the agent");
    let other = 1 - first;
    assert!(!holds_agents(&cluster.members[other]), "one manager holds the agent");
    cluster.members[first].stop_with(libc::SIGKILL);
    let ttl = Duration::from_secs(fleet_e2e::AGENT_TTL_SECONDS);
    let until = std::time::Instant::now() + ttl * 2;
    while std::time::Instant::now() < until {
        assert!(survivor(&cluster.members[other]), "the agent left the cluster or its unit moved\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(units.state("roaming.service"), running);
    assert!(holds_agents(&cluster.members[other]), "the other manager took the agent over");
    // Its states now flow through the other manager.
    cluster.members[other].ok(&["stop", "--no-block", "roaming.service"]);
    cluster.wait_until("the stop reaches the agent and its state the cluster", Duration::from_secs(20), |cluster| {
        let states = cluster.members[other].api("GET", "/fleet/v1/state?machineID=roam-1", "");
        units.state("roaming.service").is_some_and(|state| state.active != "active") && states.contains("inactive")
    });
}

/// A pull fleetd reaches its manager through the proxy `HTTPS_PROXY` names.
#[test]
fn a_pull_fleetd_honours_https_proxy() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let fleetd = Fleetd::start("e2e0manager00008", &pairs(&config));
    let api_ca_file = pki.api_ca_file.clone();
    let token = fleetd.ok(&["registration-token", "create", "proxied"]).stdout.trim().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let proxy = runtime.block_on(fleet_e2e::connect_proxy::ConnectProxy::start());
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    let _pull = PullFleetd::start_with_env(
        &format!("https://localhost:{port}"),
        &api_ca_file,
        Some(&token),
        None,
        &[],
        &[("HTTPS_PROXY", &proxy_url), ("NO_PROXY", ""), ("no_proxy", "")],
    );
    fleetd.wait_until("the proxied pull fleetd joins", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    assert!(proxy.tunnels() >= 1, "the pull fleetd did not go through the proxy");
}

/// `fleetctl journal` and `status` of a unit on a pull agent, asked of the manager: the agent's
/// long poll carries the question, and it posts the journal back.
#[test]
fn fleetctl_journal_reaches_a_pull_agents_unit_through_the_manager() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let fleetd = Fleetd::start("e2e0manager00009", &pairs(&config));
    let token = fleetd.ok(&["registration-token", "create", "journal"]).stdout.trim().to_string();
    let pull = PullFleetd::start(&format!("https://localhost:{port}"), &pki.api_ca_file, Some(&token), None, &[]);
    fleetd.wait_until("the pull fleetd joins", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "chatty.service",
        "[Service]\nExecStart=/bin/sh -c 'echo hello-from-behind-the-manager; exec sleep 1000'\n[X-Fleet]\nMachineID=pullfleetd000001\n",
    );
    fleetd.fleetctl_in(units.path(), &["start", "--no-block", "chatty.service"]);
    fleetd.wait_until("the journal comes back through the manager", Duration::from_secs(30), |fleetd| {
        fleetd.fleetctl(&["journal", "--lines", "5", "chatty.service"]).stdout.contains("hello-from-behind-the-manager")
    });
    // `status` exits 3 while the unit is still activating (as systemctl does): under load its
    // journal line can come back before the unit counts as active.
    fleetd.wait_until("status of the unit comes back through the manager, active", Duration::from_secs(30), |fleetd| {
        let status = fleetd.fleetctl(&["status", "chatty.service"]);
        status.code == 0 && status.stdout.contains("Active: active")
    });
    drop(pull);
}

/// Regression (issue 68): `journal` and `status` of a pull agent's unit asked of an etcd member
/// that is not the agent's manager ended in a 504: the question went into etcd for the agent,
/// which cannot read etcd. The manager holding the agent answers it on the agent's behalf.
#[test]
fn journal_of_a_pull_agents_unit_asked_of_another_member_comes_through_its_manager() {
    let pki = ManagerPki::local();
    let ports = [free_port(), free_port()];
    let cluster = fleet_e2e::Cluster::start(2, |index| pki.manager_config(&format!("127.0.0.1:{}", ports[index]), &[]));
    let token = cluster.members[0].ok(&["registration-token", "create", "journal"]).stdout.trim().to_string();
    // The agent knows only the first manager.
    let pull = PullFleetd::start(&format!("https://localhost:{}", ports[0]), &pki.api_ca_file, Some(&token), None, &[]);
    let other = &cluster.members[1];
    other.wait_until("the pull fleetd joins", Duration::from_secs(30), |member| {
        member.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "faraway.service",
        "[Service]\nExecStart=/bin/sh -c 'echo hello-from-another-members-agent; exec sleep 1000'\n[X-Fleet]\nMachineID=pullfleetd000001\n",
    );
    other.fleetctl_in(units.path(), &["start", "--no-block", "faraway.service"]);
    // Before the fix, every answer was a 504 ("did not answer within 10s").
    other.wait_until("the journal comes back through the agent's manager", Duration::from_secs(60), |member| {
        let journal = member.fleetctl(&["journal", "--lines", "5", "faraway.service"]);
        assert!(!journal.stderr.contains("did not answer"), "{journal:?}\n{}\n{}", cluster.logs(), pull.log());
        journal.stdout.contains("hello-from-another-members-agent")
    });
    let status = other.fleetctl(&["status", "faraway.service"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(status.stdout.contains("faraway.service"), "{status:?}");
}

/// A unit that asked to run at most once on a pull agent stops once its manager may have
/// stopped hearing from the agent for `agent_ttl` (the manager frozen here), by the agent's
/// own clock, and runs again once the manager hears it.
#[test]
fn a_pull_agent_stops_an_at_most_once_unit_once_its_manager_may_have_lost_it() {
    let pki = ManagerPki::local();
    let port = free_port();
    let mut config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    config.push(("agent_ttl".to_string(), "4s".to_string()));
    let fleetd = Fleetd::start("e2e0manager00009", &pairs(&config));
    let token = fleetd.ok(&["registration-token", "create", "once"]).stdout.trim().to_string();
    let manager_url = format!("https://localhost:{port}");
    let pull = PullFleetd::start_with_env(
        &manager_url,
        &pki.api_ca_file,
        Some(&token),
        None,
        &[],
        &[("FLEET_AGENT_TTL", "4s")],
    );
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "once.service",
        "[Service]\nExecStart=/bin/sleep 4343\n[X-Fleet]\nMachineID=pullfleetd000001\nAtMostOnce=true\n",
    );
    fleetd.wait_until("the pull fleetd joins", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    fleetd.fleetctl_in(units.path(), &["start", "--no-block", "once.service"]);
    let sleeper = ["/bin/sleep", "4343"];
    fleet_e2e::poll_until(
        "once.service runs on the pull fleetd",
        Duration::from_secs(30),
        || fleet_e2e::process_running(&sleeper),
        || pull.log(),
    );

    let pid = fleet_e2e::process_with(&sleeper).expect("once.service's process");
    fleetd.signal(libc::SIGSTOP);
    let frozen = std::time::Instant::now();
    // Its one process watched, polled often: what is timed is the agent, not a walk of /proc.
    let stopped = loop {
        if !fleet_e2e::pid_alive(pid) {
            break frozen.elapsed();
        }
        assert!(frozen.elapsed() < Duration::from_secs(20), "once.service still runs\n{}", pull.log());
        std::thread::sleep(Duration::from_millis(10));
    };
    println!("AtMostOnce on a pull agent: stopped {stopped:?} after its manager froze (agent_ttl 4 s)");
    assert!(stopped <= Duration::from_millis(4500), "stopped {stopped:?} after the manager froze\n{}", pull.log());
    fleetd.signal(libc::SIGCONT);
    fleet_e2e::poll_until(
        "it runs again once the manager hears the agent",
        Duration::from_secs(30),
        || fleet_e2e::process_running(&sleeper),
        || pull.log(),
    );
}

/// How many connections to local `port` are established, as their clients see them.
fn established_to(port: u16) -> usize {
    fleet_testkit::connections_to(port).len()
}

/// Refuses new connections to a local port while it lives (those open stay up).
struct NewConnectionsRefused(u16);

impl NewConnectionsRefused {
    /// The rule that answers a new connection to `port` with a reset, as a port nothing
    /// listens on does.
    fn rule(action: &str, port: u16) -> bool {
        let port = port.to_string();
        let args = [
            action,
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            port.as_str(),
            "--syn",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ];
        std::process::Command::new("iptables").args(args).status().expect("iptables runs").success()
    }

    fn to_port(port: u16) -> Self {
        assert!(Self::rule("-I", port), "iptables refuses new connections");
        Self(port)
    }
}

impl Drop for NewConnectionsRefused {
    fn drop(&mut self) {
        Self::rule("-D", self.0);
    }
}

/// One manager holds a pull agent's stream and its presence: when a request of the agent's
/// moves it to the other manager (its manager's port refuses new connections, while the
/// stream the agent holds there stays up), its stream on the manager it left ends, and it
/// follows its changes on the one it moved to, which holds its presence.
#[test]
fn a_pull_agent_whose_requests_move_to_another_manager_takes_its_stream_along() {
    let (cluster, ports, token, manager) = two_managers("split", Duration::from_secs(3));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (credentials, _) = runtime.block_on(manager.join(&token, "split-1")).expect("join");
    let registry = {
        let _entered = runtime.enter();
        fleet_pull_agent::RemoteRegistry::new(&manager, &credentials, None).expect("remote store")
    };
    // Journals asked of the agent are answered through its inbox, as fleetd's pull mode does.
    let answering = registry.clone();
    runtime.spawn(async move {
        use fleet_registry::JournalInbox;
        let mut asked = answering.journal_question_changes("split-1");
        loop {
            for (id, question) in answering.journal_questions("split-1").await.unwrap_or_default() {
                let journal =
                    fleet_api_schema::Journal { name: question.unit, text: "hello\n".into(), ..Default::default() };
                let answer = serde_json::to_vec(&fleet_api_schema::RelayedJournal::Journal(journal)).expect("json");
                let _ = answering.answer_journal("split-1", &id, &answer).await;
            }
            if asked.changed().await.is_err() {
                return;
            }
        }
    });
    {
        let _entered = runtime.enter();
        fleet_pull_agent::start(&registry);
    }
    let units = Arc::new(FakeUnitManager::new());
    let config = AgentConfig {
        machine: MachineState { id: "split-1".into(), public_ip: "127.0.0.6".into(), ..Default::default() },
        reconcile_interval: Duration::from_millis(500),
        debounce: Duration::from_millis(10),
        presence_ttl: None,
        stop_units_when_cut_off: false,
    };
    let (_lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
    runtime.spawn(Agent::new(config, registry.clone(), units.clone()).run(lifecycle_watch));
    let unit_dir = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        unit_dir.path(),
        "split.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=split-1\n",
    );
    cluster.members[0].fleetctl_in(unit_dir.path(), &["start", "--no-block", "split.service"]);
    let running = Some(SystemdState::new("loaded", "active", "running"));
    let streaming =
        |member: &Fleetd| fleet_e2e::metric_value(&member.metrics(), "fleet_pull_agents_streaming").unwrap_or(0.0);
    cluster.wait_until(
        "the agent runs split.service and follows a change stream",
        Duration::from_secs(90),
        |cluster| {
            units.state("split.service") == running && cluster.members.iter().any(|member| streaming(member) == 1.0)
        },
    );
    let first = cluster.members.iter().position(|member| streaming(member) == 1.0).expect("a manager streams");
    let other = 1 - first;
    // Until the stream is all the agent holds open there (a connection its requests used
    // before lingers in its pool a while, and would carry the next request past the rule).
    cluster.wait_until("the agent holds only its stream on its manager", Duration::from_secs(120), |_| {
        established_to(ports[first]) == 1
    });

    let _refused = NewConnectionsRefused::to_port(ports[first]);
    std::thread::scope(|scope| {
        // The question reaches the agent on its stream; its answer needs a new connection.
        scope.spawn(|| cluster.members[first].fleetctl(&["journal", "--lines", "1", "split.service"]));
        cluster.wait_until("the agent's stream moved with its requests", Duration::from_secs(120), |cluster| {
            streaming(&cluster.members[first]) == 0.0 && streaming(&cluster.members[other]) == 1.0
        });
    });
    let machines = cluster.members[other].ok(&["list-machines", "--full", "--no-legend"]).stdout;
    assert!(machines.contains("split-1"), "{machines}");
    assert_eq!(units.state("split.service"), running);
}

/// Agents that join through a list of managers start at one of them at random: several
/// managers sign the certificates of agents joining at once, through one token.
#[test]
fn joins_through_a_list_of_managers_are_signed_by_all_of_them() {
    let (cluster, _, token, manager) = two_managers("spread", Duration::from_secs(10));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // 24 joins: all on one manager by chance once in about 8 million runs.
    for index in 0..24 {
        runtime.block_on(manager.join(&token, &format!("spread-{index}"))).expect("join");
    }
    let joins =
        |member: &Fleetd| fleet_e2e::metric_value(&member.metrics(), "fleet_pull_agent_joins_total").unwrap_or(0.0);
    let (first, second) = (joins(&cluster.members[0]), joins(&cluster.members[1]));
    assert_eq!(first + second, 24.0);
    assert!(first >= 1.0 && second >= 1.0, "joins signed by one manager only: {first} and {second}");
}

/// The lease a machine's presence hangs on in `etcd`, if it is present.
fn presence_lease(etcd: &str, machine_id: &str) -> Option<i64> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([etcd], None).await.ok()?;
        let all = etcd_client::GetOptions::new().with_prefix().with_keys_only();
        let reply = client.get("/", Some(all)).await.ok()?;
        let suffix = format!("/machines/{machine_id}");
        reply.kvs().iter().find(|kv| kv.key().ends_with(suffix.as_bytes())).map(|kv| kv.lease())
    })
}

/// A manager killed and started again: its idle pull agent announces itself to it at once,
/// long before `agent_ttl` (here 120 s); the restarted manager holds it on the lease of its
/// previous life, which it recorded and renews again, so the presence stays as it was; its
/// unit never stops or moves. Before, the agent found its presence still there and waited
/// for that lease to expire, its units unscheduled meanwhile.
#[test]
fn an_idle_pull_agent_announces_itself_to_its_restarted_manager_at_once() {
    let pki = ManagerPki::local();
    let port = free_port();
    let mut cluster = fleet_e2e::Cluster::start(1, |_| {
        let mut config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
        config.push(("agent_ttl".into(), "120s".into()));
        config
    });
    let token = cluster.members[0].ok(&["registration-token", "create", "restart"]).stdout.trim().to_string();
    let pull = PullFleetd::start(&format!("https://localhost:{port}"), &pki.api_ca_file, Some(&token), None, &[]);
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "idle.service",
        "[Service]\nExecStart=/bin/sleep 4343\n[X-Fleet]\nMachineID=pullfleetd000001\n",
    );
    cluster.members[0].wait_until("the pull fleetd joins", Duration::from_secs(30), |fleetd| {
        fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    cluster.members[0].fleetctl_in(units.path(), &["start", "--no-block", "idle.service"]);
    let sleeper = ["/bin/sleep", "4343"];
    fleet_e2e::poll_until(
        "idle.service runs",
        Duration::from_secs(30),
        || fleet_e2e::process_running(&sleeper),
        || pull.log(),
    );
    // Idle: on its change stream (after a quiet long poll), where nothing but the stream's
    // end tells it of the manager's.
    cluster.members[0].wait_until("the agent follows its change stream", Duration::from_secs(90), |fleetd| {
        fleet_e2e::metric_value(&fleetd.metrics(), "fleet_pull_agents_streaming") == Some(1.0)
    });
    let etcd = cluster.etcd.endpoint();
    let before = presence_lease(&etcd, "pullfleetd000001").expect("the agent's presence");

    cluster.members[0].stop_with(libc::SIGKILL);
    cluster.members[0].launch();
    // A bound far inside the 120 s the lease lives: the agent announced itself anew.
    cluster.members[0].wait_until(
        "the agent announces itself to the restarted manager",
        Duration::from_secs(40),
        |fleetd| fleet_e2e::metric_value(&fleetd.metrics(), "fleet_pull_agent_announcements_total") == Some(1.0),
    );
    assert_eq!(
        presence_lease(&etcd, "pullfleetd000001"),
        Some(before),
        "held on the lease of the manager's previous life"
    );
    assert!(
        cluster.members[0]
            .log()
            .contains("holding pull agents' presences under the lease held before this manager restarted")
    );
    let listed = cluster.members[0].ok(&["list-units", "--no-legend", "--full"]).stdout;
    assert!(listed.contains("idle.service") && listed.contains("pullfleetd000001"), "{listed}");
    assert!(fleet_e2e::process_running(&sleeper), "the unit ran throughout");
    // And it follows the restarted manager on a change stream again, at once: the manager,
    // taking no crowd of agents back, welcomed it so in its announce's answer (before, the
    // agent waited 15-30 s for its long polls there to settle).
    cluster.members[0].wait_until("the agent follows a change stream again", Duration::from_secs(60), |fleetd| {
        fleet_e2e::metric_value(&fleetd.metrics(), "fleet_pull_agents_streaming") == Some(1.0)
    });
    assert!(pull.log().contains("the manager welcomes this agent's change stream again at once"), "{}", pull.log());
}

/// A pull fleetd whose manager refuses its registration token says why and exits: a refusal
/// is an answer, not an outage to wait out.
#[test]
fn a_pull_fleetd_refused_at_its_join_says_why_and_exits() {
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let _manager = Fleetd::start("e2e0manager00031", &pairs(&config));
    let manager_url = format!("https://localhost:{port}");
    let mut pull = PullFleetd::start(&manager_url, &pki.api_ca_file, Some("fleet-reg-not-one-it-made"), None, &[]);
    let mut child = pull.child.take().expect("running");
    let status = fleet_e2e::exit_within(&mut child, Duration::from_secs(30));
    assert!(status.is_some_and(|status| !status.success()), "{status:?}\n{}", pull.log());
    assert!(pull.log().contains("joining the cluster: "), "{}", pull.log());
    assert!(!pull.log().contains("joining the cluster failed; trying again"), "{}", pull.log());
}
