//! The identity a client certificate names, read from its subject the way Kubernetes reads
//! one: the common name (CN) is who it is, the organization (O) the role it holds
//! (`admin`, `operator` or `viewer`), and for an operator an organizational unit (OU) the
//! unit pattern it is limited to.

use fleet_core::access::Role;
use fleet_core::machine::valid_machine_id;

use crate::agent_ca::MACHINE_ORGANIZATION;

/// What a verified client certificate says of its holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateIdentity {
    pub name: String,
    /// The role the subject names, or why it names none (the holder is then refused
    /// everything with a 403).
    pub role: Result<Role, String>,
    /// SHA-256 (hex) of the certificate's public key (its SubjectPublicKeyInfo): what a
    /// machine ID is bound to.
    pub key_sha256: String,
}

/// SHA-256 (hex) of a DER certificate's public key.
pub fn key_sha256(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(crate::hex_sha256(certificate.public_key().raw))
}

/// SHA-256 (hex) of a PEM certificate's public key.
pub fn key_sha256_of_pem(pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    key_sha256(&pem.contents)
}

/// The longest name taken from a certificate.
const MAX_NAME: usize = 128;

/// Reads the subject of a DER certificate that the TLS handshake has already verified.
/// `None` when it cannot be parsed or names no usable common name. `machine_issuer` is the
/// subject of the cluster's agent CA: a certificate it issued names a machine (and only that),
/// and only it may issue one that does. A certificate past its validity names no role: a
/// resumed TLS session carries the certificate its first handshake verified, maybe hours ago.
pub fn from_der(der: &[u8], machine_issuer: Option<&[u8]>) -> Option<CertificateIdentity> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let from_agent_ca = machine_issuer.is_some_and(|issuer| certificate.issuer().as_raw() == issuer);
    let subject = certificate.subject();
    let first = |values: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue<'_>>| {
        values.next().and_then(|value| value.as_str().ok()).map(str::to_string)
    };
    let name = first(&mut subject.iter_common_name())?;
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return None;
    }
    let organization = first(&mut subject.iter_organization());
    let unit = first(&mut subject.iter_organizational_unit());
    let role = match (organization.as_deref(), from_agent_ca) {
        _ if !certificate.validity().is_valid() => Err("its certificate is outside its validity period".to_string()),
        (Some(MACHINE_ORGANIZATION), true) if valid_machine_id(&name) => Ok(Role::Machine { id: name.clone() }),
        (_, true) => Err("the agent CA issues machine certificates only".to_string()),
        (Some(MACHINE_ORGANIZATION), false) => Err("only the agent CA issues machine certificates".to_string()),
        (None, false) => Err("its subject has no organization (O) naming a role".to_string()),
        (Some(role), false) => Role::parse(role, unit.as_deref()).map_err(|error| error.to_string()),
    };
    let key_sha256 = crate::hex_sha256(certificate.public_key().raw);
    Some(CertificateIdentity { name, role, key_sha256 })
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;

    fn certificate(subject: &[(DnType, &str)]) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.self_signed(&KeyPair::generate().unwrap()).unwrap().der().to_vec()
    }

    #[test]
    fn the_subject_names_identity_role_and_scope() {
        let der = certificate(&[
            (DnType::CommonName, "deploy-bot"),
            (DnType::OrganizationName, "operator"),
            (DnType::OrganizationalUnitName, "web-*"),
        ]);
        let identity = from_der(&der, None).unwrap();
        assert_eq!(identity.name, "deploy-bot");
        assert_eq!(identity.role.unwrap().to_string(), "operator(web-*)");

        let viewer = from_der(&certificate(&[(DnType::CommonName, "eve"), (DnType::OrganizationName, "viewer")]), None);
        assert_eq!(viewer.unwrap().role, Ok(Role::Viewer));
    }

    #[test]
    fn machine_certificates_come_from_the_agent_ca_only() {
        // Self-signed: its issuer is its own subject, which stands in for the agent CA's.
        let der = certificate(&[(DnType::CommonName, "m1"), (DnType::OrganizationName, "machine")]);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let issuer = parsed.issuer().as_raw().to_vec();
        assert_eq!(from_der(&der, Some(&issuer)).unwrap().role, Ok(Role::Machine { id: "m1".into() }));
        assert!(from_der(&der, None).unwrap().role.is_err(), "another CA's machine certificate");
        let admin = certificate(&[(DnType::CommonName, "m1"), (DnType::OrganizationName, "admin")]);
        let (_, parsed) = x509_parser::parse_x509_certificate(&admin).unwrap();
        let issuer = parsed.issuer().as_raw().to_vec();
        assert!(from_der(&admin, Some(&issuer)).unwrap().role.is_err(), "the agent CA makes no admins");
    }

    #[test]
    fn a_certificate_outside_its_validity_grants_nothing() {
        // What a resumed TLS session presents is its first handshake's certificate, unchecked since.
        let subject = [(DnType::CommonName, "m1"), (DnType::OrganizationName, "admin")];
        let dated = |not_before: i32, not_after: i32| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name = DistinguishedName::new();
            for (kind, value) in &subject {
                params.distinguished_name.push(kind.clone(), *value);
            }
            params.not_before = rcgen::date_time_ymd(not_before, 1, 1);
            params.not_after = rcgen::date_time_ymd(not_after, 1, 1);
            params.self_signed(&KeyPair::generate().unwrap()).unwrap().der().to_vec()
        };
        assert_eq!(from_der(&dated(2000, 4000), None).unwrap().role, Ok(Role::Admin));
        let expired = from_der(&dated(2000, 2001), None).unwrap();
        assert_eq!(expired.role, Err("its certificate is outside its validity period".to_string()));
        assert!(from_der(&dated(3999, 4000), None).unwrap().role.is_err(), "not valid yet");
    }

    #[test]
    fn a_subject_without_a_role_or_name_grants_nothing() {
        let no_role = from_der(&certificate(&[(DnType::CommonName, "bob")]), None).unwrap();
        assert!(no_role.role.is_err());
        let bad_role = from_der(&certificate(&[(DnType::CommonName, "bob"), (DnType::OrganizationName, "root")]), None);
        assert!(bad_role.unwrap().role.is_err());
        assert!(from_der(&certificate(&[(DnType::OrganizationName, "admin")]), None).is_none());
        assert!(from_der(b"not a certificate", None).is_none());
    }
}
