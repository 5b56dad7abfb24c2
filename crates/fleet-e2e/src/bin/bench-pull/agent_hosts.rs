//! Where the bench's pull agents run: all in the bench's process, or, past what one process
//! may hold open (20,000 files here, each agent a connection or two), spread over child
//! processes of the bench (`bench-pull --agent-process FIRST COUNT`), each the same agent
//! code with its own connections.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fleet_agent::{Agent, AgentConfig, Lifecycle};
use fleet_core::MachineState;
use fleet_pull_agent::MachineCredentials;
use fleet_registry::{AgentRegistry, ChangeSignal};
use fleet_testkit::FakeUnitManager;
use tokio::sync::{Semaphore, watch};

/// How many agents join at once in one process (agents join on their own; the bench bounds them).
const JOINERS: usize = 128;

/// What a child process of agents is told, by environment.
const URLS: &str = "BENCH_PULL_URLS";
const CA_FILE: &str = "BENCH_PULL_CA_FILE";
const TOKEN: &str = "BENCH_PULL_TOKEN";
const HEARTBEAT: &str = "BENCH_PULL_HEARTBEAT_MS";
const IDLE_HEARTBEAT: &str = "BENCH_PULL_IDLE_HEARTBEAT_MS";

pub fn agent_id(index: usize) -> String {
    format!("pull{index:06}")
}

/// How the bench's agents reach their managers.
#[derive(Clone)]
pub struct Reach {
    pub urls: String,
    pub ca_file: std::path::PathBuf,
    pub token: String,
    /// How often an agent beats while its presence must be proven (a third of `agent_ttl`),
    /// and while idle (`agent_heartbeat`).
    pub heartbeat: Duration,
    pub idle_heartbeat: Duration,
}

impl Reach {
    fn manager(&self) -> Arc<fleet_pull_agent::Manager> {
        let ca = std::fs::read(&self.ca_file).expect("the API CA");
        let manager = fleet_pull_agent::Manager::new(&self.urls, Some(ca), Duration::from_secs(30)).expect("manager");
        Arc::new(manager.with_heartbeat(self.heartbeat).with_idle_heartbeat(self.idle_heartbeat))
    }
}

/// Joins agents `range` (certificates signed), at most [`JOINERS`] at once; of each, what
/// `keep` makes of its credentials.
async fn join<T: Send + 'static>(
    manager: &Arc<fleet_pull_agent::Manager>,
    token: &str,
    range: std::ops::Range<usize>,
    keep: fn(usize, MachineCredentials) -> T,
) -> Vec<T> {
    let permits = Arc::new(Semaphore::new(JOINERS));
    let mut joins = tokio::task::JoinSet::new();
    for index in range {
        let (manager, token, permits) = (manager.clone(), token.to_string(), permits.clone());
        joins.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore");
            let mut tries = 0;
            loop {
                match manager.join(&token, &agent_id(index)).await {
                    Ok((credentials, _)) => break keep(index, credentials),
                    Err(fleet_pull_agent::ManagerError::Unreachable(error)) if tries < 20 => {
                        tries += 1;
                        eprintln!("    join of {} retried: {error}", agent_id(index));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => panic!("join: {error}"),
                }
            }
        });
    }
    let mut joined = Vec::new();
    while let Some(result) = joins.join_next().await {
        joined.push(result.expect("a join"));
    }
    joined
}

/// Joins agents `range` as [`join`] does and keeps nothing of them: each join opens a
/// connection of its own and closes it (a real agent's first request), so that more joins
/// than a process may hold connections can be measured. How many joined.
pub async fn join_only(reach: &Reach, range: std::ops::Range<usize>) -> usize {
    join(&reach.manager(), &reach.token, range, |_, _| ()).await.len()
}

/// Starts the agents `joined`, each the real agent code on its own remote store with a
/// simulated unit manager: the signals that move when each is told of a change.
fn start(
    manager: &Arc<fleet_pull_agent::Manager>,
    joined: &[(usize, MachineCredentials)],
    lifecycle: &watch::Receiver<Lifecycle>,
) -> Vec<ChangeSignal> {
    let mut signals = Vec::with_capacity(joined.len());
    for (index, credentials) in joined {
        let registry = fleet_pull_agent::RemoteRegistry::new(manager, credentials, None).expect("remote store");
        fleet_pull_agent::start(&registry);
        signals.push(registry.machine_changes(&agent_id(*index)));
        let config = AgentConfig {
            machine: MachineState {
                id: agent_id(*index),
                public_ip: format!("10.{}.{}.{}", index / 65536, (index / 256) % 256, index % 256),
                metadata: [("role".to_string(), "worker".to_string())].into(),
                version: "bench".into(),
                disable_engine: true,
                connection: fleet_core::Connection::Pull,
                capacity: None,
                drain: None,
                taints: Default::default(),
            },
            // As fleetd's pull mode: changes come on the change stream; the fallback is a safety net.
            // fleetd's pull mode's (`reconcile_timing::PULL_RECONCILE_INTERVAL`).
            reconcile_interval: Duration::from_secs(300),
            debounce: Duration::from_millis(10),
            presence_ttl: None,
            stop_units_when_cut_off: false,
        };
        tokio::spawn(Agent::new(config, registry, Arc::new(FakeUnitManager::new())).run(lifecycle.clone()));
    }
    signals
}

/// The bench's agents, wherever they run.
pub enum AgentHosts {
    /// In the bench's process: the signals each agent's changes move.
    InProcess { signals: Vec<ChangeSignal>, _lifecycle: watch::Sender<Lifecycle> },
    /// In child processes, each ended when the bench drops it (its input closes).
    Children(Vec<Child>),
}

impl AgentHosts {
    /// Joins `agents` agents (the returned time: until all are joined), then starts them, in
    /// this process or, past `per_process`, in child processes of `per_process` agents each.
    pub async fn join_and_start(reach: &Reach, agents: usize, per_process: usize) -> (Self, Duration) {
        let joining = std::time::Instant::now();
        if agents <= per_process {
            let manager = reach.manager();
            let joined = join(&manager, &reach.token, 0..agents, |index, credentials| (index, credentials)).await;
            let joined_in = joining.elapsed();
            let (lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
            let signals = start(&manager, &joined, &lifecycle_watch);
            return (AgentHosts::InProcess { signals, _lifecycle: lifecycle }, joined_in);
        }
        let mut children = Vec::new();
        let mut outputs: Vec<BufReader<ChildStdout>> = Vec::new();
        for first in (0..agents).step_by(per_process) {
            let count = per_process.min(agents - first);
            let mut child = Command::new(std::env::current_exe().expect("the bench's own path"))
                .args(["--agent-process", &first.to_string(), &count.to_string()])
                .env(URLS, &reach.urls)
                .env(CA_FILE, &reach.ca_file)
                .env(TOKEN, &reach.token)
                .env(HEARTBEAT, reach.heartbeat.as_millis().to_string())
                .env(IDLE_HEARTBEAT, reach.idle_heartbeat.as_millis().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a process of agents");
            outputs.push(BufReader::new(child.stdout.take().expect("its output")));
            children.push(child);
        }
        // Each says `joined` once its agents are, then `started`.
        let joined_in = tokio::task::block_in_place(|| {
            let mut joined_in = Duration::ZERO;
            for word in ["joined", "started"] {
                for output in &mut outputs {
                    let mut line = String::new();
                    output.read_line(&mut line).expect("a process of agents speaks");
                    assert_eq!(line.trim(), word, "a process of agents failed");
                }
                if word == "joined" {
                    joined_in = joining.elapsed();
                }
            }
            joined_in
        });
        (AgentHosts::Children(children), joined_in)
    }

    /// The signals of in-process agents (none for agents in child processes).
    pub fn signals(&mut self) -> Option<&mut Vec<ChangeSignal>> {
        match self {
            AgentHosts::InProcess { signals, .. } => Some(signals),
            AgentHosts::Children(_) => None,
        }
    }

    /// The process IDs the agents run in.
    pub fn pids(&self) -> Vec<u32> {
        match self {
            AgentHosts::InProcess { .. } => vec![std::process::id()],
            AgentHosts::Children(children) => children.iter().map(Child::id).collect(),
        }
    }
}

impl Drop for AgentHosts {
    fn drop(&mut self) {
        if let AgentHosts::Children(children) = self {
            for child in children {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `bench-pull --agent-process FIRST COUNT`: joins and runs agents FIRST.. (COUNT of them) as
/// the environment says, until its input closes.
pub fn run_agent_process(first: usize, count: usize) {
    // RUST_LOG=fleet_pull_agent=warn shows these agents' failovers and failures (on standard
    // error: standard output speaks to the bench).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let variable = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let reach = Reach {
        urls: variable(URLS),
        ca_file: variable(CA_FILE).into(),
        token: variable(TOKEN),
        heartbeat: Duration::from_millis(variable(HEARTBEAT).parse().expect("a heartbeat in ms")),
        idle_heartbeat: Duration::from_millis(variable(IDLE_HEARTBEAT).parse().expect("a heartbeat in ms")),
    };
    // Ten such processes on a machine of about 4,900 tasks: the agents' name lookups (a
    // blocking thread each, 512 a process by default) are bounded.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let manager = reach.manager();
        let joined =
            join(&manager, &reach.token, first..first + count, |index, credentials| (index, credentials)).await;
        let say = |word: &str| {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{word}").and_then(|()| out.flush()).expect("tell the bench");
        };
        say("joined");
        let (_lifecycle, lifecycle_watch) = watch::channel(Lifecycle::Running);
        let _signals = start(&manager, &joined, &lifecycle_watch);
        say("started");
        // Until the bench ends: its end closes this input.
        tokio::task::spawn_blocking(|| {
            let mut rest = String::new();
            let _ = std::io::stdin().read_line(&mut rest);
        })
        .await
        .expect("wait for the bench");
    });
}
