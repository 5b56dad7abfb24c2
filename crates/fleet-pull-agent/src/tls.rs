//! The TLS an agent speaks to its managers: whom it trusts, the certificate it presents, and
//! the sessions it resumes. An agent on a change stream opens a connection for each change
//! it reads; resuming the session its stream (or its last request) began skips both sides'
//! certificate signatures and checks, which were most of what a change reaching every agent
//! cost its manager. A resumed session stands for the certificate it was begun with: the
//! manager still checks that certificate's expiry and revocation on every request.

use std::sync::Arc;

use rustls::client::{ClientSessionMemoryCache, Resumption};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls_platform_verifier::BuilderVerifierExt;

use crate::credentials::MachineCredentials;

/// Why the TLS of an identity cannot be set up (names what, never a key's content).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(String);

/// How many managers' sessions an agent keeps (each with the few tickets a manager gives).
const MANAGERS_REMEMBERED: usize = 16;

/// The TLS of one identity (a machine certificate, or none) towards the managers: whom it
/// trusts, what it presents, and the sessions it began. Every client made from it resumes
/// the sessions the others began (rustls resumes a session only under the very trust and
/// certificate it began with); a new certificate makes a new one, so nothing begun under
/// another certificate is resumed under it.
#[derive(Clone)]
pub struct ClientTls(Arc<rustls::ClientConfig>);

/// ALPN: what a connection may speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaks {
    /// Requests: HTTP/2, which every manager offers (a server that does not fails the
    /// handshake, where offering HTTP/1.1 too would let it answer in a protocol the client
    /// does not speak on this connection).
    Requests,
    /// HTTP/1.1 only: the change stream (to be upgraded), and a request made once on a
    /// connection of its own (a join, a renewal), which HTTP/2's setup would only slow.
    Http1,
}

impl ClientTls {
    /// Trusting `server_ca` (PEM; the system's roots without it), presenting `identity` if given.
    pub fn new(server_ca: Option<&[u8]>, identity: Option<&MachineCredentials>) -> Result<Self, TlsSetupError> {
        let setup = |what: &str, error: &dyn std::fmt::Display| TlsSetupError(format!("{what}: {error}"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| setup("TLS versions", &error))?;
        let builder = match server_ca {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in CertificateDer::pem_slice_iter(pem) {
                    let certificate = certificate.map_err(|error| setup("the manager's CA", &error))?;
                    roots.add(certificate).map_err(|error| setup("the manager's CA", &error))?;
                }
                if roots.is_empty() {
                    return Err(TlsSetupError("the manager's CA holds no certificate".into()));
                }
                builder.with_root_certificates(roots)
            }
            None => builder.with_platform_verifier().map_err(|error| setup("the system's roots", &error))?,
        };
        let mut config = match identity {
            Some(credentials) => {
                let chain = CertificateDer::pem_slice_iter(credentials.certificate.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| setup("the machine certificate", &error))?;
                // The key's own error is not shown: nothing of a key reaches a message.
                let key = PrivateKeyDer::from_pem_slice(credentials.key.as_bytes())
                    .map_err(|_| TlsSetupError("the machine key cannot be read".into()))?;
                builder.with_client_auth_cert(chain, key).map_err(|error| setup("the machine certificate", &error))?
            }
            None => builder.with_no_client_auth(),
        };
        config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(MANAGERS_REMEMBERED)));
        Ok(Self(Arc::new(config)))
    }

    /// The configuration of a connection that speaks `speaks`.
    pub fn config(&self, speaks: Speaks) -> rustls::ClientConfig {
        let mut config = (*self.0).clone();
        config.alpn_protocols = match speaks {
            Speaks::Requests => vec![b"h2".to_vec()],
            Speaks::Http1 => vec![b"http/1.1".to_vec()],
        };
        config
    }
}
