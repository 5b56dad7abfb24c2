//! The sealed form of a secret's value, as stored:
//! `fleet-secret-1:<key id>:<base64 of nonce, ciphertext and tag>`, where the key id names the
//! key that sealed it (so a value sealed under another key says so rather than "tampered").

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce};
use ring::rand::{SecureRandom, SystemRandom};

use crate::key_file::{ClusterKey, ClusterKeys};

const PREFIX: &str = "fleet-secret-1";

/// Why a sealed value does not open (never showing any of the value).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the sealed value is not in fleet's format")]
    Malformed,
    #[error("the value was sealed under secrets key {0}, which this fleetd does not hold")]
    OtherKey(String),
    #[error("the sealed value does not open: it was changed, or belongs to another secret or version")]
    Tampered,
    #[error("the system's random number generator failed")]
    Random,
}

/// A value opened: its bytes are overwritten with zeros when it is dropped.
pub struct Revealed(Vec<u8>);

impl Revealed {
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Revealed {
    fn drop(&mut self) {
        crate::wipe::wipe(&mut self.0);
    }
}

impl std::fmt::Debug for Revealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Revealed({} bytes)", self.0.len())
    }
}

/// What the seal binds a value to: its secret's name and version.
fn bound_to(name: &str, version: u64) -> Vec<u8> {
    format!("{name}\0{version}").into_bytes()
}

fn cipher(key: &ClusterKey) -> LessSafeKey {
    LessSafeKey::new(key.aead_key())
}

/// Seals `value` as version `version` of secret `name`, under the keys' sealing key.
pub fn seal(keys: &ClusterKeys, name: &str, version: u64, value: &[u8]) -> Result<String, SealError> {
    let key = keys.sealing();
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).map_err(|_| SealError::Random)?;
    let mut sealed = value.to_vec();
    cipher(key)
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(bound_to(name, version)), &mut sealed)
        .map_err(|_| SealError::Random)?;
    let mut body = nonce.to_vec();
    body.append(&mut sealed);
    Ok(format!("{PREFIX}:{}:{}", key.id(), STANDARD.encode(body)))
}

/// The id of the key that sealed `sealed`, if it is in fleet's format.
pub fn sealed_with(sealed: &str) -> Option<&str> {
    let mut parts = sealed.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(PREFIX), Some(key_id), Some(_)) => Some(key_id),
        _ => None,
    }
}

/// Opens a value [`seal`] sealed as version `version` of secret `name`.
pub fn open(keys: &ClusterKeys, name: &str, version: u64, sealed: &str) -> Result<Revealed, SealError> {
    let mut parts = sealed.splitn(3, ':');
    let (Some(PREFIX), Some(key_id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SealError::Malformed);
    };
    let key = keys.by_id(key_id).ok_or_else(|| SealError::OtherKey(key_id.chars().take(16).collect()))?;
    let mut body = STANDARD.decode(body).map_err(|_| SealError::Malformed)?;
    if body.len() < NONCE_LEN + AES_256_GCM.tag_len() {
        return Err(SealError::Malformed);
    }
    let mut text = body.split_off(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(&body).map_err(|_| SealError::Malformed)?;
    let opened = cipher(key)
        .open_in_place(nonce, Aad::from(bound_to(name, version)), &mut text)
        .map_err(|_| SealError::Tampered)?
        .len();
    text.truncate(opened);
    Ok(Revealed(text))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn keys() -> ClusterKeys {
        ClusterKeys::generate().unwrap()
    }

    #[test]
    fn a_sealed_value_opens_with_its_name_and_version_only() {
        let keys = keys();
        let sealed = seal(&keys, "db-password", 3, b"hunter2").unwrap();
        assert!(sealed.starts_with("fleet-secret-1:"));
        assert_eq!(sealed_with(&sealed), Some(keys.sealing().id()));
        assert!(!sealed.contains("hunter2"));
        assert_eq!(open(&keys, "db-password", 3, &sealed).unwrap().expose(), b"hunter2");
        assert_eq!(open(&keys, "other", 3, &sealed).unwrap_err(), SealError::Tampered);
        assert_eq!(open(&keys, "db-password", 4, &sealed).unwrap_err(), SealError::Tampered);
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let keys = keys();
        assert_ne!(seal(&keys, "a", 1, b"same").unwrap(), seal(&keys, "a", 1, b"same").unwrap());
    }

    #[test]
    fn another_key_is_named_not_mistaken_for_tampering() {
        let sealed = seal(&keys(), "a", 1, b"value").unwrap();
        let other = keys();
        assert!(matches!(open(&other, "a", 1, &sealed), Err(SealError::OtherKey(_))));
    }

    #[test]
    fn garbage_is_malformed() {
        let keys = keys();
        for garbage in ["", "fleet-secret-1", "fleet-secret-2:x:y", "fleet-secret-1:id", "x:y:z"] {
            assert!(open(&keys, "a", 1, garbage).is_err(), "{garbage}");
        }
        let id = keys.sealing().id().to_string();
        assert_eq!(open(&keys, "a", 1, &format!("fleet-secret-1:{id}:!!")).unwrap_err(), SealError::Malformed);
        assert_eq!(open(&keys, "a", 1, &format!("fleet-secret-1:{id}:AAAA")).unwrap_err(), SealError::Malformed);
    }

    proptest! {
        #[test]
        fn every_value_round_trips(value in proptest::collection::vec(any::<u8>(), 0..4096), version in any::<u64>()) {
            let keys = keys();
            let sealed = seal(&keys, "s", version, &value).unwrap();
            let opened = open(&keys, "s", version, &sealed).unwrap();
            prop_assert_eq!(opened.expose(), value.as_slice());
        }

        #[test]
        fn any_changed_byte_is_caught(value in proptest::collection::vec(any::<u8>(), 1..256), at in any::<usize>(), flip in 1u8..) {
            let keys = keys();
            let sealed = seal(&keys, "s", 1, &value).unwrap();
            let (head, body) = sealed.rsplit_once(':').unwrap();
            let mut bytes = STANDARD.decode(body).unwrap();
            let at = at % bytes.len();
            bytes[at] ^= flip;
            let changed = format!("{head}:{}", STANDARD.encode(bytes));
            prop_assert_eq!(open(&keys, "s", 1, &changed).unwrap_err(), SealError::Tampered);
        }
    }
}
