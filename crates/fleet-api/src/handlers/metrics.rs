//! `GET /metrics`: this fleetd's metrics, for Prometheus. It reads nothing from the store:
//! the cluster's counts are what the engine leader and this machine's agent published.

use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};

use crate::api_state::ApiState;
use crate::error::ApiError;

pub async fn get(state: &ApiState, headers: &HeaderMap) -> Result<Response, ApiError> {
    let pull = &fleet_metrics::metrics().pull;
    pull.agents_present.set(i64::try_from(state.agent_presence.count()).unwrap_or(i64::MAX));
    let text = fleet_metrics::render();
    let accept = headers.get(header::ACCEPT).and_then(|value| value.to_str().ok()).unwrap_or("");
    Ok(if fleet_metrics::wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, fleet_metrics::OPENMETRICS_CONTENT_TYPE)], text).into_response()
    } else {
        ([(header::CONTENT_TYPE, fleet_metrics::CLASSIC_CONTENT_TYPE)], fleet_metrics::to_classic_text(&text))
            .into_response()
    })
}
