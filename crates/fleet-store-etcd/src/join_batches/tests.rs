//! Joins written together, against a real etcd: two managers on one etcd, many joins at once
//! through one token.

use std::time::Duration;

use fleet_registry::{CredentialRegistry, JoinRefused, RegistrationRecord, RegistrationRefused};
use fleet_testkit::EtcdServer;

use crate::tests::registry;

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
