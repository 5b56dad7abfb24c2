//! `/discovery`: the original's discovery document, as it served it, with two keys of ours
//! beside its `version`: `fleetVersion` (this fleetd's release) and `storeFormat` (the store
//! format it reads and writes). Clients of the original ignore keys they do not know.

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

const DISCOVERY: &str = include_str!("../discovery.json");

/// The document served: the original's, with ours after its `"version": "v1",` line.
static SERVED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let ours = format!(
        "\"version\": \"v1\",\n  \"fleetVersion\": \"{}\",\n  \"storeFormat\": {},",
        env!("CARGO_PKG_VERSION"),
        fleet_core::store_format::CURRENT
    );
    DISCOVERY.replacen("\"version\": \"v1\",", &ours, 1)
});

pub fn get() -> Result<Response, ApiError> {
    Ok(([(header::CONTENT_TYPE, "application/json")], Body::from(SERVED.as_str())).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_is_the_originals_with_the_release_and_store_format() {
        let served: serde_json::Value = serde_json::from_str(&super::SERVED).expect("JSON");
        let original: serde_json::Value = serde_json::from_str(super::DISCOVERY).expect("JSON");
        assert_eq!(served["fleetVersion"], env!("CARGO_PKG_VERSION"));
        assert_eq!(served["storeFormat"], fleet_core::store_format::CURRENT);
        let mut without = served.clone();
        let object = without.as_object_mut().expect("an object");
        object.remove("fleetVersion");
        object.remove("storeFormat");
        assert_eq!(without, original, "nothing else differs");
    }
}
