//! The cluster's counts for `/metrics`: a pure count over what the store holds, kept by
//! store revision so that scraping a cluster that did not change reads only the revision.

use fleet_core::state::{DesiredState, UnitState};
use fleet_metrics::ClusterCounts;
use fleet_registry::UnitView;

use crate::router::ApiState;

/// The cluster's counts from what the store holds.
pub fn cluster_counts(units: &[UnitView], states: &[UnitState], machines: usize) -> ClusterCounts {
    let mut counts = ClusterCounts { machines: machines as u64, ..ClusterCounts::default() };
    for unit in units {
        *counts.units_by_desired_state.entry(unit.desired.as_str().to_string()).or_default() += 1;
        if !unit.global && unit.desired != DesiredState::Inactive && unit.machine_id.is_none() {
            counts.unplaced += 1;
        }
    }
    for state in states {
        *counts.unit_states_by_active_state.entry(state.systemd.active.clone()).or_default() += 1;
    }
    counts
}

/// The cluster's counts at the store revision they were taken at: a scrape of a cluster that
/// did not change reads nothing but the revision.
#[derive(Default)]
pub struct CountsCache(std::sync::Mutex<Option<(u64, ClusterCounts)>>);

impl CountsCache {
    fn get(&self, revision: Option<u64>) -> Option<ClusterCounts> {
        let cached = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cached.as_ref().filter(|(at, _)| Some(*at) == revision).map(|(_, counts)| counts.clone())
    }

    fn put(&self, revision: Option<u64>, counts: &ClusterCounts) {
        let mut cached = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *cached = revision.map(|revision| (revision, counts.clone()));
    }
}

/// The cluster's counts, from the cache when the store did not move since.
pub async fn counts(state: &ApiState) -> Option<ClusterCounts> {
    let registry = &state.registry;
    let revision = registry.revision().await.ok().flatten();
    if let Some(counts) = state.counts_cache.get(revision) {
        return Some(counts);
    }
    // A store that does not answer leaves the cluster's counts out; this fleetd's own
    // figures (store errors among them) are what tells why.
    match tokio::try_join!(registry.units(), registry.unit_states(), registry.machines()) {
        Ok((units, states, machines)) => {
            let counts = cluster_counts(&units, &states, machines.len());
            state.counts_cache.put(revision, &counts);
            Some(counts)
        }
        Err(error) => {
            tracing::debug!(%error, "cluster counts left out of the metrics");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::state::SystemdState;
    use fleet_core::unit_file::UnitFile;

    fn unit(name: &str, desired: DesiredState, machine: Option<&str>, global: bool) -> UnitView {
        let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").expect("valid unit");
        UnitView {
            name: name.into(),
            hash: file.hash(),
            file,
            desired,
            current: None,
            machine_id: machine.map(str::to_string),
            global,
            reason: None,
            source: None,
            drift: Default::default(),
        }
    }

    #[test]
    fn counts_units_by_state_and_the_unplaced_ones() {
        let units = [
            unit("a.service", DesiredState::Launched, Some("m1"), false),
            unit("b.service", DesiredState::Launched, None, false),
            unit("c.service", DesiredState::Inactive, None, false),
            unit("d.service", DesiredState::Loaded, None, true),
        ];
        let states = [UnitState {
            name: "a.service".into(),
            machine_id: "m1".into(),
            hash: units[0].hash,
            systemd: SystemdState::new("loaded", "active", "running"),
            launched: true,
            drift: None,
        }];
        let counts = cluster_counts(&units, &states, 2);
        assert_eq!(counts.machines, 2);
        assert_eq!(counts.unplaced, 1);
        assert_eq!(counts.units_by_desired_state.get("launched"), Some(&2));
        assert_eq!(counts.units_by_desired_state.get("loaded"), Some(&1));
        assert_eq!(counts.unit_states_by_active_state.get("active"), Some(&1));
    }
}
