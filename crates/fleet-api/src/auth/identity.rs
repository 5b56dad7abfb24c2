//! Turning a request into an [`Identity`]: one function, [`Auth::authenticate`].

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use fleet_core::access::Role;
use fleet_registry::{CredentialRegistry, RevokedMachine};

use super::certificate::CertificateIdentity;
use super::store_cache::{StoreCache, Unavailable};
use super::tokens::{FRESH_FOR, REGISTRATION_PREFIX, TokenCheck, TokenError};

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

/// The header a git forge signs a push webhook's body in (`sha256=<hex HMAC-SHA256>`).
pub const WEBHOOK_SIGNATURE: &str = "x-hub-signature-256";

/// Who a request comes from and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Shown in the audit trail: `unix:uid=0`, `token:ci`, `cert:alice`, `anonymous`.
    pub name: String,
    pub role: Role,
    pub via: Via,
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
        }
    }

    /// Whether `machine` was revoked (as of a read of the store at most [`FRESH_FOR`] ago).
    pub async fn machine_revoked(&self, machine: &str) -> Result<bool, Unavailable> {
        let revoked = self.revoked.get(FRESH_FOR, async || self.registry.revoked_machines().await).await?;
        Ok(revoked.iter().any(|revoked| revoked.id == machine))
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
    pub async fn authenticate(&self, peer: Option<&Peer>, headers: &HeaderMap) -> Result<Identity, Refused> {
        let unauthenticated = |message: &str| Refused::Unauthenticated(message.to_string());
        let (tls, certificate) = match peer {
            Some(Peer::Unix { uid }) => {
                let name = uid.map_or("unix".to_string(), |uid| format!("unix:uid={uid}"));
                return Ok(Identity { name, role: Role::Admin, via: Via::UnixSocket });
            }
            Some(Peer::Tcp { tls, certificate }) => (*tls, certificate),
            None => return Err(unauthenticated("no credential")),
        };
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let token = bearer_token(value.as_bytes()).map_err(&unauthenticated)?;
            let token = token.as_ref();
            if token.starts_with(REGISTRATION_PREFIX) {
                // It may join, nothing else; the join checks and counts the token itself.
                return Ok(Identity { name: "registration".into(), role: Role::Joining, via: Via::RegistrationToken });
            }
            return match self.tokens.verify(token).await {
                Ok((name, role)) => Ok(Identity { name: format!("token:{name}"), role, via: Via::Token }),
                Err(TokenError::Unavailable) => {
                    Err(unauthenticated("credentials cannot be checked: the store is unavailable"))
                }
                Err(error) => Err(Refused::Unauthenticated(error.to_string())),
            };
        }
        if headers.contains_key(WEBHOOK_SIGNATURE) {
            // It may ask a source to sync, nothing else; the webhook checks the signature.
            return Ok(Identity { name: "webhook".into(), role: Role::Webhook, via: Via::WebhookSignature });
        }
        if let Some(certificate) = certificate {
            let name = format!("cert:{}", certificate.name);
            return match &certificate.role {
                Ok(Role::Machine { id }) => match self.machine_revoked(id).await {
                    Ok(false) => Ok(Identity { name, role: Role::Machine { id: id.clone() }, via: Via::Certificate }),
                    Ok(true) => Err(unauthenticated("revoked machine certificate")),
                    Err(Unavailable) => Err(unauthenticated("credentials cannot be checked: the store is unavailable")),
                },
                Ok(role) => Ok(Identity { name, role: role.clone(), via: Via::Certificate }),
                Err(problem) => {
                    Err(Refused::Forbidden { name, message: format!("client certificate grants no role: {problem}") })
                }
            };
        }
        match &self.anonymous {
            Some(role) => Ok(Identity { name: "anonymous".into(), role: role.clone(), via: Via::Anonymous }),
            None if tls => Err(unauthenticated("credential required: a bearer token or a client certificate")),
            None => Err(unauthenticated("credential required: a bearer token")),
        }
    }
}

/// The token of an `Authorization: Bearer …` header, or the password of a `Basic` one (what
/// a browser sends for the web view once its user typed the token; the user name is ignored).
pub(crate) fn bearer_token(value: &[u8]) -> Result<std::borrow::Cow<'_, str>, &'static str> {
    use base64::Engine;
    if value.len() > MAX_AUTHORIZATION {
        return Err("malformed Authorization header: too long");
    }
    let text = std::str::from_utf8(value).map_err(|_| "malformed Authorization header")?;
    let (scheme, token) = text.trim().split_once(' ').ok_or("malformed Authorization header")?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(std::borrow::Cow::Borrowed(token.trim()));
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err("unsupported Authorization scheme: expected Bearer");
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| "malformed Authorization header: bad Basic credentials")?;
    let decoded = String::from_utf8(decoded).map_err(|_| "malformed Authorization header: bad Basic credentials")?;
    let (_user, password) = decoded.split_once(':').ok_or("malformed Authorization header: bad Basic credentials")?;
    Ok(std::borrow::Cow::Owned(password.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_headers_are_read_strictly() {
        assert_eq!(bearer_token(b"Bearer fleet_abc").as_deref(), Ok("fleet_abc"));
        assert_eq!(bearer_token(b"bearer  fleet_abc ").as_deref(), Ok("fleet_abc"));
        // user:pass
        assert_eq!(bearer_token(b"Basic dXNlcjpwYXNz").as_deref(), Ok("pass"));
        assert!(bearer_token(b"Basic !!!").is_err());
        assert!(bearer_token(b"Digest x").is_err());
        assert!(bearer_token(b"Bearer").is_err());
        assert!(bearer_token(&[0xff, 0xfe]).is_err());
        assert!(bearer_token(format!("Bearer {}", "a".repeat(600)).as_bytes()).is_err());
    }
}
