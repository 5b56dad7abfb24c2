use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair};
use rustls::client::{ClientSessionMemoryCache, Resumption};
use rustls::{ClientConnection, HandshakeKind, ServerConnection};

use super::*;

/// A CA, a server certificate for `localhost` and a client certificate, all written to `dir`.
pub(crate) struct Pki {
    pub files: TlsFiles,
    pub ca: CertificateDer<'static>,
    pub client: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

pub(crate) fn pki(dir: &Path) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server =
        CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&server_key, &issuer).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params.distinguished_name = DistinguishedName::new();
    client_params.distinguished_name.push(DnType::CommonName, "alice");
    client_params.distinguished_name.push(DnType::OrganizationName, "admin");
    let client = client_params.signed_by(&client_key, &issuer).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let files = TlsFiles {
        certificate: write("server.pem", server.pem()),
        key: write("server-key.pem", server_key.serialize_pem()),
        client_ca: Some(write("ca.pem", ca.pem())),
        agent_ca: None,
    };
    let client_der = PrivateKeyDer::try_from(client_key.serialize_der()).unwrap();
    Pki { files, ca: ca.der().clone(), client: (client.der().clone(), client_der) }
}

/// A client's configuration with a session store of its own; its clones share the store,
/// and resume what one another began (as a pull agent's clients do).
pub(crate) fn client_config(pki: &Pki) -> rustls::ClientConfig {
    client_config_with(pki, rustls::crypto::ring::default_provider())
}

/// [`client_config`] over `provider` (the suites it offers, in its order).
fn client_config_with(pki: &Pki, provider: rustls::crypto::CryptoProvider) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![pki.client.0.clone()], pki.client.1.clone_key())
        .unwrap();
    config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(4)));
    config
}

/// Moves what `from` has to send into `to`; whether anything moved.
fn carry(from: &mut rustls::Connection, to: &mut rustls::Connection) -> bool {
    let mut buffer = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut buffer).unwrap();
    }
    let mut unread = buffer.as_slice();
    while !unread.is_empty() {
        to.read_tls(&mut unread).unwrap();
        to.process_new_packets().unwrap();
    }
    !buffer.is_empty()
}

/// One connection, in memory, carried until both sides have nothing left to send (the
/// server's session tickets included): how its handshake went, and the client certificate the
/// server holds for it.
fn connect(client: Arc<rustls::ClientConfig>, server: Arc<ServerConfig>) -> (HandshakeKind, Vec<u8>) {
    let mut client = rustls::Connection::from(ClientConnection::new(client, "localhost".try_into().unwrap()).unwrap());
    let mut server = rustls::Connection::from(ServerConnection::new(server).unwrap());
    while carry(&mut client, &mut server) | carry(&mut server, &mut client) {}
    assert!(!client.is_handshaking() && !server.is_handshaking());
    let certificate = server.peer_certificates().and_then(|chain| chain.first()).map(|leaf| leaf.to_vec());
    (server.handshake_kind().unwrap(), certificate.unwrap_or_default())
}

#[test]
fn a_client_resumes_its_session_and_the_server_still_holds_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let server = server_config(&pki.files).unwrap();
    let client = client_config(&pki);
    let (first, presented) = connect(Arc::new(client.clone()), server.clone());
    assert_eq!(first, HandshakeKind::Full);
    assert_eq!(presented, pki.client.0.to_vec());
    // Another client of the same configuration (an agent's new connection) resumes, and the
    // server reads the same certificate from the session it resumed.
    let (second, presented) = connect(Arc::new(client.clone()), server.clone());
    assert_eq!(second, HandshakeKind::Resumed);
    assert_eq!(presented, pki.client.0.to_vec());
    // A configuration made anew (another certificate, say) does the whole handshake.
    let (fresh, _) = connect(Arc::new(client_config(&pki)), server);
    assert_eq!(fresh, HandshakeKind::Full);
}

#[test]
fn a_restarted_server_resumes_what_began_under_the_same_files_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let client = client_config(&pki);
    let (first, _) = connect(Arc::new(client.clone()), server_config(&pki.files).unwrap());
    assert_eq!(first, HandshakeKind::Full);
    // Another configuration from the same files (a restarted manager, a reload that changed
    // nothing) opens the tickets the first one made.
    let (restarted, presented) = connect(Arc::new(client.clone()), server_config(&pki.files).unwrap());
    assert_eq!(restarted, HandshakeKind::Resumed);
    assert_eq!(presented, pki.client.0.to_vec(), "the certificate the session began with");
    // Files that differ (here, a CA trusted besides) derive other keys: nothing resumes.
    let widened = TlsFiles { agent_ca: pki.files.client_ca.clone(), ..pki.files.clone() };
    let (other_files, _) = connect(Arc::new(client.clone()), server_config(&widened).unwrap());
    assert_eq!(other_files, HandshakeKind::Full);
    // The same CA trusted in the other role (machines' certificates, not clients'): other files.
    let moved = TlsFiles { client_ca: None, agent_ca: pki.files.client_ca.clone(), ..pki.files.clone() };
    let fresh_client = client_config(&pki);
    let (began, _) = connect(Arc::new(fresh_client.clone()), server_config(&pki.files).unwrap());
    assert_eq!(began, HandshakeKind::Full);
    let (as_agent_ca, _) = connect(Arc::new(fresh_client), server_config(&moved).unwrap());
    assert_eq!(as_agent_ca, HandshakeKind::Full, "a CA moved to another role resumes nothing");
}

/// The suite a connection of `client` to `server` settles on.
fn negotiated_suite(client: rustls::ClientConfig, server: Arc<ServerConfig>) -> rustls::CipherSuite {
    let mut client =
        rustls::Connection::from(ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap()).unwrap());
    let mut server = rustls::Connection::from(ServerConnection::new(server).unwrap());
    while carry(&mut client, &mut server) | carry(&mut server, &mut client) {}
    server.negotiated_cipher_suite().unwrap().suite()
}

#[test]
fn the_server_chooses_aes_128_with_sha_256_and_still_serves_a_client_offering_only_another_suite() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let server = server_config(&pki.files).unwrap();
    // rustls' own order offers AES-256-GCM with SHA-384 first.
    let offered_first = client_config(&pki).crypto_provider().cipher_suites[0].suite();
    assert_eq!(offered_first, rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
    assert_eq!(negotiated_suite(client_config(&pki), server.clone()), rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let mut only = rustls::crypto::ring::default_provider();
    only.cipher_suites.retain(|suite| suite.suite() == rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    assert_eq!(
        negotiated_suite(client_config_with(&pki, only), server),
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
    );
}
