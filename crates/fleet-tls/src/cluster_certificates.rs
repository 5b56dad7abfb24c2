//! TLS in one step: the certificates a cluster's API needs, made into one directory. The API
//! CA signs the servers' certificate and the administrator's client certificate (and is the
//! CA fleetctl and pull agents trust); the agent CA, kept apart, signs only the machine
//! certificates a manager issues to joining pull agents. Keys are written 0600 in a 0700
//! directory, and nothing already there is overwritten: a CA key is never lost by a second run.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

/// How long the two CAs are valid.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long the server and administrator certificates are valid (make new ones with the same
/// CA before then: `fleetd -make-certificates` into another directory, then copy).
pub const LEAF_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// The most host names one server certificate takes.
const MOST_HOSTS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum CertificatesError {
    #[error("{0} exists already: move it away, or make the certificates into another directory")]
    Exists(PathBuf),
    #[error("invalid host name {0:?}: give DNS names or IP addresses, comma-separated")]
    BadHost(String),
    #[error("at most {MOST_HOSTS} host names")]
    TooManyHosts,
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    #[error("cannot make a certificate: {0}")]
    Make(String),
}

/// The files made, by what they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterCertificates {
    pub api_ca: PathBuf,
    pub api_ca_key: PathBuf,
    pub server: PathBuf,
    pub server_key: PathBuf,
    pub admin: PathBuf,
    pub admin_key: PathBuf,
    pub agent_ca: PathBuf,
    pub agent_ca_key: PathBuf,
    /// The cluster's secrets key (not a certificate, but made with them and kept beside the
    /// agent CA key, where a fleetd looks for it).
    pub secrets_key: PathBuf,
}

impl ClusterCertificates {
    fn in_dir(dir: &Path) -> Self {
        Self {
            api_ca: dir.join("api-ca.pem"),
            api_ca_key: dir.join("api-ca-key.pem"),
            server: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            admin: dir.join("admin.pem"),
            admin_key: dir.join("admin-key.pem"),
            agent_ca: dir.join("agent-ca.pem"),
            agent_ca_key: dir.join("agent-ca-key.pem"),
            secrets_key: dir.join(fleet_secrets::KEY_FILE_NAME),
        }
    }

    fn all(&self) -> [&Path; 9] {
        [
            &self.api_ca,
            &self.api_ca_key,
            &self.server,
            &self.server_key,
            &self.admin,
            &self.admin_key,
            &self.agent_ca,
            &self.agent_ca_key,
            &self.secrets_key,
        ]
    }
}

/// Checks one host name of the server certificate: an IP address or a DNS name.
fn subject_name(host: &str) -> Result<SanType, CertificatesError> {
    let bad = || CertificatesError::BadHost(host.to_string());
    if let Ok(address) = host.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(address));
    }
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
        });
    if !valid {
        return Err(bad());
    }
    Ok(SanType::DnsName(host.to_string().try_into().map_err(|_| bad())?))
}

fn random_serial() -> SerialNumber {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // A failing random source leaves zeros, which only makes serials repeat.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn params(common_name: &str, organization: Option<&str>, now: SystemTime, lifetime: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        params.distinguished_name.push(DnType::OrganizationName, organization);
    }
    params.serial_number = Some(random_serial());
    params.not_before = (now - Duration::from_secs(300)).into();
    params.not_after = (now + lifetime).into();
    params
}

fn authority(name: &str, now: SystemTime) -> Result<(String, Issuer<'static, KeyPair>), CertificatesError> {
    let mut params = params(name, None, now, CA_LIFETIME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(|error| CertificatesError::Make(error.to_string()))?;
    let certificate = params.self_signed(&key).map_err(|error| CertificatesError::Make(error.to_string()))?;
    Ok((certificate.pem(), Issuer::new(params, key)))
}

/// A certificate `issuer` signs over a new key: its PEM and the key's.
fn signed(params: CertificateParams, issuer: &Issuer<'_, KeyPair>) -> Result<(String, String), CertificatesError> {
    let key = KeyPair::generate().map_err(|error| CertificatesError::Make(error.to_string()))?;
    let certificate = params.signed_by(&key, issuer).map_err(|error| CertificatesError::Make(error.to_string()))?;
    Ok((certificate.pem(), key.serialize_pem()))
}

/// Makes the cluster's certificates into `dir` (created 0700 if missing): the API CA, a server
/// certificate for `hosts` (and `localhost`, 127.0.0.1), the administrator's client
/// certificate (CN `admin`, role `admin`) and the agent CA. Refuses, writing nothing, when any
/// of the files exists.
pub fn make(dir: &Path, hosts: &[String], now: SystemTime) -> Result<ClusterCertificates, CertificatesError> {
    if hosts.len() > MOST_HOSTS {
        return Err(CertificatesError::TooManyHosts);
    }
    let mut names = vec![SanType::DnsName(
        "localhost".to_string().try_into().map_err(|_| CertificatesError::BadHost("localhost".into()))?,
    )];
    names.push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    for host in hosts.iter().map(|host| host.trim()).filter(|host| !host.is_empty()) {
        let name = subject_name(host)?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let files = ClusterCertificates::in_dir(dir);
    if let Some(existing) = files.all().into_iter().find(|path| path.exists()) {
        return Err(CertificatesError::Exists(existing.to_path_buf()));
    }
    let (api_ca_pem, api_ca) = authority("fleet API CA", now)?;
    let (agent_ca_pem, agent_ca) = authority("fleet agent CA", now)?;
    let mut server = params("fleet API", None, now, LEAF_LIFETIME);
    server.subject_alt_names = names;
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (server_pem, server_key) = signed(server, &api_ca)?;
    let mut admin = params("admin", Some("admin"), now, LEAF_LIFETIME);
    admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let (admin_pem, admin_key) = signed(admin, &api_ca)?;
    let secrets_key = fleet_secrets::ClusterKeys::generate()
        .map_err(|error| CertificatesError::Write { path: files.secrets_key.clone(), reason: error.to_string() })?;
    fleet_fs::create_private_dir(dir)
        .map_err(|error| CertificatesError::Write { path: dir.to_path_buf(), reason: error.to_string() })?;
    let contents = [
        (&files.api_ca, api_ca_pem),
        (&files.api_ca_key, api_ca.key().serialize_pem()),
        (&files.server, server_pem),
        (&files.server_key, server_key),
        (&files.admin, admin_pem),
        (&files.admin_key, admin_key),
        (&files.agent_ca, agent_ca_pem),
        (&files.agent_ca_key, agent_ca.key().serialize_pem()),
        (&files.secrets_key, secrets_key.text()),
    ];
    for (path, text) in contents {
        fleet_fs::write_private(path, text.as_bytes())
            .map_err(|error| CertificatesError::Write { path: path.clone(), reason: error.to_string() })?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use super::*;

    fn parsed(path: &Path) -> Vec<u8> {
        let pem = std::fs::read(path).expect("a certificate");
        CertificateDer::from_pem_slice(&pem).expect("PEM").to_vec()
    }

    #[test]
    fn a_cluster_gets_its_cas_server_and_admin_certificates_private_and_verifiable() {
        let base = tempfile::tempdir().expect("dir");
        let dir = base.path().join("tls");
        let hosts = vec!["manager.example.com".to_string(), "10.0.0.5".to_string()];
        let files = make(&dir, &hosts, SystemTime::now()).expect("made");
        assert_eq!(std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777, 0o700);
        for path in files.all() {
            assert_eq!(std::fs::metadata(path).expect("file").permissions().mode() & 0o777, 0o600, "{path:?}");
        }
        let server = parsed(&files.server);
        let (_, server) = x509_parser::parse_x509_certificate(&server).expect("x509");
        let names = format!("{:?}", server.subject_alternative_name().expect("SAN").expect("SAN").value.general_names);
        for name in ["manager.example.com", "localhost", "10.0.0.5", "127.0.0.1"] {
            assert!(names.contains(name) || names.contains(&name.replace('.', ", ")), "{name} in {names}");
        }
        let api_ca = parsed(&files.api_ca);
        let (_, api_ca) = x509_parser::parse_x509_certificate(&api_ca).expect("x509");
        assert_eq!(server.issuer().as_raw(), api_ca.subject().as_raw(), "the API CA signs the server");
        assert!(api_ca.is_ca() && !server.is_ca());
        // The administrator's certificate names the admin role, as the API reads subjects.
        let admin = parsed(&files.admin);
        let identity = crate::certificate::from_der(&admin, None).expect("an identity");
        assert_eq!(identity.role.map(|role| role.to_string()), Ok("admin".to_string()));
        // The agent CA is a CA of its own, apart from the API's.
        let agent_ca = parsed(&files.agent_ca);
        let (_, agent_ca) = x509_parser::parse_x509_certificate(&agent_ca).expect("x509");
        assert!(agent_ca.is_ca() && agent_ca.subject().as_raw() != api_ca.subject().as_raw());
    }

    #[test]
    fn nothing_there_is_overwritten_and_bad_hosts_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let key = dir.path().join("api-ca-key.pem");
        std::fs::write(&key, "a key kept safe").expect("write");
        let refused = make(dir.path(), &[], SystemTime::now());
        assert!(matches!(refused, Err(CertificatesError::Exists(ref path)) if *path == key), "{refused:?}");
        assert_eq!(std::fs::read_to_string(&key).expect("read"), "a key kept safe");
        assert!(!dir.path().join("server.pem").exists(), "nothing written");
        for bad in ["bad host", "-lead.example", "a..b", "é.example"] {
            let refused = make(&dir.path().join("other"), &[bad.to_string()], SystemTime::now());
            assert!(matches!(refused, Err(CertificatesError::BadHost(_))), "{bad}: {refused:?}");
        }
    }
}
