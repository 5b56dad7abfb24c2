//! Cluster secrets as units name them: `[X-Fleet] Secret=db-password` (the credential is
//! called after the secret) or `Secret=db-password:DB_PASSWORD` (named so for the unit). A
//! unit carries the reference, never the value: its hash covers which secrets it uses, and
//! the value reaches only the machine that runs it, as a systemd credential.
//!
//! The grammar and bounds every entry point checks (the API, fleetctl, a git source).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
        if reference.credential == crate::required_places::FILE_NAME {
            return Err(format!(
                "the credential name {:?} is fleet's own (where what the unit requires runs)",
                reference.credential
            ));
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

/// The versions of its secrets a unit is to run with, where they are not simply the newest:
/// a rotation rolled out in waves holds the units it has not reached yet on the version they
/// run (and an undo takes them back to it). A secret the unit names and that is not here is
/// delivered at its newest version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretPins {
    /// Secret name → version.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, u64>,
    /// A machine running the unit writes a moved version's credential where the unit reads it
    /// without restarting the unit (`secret set --no-restart`); otherwise it restarts the unit
    /// with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
}

impl SecretPins {
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty() && !self.in_place
    }

    /// Whether a unit that was given `delivered` (secret → version) must be given its
    /// credentials again for these pins; unknown deliveries (`None`: a unit taken over from
    /// an earlier fleetd) are taken to be what is pinned.
    pub fn moved_from(&self, delivered: Option<&BTreeMap<String, u64>>) -> bool {
        delivered.is_some_and(|delivered| {
            self.versions.iter().any(|(secret, version)| delivered.get(secret) != Some(version))
        })
    }
}

/// What a rollout of a secret's version calls a unit's content: a hash of the secret's name
/// and version, so that the rollout's state machine (which follows unit hashes from one to
/// another) steps units from one version of a secret to another as it steps them from one
/// unit file to another. Never a unit file's hash: that covers `[X-Fleet]` text, not this.
pub fn version_identity(secret: &str, version: u64) -> crate::UnitHash {
    use sha1::{Digest, Sha1};
    let mut digest = Sha1::new();
    digest.update(b"fleet secret version\0");
    digest.update(secret.as_bytes());
    digest.update(b"\0");
    digest.update(version.to_be_bytes());
    crate::UnitHash(digest.finalize().into())
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
    fn pins_move_only_where_a_known_delivery_differs() {
        let pins = SecretPins { versions: BTreeMap::from([("db".to_string(), 3)]), in_place: false };
        let delivered = |version: u64| BTreeMap::from([("db".to_string(), version), ("api".to_string(), 9)]);
        assert!(!pins.moved_from(Some(&delivered(3))), "the pinned version was delivered");
        assert!(pins.moved_from(Some(&delivered(2))));
        assert!(pins.moved_from(Some(&BTreeMap::new())), "a pinned secret not delivered at all");
        assert!(!pins.moved_from(None), "a unit taken over is taken to run what is pinned");
        assert!(!SecretPins::default().moved_from(Some(&delivered(1))), "no pins: the newest, whatever it is");
    }

    #[test]
    fn each_version_of_each_secret_is_its_own_content() {
        assert_eq!(version_identity("db", 2), version_identity("db", 2));
        assert_ne!(version_identity("db", 2), version_identity("db", 3));
        assert_ne!(version_identity("db", 2), version_identity("api", 2));
    }

    #[test]
    fn values_are_bounded() {
        assert!(value_problem(b"").is_some());
        assert!(value_problem(&vec![b'x'; MAX_VALUE_BYTES]).is_none());
        assert!(value_problem(&vec![b'x'; MAX_VALUE_BYTES + 1]).unwrap().contains("at most 65536 bytes"));
    }
}
