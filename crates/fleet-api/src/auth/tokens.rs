//! Bearer tokens: made from 32 random bytes, shown once, kept by the store only as their
//! SHA-256. Every fleetd checks a presented token against the store's records, read again at
//! most [`FRESH_FOR`] after the last read, so a revocation on any fleetd takes effect on all
//! of them within that time.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use fleet_core::access::Role;
use fleet_core::secret::find_by_hash;
use fleet_registry::{CredentialRegistry, RegistrationRecord, RegistrationRefused, RegistryError, TokenRecord};
use futures_util::future::BoxFuture;

use super::store_cache::StoreCache;

/// Every token starts with this, so a leaked one is easy to recognise (and to scan for).
pub const TOKEN_PREFIX: &str = "fleet_";
/// Every registration token (what a pull agent joins with) starts with this.
pub const REGISTRATION_PREFIX: &str = "fleetreg_";
/// How long a read of the store's tokens is used before it is read again.
pub const FRESH_FOR: Duration = Duration::from_millis(500);
/// A token not among the records read is looked for again in the store once the read is this
/// old (a token made on another fleetd works at once; a flood of unknown tokens costs at
/// most one store read per this period).
const UNKNOWN_RECHECK_AFTER: Duration = Duration::from_millis(50);
const RANDOM_BYTES: usize = 32;

/// Why a presented token is refused. The messages never contain the token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed bearer token")]
    Malformed,
    #[error("unknown or revoked bearer token")]
    Unknown,
    #[error("expired bearer token")]
    Expired,
    #[error("the store cannot be read to check credentials")]
    Unavailable,
    #[error("{0}")]
    Registration(RegistrationRefused),
}

/// A new token starting with `prefix` ([`TOKEN_PREFIX`] or [`REGISTRATION_PREFIX`]); `None`
/// only if the system's random source fails.
pub fn generate(prefix: &str) -> Option<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; RANDOM_BYTES];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)))
}

/// The SHA-256 of a token, in hex: what the store keeps.
pub fn digest(token: &str) -> String {
    fleet_tls::hex_sha256(token.as_bytes())
}

/// Whether `token` has the shape of one [`generate`] makes with `prefix`.
pub fn well_formed(token: &str, prefix: &str) -> bool {
    let Some(random) = token.strip_prefix(prefix) else {
        return false;
    };
    random.len() == 43 && random.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// A credential the store keeps by its hash: bearer tokens, registration tokens.
trait Hashed: Clone + Send + Sync + 'static {
    fn sha256(&self) -> &str;
    /// Every record of the kind, from the store.
    fn read(registry: &dyn CredentialRegistry) -> BoxFuture<'_, Result<Vec<Self>, RegistryError>>;
}

impl Hashed for TokenRecord {
    fn sha256(&self) -> &str {
        &self.sha256
    }

    fn read(registry: &dyn CredentialRegistry) -> BoxFuture<'_, Result<Vec<Self>, RegistryError>> {
        registry.tokens()
    }
}

impl Hashed for RegistrationRecord {
    fn sha256(&self) -> &str {
        &self.sha256
    }

    fn read(registry: &dyn CredentialRegistry) -> BoxFuture<'_, Result<Vec<Self>, RegistryError>> {
        registry.registrations()
    }
}

/// The record whose hash is `digest`, from `cache`, read again from `registry` when the last
/// read is older than [`FRESH_FOR`] (or, for a hash it does not hold, than
/// [`UNKNOWN_RECHECK_AFTER`]: a token made on another fleetd works at once).
async fn lookup<T: Hashed>(
    cache: &StoreCache<T>,
    registry: &dyn CredentialRegistry,
    digest: &str,
) -> Result<Option<T>, TokenError> {
    for fresh_for in [FRESH_FOR, UNKNOWN_RECHECK_AFTER] {
        let records = cache.get(fresh_for, async || T::read(registry).await).await;
        let records = records.map_err(|_| TokenError::Unavailable)?;
        if let Some(found) = find_by_hash(records.iter(), digest, |record| record.sha256()) {
            return Ok(Some(found.clone()));
        }
    }
    Ok(None)
}

/// Checks presented tokens against the store.
pub struct TokenCheck {
    registry: Arc<dyn CredentialRegistry>,
    tokens: StoreCache<TokenRecord>,
    registrations: StoreCache<RegistrationRecord>,
}

impl TokenCheck {
    pub fn new(registry: Arc<dyn CredentialRegistry>) -> Self {
        Self { registry, tokens: StoreCache::new("tokens"), registrations: StoreCache::new("registration tokens") }
    }

    /// The name of the registration token `presented`, if it may be used now. (The join
    /// that follows counts the use in the store, atomically, and checks it again there.)
    pub async fn verify_registration(&self, presented: &str) -> Result<String, TokenError> {
        if !well_formed(presented, REGISTRATION_PREFIX) {
            return Err(TokenError::Malformed);
        }
        let record = lookup(&self.registrations, self.registry.as_ref(), &digest(presented))
            .await?
            .ok_or(TokenError::Registration(RegistrationRefused::Unknown))?;
        record.usable_at(now_unix()).map_err(TokenError::Registration)?;
        Ok(record.name)
    }

    /// Forgets the last read, so the next check reads the store (after a change made here).
    pub async fn forget(&self) {
        self.tokens.forget().await;
    }

    /// The name and role of the token `presented`, if it is valid now.
    pub async fn verify(&self, presented: &str) -> Result<(String, Role), TokenError> {
        if !well_formed(presented, TOKEN_PREFIX) {
            return Err(TokenError::Malformed);
        }
        let record =
            lookup(&self.tokens, self.registry.as_ref(), &digest(presented)).await?.ok_or(TokenError::Unknown)?;
        if record.expires.is_some_and(|expires| expires <= now_unix()) {
            return Err(TokenError::Expired);
        }
        match Role::parse(&record.role, record.units.as_deref())
            .and_then(|role| role.with_secrets(record.secrets.as_deref()))
        {
            Ok(role) => Ok((record.name.clone(), role)),
            Err(error) => {
                tracing::warn!(token = record.name, %error, "a stored token names no valid role; refusing it");
                Err(TokenError::Unknown)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_well_formed_and_hashed() {
        let (a, b) = (generate(TOKEN_PREFIX).unwrap(), generate(TOKEN_PREFIX).unwrap());
        assert_ne!(a, b);
        assert!(well_formed(&a, TOKEN_PREFIX) && well_formed(&b, TOKEN_PREFIX), "{a}");
        let registration = generate(REGISTRATION_PREFIX).unwrap();
        assert!(well_formed(&registration, REGISTRATION_PREFIX) && !well_formed(&registration, TOKEN_PREFIX));
        assert_eq!(digest(&a).len(), 64);
        assert_ne!(digest(&a), digest(&b));
        for bad in ["", "fleet_", "fleet_short", "other_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", &format!("{a}x")]
        {
            assert!(!well_formed(bad, TOKEN_PREFIX), "{bad}");
        }
    }

    #[tokio::test]
    async fn tokens_are_looked_up_by_hash() {
        let record = |name: &str, sha256: &str| TokenRecord {
            name: name.into(),
            role: "viewer".into(),
            units: None,
            secrets: None,
            sha256: sha256.into(),
            created: 0,
            expires: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let registry = fleet_store_embedded::EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
        registry.create_token(&record("a", "11")).await.unwrap();
        registry.create_token(&record("b", "22")).await.unwrap();
        let cache = StoreCache::new("tokens");
        let found = lookup::<TokenRecord>(&cache, &registry, "22").await.map(|record| record.map(|r| r.name));
        assert_eq!(found, Ok(Some("b".into())));
        assert_eq!(lookup::<TokenRecord>(&cache, &registry, "33").await, Ok(None));
    }
}
