//! The identity a client certificate names, read from its subject the way Kubernetes reads
//! one: the common name (CN) is who it is, the organization (O) the role it holds
//! (`admin`, `operator` or `viewer`), and for an operator an organizational unit (OU) the
//! unit pattern it is limited to.

use fleet_core::access::Role;

/// What a verified client certificate says of its holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateIdentity {
    pub name: String,
    /// The role the subject names, or why it names none (the holder is then refused
    /// everything with a 403).
    pub role: Result<Role, String>,
}

/// The longest name taken from a certificate.
const MAX_NAME: usize = 128;

/// Reads the subject of a DER certificate that the TLS handshake has already verified.
/// `None` when it cannot be parsed or names no usable common name.
pub fn from_der(der: &[u8]) -> Option<CertificateIdentity> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
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
    let role = match organization {
        None => Err("its subject has no organization (O) naming a role".to_string()),
        Some(role) => Role::parse(&role, unit.as_deref()).map_err(|error| error.to_string()),
    };
    Some(CertificateIdentity { name, role })
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
        let identity = from_der(&der).unwrap();
        assert_eq!(identity.name, "deploy-bot");
        assert_eq!(identity.role.unwrap().to_string(), "operator(web-*)");

        let viewer = from_der(&certificate(&[(DnType::CommonName, "eve"), (DnType::OrganizationName, "viewer")]));
        assert_eq!(viewer.unwrap().role, Ok(Role::Viewer));
    }

    #[test]
    fn a_subject_without_a_role_or_name_grants_nothing() {
        let no_role = from_der(&certificate(&[(DnType::CommonName, "bob")])).unwrap();
        assert!(no_role.role.is_err());
        let bad_role = from_der(&certificate(&[(DnType::CommonName, "bob"), (DnType::OrganizationName, "root")]));
        assert!(bad_role.unwrap().role.is_err());
        assert!(from_der(&certificate(&[(DnType::OrganizationName, "admin")])).is_none());
        assert!(from_der(b"not a certificate").is_none());
    }
}
