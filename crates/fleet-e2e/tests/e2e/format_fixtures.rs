//! Stores written by the previous release (issue 69): `fixtures/format-1` holds an embedded
//! `registry.redb` and an etcd key dump that fleet 0.1.0 wrote (scripts/make-format-fixtures.sh),
//! with what its API said of them. The current fleetd runs on each as it is, records its
//! format, and answers the same: units (names, contents, desired states, sources), machine
//! metadata, tokens, registration tokens, sources and rollouts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_e2e::{EtcdServer, Fleetd};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/format-1")
}

/// The body of `GET /fleet/v1/<resource>`.
fn listed(fleet: &Fleetd, resource: &str) -> Value {
    let answer = fleet.api("GET", &format!("/fleet/v1/{resource}"), "");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    serde_json::from_str(body).unwrap_or_else(|error| panic!("{resource}: {error}: {answer}"))
}

fn saved(dir: &str, resource: &str) -> Value {
    let path = fixtures().join(dir).join(format!("{resource}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("a saved answer")).expect("JSON")
}

/// Only `fields` of each element of `list[key]`, by name.
fn only(value: &Value, key: &str, fields: &[&str]) -> Vec<Value> {
    let mut rows: Vec<Value> = value[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {value}"))
        .iter()
        .map(|row| fields.iter().map(|field| (field.to_string(), row[*field].clone())).collect())
        .collect();
    rows.sort_by_key(|row: &Value| row["name"].as_str().unwrap_or_default().to_string());
    rows
}

/// What the current fleetd says of a store the previous release wrote, against what that
/// release said (`dir` of the fixtures).
fn answers_as_before(fleet: &Fleetd, dir: &str) {
    let units = ["name", "desiredState", "options", "source"];
    assert_eq!(only(&listed(fleet, "units"), "units", &units), only(&saved(dir, "units"), "units", &units));
    for resource in ["tokens", "registration-tokens"] {
        assert_eq!(listed(fleet, resource), saved(dir, resource), "{resource}");
    }
    let sources =
        ["name", "repo", "intervalSeconds", "paused", "keepRemoved", "minReadySeconds", "deadlineSeconds", "drift"];
    assert_eq!(only(&listed(fleet, "sources"), "sources", &sources), only(&saved(dir, "sources"), "sources", &sources));
    let rollouts = ["name", "state", "reason", "maxUnavailable", "minReadySeconds", "units", "created"];
    assert_eq!(
        only(&listed(fleet, "rollouts"), "rollouts", &rollouts),
        only(&saved(dir, "rollouts"), "rollouts", &rollouts)
    );
    let metadata = &listed(fleet, "machines")["machines"][0]["metadata"];
    assert_eq!(metadata["zone"], "z1", "the metadata override is kept: {metadata}");
    assert!(fleet.log().contains("recorded the store's format"), "{}", fleet.log());
}

#[test]
fn the_current_fleetd_runs_on_an_embedded_store_of_the_previous_release() {
    let config = [("metadata", "role=web"), ("unit_manager", "native")];
    let mut fleet = Fleetd::start("fixture0machine01", &config);
    fleet.stop_with(libc::SIGTERM);
    std::fs::copy(fixtures().join("registry.redb"), fleet.state_dir().join("registry.redb")).expect("the fixture");
    fleet.launch();
    answers_as_before(&fleet, "embedded");
}

#[test]
fn the_current_fleetd_runs_on_an_etcd_store_of_the_previous_release() {
    use base64::Engine;
    let etcd = EtcdServer::start();
    let dump: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("etcd-keys.json")).expect("the dump"))
            .expect("JSON");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd");
        let decode = |text: &Value| {
            base64::engine::general_purpose::STANDARD.decode(text.as_str().unwrap_or_default()).expect("base64")
        };
        for kv in &dump {
            client.put(decode(&kv["key"]), decode(&kv["value"]), None).await.expect("put");
        }
    });
    let endpoint = etcd.endpoint();
    let config = [("metadata", "role=web"), ("unit_manager", "native"), ("etcd_servers", endpoint.as_str())];
    let fleet = Fleetd::start("fixture0machine02", &config);
    fleet.wait_until("the fixture's units are listed", Duration::from_secs(30), |fleet| {
        listed(fleet, "units")["units"].as_array().is_some_and(|units| units.len() == 7)
    });
    answers_as_before(&fleet, "etcd");
}
