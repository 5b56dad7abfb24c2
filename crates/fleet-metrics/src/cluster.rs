//! What this fleetd knows of the cluster without reading the store at scrape time: the
//! cluster's counts, which the engine leader publishes from the snapshot it planned from (only
//! the leader reports them: take them from the instance with `fleet_engine_leader` 1), and the
//! unit states of this machine, which its agent publishes as it reports them (sum them over
//! instances for the cluster). A scrape costs the store nothing, whatever the cluster's size.

use fleet_core::unpoisoned::Locked;
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
    /// Of those, the ones that wait only for room (their reservation fits on no machine
    /// their rules allow).
    pub unplaced_for_room: u64,
    /// Units a drain let go that have nowhere else to go.
    pub stuck_draining: u64,
    /// Each machine's capacity and what the plan leaves reserved there.
    pub fill: Vec<MachineFill>,
}

/// One machine's capacity (when it states one) and what is reserved there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFill {
    pub machine: String,
    /// Bytes and thousandths of a core.
    pub capacity: Option<(u64, u64)>,
    pub reserved: (u64, u64),
    /// While the machine is drained: how many of its units are moving (let go, not yet
    /// running elsewhere).
    pub draining: Option<u64>,
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
    PUBLISHED.locked()
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
struct MachineLabels {
    machine: String,
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
        registry.register(
            "units_unplaced_for_room",
            "Unplaced units whose reservation fits on no machine their rules allow (reported by the engine leader)",
            gauge(self.unplaced_for_room),
        );
        registry.register(
            "units_stuck_draining",
            "Units a drain let go that have nowhere else to go (reported by the engine leader)",
            gauge(self.stuck_draining),
        );
        let family = || Family::<MachineLabels, Gauge>::default();
        let (capacity_memory, capacity_cpu, reserved_memory, reserved_cpu) = (family(), family(), family(), family());
        let (draining, moving) = (family(), family());
        for fill in &self.fill {
            let labels = MachineLabels { machine: fill.machine.clone() };
            if let Some((memory, cpu)) = fill.capacity {
                capacity_memory.get_or_create(&labels).set(as_i64(memory));
                capacity_cpu.get_or_create(&labels).set(as_i64(cpu));
            }
            reserved_memory.get_or_create(&labels).set(as_i64(fill.reserved.0));
            reserved_cpu.get_or_create(&labels).set(as_i64(fill.reserved.1));
            draining.get_or_create(&labels).set(i64::from(fill.draining.is_some()));
            if let Some(count) = fill.draining {
                moving.get_or_create(&labels).set(as_i64(count));
            }
        }
        registry.register(
            "machine_draining",
            "1 while a machine is drained: it takes no new units (reported by the engine leader)",
            draining,
        );
        registry.register(
            "machine_drain_units_moving",
            "Units a drained machine let go that do not run elsewhere yet (reported by the engine leader)",
            moving,
        );
        registry.register(
            "machine_capacity_memory_bytes",
            "Memory a machine offers units that reserve some (reported by the engine leader)",
            capacity_memory,
        );
        registry.register(
            "machine_capacity_cpu_millicores",
            "CPU a machine offers units that reserve some, in thousandths of a core (reported by the engine leader)",
            capacity_cpu,
        );
        registry.register(
            "machine_reserved_memory_bytes",
            "Memory the units on a machine reserve (reported by the engine leader)",
            reserved_memory,
        );
        registry.register(
            "machine_reserved_cpu_millicores",
            "CPU the units on a machine reserve, in thousandths of a core (reported by the engine leader)",
            reserved_cpu,
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
