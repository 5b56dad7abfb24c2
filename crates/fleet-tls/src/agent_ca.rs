//! The cluster's agent CA, as a manager holds it: it turns a pull agent's certificate signing
//! request into a client certificate for that machine ID and nothing else. The subject, the
//! validity and the extensions are the manager's choice; from the request only the public key
//! is taken, once its signature proves the agent holds the private key.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;

/// The organization (O) of every machine certificate: what makes it a machine's.
pub const MACHINE_ORGANIZATION: &str = "machine";

/// Why a certificate cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum AgentCaError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("invalid agent CA: {0}")]
    Invalid(String),
    #[error("invalid certificate signing request: {0}")]
    BadRequest(String),
}

/// A CA that signs machine certificates.
pub struct AgentCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// The DER of the CA's subject: the issuer every machine certificate names.
    subject_der: Vec<u8>,
    lifetime: Duration,
}

fn read(path: &Path) -> Result<String, AgentCaError> {
    std::fs::read_to_string(path)
        .map_err(|error| AgentCaError::Read { path: path.display().to_string(), reason: error.to_string() })
}

impl AgentCa {
    /// Loads the CA certificate and key (PEM); certificates it signs are valid for `lifetime`.
    pub fn load(cert: &Path, key: &Path, lifetime: Duration) -> Result<Self, AgentCaError> {
        let cert_pem = read(cert)?;
        let key = KeyPair::from_pem(&read(key)?)
            .map_err(|_| AgentCaError::Invalid(format!("{} holds no usable key", key.display())))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|error| AgentCaError::Invalid(format!("{}: {error}", cert.display())))?;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|error| AgentCaError::Invalid(format!("{}: {error}", cert.display())))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&der)
            .map_err(|error| AgentCaError::Invalid(format!("{}: {error}", cert.display())))?;
        let subject_der = parsed.subject().as_raw().to_vec();
        Ok(Self { issuer, cert_pem, subject_der, lifetime })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The DER of the CA's subject, which every certificate it signs names as its issuer.
    pub fn subject_der(&self) -> &[u8] {
        &self.subject_der
    }

    /// Signs a client certificate for `machine_id` over the public key of `csr_pem`, valid
    /// from a little before `now` for the CA's lifetime. Returns the PEM and its expiry.
    pub fn sign(&self, machine_id: &str, csr_pem: &str, now: SystemTime) -> Result<(String, SystemTime), AgentCaError> {
        if csr_pem.len() > 16 * 1024 {
            return Err(AgentCaError::BadRequest("too long".into()));
        }
        let request = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|error| AgentCaError::BadRequest(error.to_string()))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, machine_id);
        params.distinguished_name.push(DnType::OrganizationName, MACHINE_ORGANIZATION);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
        let expires = now + self.lifetime;
        params.not_before = (now - Duration::from_secs(300)).into();
        params.not_after = expires.into();
        let certificate = params
            .signed_by(&request.public_key, &self.issuer)
            .map_err(|error| AgentCaError::BadRequest(error.to_string()))?;
        Ok((certificate.pem(), expires))
    }
}

/// 16 random bytes with the top bit clear (a positive serial number).
fn random_serial() -> [u8; 16] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // A failing random source leaves zeros, which only makes serials repeat.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes[0] &= 0x7f;
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(dir: &Path) -> (AgentCa, KeyPair) {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "agent CA");
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("ca-key.pem"), key.serialize_pem()).unwrap();
        let loaded = AgentCa::load(&dir.join("ca.pem"), &dir.join("ca-key.pem"), Duration::from_secs(3600)).unwrap();
        (loaded, key)
    }

    fn csr(subject: &str) -> (String, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, subject);
        params.distinguished_name.push(DnType::OrganizationName, "admin");
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        (params.serialize_request(&key).unwrap().pem().unwrap(), key)
    }

    #[test]
    fn a_signed_certificate_names_the_machine_and_nothing_the_request_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = ca(dir.path());
        let (request, key) = csr("someone-else");
        let now = SystemTime::now();
        let (pem, expires) = ca.sign("m1", &request, now).unwrap();
        assert_eq!(expires, now + Duration::from_secs(3600));
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let subject = cert.subject().to_string();
        assert!(subject.contains("CN=m1") && subject.contains("O=machine") && !subject.contains("admin"), "{subject}");
        assert_eq!(cert.issuer().as_raw(), ca.subject_der());
        assert!(!cert.is_ca(), "the request asked for a CA; it gets none");
        assert!(cert.subject_alternative_name().ok().flatten().is_none(), "no names the request asked for");
        use rcgen::PublicKeyData;
        assert_eq!(cert.public_key().subject_public_key.data.as_ref(), key.der_bytes(), "the agent's own key");
    }

    #[test]
    fn malformed_requests_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = ca(dir.path());
        for bad in ["", "not pem", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"] {
            assert!(matches!(ca.sign("m1", bad, SystemTime::now()), Err(AgentCaError::BadRequest(_))), "{bad}");
        }
        let (request, _) = csr("x");
        let tampered = request.replacen("MII", "MIJ", 1);
        assert!(ca.sign("m1", &tampered, SystemTime::now()).is_err());
    }
}
