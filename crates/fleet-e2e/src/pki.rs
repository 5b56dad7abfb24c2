//! Real certificates for the TLS tests, made with rcgen: a cluster CA, a server certificate
//! for `localhost`/127.0.0.1, client certificates whose subject names an identity and a role,
//! and a second, foreign CA. Written as PEM files into a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A certificate authority that signs the others.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
}

/// A certificate and key on disk.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

impl Authority {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Self { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// The CA's private key (PEM), for a test that hands the CA to fleetd.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, &self.cert_pem).expect("write CA");
        path.to_path_buf()
    }

    fn sign(&self, params: CertificateParams, dir: &Path, stem: &str) -> Pair {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert_path, key_path) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}-key.pem")));
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Pair { cert: cert_path, key: key_path, der: cert.der().to_vec() }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, dir: &Path, stem: &str) -> Pair {
        self.server_for(dir, stem, &["localhost", "127.0.0.1"])
    }

    /// A server certificate for the given names and addresses.
    pub fn server_for(&self, dir: &Path, stem: &str, names: &[&str]) -> Pair {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, dir, stem)
    }

    /// A client certificate: CN `name`, O `role` (when given), OU `units` (when given).
    pub fn client(&self, dir: &Path, name: &str, role: Option<&str>, units: Option<&str>) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some(role) = role {
            params.distinguished_name.push(DnType::OrganizationName, role);
        }
        if let Some(units) = units {
            params.distinguished_name.push(DnType::OrganizationalUnitName, units);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, dir, &format!("client-{name}"))
    }
}

/// Everything a manager of pull agents needs, on disk: the API's CA and server certificate,
/// and the cluster's agent CA with its key.
pub struct ManagerPki {
    pub dir: tempfile::TempDir,
    pub api_ca: Authority,
    pub api_ca_file: PathBuf,
    pub server: Pair,
    pub agent_ca: Authority,
    pub agent_ca_file: PathBuf,
    pub agent_ca_key: PathBuf,
}

impl ManagerPki {
    /// Certificates for a manager reached at `names` (host names and addresses).
    pub fn new(names: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (api_ca, agent_ca) = (Authority::new("API CA"), Authority::new("agent CA"));
        let api_ca_file = api_ca.write(&dir.path().join("api-ca.pem"));
        let server = api_ca.server_for(dir.path(), "server", names);
        let agent_ca_file = agent_ca.write(&dir.path().join("agent-ca.pem"));
        let agent_ca_key = dir.path().join("agent-ca-key.pem");
        std::fs::write(&agent_ca_key, agent_ca.key_pem()).expect("agent CA key");
        // The cluster's secrets key beside it, as `fleetd -make-certificates` makes it.
        let secrets_key = dir.path().join(fleet_secrets::KEY_FILE_NAME);
        fleet_secrets::ClusterKeys::generate().expect("a key").create(&secrets_key).expect("the secrets key");
        Self { dir, api_ca, api_ca_file, server, agent_ca, agent_ca_file, agent_ca_key }
    }

    /// For a manager on `localhost` and 127.0.0.1.
    pub fn local() -> Self {
        Self::new(&["localhost", "127.0.0.1"])
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The API CA (PEM), as agents trust it.
    pub fn api_ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.api_ca_file).expect("API CA")
    }

    /// The fleet.conf lines of a manager listening on `https://{address}` beside the harness's
    /// Unix socket, with the native supervisor, then `extra`.
    pub fn manager_config(&self, address: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let display = |path: &Path| path.display().to_string();
        let mut config = vec![
            ("api_listen".to_string(), format!("unix://{{socket}},https://{address}")),
            ("api_tls_cert_file".to_string(), display(&self.server.cert)),
            ("api_tls_key_file".to_string(), display(&self.server.key)),
            ("agent_ca_cert_file".to_string(), display(&self.agent_ca_file)),
            ("agent_ca_key_file".to_string(), display(&self.agent_ca_key)),
            ("unit_manager".to_string(), "native".to_string()),
        ];
        config.extend(extra.iter().map(|(key, value)| (key.to_string(), value.to_string())));
        config
    }
}

/// fleet.conf lines as the harness takes them.
pub fn pairs(config: &[(String, String)]) -> Vec<(&str, &str)> {
    config.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect()
}
