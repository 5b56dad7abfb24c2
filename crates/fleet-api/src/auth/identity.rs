//! Turning a request into an [`Identity`]: one function, [`Auth::authenticate`].

use std::sync::Arc;

use axum::http::{HeaderMap, Method, header};
use fleet_core::access::Role;
use fleet_registry::{CredentialRegistry, RevokedMachine, SourceRecord};

use super::store_cache::{StoreCache, Unavailable};
use super::tokens::{FRESH_FOR, REGISTRATION_PREFIX, TokenCheck, TokenError};
use fleet_tls::certificate::CertificateIdentity;

/// How a connection reached the API; set by the server on every request it reads.
#[derive(Clone, Debug)]
pub enum Peer {
    /// The Unix socket, whose file mode admits only root and its group: an administrator.
    Unix { uid: Option<u32> },
    /// A TCP connection, over TLS or not, with the client certificate it presented (already
    /// verified against the client CA during the handshake).
    Tcp { tls: bool, certificate: Option<Arc<CertificateIdentity>> },
}

/// How an identity was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    UnixSocket,
    Certificate,
    Token,
    /// A registration token, which can only join.
    RegistrationToken,
    /// A webhook signature, which can only ask a source to sync (its handler checks it).
    WebhookSignature,
    Anonymous,
}

/// Who a request comes from and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Shown in the audit trail: `unix:uid=0`, `token:ci`, `cert:alice`, `anonymous`.
    pub name: String,
    pub role: Role,
    pub via: Via,
    /// The public key (its SHA-256) of the certificate it was established by, if any.
    pub key_sha256: Option<String>,
}

impl Identity {
    fn new(name: String, role: Role, via: Via) -> Self {
        Self { name, role, via, key_sha256: None }
    }
}

/// Why a request has no identity (401) or an identity that can do nothing (403).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    Unauthenticated(String),
    Forbidden { name: String, message: String },
}

/// What authenticates requests: the cluster's tokens and the anonymous opt-in.
#[derive(Clone)]
pub struct Auth {
    registry: Arc<dyn CredentialRegistry>,
    tokens: Arc<TokenCheck>,
    revoked: Arc<StoreCache<RevokedMachine>>,
    /// The role clients without any credential get on TCP; none unless the operator opts in.
    anonymous: Option<Role>,
    /// The sources, as webhooks are checked against them (read at most every [`FRESH_FOR`],
    /// so unsigned requests cost the store next to nothing).
    pub(crate) webhook_sources: Arc<StoreCache<SourceRecord>>,
}

/// A bearer token longer than this is not read any further.
const MAX_AUTHORIZATION: usize = 512;

impl Auth {
    pub fn new(registry: Arc<dyn CredentialRegistry>, anonymous: Option<Role>) -> Self {
        Self {
            tokens: Arc::new(TokenCheck::new(registry.clone())),
            revoked: Arc::new(StoreCache::new("revoked machines")),
            registry,
            anonymous,
            webhook_sources: Arc::new(StoreCache::new("sources")),
        }
    }

    /// The revocation of `machine`, if any (as of a read of the store at most [`FRESH_FOR`]
    /// ago).
    pub async fn revocation(&self, machine: &str) -> Result<Option<RevokedMachine>, Unavailable> {
        let revoked = self.revoked_machines().await?;
        Ok(revoked.iter().find(|revoked| revoked.id == machine).cloned())
    }

    /// Every revoked machine, as read last (at most [`FRESH_FOR`] ago).
    pub async fn revoked_machines(&self) -> Result<Arc<Vec<RevokedMachine>>, Unavailable> {
        self.revoked.get(FRESH_FOR, async || self.registry.revoked_machines().await).await
    }

    /// Whether a certificate of `machine` over the key `key_sha256` is refused as revoked.
    pub async fn certificate_revoked(&self, machine: &str, key_sha256: &str) -> Result<bool, Unavailable> {
        let revocation = self.revocation(machine).await?;
        Ok(fleet_registry::machine_identity::certificate_revoked(revocation.as_ref(), key_sha256))
    }

    /// Forgets the revoked machines read last (after a revocation made here).
    pub async fn forget_revoked(&self) {
        self.revoked.forget().await;
    }

    pub fn anonymous_role(&self) -> Option<&Role> {
        self.anonymous.as_ref()
    }

    pub fn tokens(&self) -> &TokenCheck {
        &self.tokens
    }

    /// The identity behind a request that came on `peer` with `headers`. A request with no
    /// peer (not read by the server) has none.
    /// A registration token, or a webhook's signature, is no identity here: each is verified
    /// by the one route it serves ([`Auth::joining`], [`super::webhook::verify`]).
    pub async fn authenticate(
        &self,
        peer: Option<&Peer>,
        headers: &HeaderMap,
        method: &Method,
    ) -> Result<Identity, Refused> {
        let unauthenticated = |message: &str| Refused::Unauthenticated(message.to_string());
        let (tls, certificate) = match peer {
            Some(Peer::Unix { uid }) => {
                let name = uid.map_or("unix".to_string(), |uid| format!("unix:uid={uid}"));
                return Ok(Identity::new(name, Role::Admin, Via::UnixSocket));
            }
            Some(Peer::Tcp { tls, certificate }) => (*tls, certificate),
            None => return Err(unauthenticated("no credential")),
        };
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let credential = bearer_token(value.as_bytes()).map_err(&unauthenticated)?;
            if credential.basic && !matches!(*method, Method::GET | Method::HEAD) {
                return Err(unauthenticated(
                    "Basic credentials are accepted for reads only (the web view); send the token as a Bearer token",
                ));
            }
            let token = credential.token.as_ref();
            if token.starts_with(REGISTRATION_PREFIX) {
                return Err(unauthenticated("a registration token only joins (POST /fleet/v1/agents/join)"));
            }
            return match self.tokens.verify(token).await {
                Ok((name, role)) => Ok(Identity::new(format!("token:{name}"), role, Via::Token)),
                Err(TokenError::Unavailable) => {
                    Err(unauthenticated("credentials cannot be checked: the store is unavailable"))
                }
                Err(error) => Err(Refused::Unauthenticated(error.to_string())),
            };
        }
        if let Some(certificate) = certificate {
            let name = format!("cert:{}", certificate.name);
            return match &certificate.role {
                Ok(Role::Machine { id }) => match self.certificate_revoked(id, &certificate.key_sha256).await {
                    Ok(false) => Ok(Identity {
                        name,
                        role: Role::Machine { id: id.clone() },
                        via: Via::Certificate,
                        key_sha256: Some(certificate.key_sha256.clone()),
                    }),
                    Ok(true) => Err(unauthenticated("revoked machine certificate")),
                    Err(Unavailable) => Err(unauthenticated("credentials cannot be checked: the store is unavailable")),
                },
                Ok(role) => Ok(Identity::new(name, role.clone(), Via::Certificate)),
                Err(problem) => {
                    Err(Refused::Forbidden { name, message: format!("client certificate grants no role: {problem}") })
                }
            };
        }
        match &self.anonymous {
            Some(role) => Ok(Identity::new("anonymous".into(), role.clone(), Via::Anonymous)),
            None if tls => Err(unauthenticated("credential required: a bearer token or a client certificate")),
            None => Err(unauthenticated("credential required: a bearer token")),
        }
    }

    /// The identity of a request that joins: whoever presents a registration token that is
    /// usable now, and nobody else.
    pub async fn joining(&self, headers: &HeaderMap) -> Result<Identity, Refused> {
        let unauthenticated = |message: &str| Refused::Unauthenticated(message.to_string());
        let value = headers.get(header::AUTHORIZATION).ok_or_else(|| unauthenticated("registration token required"))?;
        let credential = bearer_token(value.as_bytes()).map_err(&unauthenticated)?;
        if credential.basic {
            return Err(unauthenticated("a registration token is sent as a Bearer token"));
        }
        match self.tokens.verify_registration(&credential.token).await {
            Ok(name) => Ok(Identity::new(format!("registration:{name}"), Role::Joining, Via::RegistrationToken)),
            Err(TokenError::Malformed) => Err(unauthenticated("malformed registration token")),
            Err(TokenError::Unavailable) => {
                Err(unauthenticated("credentials cannot be checked: the store is unavailable"))
            }
            Err(error) => Err(Refused::Unauthenticated(error.to_string())),
        }
    }
}

/// A credential of an `Authorization` header.
pub(crate) struct Credential<'a> {
    pub token: std::borrow::Cow<'a, str>,
    /// Sent as HTTP Basic (by a browser, which keeps and resends it by itself).
    pub basic: bool,
}

/// The token of an `Authorization: Bearer …` header, or the password of a `Basic` one (what
/// a browser sends for the web view once its user typed the token; the user name is ignored).
pub(crate) fn bearer_token(value: &[u8]) -> Result<Credential<'_>, &'static str> {
    use base64::Engine;
    if value.len() > MAX_AUTHORIZATION {
        return Err("malformed Authorization header: too long");
    }
    let text = std::str::from_utf8(value).map_err(|_| "malformed Authorization header")?;
    let (scheme, token) = text.trim().split_once(' ').ok_or("malformed Authorization header")?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(Credential { token: std::borrow::Cow::Borrowed(token.trim()), basic: false });
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err("unsupported Authorization scheme: expected Bearer");
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| "malformed Authorization header: bad Basic credentials")?;
    let decoded = String::from_utf8(decoded).map_err(|_| "malformed Authorization header: bad Basic credentials")?;
    let (_user, password) = decoded.split_once(':').ok_or("malformed Authorization header: bad Basic credentials")?;
    Ok(Credential { token: std::borrow::Cow::Owned(password.trim().to_string()), basic: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_headers_are_read_strictly() {
        let read =
            |value: &[u8]| bearer_token(value).map(|credential| (credential.token.into_owned(), credential.basic));
        assert_eq!(read(b"Bearer fleet_abc"), Ok(("fleet_abc".into(), false)));
        assert_eq!(read(b"bearer  fleet_abc "), Ok(("fleet_abc".into(), false)));
        // user:pass
        assert_eq!(read(b"Basic dXNlcjpwYXNz"), Ok(("pass".into(), true)));
        assert!(bearer_token(b"Basic !!!").is_err());
        assert!(bearer_token(b"Digest x").is_err());
        assert!(bearer_token(b"Bearer").is_err());
        assert!(bearer_token(&[0xff, 0xfe]).is_err());
        assert!(bearer_token(format!("Bearer {}", "a".repeat(600)).as_bytes()).is_err());
    }
}
