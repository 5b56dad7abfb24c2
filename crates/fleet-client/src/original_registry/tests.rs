use serde_json::json;

use super::*;

fn leaf(key: &str, value: &str) -> serde_json::Value {
    json!({"key": key, "value": value, "modifiedIndex": 7, "createdIndex": 7})
}

fn dir(key: &str, nodes: Vec<serde_json::Value>) -> serde_json::Value {
    json!({"key": key, "dir": true, "nodes": nodes})
}

const HASH: [u8; 20] = [0xab; 20];

fn job(name: &str, object: &str, target_state: Option<&str>, target: Option<&str>) -> serde_json::Value {
    let base = format!("/_coreos.com/fleet/job/{name}");
    let mut nodes = vec![leaf(&format!("{base}/object"), object)];
    if let Some(state) = target_state {
        nodes.push(leaf(&format!("{base}/target-state"), state));
    }
    if let Some(machine) = target {
        nodes.push(leaf(&format!("{base}/target"), machine));
    }
    dir(&base, nodes)
}

fn object(name: &str, hash: &[u8]) -> String {
    json!({"Name": name, "UnitHash": hash}).to_string()
}

fn tree(jobs: Vec<serde_json::Value>) -> V2Node {
    let hex: String = HASH.iter().map(|byte| format!("{byte:02x}")).collect();
    let body = json!({"Raw": "[Service]\nExecStart=/bin/sleep 1000\n"}).to_string();
    let machine = dir(
        "/_coreos.com/fleet/machines/m1",
        vec![
            leaf(
                "/_coreos.com/fleet/machines/m1/object",
                &json!({"ID": "m1", "Metadata": {"role": "web", "az": "a"}}).to_string(),
            ),
            dir(
                "/_coreos.com/fleet/machines/m1/metadata",
                vec![
                    leaf("/_coreos.com/fleet/machines/m1/metadata/role", "db"),
                    leaf("/_coreos.com/fleet/machines/m1/metadata/az", ""),
                ],
            ),
        ],
    );
    let root = dir(
        "/_coreos.com/fleet",
        vec![
            dir("/_coreos.com/fleet/job", jobs),
            dir("/_coreos.com/fleet/unit", vec![leaf(&format!("/_coreos.com/fleet/unit/{hex}"), &body)]),
            dir("/_coreos.com/fleet/machines", vec![machine]),
            leaf("/_coreos.com/fleet/engine/version", "1"),
        ],
    );
    serde_json::from_value(root).expect("a v2 tree")
}

#[test]
fn units_are_found_with_their_state_machine_and_file_or_why_not() {
    let registry = registry_in(&tree(vec![
        job("web.service", &object("web.service", &HASH), Some("launched"), Some("m1")),
        job("idle.service", &object("idle.service", &HASH), Some("inactive"), None),
        job("lost.service", &object("lost.service", &[1; 20]), Some("launched"), None),
        job("short.service", &object("short.service", &[1; 3]), Some("launched"), None),
        job("garbled.service", "{not json", Some("launched"), None),
        job("stateless.service", &object("stateless.service", &HASH), None, None),
        job("other.service", &object("web.service", &HASH), Some("launched"), None),
    ]))
    .expect("a registry");
    let found: BTreeMap<&str, &std::result::Result<FoundUnit, String>> =
        registry.units.iter().map(|unit| (unit.name.as_str(), &unit.found)).collect();
    let web = found["web.service"].as_ref().expect("web is read");
    assert_eq!((web.desired_state.as_str(), web.machine.as_deref()), ("launched", Some("m1")));
    assert_eq!(web.hash, "ab".repeat(20));
    assert_eq!(web.text, "[Service]\nExecStart=/bin/sleep 1000\n");
    assert_eq!(found["idle.service"].as_ref().map(|unit| unit.machine.clone()), Ok(None));
    let why = |name: &str| found[name].clone().expect_err(name);
    assert!(why("lost.service").contains("is missing"), "{}", why("lost.service"));
    assert!(why("short.service").contains("has 3 bytes, not 20"));
    assert!(why("garbled.service").contains("cannot be read"));
    assert!(why("stateless.service").contains("no target-state"));
    assert!(why("other.service").contains("names another unit"));
    let names: Vec<&str> = registry.units.iter().map(|unit| unit.name.as_str()).collect();
    assert!(names.is_sorted(), "{names:?}");
    let machine = &registry.machines[0];
    assert_eq!(machine.id, "m1");
    assert_eq!(machine.metadata, BTreeMap::from([("role".to_string(), "db".to_string())]), "the API's settings win");
}

#[test]
fn a_tree_without_a_registry_is_named() {
    let other: V2Node = serde_json::from_value(dir("/other", vec![leaf("/other/x", "1")])).unwrap();
    let error = registry_in(&other).expect_err("no registry");
    assert!(error.contains("/other holds no fleet registry"), "{error}");
}
