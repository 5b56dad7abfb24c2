//! What this fleetd knows of the cluster without reading the store at scrape time: the
//! cluster's counts, which the engine leader publishes from the snapshot it planned from (only
//! the leader reports them: take them from the instance with `fleet_engine_leader` 1), and the
//! unit states of this machine, which its agent publishes as it reports them (sum them over
//! instances for the cluster). A scrape costs the store nothing, whatever the cluster's size.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    pub machines: u64,
    /// Units by desired state (`inactive`, `loaded`, `launched`).
    pub units_by_desired_state: BTreeMap<String, u64>,
    /// Units that should be on a machine and are on none (global units excluded).
    pub unplaced: u64,
}

/// What the engine and the agent last published.
#[derive(Default)]
struct Published {
    cluster: Option<ClusterCounts>,
    /// This machine's units by systemd active state (`active`, `failed`, ...).
    unit_states: BTreeMap<String, u64>,
}

static PUBLISHED: Mutex<Published> = Mutex::new(Published { cluster: None, unit_states: BTreeMap::new() });

fn published() -> std::sync::MutexGuard<'static, Published> {
    PUBLISHED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The engine leader's counts of the cluster; `None` when this fleetd does not lead.
pub fn publish_cluster(counts: Option<ClusterCounts>) {
    published().cluster = counts;
}

/// This machine's units by systemd active state, as its agent last reported them.
pub fn publish_unit_states(by_active_state: BTreeMap<String, u64>) {
    published().unit_states = by_active_state;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DesiredStateLabels {
    desired_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActiveStateLabels {
    active_state: String,
}

fn gauge(value: u64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(as_i64(value));
    gauge
}

impl ClusterCounts {
    fn register(&self, registry: &mut Registry) {
        registry.register("machines", "Machines in the cluster (reported by the engine leader)", gauge(self.machines));
        let desired = Family::<DesiredStateLabels, Gauge>::default();
        // Every desired state is shown, at 0 when no unit has it, so that a series never vanishes.
        for state in ["inactive", "loaded", "launched"] {
            desired.get_or_create(&DesiredStateLabels { desired_state: state.to_string() }).set(0);
        }
        for (state, count) in &self.units_by_desired_state {
            desired.get_or_create(&DesiredStateLabels { desired_state: state.clone() }).set(as_i64(*count));
        }
        registry.register("units", "Units in the cluster by desired state (reported by the engine leader)", desired);
        registry.register(
            "units_unplaced",
            "Units that should run on a machine and are on none (reported by the engine leader)",
            gauge(self.unplaced),
        );
    }
}

/// Registers what was published into `registry` (prefixed `fleet_` by the caller).
pub(crate) fn register_published(registry: &mut Registry) {
    let published = published();
    if let Some(cluster) = &published.cluster {
        cluster.register(registry);
    }
    let active = Family::<ActiveStateLabels, Gauge>::default();
    for (state, count) in &published.unit_states {
        active.get_or_create(&ActiveStateLabels { active_state: state.clone() }).set(as_i64(*count));
    }
    registry.register("unit_states", "Units on this machine by systemd active state", active);
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
