//! The machine's own credentials: its certificate, its private key and the agent CA's
//! certificate, kept in one 0600 file under `state_dir`, and when to renew them.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

/// What a pull agent holds to prove who it is.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineCredentials {
    pub machine_id: String,
    /// PEM.
    pub certificate: String,
    /// PEM; never logged (see the `Debug` impl).
    pub key: String,
    /// The agent CA's certificate (PEM).
    pub ca_certificate: String,
    /// The certificate's validity, in seconds since the Unix epoch.
    pub not_before: u64,
    pub not_after: u64,
    /// The metadata the registration token gave the machine when it joined.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for MachineCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineCredentials")
            .field("machine_id", &self.machine_id)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read or write {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("{path} holds no usable credentials: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("the manager sent an unusable certificate: {0}")]
    BadCertificate(String),
}

/// The file the credentials live in, under a state directory.
pub fn credentials_path(state_dir: &Path) -> PathBuf {
    state_dir.join("machine-credentials.json")
}

fn seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

impl MachineCredentials {
    /// Credentials from a signed certificate (PEM) and the key it was made for; the validity
    /// is read from the certificate itself.
    pub fn new(
        machine_id: String,
        certificate: String,
        key: String,
        ca_certificate: String,
    ) -> Result<Self, CredentialsError> {
        let bad = |reason: String| CredentialsError::BadCertificate(reason);
        let der = CertificateDer::from_pem_slice(certificate.as_bytes()).map_err(|error| bad(error.to_string()))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).map_err(|error| bad(error.to_string()))?;
        let validity = parsed.validity();
        let (not_before, not_after) = (validity.not_before.timestamp(), validity.not_after.timestamp());
        if not_after <= not_before || not_before < 0 {
            return Err(bad("its validity is empty".into()));
        }
        let names_machine = parsed.subject().iter_common_name().any(|cn| cn.as_str().ok() == Some(machine_id.as_str()));
        if !names_machine {
            return Err(bad(format!("it does not name machine {machine_id:?}")));
        }
        Ok(Self {
            machine_id,
            certificate,
            key,
            ca_certificate,
            not_before: not_before as u64,
            not_after: not_after as u64,
            metadata: Default::default(),
        })
    }

    /// Reads the credentials kept in `state_dir`, if any.
    pub fn load(state_dir: &Path) -> Result<Option<Self>, CredentialsError> {
        let path = credentials_path(state_dir);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(CredentialsError::Io { path, reason: error.to_string() }),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|error| CredentialsError::Corrupt { path, reason: error.to_string() })
    }

    /// Keeps the credentials in `state_dir`, readable by the owner only, replacing the old
    /// ones at once (a crash leaves the old or the new, never half of either).
    pub fn save(&self, state_dir: &Path) -> Result<(), CredentialsError> {
        let path = credentials_path(state_dir);
        let text = serde_json::to_vec(self)
            .map_err(|error| CredentialsError::Io { path: path.clone(), reason: error.to_string() })?;
        fleet_fs::write_private(&path, &text).map_err(|error| CredentialsError::Io { path, reason: error.to_string() })
    }

    /// Whether to renew at `now`: once two thirds of the validity have passed.
    pub fn renewal_due(&self, now: SystemTime) -> bool {
        let lifetime = self.not_after.saturating_sub(self.not_before);
        seconds(now) >= self.not_before + lifetime * 2 / 3
    }

    /// How long until [`MachineCredentials::renewal_due`] turns true (zero if it is).
    pub fn until_renewal(&self, now: SystemTime) -> Duration {
        let lifetime = self.not_after.saturating_sub(self.not_before);
        Duration::from_secs((self.not_before + lifetime * 2 / 3).saturating_sub(seconds(now)))
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        seconds(now) >= self.not_after
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;

    fn certificate(cn: &str, lifetime: Duration) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        let now = SystemTime::now();
        params.not_before = now.into();
        params.not_after = (now + lifetime).into();
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn kept_private_read_back_and_renewed_at_two_thirds() {
        let dir = tempfile::tempdir().unwrap();
        assert!(MachineCredentials::load(dir.path()).unwrap().is_none());
        let (cert, key) = certificate("m1", Duration::from_secs(3000));
        let credentials = MachineCredentials::new("m1".into(), cert, key.clone(), "ca".into()).unwrap();
        credentials.save(dir.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(credentials_path(dir.path())).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(MachineCredentials::load(dir.path()).unwrap(), Some(credentials.clone()));
        assert!(!format!("{credentials:?}").contains(&key), "the key is never printed");

        let start = UNIX_EPOCH + Duration::from_secs(credentials.not_before);
        assert!(!credentials.renewal_due(start + Duration::from_secs(1900)));
        assert!(credentials.renewal_due(start + Duration::from_secs(2000)));
        assert_eq!(credentials.until_renewal(start + Duration::from_secs(1000)), Duration::from_secs(1000));
        assert!(!credentials.expired(start + Duration::from_secs(2999)));
        assert!(credentials.expired(start + Duration::from_secs(3000)));
    }

    #[test]
    fn a_certificate_for_another_machine_or_garbage_is_refused() {
        let (cert, key) = certificate("m2", Duration::from_secs(60));
        assert!(MachineCredentials::new("m1".into(), cert, key.clone(), String::new()).is_err());
        assert!(MachineCredentials::new("m1".into(), "not pem".into(), key, String::new()).is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(credentials_path(dir.path()), "{").unwrap();
        assert!(matches!(MachineCredentials::load(dir.path()), Err(CredentialsError::Corrupt { .. })));
    }
}
