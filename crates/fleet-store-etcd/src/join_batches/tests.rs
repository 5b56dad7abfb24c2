//! Joins written together, against a real etcd: two managers on one etcd, many joins at once
//! through one token.

use std::time::Duration;

use fleet_registry::{CredentialRegistry, JoinRefused, MachineIdentity, RegistrationRecord, RegistrationRefused};
use fleet_testkit::EtcdServer;

use crate::tests::{keys_under, registry};

/// 120 machines join through one token of 90 uses, half through each of two managers, all at
/// once: exactly 90 join, each bound to its own key, and the token counts 90 uses. Each
/// manager writes its waiting joins together, and the two managers' batches race on the
/// token's revision like single joins did.
#[tokio::test]
async fn joins_at_once_through_two_managers_use_a_token_exactly_as_often_as_it_allows() {
    let etcd = EtcdServer::start();
    let ttl = Duration::from_secs(30);
    let (first, second) = (registry(&etcd, ttl).await, registry(&etcd, ttl).await);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let token = RegistrationRecord {
        name: "rush".into(),
        sha256: "ff".into(),
        created: now,
        expires: None,
        max_uses: Some(90),
        uses: 0,
        metadata: Default::default(),
        machine_ids: None,
    };
    assert!(first.create_registration(&token).await.unwrap());
    let joins = (0..120).map(|index| {
        let manager = if index % 2 == 0 { first.clone() } else { second.clone() };
        let (machine, key) = (format!("m{index:03}"), format!("k{index:03}"));
        tokio::spawn(async move { (machine.clone(), manager.join_machine("ff", now, &machine, &key).await) })
    });
    let mut granted = 0;
    let mut exhausted = 0;
    for join in joins.collect::<Vec<_>>() {
        let (machine, answer) = join.await.unwrap();
        match answer.unwrap() {
            Ok((_, identity)) => {
                assert_eq!(identity.id, machine);
                assert_eq!(identity.key_sha256, format!("k{}", &machine[1..]));
                granted += 1;
            }
            Err(JoinRefused::Token(RegistrationRefused::Exhausted)) => exhausted += 1,
            Err(other) => panic!("{machine}: {other:?}"),
        }
    }
    assert_eq!((granted, exhausted), (90, 30));
    let listed = first.registrations().await.unwrap();
    assert_eq!(listed.iter().map(|record| record.uses).collect::<Vec<_>>(), vec![90]);
    let mut bound = 0;
    for index in 0..120 {
        bound += usize::from(second.machine_identity(&format!("m{index:03}")).await.unwrap().is_some());
    }
    assert_eq!(bound, 90, "every machine that joined, and no other, is bound");
}

/// 120 machines join through one token without a use limit, half through each of two
/// managers, all at once: every one joins, the token lists 120 uses, and the managers wrote
/// no key in common, so neither's batches could race the other's (each counts its uses under
/// a key of its own, and the token's record is never written). A counter carries the token's expiry lease, and revoking
/// the token deletes its counters, so a token made again under the name starts at none.
#[tokio::test]
async fn joins_through_two_managers_on_a_token_without_a_limit_never_race() {
    let etcd = EtcdServer::start();
    let ttl = Duration::from_secs(30);
    let (first, second) = (registry(&etcd, ttl).await, registry(&etcd, ttl).await);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let token = RegistrationRecord {
        name: "fleet".into(),
        sha256: "ee".into(),
        created: now,
        expires: Some(now + 3600),
        max_uses: None,
        uses: 0,
        metadata: Default::default(),
        machine_ids: None,
    };
    assert!(first.create_registration(&token).await.unwrap());
    let joins = (0..120).map(|index| {
        let manager = if index % 2 == 0 { first.clone() } else { second.clone() };
        let (machine, key) = (format!("m{index:03}"), format!("k{index:03}"));
        tokio::spawn(async move { (machine.clone(), manager.join_machine("ee", now, &machine, &key).await) })
    });
    for join in joins.collect::<Vec<_>>() {
        let (machine, answer) = join.await.unwrap();
        let (_, identity) = answer.unwrap().unwrap_or_else(|refused| panic!("{machine}: {refused:?}"));
        assert_eq!(identity.id, machine);
    }
    // No key both managers wrote, so no batch could lose a race to the other's: the token's
    // record was never rewritten (its metric counts races process-wide, and tests of this
    // binary share a process under `cargo test`).
    let keys = first.keys();
    let token_key = first.connection().get(&keys.registration("fleet"), None).await.unwrap();
    let token_kv = token_key.kvs().first().expect("the token");
    assert_eq!(token_kv.mod_revision(), token_kv.create_revision(), "the token's record is not written by joins");
    for manager in [&first, &second] {
        let listed = manager.registrations().await.unwrap();
        assert_eq!(listed.iter().map(|record| record.uses).collect::<Vec<_>>(), vec![120]);
    }

    let counters = keys_under(&first, &keys.registration_uses("fleet")).await;
    assert_eq!(counters.len(), 2, "one counter a manager: {counters:?}");
    let lease_of = |key: String| {
        let registry = first.clone();
        async move { registry.connection().get(&key, None).await.unwrap().kvs().first().map(|kv| kv.lease()) }
    };
    let token_lease = lease_of(keys.registration("fleet")).await.expect("the token");
    assert_ne!(token_lease, 0, "an expiring token has a lease");
    for counter in counters {
        assert_eq!(lease_of(counter).await, Some(token_lease), "a counter ends with its token");
    }

    assert!(second.revoke_registration("fleet").await.unwrap());
    assert!(keys_under(&first, &keys.registration_uses("fleet")).await.is_empty());
    assert!(!second.revoke_registration("fleet").await.unwrap(), "revoked once");
    assert!(first.create_registration(&RegistrationRecord { expires: None, ..token }).await.unwrap());
    assert!(second.join_machine("ee", now, "m999", "k999").await.unwrap().is_ok());
    let listed = first.registrations().await.unwrap();
    assert_eq!(listed.iter().map(|record| record.uses).collect::<Vec<_>>(), vec![1], "a new token starts afresh");
}

/// Identities put at the same time (pull agents recording their public IP on their first
/// announcement) go in one write: thirty, one etcd revision, each readable after; a machine
/// given twice keeps the identity put later.
#[tokio::test]
async fn identities_put_at_once_are_written_together() {
    let etcd = EtcdServer::start();
    let manager = registry(&etcd, Duration::from_secs(30)).await;
    let identity = |index: usize, ip: &str| MachineIdentity {
        id: format!("m{index:02}"),
        key_sha256: format!("k{index:02}"),
        registration: "fleet".into(),
        joined: 1,
        metadata: Default::default(),
        public_ip: Some(ip.into()),
        member: false,
    };
    manager.put_machine_identity(&identity(99, "10.0.0.99")).await.unwrap();
    let revision =
        || async { manager.connection().get("/fleet-test/", None).await.unwrap().header().unwrap().revision() };
    let before = revision().await;

    let held = manager.inner.identity_batches.hold_turn().await;
    let mut putting = Vec::new();
    for (index, ip) in (0..30).map(|index| (index, "10.0.0.1")).chain([(7, "10.0.0.2")]) {
        let (putter, identity) = (manager.clone(), identity(index, ip));
        putting.push(tokio::spawn(async move { putter.put_machine_identity(&identity).await }));
        // In this order: the second identity of m07 is the later.
        while manager.inner.identity_batches.waiting() < putting.len() {
            tokio::task::yield_now().await;
        }
    }
    drop(held);
    for put in putting {
        put.await.unwrap().unwrap();
    }

    assert_eq!(revision().await, before + 1, "thirty-one puts, one write");
    for index in 0..30 {
        let read = manager.machine_identity(&format!("m{index:02}")).await.unwrap().expect("written");
        let ip = if index == 7 { "10.0.0.2" } else { "10.0.0.1" };
        assert_eq!(read.public_ip.as_deref(), Some(ip), "m{index:02}");
    }
}
