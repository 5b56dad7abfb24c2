//! Cluster secrets as units name them: `[X-Fleet] Secret=db-password` (the credential is
//! called after the secret) or `Secret=db-password:DB_PASSWORD` (named so for the unit). A
//! unit carries the reference, never the value: its hash covers which secrets it uses, and
//! the value reaches only the machine that runs it, as a systemd credential.
//!
//! The grammar and bounds every entry point checks (the API, fleetctl, a git source).

/// The key in `[X-Fleet]`.
pub const KEY: &str = "Secret";

/// The longest value a secret may have.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The most secrets one unit may name.
pub const MAX_REFERENCES: usize = 64;

/// The longest name of a secret or a credential.
pub const MAX_NAME_BYTES: usize = 128;

/// Whether `name` may name a secret or a credential: 1 to 128 of `A-Z a-z 0-9 _ . -`, not
/// starting with `.` or `-` (a file name in `$CREDENTIALS_DIRECTORY`, a key in a store, a
/// word on a command line: nothing that is a path, an option or an escape).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.starts_with(['.', '-'])
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'))
}

/// Why `name` cannot name a secret, for an error message.
pub fn name_problem(name: &str) -> Option<String> {
    (!valid_name(name)).then(|| {
        format!(
            "secret name {:?} is not 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 _ . - (not starting with . or -)",
            shortened(name)
        )
    })
}

/// At most the first 64 characters of `text`, for an error message about it.
fn shortened(text: &str) -> String {
    text.chars().take(64).collect()
}

/// One `Secret=` of a unit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretReference {
    /// The cluster secret.
    pub secret: String,
    /// The credential's name in the unit's `$CREDENTIALS_DIRECTORY`.
    pub credential: String,
}

/// Reads one `Secret=` value.
pub fn parse_reference(value: &str) -> Result<SecretReference, String> {
    let value = value.trim();
    let (secret, credential) = match value.split_once(':') {
        Some((secret, credential)) => (secret, credential),
        None => (value, value),
    };
    for name in [secret, credential] {
        if let Some(problem) = name_problem(name) {
            return Err(format!("Secret={:?}: {problem}", shortened(value)));
        }
    }
    Ok(SecretReference { secret: secret.to_string(), credential: credential.to_string() })
}

/// The secrets `file` names, in order; an error names the first value that cannot be read,
/// too many of them, or two that give one credential name.
pub fn references(file: &crate::UnitFile) -> Result<Vec<SecretReference>, String> {
    let values: Vec<&str> = file.values("X-Fleet", KEY).collect();
    if values.len() > MAX_REFERENCES {
        return Err(format!("the unit names {} secrets; at most {MAX_REFERENCES} may be named", values.len()));
    }
    let mut references: Vec<SecretReference> = Vec::with_capacity(values.len());
    for value in values {
        let reference = parse_reference(value)?;
        if references.iter().any(|known| known.credential == reference.credential) {
            return Err(format!("two Secret= lines give the credential name {:?}", reference.credential));
        }
        references.push(reference);
    }
    Ok(references)
}

/// Why `value` cannot be a secret's value.
pub fn value_problem(value: &[u8]) -> Option<String> {
    if value.is_empty() {
        return Some("a secret's value may not be empty".into());
    }
    (value.len() > MAX_VALUE_BYTES)
        .then(|| format!("a secret's value may be at most {MAX_VALUE_BYTES} bytes; this one is {}", value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(text: &str) -> crate::UnitFile {
        crate::UnitFile::parse(text).unwrap()
    }

    #[test]
    fn names_are_file_names_and_nothing_else() {
        for good in ["db-password", "API_KEY", "tls.key", "a", &"x".repeat(128)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", ".hidden", "-rf", "a/b", "..", "a b", "ä", "a:b", "a\nb", &"x".repeat(129)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_reference_names_the_secret_and_maybe_the_credential() {
        assert_eq!(
            parse_reference("db-password").unwrap(),
            SecretReference { secret: "db-password".into(), credential: "db-password".into() }
        );
        assert_eq!(
            parse_reference(" db-password:DB_PASSWORD ").unwrap(),
            SecretReference { secret: "db-password".into(), credential: "DB_PASSWORD".into() }
        );
        assert!(parse_reference("db:../etc/passwd").unwrap_err().contains("is not 1 to 128"));
        assert!(parse_reference("").is_err());
        assert!(parse_reference("a:").is_err());
    }

    #[test]
    fn a_unit_names_at_most_so_many_distinct_credentials() {
        let two = unit("[Service]\nExecStart=/bin/true\n[X-Fleet]\nSecret=db\nSecret=api:API\n");
        assert_eq!(references(&two).unwrap().len(), 2);
        let clash = unit("[X-Fleet]\nSecret=db:cred\nSecret=other:cred\n");
        assert!(references(&clash).unwrap_err().contains("credential name \"cred\""));
        let many: String = (0..=MAX_REFERENCES).map(|n| format!("Secret=s{n}\n")).collect();
        let too_many = unit(&format!("[X-Fleet]\n{many}"));
        assert!(references(&too_many).unwrap_err().contains("at most 64"));
        assert_eq!(references(&unit("[Service]\nExecStart=/bin/true\n")).unwrap(), vec![]);
    }

    #[test]
    fn values_are_bounded() {
        assert!(value_problem(b"").is_some());
        assert!(value_problem(&vec![b'x'; MAX_VALUE_BYTES]).is_none());
        assert!(value_problem(&vec![b'x'; MAX_VALUE_BYTES + 1]).unwrap().contains("at most 65536 bytes"));
    }
}
