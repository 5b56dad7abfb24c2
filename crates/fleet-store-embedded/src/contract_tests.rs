//! The registry contract against the embedded store.

use std::sync::Arc;

use fleet_registry::contract::{self, Opened};

use crate::EmbeddedRegistry;

async fn open() -> Opened {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("embedded store");
    Opened { registry: Arc::new(registry), chores: None, guard: Box::new(dir) }
}

mod opened {
    fleet_registry::registry_contract!(super::open);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_unit_hides_only_itself() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("store");
    contract::an_unreadable_unit_hides_only_itself(&registry, async || registry.corrupt_unit_record("bad.service"))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_records_its_format_once() {
    use fleet_registry::FormatRecord;
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("fleet.redb");
    let registry = EmbeddedRegistry::open(&path).expect("store");
    contract::a_store_records_its_format_once(&registry).await;
    drop(registry);
    let reopened = EmbeddedRegistry::open(&path).expect("store");
    assert_eq!(reopened.stored_format().await.expect("read").map(|stored| stored.format), Some(2), "kept");
}
