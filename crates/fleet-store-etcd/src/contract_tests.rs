//! The registry contract against the etcd store, opened both ways: as a cluster member's
//! fleetd opens it, and as a manager of pull agents does (every machine's work from one copy).

use std::sync::Arc;
use std::time::Duration;

use fleet_registry::contract::{self, Opened};
use fleet_registry::{CredentialRegistry, RegistrationRecord};
use fleet_testkit::{EtcdServer, eventually};

use crate::{EtcdOptions, EtcdRegistry, Lifetimes};

/// A new etcd, and the etcd store on it.
async fn etcd_store(serve_many_machines: bool) -> (EtcdRegistry, EtcdServer) {
    let etcd = EtcdServer::start();
    let options = EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: "/contract/".into(),
        request_timeout: Duration::from_secs(2),
        serve_many_machines,
        ..EtcdOptions::default()
    };
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(5) };
    let registry = EtcdRegistry::connect(&options, lifetimes).await.expect("etcd store");
    (registry, etcd)
}

async fn open_with(serve_many_machines: bool) -> Opened {
    let (registry, etcd) = etcd_store(serve_many_machines).await;
    let registry = Arc::new(registry);
    Opened { registry: registry.clone(), chores: Some(registry), guard: Box::new(etcd) }
}

async fn open() -> Opened {
    open_with(false).await
}

async fn open_serving_many() -> Opened {
    open_with(true).await
}

mod opened_by_a_member {
    fleet_registry::registry_contract!(super::open);
}

mod opened_serving_many_machines {
    fleet_registry::registry_contract!(super::open_serving_many);
}

/// The etcd store drops an expired registration token by itself (its lease ends).
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_registration_token_is_dropped() {
    let (registry, _etcd) = etcd_store(false).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let record = RegistrationRecord {
        name: "brief".into(),
        sha256: "dd".into(),
        created: now,
        expires: Some(now + 1),
        max_uses: None,
        uses: 0,
        metadata: Default::default(),
        machine_ids: None,
    };
    assert!(registry.create_registration(&record).await.expect("create"));
    eventually("the lease drops the token", async || registry.registrations().await.expect("list").is_empty()).await;
}

async fn an_unreadable_unit(serve_many_machines: bool) {
    let (registry, _etcd) = etcd_store(serve_many_machines).await;
    contract::an_unreadable_unit_hides_only_itself(&registry, async || {
        registry.corrupt_unit_record("bad.service").await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_unit_hides_only_itself_from_a_member() {
    an_unreadable_unit(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_unit_hides_only_itself_serving_many_machines() {
    an_unreadable_unit(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_records_its_format_once() {
    use fleet_registry::FormatRecord;
    let (registry, etcd) = etcd_store(false).await;
    contract::a_store_records_its_format_once(&registry).await;
    let options = EtcdOptions {
        endpoints: vec![etcd.endpoint()],
        key_prefix: "/contract/".into(),
        request_timeout: Duration::from_secs(2),
        ..EtcdOptions::default()
    };
    let lifetimes = Lifetimes { agent_ttl: Duration::from_secs(10), engine_lease_ttl: Duration::from_secs(5) };
    let other = EtcdRegistry::connect(&options, lifetimes).await.expect("etcd store");
    assert_eq!(
        other.stored_format().await.expect("read").map(|stored| stored.format),
        Some(2),
        "another member reads it"
    );
}
