//! The cluster's counts for `/metrics`, from the snapshot the engine planned from: a pure
//! count over what the leader holds anyway, so no fleetd reads the store to be scraped.

use std::collections::HashMap;

use fleet_core::schedule::{ClusterSnapshot, Plan, UnplacedReason};
use fleet_metrics::{ClusterCounts, MachineFill};

/// Machines, units by desired state, the units the plan could put nowhere (and of those the
/// ones short of room), the units that cannot leave a drained machine, and each machine's
/// capacity, what the plan leaves reserved there and its drain.
pub fn cluster_counts(cluster: &ClusterSnapshot, plan: &Plan) -> ClusterCounts {
    let mut counts = ClusterCounts {
        machines: cluster.machines.len() as u64,
        unplaced: plan.unplaced.len() as u64,
        unplaced_for_room: plan
            .unplaced
            .iter()
            .filter(|(_, reason)| matches!(reason, UnplacedReason::NoRoom { .. }))
            .count() as u64,
        stuck_draining: plan.stuck.len() as u64,
        ..ClusterCounts::default()
    };
    for unit in &cluster.units {
        *counts.units_by_desired_state.entry(unit.desired.as_str().to_string()).or_default() += 1;
    }
    let machines: HashMap<&str, _> = cluster.machines.iter().map(|machine| (machine.id.as_str(), machine)).collect();
    counts.fill = plan
        .loads
        .iter()
        .map(|load| MachineFill {
            machine: load.machine.clone(),
            capacity: machines
                .get(load.machine.as_str())
                .and_then(|machine| machine.capacity)
                .map(|c| (c.memory, c.cpu_millis)),
            reserved: (load.reserved.memory, load.reserved.cpu_millis),
            draining: machines
                .get(load.machine.as_str())
                .and_then(|machine| machine.drain.as_ref())
                .map(|drain| drain.released.len() as u64),
        })
        .collect();
    counts
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleet_core::schedule::UnitSpec;
    use fleet_core::schedule::plan;
    use fleet_core::{DesiredState, MachineState, Requirements, Resources, UnitFile};

    use super::*;

    fn unit(name: &str, desired: DesiredState, x_fleet: &str) -> UnitSpec {
        let file =
            UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{x_fleet}\n")).expect("valid unit");
        UnitSpec {
            name: name.into(),
            desired,
            requirements: Arc::new(Requirements::from_unit(name, &file)),
            scheduled_on: None,
        }
    }

    #[test]
    fn counts_machines_units_by_desired_state_the_unplaced_and_each_machines_fill() {
        let machine = MachineState {
            id: "m1".into(),
            capacity: Some(Resources { memory: 4 << 30, cpu_millis: 2000 }),
            ..MachineState::default()
        };
        let cluster = ClusterSnapshot {
            machines: vec![machine, MachineState { id: "m2".into(), ..MachineState::default() }],
            units: vec![
                unit("a.service", DesiredState::Launched, "Memory=1G"),
                unit("b.service", DesiredState::Launched, "Memory=8G"),
                unit("c.service", DesiredState::Inactive, ""),
            ],
            ..ClusterSnapshot::default()
        };
        let counts = cluster_counts(&cluster, &plan(&cluster));
        assert_eq!(counts.machines, 2);
        assert_eq!((counts.unplaced, counts.unplaced_for_room), (0, 0), "m2 limits nothing");
        assert_eq!(counts.units_by_desired_state.get("launched"), Some(&2));
        assert_eq!(counts.units_by_desired_state.get("inactive"), Some(&1));
        assert_eq!(counts.units_by_desired_state.get("loaded"), None);
        let fill = &counts.fill;
        assert_eq!(
            fill[0],
            MachineFill {
                machine: "m1".into(),
                capacity: Some((4 << 30, 2000)),
                reserved: (1 << 30, 0),
                draining: None
            }
        );
        assert_eq!(
            fill[1],
            MachineFill { machine: "m2".into(), capacity: None, reserved: (8 << 30, 0), draining: None }
        );
        let bounded = ClusterSnapshot { machines: cluster.machines[..1].to_vec(), ..cluster };
        let counts = cluster_counts(&bounded, &plan(&bounded));
        assert_eq!((counts.unplaced, counts.unplaced_for_room), (1, 1), "8G fits nowhere");
    }
}
