//! The cluster as the store holds it, counted at scrape time (every fleetd of a cluster
//! reports the same counts; take them from one).

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    pub machines: u64,
    /// Units by desired state (`inactive`, `loaded`, `launched`).
    pub units_by_desired_state: BTreeMap<String, u64>,
    /// Units on machines by systemd active state (`active`, `failed`, ...).
    pub unit_states_by_active_state: BTreeMap<String, u64>,
    /// Units that should be on a machine and are on none (global units excluded).
    pub unplaced: u64,
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
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register("machines", "Machines in the cluster", gauge(self.machines));
        let desired = Family::<DesiredStateLabels, Gauge>::default();
        // Every desired state is shown, at 0 when no unit has it, so that a series never vanishes.
        for state in ["inactive", "loaded", "launched"] {
            desired.get_or_create(&DesiredStateLabels { desired_state: state.to_string() }).set(0);
        }
        for (state, count) in &self.units_by_desired_state {
            desired.get_or_create(&DesiredStateLabels { desired_state: state.clone() }).set(as_i64(*count));
        }
        registry.register("units", "Units in the cluster by desired state", desired);
        let active = Family::<ActiveStateLabels, Gauge>::default();
        for (state, count) in &self.unit_states_by_active_state {
            active.get_or_create(&ActiveStateLabels { active_state: state.clone() }).set(as_i64(*count));
        }
        registry.register("unit_states", "Units on machines by systemd active state", active);
        registry.register("units_unplaced", "Units that should run on a machine and are on none", gauge(self.unplaced));
    }
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
