//! Who a pull agent's machine ID belongs to, and what it may say of itself. Pure: the stores
//! keep the records and call these in their transactions; the API calls them on requests.
//!
//! A machine ID belongs to the key that first joined with it: rejoining as that machine takes
//! the same key (which is the machine's own credential), or an administrator's revocation and
//! `forget` first. The ID of a machine that reaches the store itself (a store member, whose
//! credential is its access to the store, not a key) is bound to it when it first registers:
//! no join takes it, live or not, until an administrator revokes and forgets it. What it may announce (metadata, public IP) is bounded by what was granted:
//! its registration token's metadata, and the public IP of its first announcement; changing
//! either is an administrator's act.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{RegistrationRecord, RegistrationRefused, RevokedMachine};

/// A pull agent's machine: its key and what it was granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineIdentity {
    pub id: String,
    /// SHA-256 (hex) of the machine's public key (its SubjectPublicKeyInfo, DER).
    pub key_sha256: String,
    /// The registration token it joined with (by name).
    pub registration: String,
    /// Seconds since the Unix epoch.
    pub joined: u64,
    /// What its registration token granted: binding, the machine cannot widen it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The public IP its first announcement gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<String>,
    /// A store member's ID (it reaches the store itself): no key holds it, no join takes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub member: bool,
}

impl MachineIdentity {
    /// The binding of a store member's ID, made when it first registers at `now`.
    pub fn member(id: &str, now: u64) -> Self {
        Self {
            id: id.to_string(),
            key_sha256: String::new(),
            registration: String::new(),
            joined: now,
            metadata: BTreeMap::new(),
            public_ip: None,
            member: true,
        }
    }
}

/// Why a join is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JoinRefused {
    #[error("{0}")]
    Token(RegistrationRefused),
    #[error("this registration token creates only machines named {pattern:?}")]
    NotNamed { pattern: String },
    #[error(
        "machine {0:?} is revoked: an administrator forgets it (fleetctl machine forget) before its ID is used again"
    )]
    Revoked(String),
    #[error("machine {0:?} was revoked with this key: join with a new key")]
    RevokedKey(String),
    #[error(
        "machine {0:?} belongs to another key: rejoin with that machine's own key, or an administrator revokes and forgets it first"
    )]
    Taken(String),
    #[error("machine {0:?} is alive in the cluster")]
    Alive(String),
    #[error(
        "machine {0:?} is a member of the cluster that reaches the store itself: an administrator revokes and forgets it (fleetctl machine revoke, then forget) before a pull agent may use its ID"
    )]
    Member(String),
}

/// Whether a registration token names `machine_id` among those it may create.
pub fn token_names(token: &RegistrationRecord, machine_id: &str) -> bool {
    match &token.machine_ids {
        None => true,
        Some(pattern) => fleet_core::glob::Glob::new(pattern).is_some_and(|glob| glob.matches(machine_id)),
    }
}

/// The identity a join with `token` at `now` gives `machine_id` over the key `key_sha256`,
/// given who holds the ID now (`bound`), its revocation, if any, and whether a machine of that
/// ID is alive in the cluster (`present`): a live machine no key holds (an etcd machine) is not
/// taken over, one the same key holds is the machine itself.
pub fn admit_join(
    token: &RegistrationRecord,
    now: u64,
    machine_id: &str,
    key_sha256: &str,
    bound: Option<&MachineIdentity>,
    revoked: Option<&RevokedMachine>,
    present: bool,
) -> Result<MachineIdentity, JoinRefused> {
    token.usable_at(now).map_err(JoinRefused::Token)?;
    if present && bound.is_none_or(|bound| bound.key_sha256 != key_sha256) {
        return Err(JoinRefused::Alive(machine_id.to_string()));
    }
    if !token_names(token, machine_id) {
        let pattern = token.machine_ids.clone().unwrap_or_default();
        return Err(JoinRefused::NotNamed { pattern });
    }
    if let Some(revoked) = revoked {
        if !revoked.forgotten {
            return Err(JoinRefused::Revoked(machine_id.to_string()));
        }
        if revoked.key_sha256.as_deref() == Some(key_sha256) {
            return Err(JoinRefused::RevokedKey(machine_id.to_string()));
        }
    }
    match bound {
        Some(bound) if bound.member => Err(JoinRefused::Member(machine_id.to_string())),
        Some(bound) if bound.key_sha256 != key_sha256 => Err(JoinRefused::Taken(machine_id.to_string())),
        // The same key again: the machine itself, which keeps what it was granted.
        Some(bound) => Ok(MachineIdentity { registration: token.name.clone(), joined: now, ..bound.clone() }),
        None => Ok(MachineIdentity {
            id: machine_id.to_string(),
            key_sha256: key_sha256.to_string(),
            registration: token.name.clone(),
            joined: now,
            metadata: token.metadata.clone(),
            public_ip: None,
            member: false,
        }),
    }
}

/// Why an announcement is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnnounceRefused {
    #[error(
        "machine {machine:?} may not announce metadata {key}={value}: its registration grants {granted}; an administrator changes machine metadata"
    )]
    Metadata { machine: String, key: String, value: String, granted: String },
    #[error(
        "machine {machine:?} announced public IP {announced}, but {bound} is its own; an administrator revokes and forgets it to change it"
    )]
    PublicIp { machine: String, announced: String, bound: String },
}

/// Checks what a machine announces of itself against what it was granted, and returns the
/// identity with the public IP bound (on its first announcement).
pub fn admit_announce(
    identity: &MachineIdentity,
    metadata: &BTreeMap<String, String>,
    public_ip: &str,
) -> Result<MachineIdentity, AnnounceRefused> {
    for (key, value) in metadata {
        if identity.metadata.get(key) != Some(value) {
            let granted = identity.metadata.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>();
            let granted = if granted.is_empty() { "none".to_string() } else { granted.join(",") };
            return Err(AnnounceRefused::Metadata {
                machine: identity.id.clone(),
                key: key.clone(),
                value: value.clone(),
                granted,
            });
        }
    }
    match &identity.public_ip {
        Some(bound) if !public_ip.is_empty() && bound != public_ip => Err(AnnounceRefused::PublicIp {
            machine: identity.id.clone(),
            announced: public_ip.to_string(),
            bound: bound.clone(),
        }),
        Some(_) => Ok(identity.clone()),
        None => Ok(MachineIdentity {
            public_ip: Some(public_ip.to_string()).filter(|ip| !ip.is_empty()),
            ..identity.clone()
        }),
    }
}

/// Whether a machine certificate over the key `key_sha256` is refused because its machine
/// was revoked: every key of a machine revoked and not forgotten (or revoked before keys were
/// recorded), the revoked key of one forgotten.
pub fn certificate_revoked(revoked: Option<&RevokedMachine>, key_sha256: &str) -> bool {
    match revoked {
        None => false,
        Some(revoked) if !revoked.forgotten => true,
        Some(revoked) => revoked.key_sha256.as_deref().is_none_or(|key| key == key_sha256),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(machine_ids: Option<&str>) -> RegistrationRecord {
        RegistrationRecord {
            name: "rack".into(),
            sha256: "00".into(),
            created: 0,
            expires: Some(100),
            max_uses: Some(2),
            uses: 0,
            metadata: BTreeMap::from([("rack".into(), "r9".into())]),
            machine_ids: machine_ids.map(str::to_string),
        }
    }

    fn revoked(key: Option<&str>, forgotten: bool) -> RevokedMachine {
        RevokedMachine { id: "m1".into(), at: 5, key_sha256: key.map(str::to_string), forgotten }
    }

    #[test]
    fn an_id_belongs_to_the_key_that_first_joined_with_it() {
        let first = admit_join(&token(None), 10, "m1", "k1", None, None, false).unwrap();
        assert_eq!((first.key_sha256.as_str(), first.metadata["rack"].as_str()), ("k1", "r9"));
        assert_eq!(
            admit_join(&token(None), 10, "m1", "k2", Some(&first), None, false),
            Err(JoinRefused::Taken("m1".into()))
        );
        let again = admit_join(&token(None), 11, "m1", "k1", Some(&first), None, false).unwrap();
        assert_eq!((again.key_sha256.as_str(), again.joined), ("k1", 11));
    }

    #[test]
    fn a_live_machine_is_taken_over_only_by_the_key_that_holds_it() {
        let alive =
            |key: &str, bound: Option<&MachineIdentity>| admit_join(&token(None), 10, "m1", key, bound, None, true);
        assert_eq!(alive("k1", None), Err(JoinRefused::Alive("m1".into())), "an etcd machine no key holds");
        let first = admit_join(&token(None), 10, "m1", "k1", None, None, false).unwrap();
        assert_eq!(alive("k2", Some(&first)), Err(JoinRefused::Alive("m1".into())));
        assert_eq!(
            alive("k1", Some(&first)).map(|identity| identity.key_sha256),
            Ok("k1".to_string()),
            "the machine itself"
        );
    }

    #[test]
    fn a_revoked_id_is_free_again_only_once_forgotten_and_never_for_its_old_key() {
        let refused =
            |revoked: &RevokedMachine, key: &str| admit_join(&token(None), 10, "m1", key, None, Some(revoked), false);
        assert_eq!(refused(&revoked(Some("k1"), false), "k2"), Err(JoinRefused::Revoked("m1".into())));
        assert_eq!(refused(&revoked(Some("k1"), true), "k1"), Err(JoinRefused::RevokedKey("m1".into())));
        assert!(refused(&revoked(Some("k1"), true), "k2").is_ok());
        assert!(certificate_revoked(Some(&revoked(Some("k1"), false)), "k2"));
        assert!(certificate_revoked(Some(&revoked(Some("k1"), true)), "k1"));
        assert!(!certificate_revoked(Some(&revoked(Some("k1"), true)), "k2"));
        assert!(certificate_revoked(Some(&revoked(None, true)), "k2"));
        assert!(!certificate_revoked(None, "k1"));
    }

    #[test]
    fn a_token_may_name_the_ids_it_creates_and_is_counted() {
        assert!(admit_join(&token(Some("edge-*")), 10, "edge-7", "k", None, None, false).is_ok());
        assert_eq!(
            admit_join(&token(Some("edge-*")), 10, "core-1", "k", None, None, false),
            Err(JoinRefused::NotNamed { pattern: "edge-*".into() })
        );
        let expired = admit_join(&token(None), 100, "m1", "k", None, None, false);
        assert_eq!(expired, Err(JoinRefused::Token(RegistrationRefused::Expired)));
    }

    #[test]
    fn a_machine_announces_no_more_than_it_was_granted() {
        let identity = admit_join(&token(None), 10, "m1", "k1", None, None, false).unwrap();
        let granted = BTreeMap::from([("rack".to_string(), "r9".to_string())]);
        let bound = admit_announce(&identity, &granted, "10.0.0.1").unwrap();
        assert_eq!(bound.public_ip.as_deref(), Some("10.0.0.1"));
        assert!(admit_announce(&bound, &BTreeMap::new(), "10.0.0.1").is_ok(), "saying less is fine");
        assert!(admit_announce(&bound, &granted, "").is_ok(), "not saying the IP is fine");
        let widened = BTreeMap::from([("role".to_string(), "db".to_string())]);
        let refused = admit_announce(&bound, &widened, "10.0.0.1").unwrap_err().to_string();
        assert!(refused.contains("role=db") && refused.contains("rack=r9"), "{refused}");
        let changed = BTreeMap::from([("rack".to_string(), "r1".to_string())]);
        assert!(admit_announce(&bound, &changed, "10.0.0.1").is_err());
        assert!(matches!(admit_announce(&bound, &granted, "10.9.9.9"), Err(AnnounceRefused::PublicIp { .. })));
    }
}
