//! The cluster's counts for `/metrics`, from the snapshot the engine planned from: a pure
//! count over what the leader holds anyway, so no fleetd reads the store to be scraped.

use fleet_core::schedule::ClusterSnapshot;
use fleet_metrics::ClusterCounts;

/// Machines, units by desired state, and `unplaced` (the units the plan could put nowhere).
pub fn cluster_counts(cluster: &ClusterSnapshot, unplaced: usize) -> ClusterCounts {
    let mut counts = ClusterCounts {
        machines: cluster.machines.len() as u64,
        unplaced: unplaced as u64,
        ..ClusterCounts::default()
    };
    for unit in &cluster.units {
        *counts.units_by_desired_state.entry(unit.desired.as_str().to_string()).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleet_core::schedule::UnitSpec;
    use fleet_core::{DesiredState, MachineState, Requirements, UnitFile};

    use super::*;

    fn unit(name: &str, desired: DesiredState) -> UnitSpec {
        let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").expect("valid unit");
        UnitSpec {
            name: name.into(),
            desired,
            requirements: Arc::new(Requirements::from_unit(name, &file)),
            scheduled_on: None,
        }
    }

    #[test]
    fn counts_machines_units_by_desired_state_and_the_unplaced() {
        let machine = MachineState { id: "m1".into(), ..MachineState::default() };
        let cluster = ClusterSnapshot {
            machines: vec![machine],
            units: vec![
                unit("a.service", DesiredState::Launched),
                unit("b.service", DesiredState::Launched),
                unit("c.service", DesiredState::Inactive),
            ],
            ..ClusterSnapshot::default()
        };
        let counts = cluster_counts(&cluster, 1);
        assert_eq!(counts.machines, 1);
        assert_eq!(counts.unplaced, 1);
        assert_eq!(counts.units_by_desired_state.get("launched"), Some(&2));
        assert_eq!(counts.units_by_desired_state.get("inactive"), Some(&1));
        assert_eq!(counts.units_by_desired_state.get("loaded"), None);
    }
}
