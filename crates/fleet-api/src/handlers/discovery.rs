//! `/discovery`: the original's discovery document, as it served it.

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

const DISCOVERY: &str = include_str!("../discovery.json");

pub fn get() -> Result<Response, ApiError> {
    Ok(([(header::CONTENT_TYPE, "application/json")], Body::from(DISCOVERY)).into_response())
}
