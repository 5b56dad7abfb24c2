//! The API's error answer: a status and the original's JSON error body.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_registry::RegistryError;

use crate::schema::{ErrorBody, ErrorDetail};

/// An error answer: a status and the message of the JSON error body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        tracing::warn!(%error, "registry error while serving the API");
        match error {
            RegistryError::Unavailable(_) | RegistryError::NotListedYet | RegistryError::PresenceLapsed => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "fleet server unable to communicate with etcd")
            }
            RegistryError::Corrupt { .. } => Self::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
            RegistryError::LeadershipLost | RegistryError::MachineInUse { .. } => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "")
            }
            RegistryError::NotAnnounced { .. }
            | RegistryError::Owned { .. }
            | RegistryError::ChangedSincePlan { .. }
            | RegistryError::SourceRemoved { .. } => Self::new(StatusCode::CONFLICT, error.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.status.as_u16(), message: self.message } };
        json_response(self.status, &body)
    }
}

pub fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
