//! fleetd's metrics for Prometheus: one process-wide set that the engine, the agent, the
//! stores and the API add to as they work, and [`render`] to write them, with the cluster's
//! counts and the process's figures taken at scrape time, in the OpenMetrics text format.
//!
//! Counting is the only side effect here: nothing reads these values to decide anything.

#![forbid(unsafe_code)]

mod cluster;
mod process;

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

pub use cluster::{ClusterCounts, MachineFill, publish_cluster, publish_unit_states};

/// The content type of [`render`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of [`to_classic_text`]'s text, for scrapers that do not ask for OpenMetrics.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `schedule` or `unschedule`.
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    /// `succeeded`, `failed`, `lost` or `stopped`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// `missed`, `overlap` or `too_soon`.
    pub why: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlanLabels {
    /// `full` (every unit planned), `changed` (only what changed since the last plan) or
    /// `skipped` (only units' contents changed and their placement rules did not: no plan).
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// `load`, `start`, `stop`, `unload`, `reload` (what the agent asked its unit manager).
    pub task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `etcd` or `embedded`.
    pub store: &'static str,
    /// The kind of request: `txn`, `range`, `watch`, `lease_grant`, `lease_revoke`,
    /// `lease_keepalive` (etcd), `read`, `write` (embedded).
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's pattern (`/fleet/v1/units/{unit}`), never the path itself, so that the
    /// number of series stays bounded whatever clients send.
    pub endpoint: &'static str,
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// `full` (certificates sent and checked) or `resumed` (a session an earlier handshake began).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    pub endpoint: &'static str,
    pub method: String,
    pub code: u16,
}

/// The engine's reconciler.
pub struct EngineMetrics {
    pub reconciles: Counter,
    pub reconcile_duration: Histogram,
    /// 1 while this fleetd's engine holds the leadership.
    pub leader: Gauge,
    pub decisions: Family<DecisionLabels, Counter>,
    pub plans: Family<PlanLabels, Counter>,
    /// Runs of units on a calendar that ended, by result (counted by the leader that saw the
    /// end).
    pub runs: Family<RunLabels, Counter>,
    /// How long the runs that ended ran, start to end.
    pub run_duration: Histogram,
    /// Elapses of units on a calendar skipped, by why.
    pub elapses_skipped: Family<SkipLabels, Counter>,
}

/// The agent's reconciler.
pub struct AgentMetrics {
    /// Passes of the agent's reconciler: how often it looked at its work.
    pub passes: Counter,
    /// Of those, the passes woken by a health flip alone that only reported.
    pub report_passes: Counter,
    pub tasks: Family<TaskLabels, Counter>,
    pub task_failures: Family<TaskLabels, Counter>,
    /// Units the agent holds on its machine.
    pub units: Gauge,
    /// Units found drifted (stopped, edited or removed outside fleet), corrected or not.
    pub drifts: Counter,
    /// Drifted units the agent put back.
    pub drift_corrections: Counter,
    /// Units on this machine whose health checks find them unhealthy now.
    pub units_unhealthy: Gauge,
    /// Restarts of units their health checks found unhealthy (`HealthCheckRestart=`).
    pub health_restarts: Counter,
    /// Health check probes made.
    pub health_probes: Counter,
    /// Agents (in this process) that cannot read their machine's work now: their presence
    /// lapsed and the store does not yet show the work since they registered again.
    pub work_unreadable: Gauge,
}

/// Requests to the store, whichever it is.
pub struct StoreMetrics {
    pub request_duration: Family<StoreLabels, Histogram>,
    pub request_errors: Family<StoreLabels, Counter>,
    /// Seconds bulk writes waited for the store to catch up with what it committed.
    pub writes_held: Counter<f64, std::sync::atomic::AtomicU64>,
}

/// The HTTP API.
pub struct ApiMetrics {
    pub requests: Family<ResponseLabels, Counter>,
    pub request_duration: Family<RouteLabels, Histogram>,
    /// TLS handshakes completed, full or resumed.
    pub tls_handshakes: Family<HandshakeLabels, Counter>,
}

/// A manager's pull agents.
pub struct PullMetrics {
    /// Agents heard from within their presence window.
    pub agents_present: Gauge,
    /// Agents waiting on a long poll for changes now.
    pub waiting: Gauge,
    /// Agents following their changes on a change stream now.
    pub streaming: Gauge,
    pub joins: Counter,
    /// Announcements of pull agents this manager took (each agent's first after this manager
    /// started, and each after the cluster lost it).
    pub announcements: Counter,
    /// Batches of joins written again because another manager's joins (or any write to a
    /// key they compare) landed between their read and their write.
    pub join_races_lost: Counter,
    /// Lines of changes that carried the work on a change stream.
    pub stream_works: Counter,
    /// States lines agents wrote on their change streams.
    pub stream_states: Counter,
    /// Heartbeats agents sent on their change streams (each answered).
    pub stream_heartbeats: Counter,
}

pub struct Metrics {
    registry: Registry,
    pub engine: EngineMetrics,
    pub agent: AgentMetrics,
    pub store: StoreMetrics,
    pub api: ApiMetrics,
    pub pull: PullMetrics,
}

fn latency_histogram() -> Histogram {
    // 0.25 ms to about 8 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let engine = EngineMetrics {
            reconciles: Counter::default(),
            reconcile_duration: latency_histogram(),
            leader: Gauge::default(),
            decisions: Family::default(),
            plans: Family::default(),
            runs: Family::default(),
            // 0.1 s to about 27 h.
            run_duration: Histogram::new(exponential_buckets(0.1, 3.0, 14)),
            elapses_skipped: Family::default(),
        };
        let agent = AgentMetrics {
            passes: Counter::default(),
            report_passes: Counter::default(),
            tasks: Family::default(),
            task_failures: Family::default(),
            units: Gauge::default(),
            drifts: Counter::default(),
            drift_corrections: Counter::default(),
            units_unhealthy: Gauge::default(),
            health_restarts: Counter::default(),
            health_probes: Counter::default(),
            work_unreadable: Gauge::default(),
        };
        let store = StoreMetrics {
            request_duration: Family::new_with_constructor(latency_histogram),
            request_errors: Family::default(),
            writes_held: Counter::default(),
        };
        let api = ApiMetrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            tls_handshakes: Family::default(),
        };
        let pull = PullMetrics {
            agents_present: Gauge::default(),
            waiting: Gauge::default(),
            streaming: Gauge::default(),
            joins: Counter::default(),
            announcements: Counter::default(),
            join_races_lost: Counter::default(),
            stream_works: Counter::default(),
            stream_states: Counter::default(),
            stream_heartbeats: Counter::default(),
        };
        let fleet = registry.sub_registry_with_prefix("fleet");
        fleet.register("engine_reconciles", "Reconciles the engine ran", engine.reconciles.clone());
        fleet.register_with_unit(
            "engine_reconcile_duration",
            "How long each engine reconcile took",
            Unit::Seconds,
            engine.reconcile_duration.clone(),
        );
        fleet.register("engine_leader", "1 while this fleetd's engine is the cluster's leader", engine.leader.clone());
        fleet.register("engine_decisions", "Units the engine scheduled or unscheduled", engine.decisions.clone());
        fleet.register(
            "engine_plans",
            "Plans the engine made, of every unit or of what changed, and those it skipped",
            engine.plans.clone(),
        );
        fleet.register("scheduled_runs", "Runs of units on a calendar that ended, by result", engine.runs.clone());
        fleet.register_with_unit(
            "scheduled_run_duration",
            "How long the runs of units on a calendar ran",
            Unit::Seconds,
            engine.run_duration.clone(),
        );
        fleet.register(
            "scheduled_elapses_skipped",
            "Elapses of units on a calendar skipped, by why",
            engine.elapses_skipped.clone(),
        );
        fleet.register("agent_passes", "Passes of the agent over its machine's work", agent.passes.clone());
        fleet.register(
            "agent_report_passes",
            "Passes of the agent woken by a health flip alone that only reported its units' states",
            agent.report_passes.clone(),
        );
        fleet.register("agent_tasks", "Tasks the agent gave its unit manager", agent.tasks.clone());
        fleet.register("agent_task_failures", "Tasks of the agent that failed", agent.task_failures.clone());
        fleet.register("agent_units", "Units the agent holds on this machine", agent.units.clone());
        fleet.register("agent_drifts", "Units found drifted from what fleet made them", agent.drifts.clone());
        fleet.register("agent_drift_corrections", "Drifted units the agent put back", agent.drift_corrections.clone());
        fleet.register(
            "agent_units_unhealthy",
            "Units on this machine its health checks find unhealthy",
            agent.units_unhealthy.clone(),
        );
        fleet.register(
            "agent_health_restarts",
            "Units restarted because their health checks found them unhealthy",
            agent.health_restarts.clone(),
        );
        fleet.register("agent_health_probes", "Health check probes made", agent.health_probes.clone());
        fleet.register(
            "agent_work_unreadable",
            "Agents that cannot read their machine's work now (its presence lapsed and the store does not yet show the work since it registered again): such a machine runs nothing meanwhile",
            agent.work_unreadable.clone(),
        );
        fleet.register_with_unit(
            "store_request_duration",
            "How long requests to the store took",
            Unit::Seconds,
            store.request_duration.clone(),
        );
        fleet.register("store_request_errors", "Requests to the store that failed", store.request_errors.clone());
        fleet.register_with_unit(
            "store_writes_held",
            "How long bulk writes waited for the store to catch up with what it committed",
            Unit::Seconds,
            store.writes_held.clone(),
        );
        fleet.register("api_requests", "API requests answered, by endpoint and status", api.requests.clone());
        fleet.register_with_unit(
            "api_request_duration",
            "How long API requests took to answer",
            Unit::Seconds,
            api.request_duration.clone(),
        );
        fleet.register(
            "api_tls_handshakes",
            "TLS handshakes the API completed, full or resuming a session",
            api.tls_handshakes.clone(),
        );
        fleet.register(
            "pull_agents_present",
            "Pull agents heard from within their presence window",
            pull.agents_present.clone(),
        );
        fleet.register("pull_agents_waiting", "Pull agents waiting on a long poll for changes", pull.waiting.clone());
        fleet.register(
            "pull_agents_streaming",
            "Pull agents following their changes on a change stream",
            pull.streaming.clone(),
        );
        fleet.register("pull_agent_joins", "Machines that joined through this manager", pull.joins.clone());
        fleet.register(
            "pull_agent_announcements",
            "Announcements of pull agents this manager took",
            pull.announcements.clone(),
        );
        fleet.register(
            "pull_join_races_lost",
            "Batches of joins written again after another write to a key they compare landed first",
            pull.join_races_lost.clone(),
        );
        fleet.register(
            "pull_stream_works",
            "Changes whose work a change stream carried to its agent",
            pull.stream_works.clone(),
        );
        fleet.register(
            "pull_stream_states",
            "States reports pull agents sent on their change streams",
            pull.stream_states.clone(),
        );
        fleet.register(
            "pull_stream_heartbeats",
            "Heartbeats pull agents sent on their change streams",
            pull.stream_heartbeats.clone(),
        );
        Self { registry, engine, agent, store, api, pull }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl StoreMetrics {
    /// Records one request to the store.
    pub fn observe(&self, store: &'static str, operation: &'static str, took: Duration, failed: bool) {
        let labels = StoreLabels { store, operation };
        self.request_duration.get_or_create(&labels).observe(took.as_secs_f64());
        if failed {
            self.request_errors.get_or_create(&labels).inc();
        }
    }
}

/// Counts one open long poll or change stream in its gauge while it lives (a client that
/// goes away drops it, and the count with it).
pub struct OpenNow(&'static Gauge);

impl OpenNow {
    /// A long poll, in [`PullMetrics::waiting`].
    pub fn long_poll() -> Self {
        Self::counted(&metrics().pull.waiting)
    }

    /// A change stream, in [`PullMetrics::streaming`].
    pub fn change_stream() -> Self {
        Self::counted(&metrics().pull.streaming)
    }

    fn counted(gauge: &'static Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for OpenNow {
    fn drop(&mut self) {
        self.0.dec();
    }
}

static BUILD: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// What this process is (`version`, `commit`, `store_format`), shown as `fleet_build_info`;
/// set once, at start.
pub fn set_build_info(labels: &[(&str, &str)]) {
    let _ = BUILD.set(labels.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect());
}

/// Everything in the text format: this process's metrics, then what the engine and the agent
/// published of the cluster and this machine, and the process's figures.
pub fn render() -> String {
    use prometheus_client::encoding::text::{encode_eof, encode_registry};
    let mut text = String::new();
    let mut scraped = Registry::default();
    if let Some(build) = BUILD.get() {
        // A gauge of 1 labelled with what it is (the classic text format has no info type).
        let info = Family::<Vec<(String, String)>, Gauge>::default();
        info.get_or_create(build).set(1);
        scraped.sub_registry_with_prefix("fleet").register(
            "build_info",
            "What this fleetd is: its version, the commit it was built from, its store format",
            info,
        );
    }
    cluster::register_published(scraped.sub_registry_with_prefix("fleet"));
    process::register(&mut scraped);
    // Writing to a String cannot fail.
    let _ = encode_registry(&mut text, &metrics().registry);
    let _ = encode_registry(&mut text, &scraped);
    let _ = encode_eof(&mut text);
    text
}

/// Whether a scraper's `Accept` header asks for OpenMetrics (Prometheus does; curl does not).
pub fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|kind| kind.trim_start().starts_with("application/openmetrics-text"))
}

/// [`render`]'s OpenMetrics text in the classic Prometheus text format (0.0.4): counter
/// families are named with their `_total` suffix, and there are no `# UNIT` or `# EOF` lines.
pub fn to_classic_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            help = Some(line);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let classic = if kind == "counter" { format!("{name}_total") } else { name.to_string() };
            if let Some(help) = help.take() {
                let text =
                    help.strip_prefix("# HELP ").and_then(|rest| rest.split_once(' ')).map_or("", |(_, text)| text);
                out.push_str(&format!("# HELP {classic} {text}\n"));
            }
            out.push_str(&format!("# TYPE {classic} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_follow_the_naming_conventions() {
        metrics().engine.reconciles.inc();
        metrics().store.observe("etcd", "txn", Duration::from_millis(3), true);
        publish_cluster(Some(ClusterCounts::default()));
        let text = render();
        assert!(text.contains("# TYPE fleet_engine_reconciles counter\n"), "{text}");
        assert!(text.contains("fleet_engine_reconciles_total "), "{text}");
        assert!(text.contains("fleet_store_request_errors_total{store=\"etcd\",operation=\"txn\"} 1"), "{text}");
        assert!(text.contains("fleet_store_request_duration_seconds_bucket{"), "{text}");
        assert!(text.contains("fleet_machines 0"), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        let classic = to_classic_text(&text);
        assert!(classic.contains("# HELP fleet_engine_reconciles_total Reconciles the engine ran.\n# TYPE fleet_engine_reconciles_total counter\n"), "{classic}");
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        assert!(wants_openmetrics("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"));
        assert!(!wants_openmetrics("*/*"));
    }
}
