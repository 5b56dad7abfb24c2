//! `GET /metrics`: this fleetd's metrics and the cluster's counts, for Prometheus.

use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};

use crate::cluster_counts::counts;
use crate::router::{ApiError, ApiState};

pub async fn get(state: &ApiState, headers: &HeaderMap) -> Result<Response, ApiError> {
    let counts = counts(state).await;
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
