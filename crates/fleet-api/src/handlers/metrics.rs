//! `GET /metrics`: this fleetd's metrics and the cluster's counts, for Prometheus.

use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use fleet_core::state::{DesiredState, UnitState};
use fleet_metrics::ClusterCounts;
use fleet_registry::UnitView;

use crate::router::{ApiError, ApiState};

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

pub async fn get(state: &ApiState, headers: &HeaderMap) -> Result<Response, ApiError> {
    let registry = &state.registry;
    // A store that does not answer leaves the cluster's counts out; this fleetd's own
    // figures (store errors among them) are what tells why.
    let counts = match tokio::try_join!(registry.units(), registry.unit_states(), registry.machines()) {
        Ok((units, states, machines)) => Some(cluster_counts(&units, &states, machines.len())),
        Err(error) => {
            tracing::debug!(%error, "cluster counts left out of the metrics");
            None
        }
    };
    let pull = &fleet_metrics::metrics().pull;
    pull.agents_present.set(i64::try_from(state.agent_presence.count()).unwrap_or(i64::MAX));
    let text = fleet_metrics::render(counts.as_ref());
    let accept = headers.get(header::ACCEPT).and_then(|value| value.to_str().ok()).unwrap_or("");
    Ok(if fleet_metrics::wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, fleet_metrics::OPENMETRICS_CONTENT_TYPE)], text).into_response()
    } else {
        ([(header::CONTENT_TYPE, fleet_metrics::CLASSIC_CONTENT_TYPE)], fleet_metrics::to_classic_text(&text))
            .into_response()
    })
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
        }];
        let counts = cluster_counts(&units, &states, 2);
        assert_eq!(counts.machines, 2);
        assert_eq!(counts.unplaced, 1);
        assert_eq!(counts.units_by_desired_state.get("launched"), Some(&2));
        assert_eq!(counts.units_by_desired_state.get("loaded"), Some(&1));
        assert_eq!(counts.unit_states_by_active_state.get("active"), Some(&1));
    }
}
