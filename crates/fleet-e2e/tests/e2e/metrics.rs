//! `/metrics` of a real fleetd, checked by `promtool check metrics` and by its values as
//! units start, wait unplaced and stop.

use std::time::Duration;

use fleet_e2e::{Fleetd, examples_dir, metric_value, write_unit};

const WAIT: Duration = Duration::from_secs(20);

fn value(fleet: &Fleetd, series: &str) -> f64 {
    metric_value(&fleet.metrics(), series).unwrap_or_else(|| panic!("{series} missing from\n{}", fleet.metrics()))
}

#[test]
fn metrics_follow_the_cluster_and_pass_promtool() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start("e2e0metrics00001", &[("api_listen", listen.as_str())]);
    fleet.wait_until("the engine leads", WAIT, |f| metric_value(&f.metrics(), "fleet_engine_leader") == Some(1.0));
    assert_eq!(value(&fleet, "fleet_machines"), 1.0);
    assert!(value(&fleet, "process_resident_memory_bytes") > 1e6);
    assert!(value(&fleet, "process_open_fds") > 3.0);
    assert_eq!(metric_value(&fleet.metrics(), "fleet_unit_states{active_state=\"active\"}"), None);
    // What this fleetd is (issue 69), a gauge promtool takes.
    let build = format!("fleet_build_info{{version=\"{}\",commit=\"", env!("CARGO_PKG_VERSION"));
    let scraped = fleet.metrics();
    let line = scraped.lines().find(|line| line.starts_with(&build)).unwrap_or_else(|| panic!("{scraped}"));
    let format = fleet_core::store_format::CURRENT;
    assert!(line.ends_with(&format!(",store_format=\"{format}\"}} 1")), "{line}");

    let hello = examples_dir().join("hello.service").display().to_string();
    fleet.ok(&["start", &hello]);
    let text = fleet.metrics();
    assert_eq!(metric_value(&text, "fleet_units{desired_state=\"launched\"}"), Some(1.0), "{text}");
    assert_eq!(metric_value(&text, "fleet_unit_states{active_state=\"active\"}"), Some(1.0), "{text}");
    assert!(metric_value(&text, "fleet_agent_tasks_total{task=\"start\"}").unwrap_or(0.0) >= 1.0, "{text}");
    assert!(metric_value(&text, "fleet_engine_decisions_total{decision=\"schedule\"}").unwrap_or(0.0) >= 1.0);
    assert!(metric_value(&text, "fleet_engine_reconciles_total").unwrap_or(0.0) >= 1.0);
    // fleetctl sends its unit writes to fleetd in batches.
    let batches = "fleet_api_requests_total{endpoint=\"/fleet/v1/units\",method=\"POST\",code=\"200\"}";
    assert!(metric_value(&text, batches).unwrap_or(0.0) >= 1.0, "{text}");
    assert!(text.contains("fleet_store_request_duration_seconds_count{store=\"embedded\",operation=\"write\"}"));

    // A unit no machine can take shows as unplaced.
    let dir = tempfile::tempdir().expect("scratch dir");
    let nowhere = write_unit(
        dir.path(),
        "nowhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=nowhere\n",
    );
    fleet.ok(&["start", "--no-block", &nowhere]);
    fleet.wait_until("the unit shows as unplaced", WAIT, |f| {
        metric_value(&f.metrics(), "fleet_units_unplaced") == Some(1.0)
    });

    fleet.ok(&["stop", "hello.service"]);
    let text = fleet.metrics();
    assert_eq!(metric_value(&text, "fleet_unit_states{active_state=\"active\"}"), None, "{text}");
    assert_eq!(metric_value(&text, "fleet_unit_states{active_state=\"inactive\"}"), Some(1.0), "{text}");

    // Over TCP, the metrics need a credential like the rest of the API.
    let answer = fleet_e2e::http_get(&format!("127.0.0.1:{port}"), "/metrics");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}
