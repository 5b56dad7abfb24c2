//! TLS for TCP listeners (rustls with ring, the tree's one provider): the server certificate
//! and key, and optionally a client CA for mutual TLS. The files are read again on
//! [`ServerTls::reload`] (fleetd calls it on SIGHUP), so certificates rotate without a
//! restart; connections made before keep the configuration they started with.

use fleet_core::unpoisoned::ReadWriteLocked;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::tickets::DerivedTicketer;

/// Where the TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub certificate: PathBuf,
    pub key: PathBuf,
    /// When set, clients may present certificates this CA signed (and a certificate from
    /// any other CA fails the handshake). Clients without one may still use a token.
    pub client_ca: Option<PathBuf>,
    /// The cluster's agent CA: machines present certificates it signed (they name a machine).
    pub agent_ca: Option<PathBuf>,
}

/// Why TLS cannot be set up. Names files, never their contents.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no private key")]
    NoKey { path: PathBuf },
    #[error("invalid TLS setup: {0}")]
    Invalid(String),
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |reason: String| TlsError::Read { path: path.to_path_buf(), reason };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| read(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| read(error.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_path_buf() });
    }
    Ok(certificates)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey { path: path.to_path_buf() },
        other => TlsError::Read { path: path.to_path_buf(), reason: other.to_string() },
    })
}

/// ring, with the TLS 1.3 suites in the order the server prefers: AES-128-GCM with SHA-256
/// first. Every suite ring offers stays (a client that offers one other is still served);
/// SHA-256 runs on the processor's SHA extensions where SHA-384 has none, and a handshake's
/// key schedule hashes several times: about a twentieth of a manager's CPU for each joining
/// agent went to SHA-384 with rustls' own order (AES-256-GCM with SHA-384 first).
fn provider() -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| match suite.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        _ => 2,
    });
    provider
}

/// Builds a server configuration from `files`.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Invalid(error.to_string()))?;
    let client_roots: Vec<&PathBuf> = files.client_ca.iter().chain(files.agent_ca.iter()).collect();
    let served = certificates(&files.certificate)?;
    let key = private_key(&files.key)?;
    // What the tickets' keys are derived from: the served chain and every trusted CA, each
    // CA after the role it is trusted in (a CA moved from one role to the other is other files).
    let mut context: Vec<Vec<u8>> = served.iter().map(|certificate| certificate.to_vec()).collect();
    let builder = match client_roots.as_slice() {
        [] => builder.with_no_client_auth(),
        paths => {
            let mut roots = rustls::RootCertStore::empty();
            for path in paths {
                let role: &[u8] = if files.client_ca.as_ref() == Some(*path) { b"client CA" } else { b"agent CA" };
                context.push(role.to_vec());
                for certificate in certificates(path)? {
                    context.push(certificate.to_vec());
                    roots
                        .add(certificate)
                        .map_err(|error| TlsError::Invalid(format!("{}: {error}", path.display())))?;
                }
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|error| TlsError::Invalid(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let ticketer = {
        let context: Vec<&[u8]> = context.iter().map(Vec::as_slice).collect();
        DerivedTicketer::new(key.secret_der(), &context)
    };
    let mut config = builder
        .with_single_cert(served, key)
        .map_err(|error| TlsError::Invalid(format!("{}: {error}", files.certificate.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // The suite is the server's choice (see `provider`), whatever order a client offers.
    config.ignore_client_order = true;
    // Sessions are resumed from tickets only these files open (`tickets.rs`: in this process
    // and the next one, so a restarted manager's agents come back without full handshakes;
    // nothing begun under other files resumes), each carrying the client certificate it began
    // with: a pull agent's many short connections cost no certificate signatures, and the
    // manager still reads (and checks) the certificate on every one.
    config.ticketer = Arc::new(ticketer);
    Ok(Arc::new(config))
}

/// The subject (DER) of the first certificate in `path`.
fn subject_of(path: &Path) -> Result<Vec<u8>, TlsError> {
    let first =
        certificates(path)?.into_iter().next().ok_or_else(|| TlsError::NoCertificate { path: path.to_path_buf() })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&first)
        .map_err(|error| TlsError::Invalid(format!("{}: {error}", path.display())))?;
    Ok(parsed.subject().as_raw().to_vec())
}

/// What a reload swaps at once: the configuration and the agent CA's subject.
struct Loaded {
    config: Arc<ServerConfig>,
    machine_issuer: Option<Arc<[u8]>>,
}

fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let machine_issuer = files.agent_ca.as_deref().map(subject_of).transpose()?.map(Arc::from);
    Ok(Loaded { config: server_config(files)?, machine_issuer })
}

/// The TLS configuration every TLS listener serves with, replaceable while they serve.
pub struct ServerTls {
    files: RwLock<TlsFiles>,
    loaded: RwLock<Loaded>,
}

impl ServerTls {
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let loaded = load(&files)?;
        Ok(Self { files: RwLock::new(files), loaded: RwLock::new(loaded) })
    }

    /// The configuration new connections use.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.loaded.read_locked().config.clone()
    }

    /// The subject of the agent CA, whose certificates name machines.
    pub fn machine_issuer(&self) -> Option<Arc<[u8]>> {
        self.loaded.read_locked().machine_issuer.clone()
    }

    /// Reads the files again (at the paths `files` names now); on failure the running
    /// configuration stays.
    pub fn reload(&self, files: TlsFiles) -> Result<(), TlsError> {
        let loaded = load(&files)?;
        *self.loaded.write_locked() = loaded;
        *self.files.write_locked() = files;
        Ok(())
    }

    pub fn files(&self) -> TlsFiles {
        self.files.read_locked().clone()
    }
}

#[cfg(test)]
pub(crate) mod tests;
