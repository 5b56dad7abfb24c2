//! A git forge's push webhook: the request is a webhook of a source only once its body's
//! signature (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256>`) verifies with that source's
//! shared secret. Before that it is nobody.

use std::path::Path;

use axum::http::HeaderMap;
use fleet_core::access::Role;
use fleet_registry::{SourceRecord, SourceRegistry};

use super::store_cache::StoreCache;
use super::tokens::FRESH_FOR;
use super::{Identity, Refused, Via};

/// The header a git forge signs a push webhook's body in.
pub const WEBHOOK_SIGNATURE: &str = "x-hub-signature-256";

/// The identity of a webhook of `source` whose `body` came with `headers`, reading the
/// shared secret the source names from `secrets_dir`.
pub async fn verify(
    registry: &dyn SourceRegistry,
    sources: &StoreCache<SourceRecord>,
    secrets_dir: Option<&Path>,
    source: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Identity, Refused> {
    let refused = || Refused::Unauthenticated("webhook signature does not match".into());
    let signature = headers
        .get(WEBHOOK_SIGNATURE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("sha256="))
        .and_then(decode_hex)
        .ok_or_else(refused)?;
    let secrets_dir = secrets_dir.ok_or_else(refused)?;
    let records = sources
        .get(FRESH_FOR, async || registry.sources().await)
        .await
        .map_err(|_| Refused::Unauthenticated("credentials cannot be checked: the store is unavailable".into()))?;
    let record = records.iter().find(|record| record.name == source).ok_or_else(refused)?;
    let secret_name = record.webhook_secret.as_deref().ok_or_else(refused)?;
    let secret = match std::fs::read(secrets_dir.join(secret_name)) {
        Ok(secret) => secret,
        Err(error) => {
            tracing::warn!(source, file = secret_name, kind = %error.kind(), "cannot read a webhook secret");
            return Err(refused());
        }
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.trim_ascii_end());
    ring::hmac::verify(&key, body, &signature).map_err(|_| refused())?;
    Ok(Identity {
        name: format!("webhook:{source}"),
        role: Role::Webhook { source: source.to_string() },
        via: Via::WebhookSignature,
        key_sha256: None,
    })
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok()).collect()
}
