use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use fleet_core::{MachineState, UnitFile, UnitHash};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, EventLog};
use fleet_store_embedded::EmbeddedRegistry;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::auth::Auth;
use crate::{ApiState, PageSize};

struct Api {
    router: Router,
    registry: EmbeddedRegistry,
    _dir: tempfile::TempDir,
}

async fn api(token_limit: u16) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState {
        page_size: PageSize::new(token_limit),
        ..ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None))
    };
    Api { router: router(state), registry, _dir: dir }
}

struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    server: Option<String>,
    body: Value,
}

impl Api {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(body.map_or(Body::empty(), |b| Body::from(b.to_string()))).unwrap();
        self.send(request).await
    }

    /// Sends `request` as the Unix socket's administrator, unless it names another peer.
    async fn send(&self, mut request: Request<Body>) -> Answer {
        if request.extensions().get::<Peer>().is_none() {
            request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
        }
        let response = self.router.clone().oneshot(request).await.unwrap();
        self.answer(response).await
    }

    async fn answer(&self, response: axum::response::Response) -> Answer {
        let status = response.status();
        let text = |name| response.headers().get(name).map(|v: &HeaderValue| v.to_str().unwrap().to_string());
        let (content_type, server) = (text(header::CONTENT_TYPE), text(header::SERVER));
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        Answer { status, content_type, server, body }
    }
}

fn error(code: u16, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

fn hello(desired: Option<&str>) -> Value {
    let mut unit = json!({"options": [{"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"}]});
    if let Some(desired) = desired {
        unit["desiredState"] = json!(desired);
    }
    unit
}

#[tokio::test]
async fn routing_and_method_errors() {
    let api = api(100).await;
    let cases: &[(&str, &str, u16, &str)] = &[
        ("PUT", "/", 405, ""),
        ("GET", "/fleet/v1", 405, ""),
        ("GET", "/nothing", 404, ""),
        ("GET", "/fleet/v1/units/", 404, ""),
        ("GET", "/fleet/v1/units/a/b", 404, ""),
        ("PUT", "/fleet/v1/units", 405, "only GET supported against this resource"),
        ("POST", "/fleet/v1/units/a.service", 405, "only GET, PUT and DELETE supported against this resource"),
        ("DELETE", "/fleet/v1/state", 405, "only GET supported against this resource"),
        ("PUT", "/fleet/v1/machines", 405, "only GET and PATCH supported against this resource"),
        ("POST", "/fleet/v1/discovery", 405, "only HTTP GET supported against this resource"),
        ("GET", "/fleet/v1/units/nope.service", 404, "unit does not exist"),
        ("GET", "/fleet/v1/state/nope.service", 404, "unit state does not exist"),
        ("DELETE", "/v1-alpha/units/nope.service", 404, "unit does not exist"),
    ];
    for (method, path, code, message) in cases {
        let answer = api.call(method, path, None).await;
        assert_eq!(answer.status.as_u16(), *code, "{method} {path}");
        assert_eq!(answer.body, error(*code, message), "{method} {path}");
        assert_eq!(answer.content_type.as_deref(), Some("application/json"));
        assert_eq!(answer.server, Some(format!("fleetd/{}", crate::VERSION)));
    }
    let discovery = api.call("GET", "/fleet/v1/discovery", None).await;
    assert_eq!(discovery.status, StatusCode::OK);
    assert_eq!(discovery.body["id"], "fleet:v1");
}

#[tokio::test]
async fn empty_collections_are_empty_objects() {
    let api = api(100).await;
    for path in ["/fleet/v1/units", "/fleet/v1/state", "/fleet/v1/machines"] {
        let answer = api.call("GET", path, None).await;
        assert_eq!((answer.status, answer.body), (StatusCode::OK, json!({})), "{path}");
    }
}

#[tokio::test]
async fn unit_lifecycle_through_put() {
    let api = api(100).await;
    let path = "/fleet/v1/units/hello.service";
    assert_eq!(
        api.call("PUT", path, Some(json!({"desiredState": "launched"}))).await.body,
        error(409, "unit does not exist and options field empty")
    );
    let created = api.call("PUT", path, Some(hello(None))).await;
    assert_eq!((created.status, created.body, created.content_type), (StatusCode::CREATED, Value::Null, None));
    let unit = api.call("GET", path, None).await.body;
    assert_eq!(
        unit,
        json!({"currentState": "inactive", "desiredState": "inactive", "name": "hello.service",
               "options": [{"name": "ExecStart", "section": "Service", "value": "/bin/sleep 1000"}]})
    );
    assert_eq!(
        api.call("PUT", path, Some(json!({}))).await.body,
        error(409, "must provide DesiredState to update existing unit")
    );
    assert_eq!(
        api.call("PUT", path, Some(json!({"desiredState": "bogus"}))).await.body,
        error(400, "invalid desiredState: \"bogus\"")
    );
    assert_eq!(api.call("GET", path, None).await.body["desiredState"], "inactive", "a bad state stores nothing");
    assert_eq!(api.call("PUT", path, Some(json!({"desiredState": "launched"}))).await.status, StatusCode::NO_CONTENT);
    assert_eq!(api.call("GET", path, None).await.body["desiredState"], "launched");
    // Same options: only the state changes. New options: a new unit, inactive unless told.
    assert_eq!(api.call("PUT", path, Some(hello(Some("loaded")))).await.status, StatusCode::NO_CONTENT);
    let mut changed = hello(None);
    changed["options"][0]["value"] = json!("/bin/sleep 2000");
    assert_eq!(api.call("PUT", path, Some(changed)).await.status, StatusCode::CREATED);
    assert_eq!(api.call("GET", path, None).await.body["desiredState"], "inactive");
    assert_eq!(api.call("DELETE", path, None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(api.call("DELETE", path, None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn many_units_in_one_request() {
    let api = api(100).await;
    let named = |name: &str, desired: &str| {
        let mut unit = hello(Some(desired));
        unit["name"] = json!(name);
        unit
    };
    let batch = |units: Vec<Value>| Some(json!({ "units": units }));
    let answer = api
        .call(
            "POST",
            "/fleet/v1/units",
            batch(vec![
                named("a.service", "launched"),
                named("b.service", "inactive"),
                json!({"name": "absent.service", "desiredState": "launched"}),
            ]),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body,
        json!({"units": [{"name": "a.service", "code": 201}, {"name": "b.service", "code": 201},
                         {"name": "absent.service", "code": 404, "message": "unit does not exist"}]})
    );
    let api = &api;
    let unit = async |name: &str| api.call("GET", &format!("/fleet/v1/units/{name}"), None).await.body;
    assert_eq!(unit("a.service").await["desiredState"], "launched");
    // A desired state alone keeps the content.
    let answer =
        api.call("POST", "/fleet/v1/units", batch(vec![json!({"name": "b.service", "desiredState": "loaded"})])).await;
    assert_eq!(answer.body, json!({"units": [{"name": "b.service", "code": 204}]}));
    assert_eq!(unit("b.service").await["desiredState"], "loaded");
    assert_eq!(unit("b.service").await["options"], hello(None)["options"]);
    // One bad unit refuses the batch, naming it; nothing is stored.
    let refusals: Vec<(Option<Value>, u16, &str)> = vec![
        (
            batch(vec![named("c.service", "launched"), named("d.service", "bogus")]),
            400,
            "unit d.service: invalid desiredState: \"bogus\"",
        ),
        (
            batch(vec![
                named("c.service", "launched"),
                json!({"name": "d.service", "options": hello(None)["options"]}),
            ]),
            400,
            "unit d.service: desiredState missing",
        ),
        (
            batch(vec![named("c.service", "launched"), named("c.service", "loaded")]),
            400,
            "unit c.service is given twice",
        ),
        (
            batch(vec![named("c.service", "launched"), named("t@.service", "launched")]),
            400,
            "unit t@.service: cannot activate template \"t@.service\"",
        ),
        (batch(vec![named("c.service", "launched"), hello(Some("launched"))]), 400, "unit 1 of the batch has no name"),
        (batch(vec![]), 400, "no units given"),
        (
            batch((0..1001).map(|index| named(&format!("n{index}.service"), "loaded")).collect()),
            400,
            "1001 units given; at most 1000 per request",
        ),
        (Some(json!([named("c.service", "launched")])), 400, "unable to decode body: expected a JSON object"),
    ];
    for (body, code, message) in refusals {
        let answer = api.call("POST", "/fleet/v1/units", body).await;
        assert_eq!((answer.status.as_u16(), answer.body), (code, error(code, message)));
    }
    assert_eq!(api.call("GET", "/fleet/v1/units/c.service", None).await.status, StatusCode::NOT_FOUND);
    let bad_options = json!({"name": "e.service", "desiredState": "loaded", "options": [{"section": "Service", "name": "Restart", "value": "sometimes"}]});
    let answer = api.call("POST", "/fleet/v1/units", batch(vec![bad_options])).await;
    assert_eq!(
        answer.body,
        error(400, "unit e.service: invalid value \"sometimes\" for Restart=: unknown value \"sometimes\"")
    );
}

#[tokio::test]
async fn put_refusals() {
    let api = api(100).await;
    let with_x_fleet = |pairs: &[(&str, &str)]| {
        let options: Vec<Value> =
            pairs.iter().map(|(n, v)| json!({"section": "X-Fleet", "name": n, "value": v})).collect();
        json!({"options": options})
    };
    let cases = [
        ("/fleet/v1/units/a.bad", hello(None), 400, "invalid unit type: \"bad\""),
        (
            "/fleet/v1/units/a.service",
            json!({"name": "b.service"}),
            400,
            "name in URL \"a.service\" differs from unit name in request body \"b.service\"",
        ),
        (
            "/fleet/v1/units/a.service",
            with_x_fleet(&[("MachineID", "x"), ("Global", "true")]),
            400,
            "MachineID cannot be used with Global",
        ),
        ("/fleet/v1/units/t@.service", hello(Some("launched")), 400, "cannot activate template \"t@.service\""),
        (
            "/fleet/v1/units/a.service",
            json!({"options": [{"section": "Service", "name": "ExecStart", "value": "x".repeat(3000)}]}),
            400,
            "line too long (max 2048 bytes)",
        ),
        ("/fleet/v1/units/a.service", json!({"options": "nope"}), 400, ""),
        ("/fleet/v1/units/a.service", hello(Some("bogus")), 400, "invalid desiredState: \"bogus\""),
    ];
    for (path, body, code, message) in cases {
        let answer = api.call("PUT", path, Some(body)).await;
        assert_eq!(answer.status.as_u16(), code, "{path}");
        if message.is_empty() {
            assert!(answer.body["error"]["message"].as_str().unwrap().starts_with("unable to decode body: "));
        } else {
            assert_eq!(answer.body, error(code, message), "{path}");
        }
    }
    assert_eq!(api.call("GET", "/fleet/v1/units", None).await.body, json!({}), "nothing was stored");
    let plain = Request::builder()
        .method("PUT")
        .uri("/fleet/v1/units/a.service")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(hello(None).to_string()))
        .unwrap();
    assert_eq!(api.send(plain).await.body, error(415, "only acceptable Content-Type is application/json"));
    let none = Request::builder().method("PUT").uri("/fleet/v1/units/a.service").body(Body::from("{}")).unwrap();
    assert_eq!(api.send(none).await.body, error(415, "expected 1 Content-Type, got 0"));
    let huge = Request::builder()
        .method("PUT")
        .uri("/fleet/v1/units/a.service")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(vec![b' '; BODY_LIMIT + 1]))
        .unwrap();
    assert_eq!(api.send(huge).await.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn pagination_tokens() {
    let api = api(2).await;
    for n in 0..4 {
        api.call("PUT", &format!("/fleet/v1/units/u{n}.service"), Some(hello(None))).await;
    }
    let first = api.call("GET", "/fleet/v1/units", None).await.body;
    assert_eq!(first["units"].as_array().unwrap().len(), 2);
    assert_eq!(first["nextPageToken"], "AgACAA==");
    let second = api.call("GET", "/fleet/v1/units?nextPageToken=AgACAA%3D%3D", None).await.body;
    assert_eq!(second["units"][0]["name"], "u2.service");
    assert!(second.get("nextPageToken").is_none(), "no token on the last page");
    let cases = [
        ("?nextPageToken=AgACAA==&nextPageToken=AgACAA==", "too many values for page token"),
        ("?nextPageToken=EwBMLg==", "token limit must be 2"),
        ("?nextPageToken=AgAAAA==", "token page must be greater than zero"),
    ];
    for (query, message) in cases {
        assert_eq!(
            api.call("GET", &format!("/fleet/v1/machines{query}"), None).await.body,
            error(400, message),
            "{query}"
        );
    }
}

/// `pageSize` (our addition) asks for pages of another size than the server's; its tokens
/// carry that size, and a request must keep asking it. Out of bounds is a 400 naming it.
#[tokio::test]
async fn a_client_may_ask_for_its_page_size() {
    let api = api(2).await;
    for n in 0..5 {
        api.call("PUT", &format!("/fleet/v1/units/u{n}.service"), Some(hello(None))).await;
    }
    let first = api.call("GET", "/fleet/v1/units?pageSize=3", None).await.body;
    assert_eq!(first["units"].as_array().unwrap().len(), 3);
    let token = first["nextPageToken"].as_str().unwrap().replace('=', "%3D");
    let second = api.call("GET", &format!("/fleet/v1/units?pageSize=3&nextPageToken={token}"), None).await.body;
    let names: Vec<&str> =
        second["units"].as_array().unwrap().iter().map(|unit| unit["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["u3.service", "u4.service"]);
    assert!(second.get("nextPageToken").is_none());
    let states = api.call("GET", "/fleet/v1/state?pageSize=10000", None).await;
    assert_eq!(states.status, StatusCode::OK);
    let cases = [
        (format!("/fleet/v1/units?nextPageToken={token}"), "token limit must be 2".to_string()),
        ("/fleet/v1/units?pageSize=0".into(), "invalid pageSize \"0\": a number from 1 to 10000".into()),
        ("/fleet/v1/machines?pageSize=10001".into(), "invalid pageSize \"10001\": a number from 1 to 10000".into()),
        ("/fleet/v1/state?pageSize=x".into(), "invalid pageSize \"x\": a number from 1 to 10000".into()),
        ("/fleet/v1/units?pageSize=3&pageSize=4".into(), "too many values for pageSize".into()),
    ];
    for (path, message) in cases {
        assert_eq!(api.call("GET", &path, None).await.body, error(400, &message), "{path}");
    }
}

#[tokio::test]
async fn machine_metadata_patch() {
    let api = api(100).await;
    let machine = MachineState {
        id: "m1".into(),
        public_ip: "10.0.0.1".into(),
        metadata: [("hostname".to_string(), "smoke".to_string())].into(),
        ..Default::default()
    };
    api.registry.register_machine(&machine).await.unwrap();
    let ops = json!([
        {"op": "add", "path": "/m1/metadata/foo", "Value": {"value": "bar"}},
        {"op": "replace", "path": "/m1/metadata/zone", "value": "z1"},
    ]);
    let answer = api.call("PATCH", "/fleet/v1/machines", Some(ops)).await;
    assert_eq!((answer.status, answer.content_type.as_deref()), (StatusCode::NO_CONTENT, Some("application/json")));
    let listed = api.call("GET", "/fleet/v1/machines", None).await.body;
    assert_eq!(
        listed,
        json!({"machines": [{"connection": "etcd", "id": "m1", "metadata": {"foo": "bar", "hostname": "smoke", "zone": "z1"}, "primaryIP": "10.0.0.1"}]})
    );
    let remove = json!([{"op": "remove", "path": "/m1/metadata/foo"}, {"op": "remove", "path": "/m1/metadata/zone"}]);
    assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(remove)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        api.call("GET", "/fleet/v1/machines", None).await.body["machines"][0]["metadata"],
        json!({"hostname": "smoke"})
    );
    let bad = [
        (json!([{"op": "move", "path": "/m1/metadata/a", "value": "b"}]), "invalid op: expect add, remove, or replace"),
        (json!([{"op": "add", "path": "/m1/meta/a", "value": "b"}]), "machine metadata path invalid"),
        (json!([{"op": "add", "path": "/m1/metadata/a b", "value": "b"}]), "machine metadata path invalid"),
        (
            json!([{"op": "add", "path": "/m1/metadata/a", "value": {"value": ""}}]),
            "invalid value: add and replace require a value",
        ),
        (
            json!([{"op": "add", "path": "/m1/metadata/ok", "value": "1"}, {"op": "bad"}]),
            "invalid op: expect add, remove, or replace",
        ),
    ];
    for (ops, message) in bad {
        assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(ops)).await.body, error(400, message));
    }
    assert!(
        api.call("GET", "/fleet/v1/machines", None).await.body["machines"][0]["metadata"].get("ok").is_none(),
        "all ops are checked before any applies"
    );
}

#[tokio::test]
async fn machine_taints_patch_through_the_same_operations() {
    let api = api(100).await;
    let machine = MachineState {
        id: "m1".into(),
        public_ip: "10.0.0.1".into(),
        taints: fleet_core::taint::parse_taints("gpu=yes").unwrap(),
        ..Default::default()
    };
    api.registry.register_machine(&machine).await.unwrap();
    let taints = || async { api.call("GET", "/fleet/v1/machines", None).await.body["machines"][0]["taints"].clone() };
    assert_eq!(taints().await, json!(["gpu=yes"]));
    let ops = json!([
        {"op": "add", "path": "/m1/taints/db", "value": ":evict"},
        {"op": "replace", "path": "/m1/taints/gpu", "value": "a100"},
        {"op": "add", "path": "/m1/taints/edge"},
    ]);
    assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(ops)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(taints().await, json!(["db:evict", "edge", "gpu=a100"]));
    let body = api.call("GET", "/fleet/v1/machines", None).await.body;
    assert!(body["machines"][0].get("metadata").is_none(), "a taint is not metadata: {body}");
    let remove = json!([{"op": "remove", "path": "/m1/taints/gpu"}, {"op": "remove", "path": "/m1/taints/edge"}]);
    assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(remove)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(taints().await, json!(["db:evict"]));
    let bad = [
        (
            json!([{"op": "add", "path": "/m1/taints/gpu", "value": "yes:later"}]),
            "invalid taint: \"gpu=yes:later\" is not a taint: expected key, key=value, each optionally followed by :evict",
        ),
        (
            json!([{"op": "add", "path": "/m1/taints/gpu", "value": "a,b"}]),
            "invalid taint: a taint's or toleration's value is at most 64 letters, digits, '_', '.' and '-', not \"a,b\"",
        ),
        (json!([{"op": "add", "path": "/m1/taints/g:pu", "value": "x"}]), "machine metadata path invalid"),
    ];
    for (ops, message) in bad {
        assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(ops)).await.body, error(400, message));
    }
    let missing = json!([{"op": "add", "path": "/m9/taints/gpu", "value": "x"}]);
    assert_eq!(api.call("PATCH", "/fleet/v1/machines", Some(missing)).await.status, StatusCode::NOT_FOUND);
}

/// Regression: values that a unit file cannot hold, and `[Service]` values no manager can
/// use (a time span that panicked the agent), are refused at submission, naming the problem.
#[tokio::test]
async fn put_refuses_unusable_values() {
    let api = api(100).await;
    let unit = |name: &str, value: &str| {
        json!({"desiredState": "launched", "options": [
            {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
            {"section": "Service", "name": name, "value": value},
        ]})
    };
    let cases = [
        (
            unit("TimeoutStartSec", "99999999999999999999999"),
            "invalid value \"99999999999999999999999\" for TimeoutStartSec=: time span out of range",
        ),
        (unit("RestartSec", "5 parsecs"), "invalid value \"5 parsecs\" for RestartSec=: unknown time unit \"parsecs\""),
        (unit("Restart", "sometimes"), "invalid value \"sometimes\" for Restart=: unknown value \"sometimes\""),
        (
            unit("Environment", "A=1\n[X-Fleet]\nMachineID=abc"),
            "invalid option \"Environment\" in section \"Service\": value has a newline that is not a backslash continuation",
        ),
        (unit("Environment", "A=\u{0}"), "invalid option \"Environment\" in section \"Service\": value has a NUL byte"),
        (
            json!({"options": [{"section": "", "name": "ExecStart", "value": "x"}]}),
            "invalid option \"ExecStart\" in section \"\": empty section name",
        ),
    ];
    for (body, message) in cases {
        let answer = api.call("PUT", "/fleet/v1/units/a.service", Some(body)).await;
        assert_eq!(answer.body, error(400, message));
    }
    assert_eq!(api.call("GET", "/fleet/v1/units", None).await.body, json!({}), "nothing was stored");
}

/// Regressions: a body of `[]` answered 409 instead of 400; metadata for a machine that does
/// not exist was stored; units came back in file order rather than grouped by section.
#[tokio::test]
async fn smaller_refusals_and_grouped_options() {
    let api = api(100).await;
    let answer = api.call("PUT", "/fleet/v1/units/a.service", Some(json!([]))).await;
    assert_eq!(answer.body, error(400, "unable to decode body: expected a JSON object"));
    let ops = json!([{"op": "add", "path": "/ghost/metadata/role", "value": "web"}]);
    assert_eq!(
        api.call("PATCH", "/fleet/v1/machines", Some(ops)).await.body,
        error(404, "machine \"ghost\" does not exist")
    );
    let unit = json!({"options": [
        {"section": "Unit", "name": "Description", "value": "x"},
        {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
        {"section": "Unit", "name": "After", "value": "y"},
    ]});
    assert_eq!(api.call("PUT", "/fleet/v1/units/a.service", Some(unit)).await.status, StatusCode::CREATED);
    let options = api.call("GET", "/fleet/v1/units/a.service", None).await.body["options"].clone();
    let names: Vec<&str> = options.as_array().unwrap().iter().map(|option| option["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Description", "After", "ExecStart"], "grouped by section, as the original re-reads them");
}

/// Regression: a page of `GET /units` could be 96 MB; pages are bounded by size too, and
/// following the tokens still lists every unit once.
#[tokio::test]
async fn pages_are_bounded_by_size() {
    let api = api(100).await;
    let long = "x".repeat(2000);
    // 12 units of ~500 KiB each: more than 4 MiB in one page of 100.
    for n in 0..12 {
        let options: Vec<Value> = (0..250)
            .map(|i| json!({"section": "Service", "name": format!("Environment"), "value": format!("V{i}={long}")}))
            .chain([json!({"section": "Service", "name": "ExecStart", "value": "/bin/true"})])
            .collect();
        let answer =
            api.call("PUT", &format!("/fleet/v1/units/u{n:02}.service"), Some(json!({"options": options}))).await;
        assert_eq!(answer.status, StatusCode::CREATED);
    }
    let mut names = Vec::new();
    let mut path = "/fleet/v1/units".to_string();
    let mut pages = 0;
    loop {
        let answer = api.call("GET", &path, None).await;
        let bytes = answer.body.to_string().len();
        assert!(bytes <= crate::pagination::MAX_PAGE_BYTES + 600 * 1024, "{bytes} bytes in a page");
        pages += 1;
        names.extend(answer.body["units"].as_array().unwrap().iter().map(|unit| unit["name"].to_string()));
        match answer.body["nextPageToken"].as_str() {
            Some(token) => path = format!("/fleet/v1/units?nextPageToken={token}"),
            None => break,
        }
    }
    assert!(pages >= 2, "{pages} pages");
    assert_eq!(names.len(), 12);
    names.dedup();
    assert_eq!(names.len(), 12, "every unit once");
}

#[tokio::test]
async fn metrics_count_the_requests_in_both_formats() {
    let api = api(100).await;
    assert_eq!(api.call("PUT", "/fleet/v1/units/a.service", Some(hello(Some("launched")))).await.status, 201);
    let scrape = |accept: &'static str| {
        let request = Request::builder().uri("/metrics").header(header::ACCEPT, accept).body(Body::empty()).unwrap();
        let mut request = request;
        request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
        let router = api.router.clone();
        async move {
            let response = router.oneshot(request).await.unwrap();
            let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_string();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (content_type, String::from_utf8(bytes.to_vec()).unwrap())
        }
    };
    let (content_type, text) = scrape("*/*").await;
    assert_eq!(content_type, fleet_metrics::CLASSIC_CONTENT_TYPE);
    assert!(
        text.contains("fleet_api_requests_total{endpoint=\"/fleet/v1/units/{unit}\",method=\"PUT\",code=\"201\"}"),
        "{text}"
    );
    assert!(!text.contains("# EOF"));
    // The cluster's counts come from the engine leader, and there is none here.
    assert!(!text.contains("fleet_units{"), "{text}");
    let (content_type, text) = scrape("application/openmetrics-text;version=1.0.0").await;
    assert_eq!(content_type, fleet_metrics::OPENMETRICS_CONTENT_TYPE);
    assert!(text.ends_with("# EOF\n"));
    assert_eq!(api.call("POST", "/metrics", None).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_web_view_asks_browsers_for_a_credential_and_serves_hardened_assets() {
    let api = api(100).await;
    let get = |path: &str, peer: Peer| {
        let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
        request.extensions_mut().insert(peer);
        api.router.clone().oneshot(request)
    };
    let anonymous = || Peer::Tcp { tls: true, certificate: None };
    let refused = get("/ui/", anonymous()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()[header::WWW_AUTHENTICATE], "Basic realm=\"fleet\", charset=\"UTF-8\"");
    let api_refused = get("/fleet/v1/units", anonymous()).await.unwrap();
    assert_eq!(api_refused.headers()[header::WWW_AUTHENTICATE], "Bearer");
    let page = get("/ui/", Peer::Unix { uid: Some(0) }).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().contains("script-src 'self'"));
    let script = get("/ui/app.js", Peer::Unix { uid: Some(0) }).await.unwrap();
    assert_eq!(script.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
    for path in ["/ui", "/"] {
        let redirect = get(path, Peer::Unix { uid: Some(0) }).await.unwrap();
        assert_eq!(
            (redirect.status(), &redirect.headers()[header::LOCATION]),
            (StatusCode::PERMANENT_REDIRECT, &HeaderValue::from_static("/ui/")),
            "{path}"
        );
    }
    let root_refused = get("/", anonymous()).await.unwrap();
    assert_eq!(root_refused.headers()[header::WWW_AUTHENTICATE], "Basic realm=\"fleet\", charset=\"UTF-8\"");
    assert_eq!(get("/ui/secret.txt", Peer::Unix { uid: Some(0) }).await.unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(get("/ui/../metrics", Peer::Unix { uid: Some(0) }).await.unwrap().status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_machine_is_drained_shown_and_undrained_and_bad_requests_are_refused() {
    let api = api(100).await;
    for id in ["3d1219c7aaaabbbbccccddddeeeeffff", "m2"] {
        let machine = MachineState { id: id.into(), public_ip: "10.0.0.1".into(), ..Default::default() };
        api.registry.register_machine(&machine).await.unwrap();
    }
    let file = fleet_core::UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    api.registry
        .put_unit(
            "pinned.service",
            &fleet_core::UnitFile::parse("[X-Fleet]\nMachineID=3d1219c7\n").unwrap(),
            fleet_core::DesiredState::Launched,
        )
        .await
        .unwrap();
    api.registry.put_unit("web.service", &file, fleet_core::DesiredState::Launched).await.unwrap();
    let lease = api.registry.acquire_leadership("m2").await.unwrap().unwrap();
    let decisions: Vec<fleet_core::schedule::Decision> = ["pinned.service", "web.service"]
        .iter()
        .map(|unit| fleet_core::schedule::Decision::Schedule {
            unit: unit.to_string(),
            machine: "3d1219c7aaaabbbbccccddddeeeeffff".into(),
        })
        .collect();
    api.registry.apply(&lease, &decisions, &[]).await.unwrap();
    let drained = api.call("PUT", "/fleet/v1/machines/3d1219c7/drain", Some(json!({"maxUnavailable": "25%"}))).await;
    assert_eq!(drained.status, StatusCode::OK);
    assert_eq!(drained.body["state"], "draining");
    assert_eq!(drained.body["maxUnavailable"], "25%");
    assert_eq!(drained.body["left"], json!(["web.service"]));
    assert_eq!(drained.body["stays"], json!([{"name": "pinned.service", "reason": "MachineID= names this machine"}]));
    let listed = api.call("GET", "/fleet/v1/machines", None).await.body;
    assert_eq!(listed["machines"][0]["drain"]["state"], "draining");
    assert!(listed["machines"][1].get("drain").is_none(), "m2 is not drained");
    let shown = api.call("GET", "/fleet/v1/machines/3d1219c7aaaabbbbccccddddeeeeffff/drain", None).await;
    assert_eq!(shown.body, drained.body);
    // Changing the budget keeps the drain's start.
    let changed = api.call("PUT", "/fleet/v1/machines/3d1219c7/drain", Some(json!({}))).await.body;
    assert_eq!((&changed["maxUnavailable"], &changed["started"]), (&json!("1"), &drained.body["started"]));
    let refusals = [
        ("PUT", "/fleet/v1/machines/3d1219c7/drain", Some(json!({"maxUnavailable": "0"})), 400),
        ("PUT", "/fleet/v1/machines/3d1219c7/drain", Some(json!({"maxUnavailable": 3})), 400),
        ("PUT", "/fleet/v1/machines/nosuch/drain", Some(json!({})), 404),
        ("PUT", "/fleet/v1/machines/bad%20id/drain", Some(json!({})), 400),
        ("GET", "/fleet/v1/machines/m2/drain", None, 404),
        ("DELETE", "/fleet/v1/machines/m2/drain", None, 404),
    ];
    for (method, path, body, status) in refusals {
        let answer = api.call(method, path, body).await;
        assert_eq!(answer.status.as_u16(), status, "{method} {path}: {}", answer.body);
        assert!(answer.body["error"]["message"].is_string(), "a JSON error: {}", answer.body);
    }
    assert_eq!(api.call("DELETE", "/fleet/v1/machines/3d1219c7/drain", None).await.status, StatusCode::NO_CONTENT);
    assert!(api.call("GET", "/fleet/v1/machines", None).await.body["machines"][0].get("drain").is_none());
}

#[tokio::test]
async fn a_body_too_large_and_a_body_that_broke_off_are_told_apart() {
    let large = Body::from(vec![b'x'; BODY_LIMIT + 1]);
    let refused = read_body(Some(large), crate::routes::Body::Json).await.unwrap_err();
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    // A bulk body (an administrator's import) may be larger, to its own bound.
    let bulk = Body::from(vec![b'x'; BODY_LIMIT + 1]);
    assert!(read_body(Some(bulk), crate::routes::Body::Bulk).await.is_ok());
    let too_large = Body::from(vec![b'x'; BULK_BODY_LIMIT + 1]);
    let refused = read_body(Some(too_large), crate::routes::Body::Bulk).await.unwrap_err();
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    let chunks: Vec<Result<&'static [u8], std::io::Error>> =
        vec![Ok(b"{\"a\":"), Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"))];
    let broken = Body::from_stream(futures_util::stream::iter(chunks));
    let refused = read_body(Some(broken), crate::routes::Body::Json).await.unwrap_err();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "the client went away: its body is not too large");
}

/// Creates `units` launched, each running `hello`.
async fn launch(api: &Api, units: &[&str]) {
    for unit in units {
        let created = api.call("PUT", &format!("/fleet/v1/units/{unit}"), Some(hello(Some("launched")))).await;
        assert_eq!(created.status, StatusCode::CREATED, "{unit}: {}", created.body);
    }
}

#[tokio::test]
async fn a_rollout_is_read_with_its_steps_counted_and_without_its_units_when_asked() {
    let api = api(100).await;
    launch(&api, &["web@1.service", "web@2.service", "web@3.service"]).await;
    let request = json!({
        "units": ["web@1.service", "web@2.service", "web@3.service"],
        "options": [{"section": "Service", "name": "ExecStart", "value": "/bin/sleep 2000"}],
        "maxUnavailable": "1",
    });
    let started = api.call("PUT", "/fleet/v1/rollouts/web", Some(request)).await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.body);
    assert_eq!(started.body["steps"], json!({"waiting": 3}));
    assert_eq!(started.body["units"].as_array().map(Vec::len), Some(3));

    let full = api.call("GET", "/fleet/v1/rollouts/web", None).await.body;
    assert_eq!((&full["steps"], full["units"].as_array().map(Vec::len)), (&json!({"waiting": 3}), Some(3)));
    let progress = api.call("GET", "/fleet/v1/rollouts/web?units=false", None).await.body;
    assert!(progress.get("units").is_none(), "no units listed: {progress}");
    assert_eq!((&progress["state"], &progress["steps"]), (&json!("running"), &json!({"waiting": 3})));
    let listed = api.call("GET", "/fleet/v1/rollouts?units=false", None).await.body;
    assert!(listed["rollouts"][0].get("units").is_none(), "{listed}");
    assert_eq!(listed["rollouts"][0]["steps"], json!({"waiting": 3}));
    // The client reads both forms.
    let read: fleet_api_schema::Rollout = serde_json::from_value(progress).unwrap();
    assert_eq!((read.units.len(), read.steps.get("waiting")), (0, Some(&3)));

    let refused = api.call("GET", "/fleet/v1/rollouts/web?units=maybe", None).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.body, error(400, "invalid units \"maybe\": true or false"));
}

#[tokio::test]
async fn a_rollout_takes_each_unit_s_own_content_and_refuses_a_unit_that_does_not_exist() {
    use fleet_registry::SourceRegistry;
    let api = api(100).await;
    launch(&api, &["web@1.service", "web@2.service", "db.service"]).await;
    let option = |command: &str| json!([{"section": "Service", "name": "ExecStart", "value": command}]);
    let refused = api
        .call(
            "PUT",
            "/fleet/v1/rollouts/missing",
            Some(json!({
                "units": ["web@1.service", "nope.service"],
                "options": option("/bin/sleep 2"),
                "maxUnavailable": "1",
            })),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.body, error(400, "unit nope.service does not exist"));
    assert!(api.registry.rollouts().await.unwrap().is_empty(), "nothing stored for a refused rollout");

    let files = json!({
        "web@1.service": option("/bin/sleep 2"),
        "web@2.service": option("/bin/sleep 2"),
        "db.service": option("/bin/sleep 3"),
    });
    let started =
        api.call("PUT", "/fleet/v1/rollouts/mixed", Some(json!({"files": files, "maxUnavailable": "1"}))).await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.body);
    let record = api.registry.rollouts().await.unwrap().pop().expect("the rollout stored");
    let to: BTreeMap<&str, UnitHash> = record.rollout.units.iter().map(|unit| (unit.name.as_str(), unit.to)).collect();
    assert_eq!(to["web@1.service"], to["web@2.service"]);
    assert_ne!(to["web@1.service"], to["db.service"]);
    let old = record.rollout.units[0].from;
    assert!(record.rollout.units.iter().all(|unit| unit.from == old), "every unit starts from its current content");
    // The old content and each new one, once each.
    assert_eq!(record.bodies.len(), 3);
    for hash in to.values().chain([&old]) {
        let body = &record.bodies[&hash.to_string()];
        assert_eq!(UnitFile::parse(body).unwrap().hash(), *hash);
    }
}

#[tokio::test]
async fn a_rollout_replaces_the_units_after_its_canary_machine_by_machine() {
    use fleet_registry::SourceRegistry;
    let api = api(100).await;
    let names = ["web@1.service", "web@2.service", "web@3.service", "web@4.service", "web@5.service"];
    launch(&api, &names).await;
    for id in ["m1", "m2"] {
        let machine = MachineState { id: id.into(), public_ip: "10.0.0.1".into(), ..Default::default() };
        api.registry.register_machine(&machine).await.unwrap();
    }
    // Placed as the engine spreads instances: one machine, then the other.
    let lease = api.registry.acquire_leadership("m1").await.unwrap().unwrap();
    let decisions: Vec<fleet_core::schedule::Decision> = names
        .iter()
        .enumerate()
        .map(|(index, unit)| fleet_core::schedule::Decision::Schedule {
            unit: unit.to_string(),
            machine: if index % 2 == 0 { "m1" } else { "m2" }.into(),
        })
        .collect();
    api.registry.apply(&lease, &decisions, &[]).await.unwrap();
    let request = json!({
        "units": names,
        "options": [{"section": "Service", "name": "ExecStart", "value": "/bin/sleep 2000"}],
        "maxUnavailable": "2",
        "canary": "1",
        "bakeSeconds": 5,
    });
    let started = api.call("PUT", "/fleet/v1/rollouts/web", Some(request)).await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.body);
    let record = api.registry.rollouts().await.unwrap().pop().expect("the rollout stored");
    let order: Vec<&str> = record.rollout.units.iter().map(|unit| unit.name.as_str()).collect();
    // The canary as asked; then m2's units (its first, web@2, came first after the canary),
    // then m1's others.
    assert_eq!(order, ["web@1.service", "web@2.service", "web@4.service", "web@3.service", "web@5.service"]);
}

#[tokio::test]
async fn a_plan_shows_what_a_change_would_do_and_writes_nothing() {
    let api = api(100).await;
    launch(&api, &["old.service", "other.service"]).await;
    for id in ["m1", "m2"] {
        let machine = MachineState { id: id.into(), public_ip: "10.0.0.1".into(), ..Default::default() };
        api.registry.register_machine(&machine).await.unwrap();
    }
    let lease = api.registry.acquire_leadership("m1").await.unwrap().unwrap();
    let placed = |unit: &str, machine: &str| fleet_core::schedule::Decision::Schedule {
        unit: unit.into(),
        machine: machine.into(),
    };
    api.registry.apply(&lease, &[placed("old.service", "m1"), placed("other.service", "m2")], &[]).await.unwrap();
    let revision = api.registry.revision().await.unwrap();

    let mut replacing = hello(Some("launched"));
    replacing["name"] = json!("new.service");
    replacing["options"]
        .as_array_mut()
        .unwrap()
        .push(json!({"section": "X-Fleet", "name": "Replaces", "value": "old.service"}));
    let mut changed = hello(Some("launched"));
    changed["name"] = json!("other.service");
    changed["options"][0]["value"] = json!("/bin/sleep 2000");
    let request = json!({
        "units": [replacing, changed, {"name": "absent.service", "desiredState": "loaded"}],
        "destroy": ["gone.service"],
    });
    let plan = api.call("POST", "/fleet/v1/plans", Some(request)).await;
    assert_eq!(plan.status, StatusCode::OK, "{}", plan.body);
    let by_name: BTreeMap<String, Value> = plan.body["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|unit| (unit["name"].as_str().unwrap().to_string(), unit.clone()))
        .collect();
    let field = |unit: &str, name: &str| by_name[unit].get(name).cloned().unwrap_or(Value::Null);
    assert_eq!((field("new.service", "action"), field("new.service", "machine")), (json!("create"), json!("m1")));
    assert_eq!(
        (field("old.service", "action"), field("old.service", "machineBefore"), field("old.service", "machine")),
        (json!("moved"), json!("m1"), json!("m2")),
        "the unit it replaces moves"
    );
    assert_eq!((field("other.service", "action"), field("other.service", "machine")), (json!("change"), json!("m2")));
    assert_ne!(field("other.service", "hash"), field("other.service", "hashBefore"));
    assert_eq!(field("absent.service", "action"), json!("missing"));
    assert_eq!(field("gone.service", "action"), json!("missing"));
    // Nothing was written: the store's revision and the units are as they were.
    assert_eq!(api.registry.revision().await.unwrap(), revision);
    assert_eq!(api.call("GET", "/fleet/v1/units/new.service", None).await.status, StatusCode::NOT_FOUND);

    // The plan's index guards a write: taken while nothing changed, refused once something
    // did, whatever the unit written.
    let index = plan.body["index"].as_u64().expect("a plan index");
    let again = api.call("POST", "/fleet/v1/plans", Some(json!({"destroy": ["other.service"]}))).await;
    assert_eq!(again.body["index"], json!(index), "the same cluster, the same index");
    let mut first = hello(Some("launched"));
    first["name"] = json!("first.service");
    let guarded = |body: &Value| Some(json!({"units": [body]}));
    let written = api.call("POST", &format!("/fleet/v1/units?ifUnchanged={index}"), guarded(&first)).await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.body);
    let stale = api
        .call("PUT", &format!("/fleet/v1/units/second.service?ifUnchanged={index}"), Some(hello(Some("launched"))))
        .await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    let message = stale.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(&format!("the cluster changed since plan index {index} (it is at ")), "{message}");
    assert_eq!(api.call("GET", "/fleet/v1/units/second.service", None).await.status, StatusCode::NOT_FOUND);
    let stale_delete = api.call("DELETE", &format!("/fleet/v1/units/first.service?ifUnchanged={index}"), None).await;
    assert_eq!(stale_delete.status, StatusCode::CONFLICT);
    let bad_index = api.call("DELETE", "/fleet/v1/units/first.service?ifUnchanged=soon", None).await;
    assert_eq!(bad_index.body, error(400, "invalid ifUnchanged \"soon\": a plan index, as fleetctl plan prints it"));

    // What the write would refuse, the plan refuses with the same words.
    let mut bad = hello(Some("launched"));
    bad["name"] = json!("bad.service");
    bad["options"][0] = json!({"section": "Service", "name": "Restart", "value": "sometimes"});
    let refused = api.call("POST", "/fleet/v1/plans", Some(json!({"units": [bad]}))).await;
    assert_eq!(
        (refused.status.as_u16(), refused.body),
        (400, error(400, "unit bad.service: invalid value \"sometimes\" for Restart=: unknown value \"sometimes\""))
    );
    let empty = api.call("POST", "/fleet/v1/plans", Some(json!({}))).await;
    assert_eq!(empty.body, error(400, "no units given"));

    // Instances share their content: it is carried once, named by each.
    let shared = json!({
        "contents": {"k": hello(None)["options"]},
        "units": [{"name": "i@1.service", "desiredState": "launched", "content": "k"},
                  {"name": "i@2.service", "desiredState": "launched", "content": "k"}],
    });
    let plan = api.call("POST", "/fleet/v1/plans", Some(shared)).await;
    let actions: Vec<(&str, &str)> = plan.body["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|unit| (unit["name"].as_str().unwrap(), unit["action"].as_str().unwrap()))
        .collect();
    assert_eq!(actions, [("i@1.service", "create"), ("i@2.service", "create")], "{}", plan.body);
    let unknown = json!({"units": [{"name": "i@3.service", "desiredState": "launched", "content": "nope"}]});
    let refused = api.call("POST", "/fleet/v1/plans", Some(unknown)).await;
    assert_eq!(refused.body, error(400, "unit i@3.service: content \"nope\" is not in the request's contents"));
}

/// An import stores the original's units with the machines they run on, reports what it does
/// with each, and writes nothing while one is refused or when asked for a dry run.
#[tokio::test]
async fn an_import_writes_units_where_they_run_or_nothing_and_says_why() {
    let api = api(100).await;
    launch(&api, &["taken.service"]).await;
    let machine = MachineState { id: "m1".into(), public_ip: "10.0.0.1".into(), ..Default::default() };
    api.registry.register_machine(&machine).await.unwrap();
    let options = json!([{"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"}]);
    let global = json!([
        {"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"},
        {"section": "X-Fleet", "name": "Global", "value": "true"}
    ]);
    let unit = |name: &str, desired: &str, machine: Option<&str>| json!({"name": name, "desiredState": desired, "content": "app", "machineID": machine});
    let units = vec![
        unit("web.service", "launched", Some("m1")),
        unit("batch.service", "launched", None),
        unit("idle.service", "inactive", Some("m1")),
        json!({"name": "everywhere.service", "desiredState": "launched", "content": "global", "machineID": "m1"}),
    ];
    let contents = json!({"app": options, "global": global});
    let refused = |units: Vec<Value>| json!({"units": units, "contents": contents});

    let dry = api
        .call("POST", "/fleet/v1/imports", Some(json!({"units": units, "contents": contents, "dryRun": true})))
        .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.body);
    let actions: Vec<(String, String)> = dry.body["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|unit| (unit["name"].as_str().unwrap().to_string(), unit["action"].as_str().unwrap().to_string()))
        .collect();
    let expected = [
        ("web.service", "adopt"),
        ("batch.service", "place"),
        ("idle.service", "store"),
        ("everywhere.service", "global"),
    ];
    assert_eq!(actions, expected.map(|(name, action)| (name.to_string(), action.to_string())));
    assert_eq!(dry.body["written"], json!(false));
    assert_eq!(
        api.call("GET", "/fleet/v1/units/web.service", None).await.status,
        StatusCode::NOT_FOUND,
        "a dry run wrote"
    );

    // One unit refused, whatever the reason, and nothing is written; the dry run says why.
    for (bad, reason) in [
        (unit("taken.service", "launched", Some("m1")), "exists in fleet already"),
        (
            unit("elsewhere.service", "launched", Some("m9")),
            "machine m9, where the original runs it, has not joined fleet",
        ),
        (
            json!({"name": "bad.service", "desiredState": "launched", "options": [{"section": "Service", "name": "", "value": "x"}]}),
            "option name is empty",
        ),
        (unit("tmpl@.service", "launched", None), "cannot activate template"),
        (
            json!({"name": "db.service", "desiredState": "launched", "machineID": "m1", "options": [
                {"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"},
                {"section": "X-Fleet", "name": "MachineMetadata", "value": "role=db"}
            ]}),
            "lacks the metadata its MachineMetadata= asks for",
        ),
        (
            json!({"name": "web.service", "desiredState": "launched", "content": "none"}),
            "is not in the request's contents",
        ),
    ] {
        let mut with_bad = units.clone();
        with_bad.push(bad);
        let answer = api.call("POST", "/fleet/v1/imports", Some(refused(with_bad.clone()))).await;
        assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.body);
        assert!(answer.body["error"]["message"].as_str().unwrap().contains("nothing was imported"), "{}", answer.body);
        let mut dry = refused(with_bad);
        dry["dryRun"] = json!(true);
        let report = api.call("POST", "/fleet/v1/imports", Some(dry)).await;
        let last = report.body["units"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["action"], json!("refused"), "{last}");
        assert!(last["reason"].as_str().unwrap().contains(reason), "{last} should say {reason:?}");
        assert_eq!(api.call("GET", "/fleet/v1/units/web.service", None).await.status, StatusCode::NOT_FOUND);
    }

    let written = api.call("POST", "/fleet/v1/imports", Some(refused(units.clone()))).await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.body);
    assert_eq!(written.body["written"], json!(true));
    let web = api.call("GET", "/fleet/v1/units/web.service", None).await;
    assert_eq!((web.body["machineID"].clone(), web.body["desiredState"].clone()), (json!("m1"), json!("launched")));
    let idle = api.call("GET", "/fleet/v1/units/idle.service", None).await;
    assert_eq!((idle.body.get("machineID"), idle.body["desiredState"].clone()), (None, json!("inactive")));
    let again = api.call("POST", "/fleet/v1/imports", Some(refused(units))).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "an import again finds its units: {}", again.body);
    assert_eq!(api.call("POST", "/fleet/v1/imports", Some(json!({"units": []}))).await.status, StatusCode::BAD_REQUEST);
}

/// `LostAfter=` is refused shorter than the API's `agent_ttl` or unreadable, naming the
/// option; the machines out of touch the engine recorded are listed, with their waiting units
/// as `unknown`, only when asked, and only while they are not present again.
#[tokio::test]
async fn lost_after_is_checked_and_machines_out_of_touch_are_listed_when_asked() {
    let api = api(100).await;
    let unit = |lost_after: &str| {
        json!({"desiredState": "launched", "options": [
            {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
            {"section": "X-Fleet", "name": "LostAfter", "value": lost_after},
        ]})
    };
    let short = api.call("PUT", "/fleet/v1/units/db.service", Some(unit("10s"))).await;
    assert_eq!(
        short.body,
        error(
            400,
            "invalid value \"10s\" for [X-Fleet] LostAfter: shorter than this cluster's agent_ttl (30s), after which a machine is first seen gone"
        )
    );
    let bad = api.call("PUT", "/fleet/v1/units/db.service", Some(unit("soon"))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.to_string().contains("[X-Fleet] LostAfter"), "{}", bad.body);
    assert_eq!(api.call("GET", "/fleet/v1/units", None).await.body, json!({}), "nothing was stored");
    for good in ["30s", "10min", "never"] {
        let answer = api.call("PUT", "/fleet/v1/units/db.service", Some(unit(good))).await;
        assert!(answer.status.is_success(), "{good}: {:?}", answer.body);
    }

    let present = fleet_core::MachineState { id: "m1".into(), public_ip: "10.0.0.1".into(), ..Default::default() };
    api.registry.register_machine(&present).await.unwrap();
    let gone = fleet_core::MachineState { id: "m2".into(), public_ip: "10.0.0.2".into(), ..Default::default() };
    let lease = api.registry.acquire_leadership("m1").await.unwrap().expect("the embedded store's leader");
    let record = |machine: &fleet_core::MachineState| fleet_core::OutOfTouch {
        id: machine.id.clone(),
        since: 1_764_936_184_000_000,
        last: Some(machine.clone()),
        units: vec!["db.service".into()],
    };
    api.registry.record_out_of_touch(&lease, &[record(&gone), record(&present)]).await.unwrap();

    let plain = api.call("GET", "/fleet/v1/machines", None).await.body;
    assert_eq!(plain["machines"].as_array().map(Vec::len), Some(1), "the original's list: {plain}");
    let asked = api.call("GET", "/fleet/v1/machines?outOfTouch=true", None).await.body;
    let listed = asked["machines"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 2, "m1 is present again: listed once: {asked}");
    assert_eq!(
        (&listed[1]["id"], &listed[1]["primaryIP"], &listed[1]["outOfTouchSince"]),
        (&json!("m2"), &json!("10.0.0.2"), &json!("2025-12-05T12:03:04Z"))
    );
    assert!(listed[0].get("outOfTouchSince").is_none(), "{asked}");
    let states = api.call("GET", "/fleet/v1/state?outOfTouch=true", None).await.body;
    assert_eq!(
        states["states"],
        json!([{"machineID": "m2", "name": "db.service", "systemdActiveState": "unknown",
                "systemdLoadState": "unknown", "systemdSubState": "unknown",
                "outOfTouchSince": "2025-12-05T12:03:04Z"}])
    );
    assert_eq!(api.call("GET", "/fleet/v1/state", None).await.body, json!({}), "not asked: the original's list");
    let other = api.call("GET", "/fleet/v1/state?outOfTouch=true&machineID=m1", None).await.body;
    assert_eq!(other, json!({}), "filtered by machine as the rest");
    let wrong = api.call("GET", "/fleet/v1/machines?outOfTouch=maybe", None).await;
    assert_eq!(wrong.body, error(400, "invalid outOfTouch \"maybe\": true or false"));
}

/// `DisruptionBudget=` is refused at submission when it could never be kept or read, naming
/// the option (a budget of 0 would hold every rollout and drain of its group), and stores
/// nothing; a good one is taken, through a batch too.
#[tokio::test]
async fn a_disruption_budget_is_checked_at_submission_naming_the_option() {
    let api = api(100).await;
    let unit = |x_fleet: &[(&str, &str)]| {
        let mut options = vec![json!({"section": "Service", "name": "ExecStart", "value": "/bin/true"})];
        options.extend(x_fleet.iter().map(|(name, value)| json!({"section": "X-Fleet", "name": name, "value": value})));
        json!({"desiredState": "launched", "options": options})
    };
    let refused = [
        (
            "web@1.service",
            vec![("DisruptionBudget", "0")],
            "invalid value \"0\" for [X-Fleet] DisruptionBudget: a budget of 0 would hold every rollout and drain of the group for ever; expected 1 or more units, or 1% to 100%",
        ),
        (
            "web@1.service",
            vec![("DisruptionBudget", "0%")],
            "invalid value \"0%\" for [X-Fleet] DisruptionBudget: a budget of 0",
        ),
        (
            "web@1.service",
            vec![("DisruptionBudget", "half")],
            "invalid value \"half\" for [X-Fleet] DisruptionBudget: expected a number of units",
        ),
        (
            "web@1.service",
            vec![("DisruptionBudgetBy", "zone")],
            "[X-Fleet] DisruptionBudgetBy= needs a DisruptionBudget= to group",
        ),
        (
            "db.service",
            vec![("DisruptionBudget", "1")],
            "[X-Fleet] DisruptionBudget= counts a group of units, and db.service is in none",
        ),
        ("web@1.service", vec![("DisruptionBudget", "1"), ("Global", "true")], "DisruptionBudget"),
    ];
    for (name, x_fleet, says) in refused {
        let answer = api.call("PUT", &format!("/fleet/v1/units/{name}"), Some(unit(&x_fleet))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{x_fleet:?}: {}", answer.body);
        assert!(
            answer.body["error"]["message"].as_str().is_some_and(|message| message.contains(says)),
            "{x_fleet:?}: {}",
            answer.body
        );
    }
    assert_eq!(api.call("GET", "/fleet/v1/units", None).await.body, json!({}), "nothing was stored");
    let good = unit(&[("DisruptionBudget", "25%"), ("DisruptionBudgetBy", "zone")]);
    let answer = api.call("PUT", "/fleet/v1/units/web@1.service", Some(good)).await;
    assert!(answer.status.is_success(), "{:?}", answer.body);
    let batch = json!({"units": [{"name": "web@2.service", "desiredState": "launched", "options": unit(&[("DisruptionBudget", "0")])["options"]}]});
    let answer = api.call("POST", "/fleet/v1/units", Some(batch)).await;
    assert!(answer.body.to_string().contains("[X-Fleet] DisruptionBudget"), "a batch refuses it too: {}", answer.body);
}

/// `Requires=` and `After=` are checked at submission: a bad item is refused naming the option,
/// a name not in the cluster is taken (it may come later), and a write that would have units
/// wait for each other in a circle (directly or through a pattern) is refused naming the circle,
/// through a batch and a plan too, storing nothing.
#[tokio::test]
async fn dependencies_are_checked_and_a_circle_is_refused_naming_it() {
    let api = api(100).await;
    let unit = |x_fleet: &str| {
        let mut options = vec![json!({"section": "Service", "name": "ExecStart", "value": "/bin/true"})];
        for line in x_fleet.lines() {
            let (name, value) = line.split_once('=').expect("key=value");
            options.push(json!({"section": "X-Fleet", "name": name, "value": value}));
        }
        json!({"desiredState": "launched", "options": options})
    };
    let bad = api.call("PUT", "/fleet/v1/units/app.service", Some(unit("Requires=db@*.service:0"))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.to_string().contains("[X-Fleet] Requires: a count from 1 to 1000"), "{}", bad.body);
    let first = api.call("PUT", "/fleet/v1/units/app.service", Some(unit("Requires=db.service"))).await;
    assert!(first.status.is_success(), "a unit not in the cluster yet may be required: {}", first.body);
    let closing = api.call("PUT", "/fleet/v1/units/db.service", Some(unit("After=app*.service"))).await;
    assert_eq!(closing.status, StatusCode::BAD_REQUEST, "{}", closing.body);
    let message = closing.body["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("would have units wait for each other in a circle: "), "{message}");
    assert!(message.contains("app.service → db.service") || message.contains("db.service → app.service"), "{message}");
    let batch = json!({"units": [{"name": "db.service", "desiredState": "launched", "options": unit("Requires=app.service")["options"]}]});
    let refused = api.call("POST", "/fleet/v1/units", Some(batch.clone())).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    let planned = api.call("POST", "/fleet/v1/plans", Some(batch)).await;
    assert_eq!(planned.status, StatusCode::BAD_REQUEST, "a plan refuses it as the write would: {}", planned.body);
    let listed = api.call("GET", "/fleet/v1/units", None).await.body;
    assert_eq!(listed["units"].as_array().map(Vec::len), Some(1), "only app.service is stored: {listed}");
    let fine = api.call("PUT", "/fleet/v1/units/db.service", Some(unit("After=migrate.service"))).await;
    assert!(fine.status.is_success(), "{}", fine.body);
}

#[tokio::test]
async fn a_units_versions_are_listed_and_each_read_back_with_its_file() {
    let api = api(100).await;
    let path = "/fleet/v1/units/a.service";
    api.call("PUT", path, Some(hello(Some("inactive")))).await;
    api.call("PUT", path, Some(json!({"desiredState": "launched"}))).await;
    let mut changed = hello(Some("launched"));
    changed["options"][0]["value"] = json!("/bin/sleep 2000");
    assert!(api.call("PUT", path, Some(changed)).await.status.is_success());
    assert_eq!(
        api.call("GET", path, None).await.body["version"],
        json!(3),
        "a unit says its version from the second on"
    );
    let history = api.call("GET", "/fleet/v1/units/a.service/history", None).await.body;
    let versions = history["versions"].as_array().unwrap();
    let summary: Vec<(u64, &str, bool)> = versions
        .iter()
        .map(|v| (v["version"].as_u64().unwrap(), v["desiredState"].as_str().unwrap(), v["current"] == json!(true)))
        .collect();
    assert_eq!(summary, [(1, "inactive", false), (2, "launched", false), (3, "launched", true)]);
    for version in versions {
        assert_eq!(version["changedBy"], json!({"identity": "unix:uid=0"}), "{version}");
        assert!(version["changedAt"].as_str().unwrap().ends_with('Z'), "{version}");
    }
    assert_eq!(versions[0]["hash"], versions[1]["hash"], "a desired-state change keeps the content");
    let first = api.call("GET", "/fleet/v1/units/a.service/history/1", None).await.body;
    assert_eq!(first["options"], hello(None)["options"]);
    assert_eq!(first["version"], json!(1));
    let current = api.call("GET", "/fleet/v1/units/a.service/history/3", None).await.body;
    assert_eq!(current["options"][0]["value"], json!("/bin/sleep 2000"));
    let cases = [
        ("/fleet/v1/units/a.service/history/9", 404, "unit a.service keeps no version 9: it keeps versions 1 to 3"),
        ("/fleet/v1/units/a.service/history/0", 400, "invalid version \"0\": expected a whole number from 1"),
        ("/fleet/v1/units/a.service/history/x", 400, "invalid version \"x\": expected a whole number from 1"),
        ("/fleet/v1/units/nope.service/history", 404, "unit does not exist"),
        ("/fleet/v1/units/nope.service/history/1", 404, "unit does not exist"),
    ];
    for (path, code, message) in cases {
        assert_eq!(api.call("GET", path, None).await.body, error(code, message), "{path}");
    }
}

/// The events of `path` (a stream that ends: `follow=false`) as (id, kind, data), or the
/// status and JSON body of a refusal.
async fn events_of(api: &Api, path: &str, last_event_id: Option<u64>) -> Result<Vec<(u64, String, Value)>, Answer> {
    let mut request = Request::builder().method("GET").uri(path);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let mut request = request.body(Body::empty()).unwrap();
    request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
    let response = api.router.clone().oneshot(request).await.unwrap();
    if response.status() != StatusCode::OK {
        return Err(api.answer(response).await);
    }
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|block| !block.trim().is_empty()) {
        let field = |name: &str| {
            block.lines().find_map(|line| line.strip_prefix(&format!("{name}: "))).unwrap_or_default().to_string()
        };
        let data: Value = serde_json::from_str(&field("data")).unwrap();
        events.push((field("id").parse().unwrap(), field("event"), data));
    }
    Ok(events)
}

/// An API whose writes are events in its store's log.
async fn api_with_events() -> Api {
    let mut api = api(100).await;
    let state = ApiState {
        events: fleet_registry::EventSink::writing_to(Arc::new(api.registry.clone())),
        ..ApiState::new(Arc::new(api.registry.clone()), Auth::new(Arc::new(api.registry.clone()), None))
    };
    api.router = router(state);
    api
}

/// A batch write's event names its units (its path names none), so a pattern finds it; one
/// refused whole names none.
#[tokio::test]
async fn a_batch_write_is_one_event_naming_its_units() {
    let api = api_with_events().await;
    let unit = |name: &str| json!({"name": name, "desiredState": "inactive", "options": hello(None)["options"]});
    let batch = json!({"units": [unit("web-1.service"), unit("web-2.service")]});
    assert_eq!(api.call("POST", "/fleet/v1/units", Some(batch)).await.status, StatusCode::OK);
    let refused = json!({"units": [unit("web-3.service"), {"name": "bad name"}]});
    assert_eq!(api.call("POST", "/fleet/v1/units", Some(refused)).await.status, StatusCode::BAD_REQUEST);
    let all = async || events_of(&api, "/fleet/v1/events?follow=false", None).await.ok().unwrap_or_default();
    fleet_testkit::eventually("both writes are events", async || all().await.len() == 2).await;
    let events = all().await;
    assert_eq!(events[0].2["units"], json!(["web-1.service", "web-2.service"]), "{:?}", events[0]);
    assert_eq!(events[0].2.get("unit"), None);
    assert_eq!((events[1].2.get("units"), events[1].2.get("unit")), (None, None), "{:?}", events[1]);
    let of_web_2 = events_of(&api, "/fleet/v1/events?follow=false&unit=web-2*", None).await.ok().unwrap();
    assert_eq!(of_web_2.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), [events[0].0]);
}

/// Reads server-sent messages of `event` type `kind` from `body` until `wanted` of them came.
async fn messages_of(body: &mut Body, kind: &str, wanted: usize) -> Vec<Value> {
    use http_body_util::BodyExt;
    let mut text = String::new();
    let mut found = Vec::new();
    while found.len() < wanted {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("no {kind} message came; read: {text}"))
            .expect("the feed goes on")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            if block.lines().any(|line| line == format!("event: {kind}")) {
                let data = block.lines().find_map(|line| line.strip_prefix("data: ")).unwrap_or("null");
                found.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    found
}

/// The web view's feed carries the latest events after its first view, then each new one.
#[tokio::test]
async fn the_web_views_feed_carries_the_latest_events_then_new_ones() {
    let api = api_with_events().await;
    let all = async || events_of(&api, "/fleet/v1/events?follow=false", None).await.ok().unwrap_or_default();
    api.call("PUT", "/fleet/v1/units/a.service", Some(hello(Some("inactive")))).await;
    fleet_testkit::eventually("the write is an event", async || all().await.len() == 1).await;
    let mut request = Request::builder().uri("/ui/events").body(Body::empty()).unwrap();
    request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
    let response = api.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let latest = messages_of(&mut body, "happened", 1).await.remove(0);
    assert_eq!(latest.as_array().map(Vec::len), Some(1), "{latest}");
    assert_eq!(latest[0]["message"], "PUT /fleet/v1/units/a.service: 201 Created");
    assert_eq!(latest[0]["kind"], "write");
    api.call("DELETE", "/fleet/v1/units/a.service", None).await;
    let next = messages_of(&mut body, "happened", 1).await.remove(0);
    assert_eq!(next[0]["message"], "DELETE /fleet/v1/units/a.service: 204 No Content", "{next}");
    assert!(next[0]["index"].as_u64() > latest[0]["index"].as_u64(), "{next}");

    // An operator limited to web-* sees the events of its units only.
    use fleet_registry::CredentialRegistry;
    let token = crate::auth::tokens::generate(crate::auth::tokens::TOKEN_PREFIX).unwrap();
    let record = fleet_registry::TokenRecord {
        name: "web-op".into(),
        role: "operator".into(),
        units: Some("web-*".into()),
        secrets: None,
        sha256: crate::auth::tokens::digest(&token),
        created: 0,
        expires: None,
    };
    assert!(api.registry.create_token(&record).await.unwrap());
    api.call("PUT", "/fleet/v1/units/web-1.service", Some(hello(Some("inactive")))).await;
    fleet_testkit::eventually("the web unit's write is an event", async || all().await.len() == 3).await;
    let mut request = Request::builder()
        .uri("/ui/events")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(Peer::Tcp { tls: true, certificate: None });
    let response = api.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let scoped = messages_of(&mut body, "happened", 1).await.remove(0);
    let units: Vec<&str> = scoped.as_array().unwrap().iter().filter_map(|e| e["unit"].as_str()).collect();
    assert_eq!(units, ["web-1.service"], "{scoped}");
}

#[tokio::test]
async fn writes_are_events_read_back_filtered_resumed_and_refused_once_trimmed() {
    let api = api_with_events().await;
    let all = async || events_of(&api, "/fleet/v1/events?follow=false", None).await.ok().unwrap_or_default();
    // Each write is waited for before the next, so each is a batch of its own in the log (the
    // sink writes what is queued together, and the log is trimmed a batch at a time).
    let writes = [
        ("PUT", "/fleet/v1/units/a.service", Some(hello(Some("inactive")))),
        ("PUT", "/fleet/v1/units/b.service", Some(hello(Some("inactive")))),
        ("PUT", "/fleet/v1/units/b.service", Some(json!({"desiredState": "sideways"}))),
        ("DELETE", "/fleet/v1/units/b.service", None),
    ];
    // A read first: were it an event, it would come before the first write's.
    api.call("GET", "/fleet/v1/units", None).await;
    for (written, (method, path, body)) in writes.into_iter().enumerate() {
        api.call(method, path, body).await;
        fleet_testkit::eventually("the write is an event", async || all().await.len() == written + 1).await;
    }

    let events = all().await;
    let messages: Vec<&str> = events.iter().map(|(_, _, data)| data["message"].as_str().unwrap()).collect();
    assert_eq!(
        messages,
        [
            "PUT /fleet/v1/units/a.service: 201 Created",
            "PUT /fleet/v1/units/b.service: 201 Created",
            "PUT /fleet/v1/units/b.service: 400 Bad Request",
            "DELETE /fleet/v1/units/b.service: 204 No Content",
        ],
        "every write, refused ones too, and no read"
    );
    for (id, kind, data) in &events {
        assert_eq!((kind.as_str(), data["kind"].as_str(), data["index"].as_u64()), ("write", Some("write"), Some(*id)));
        assert_eq!(data["by"], json!("unix:uid=0"));
        assert!(data["time"].as_str().unwrap().ends_with('Z'), "{data}");
    }
    assert_eq!(events[0].2["unit"], json!("a.service"));
    let ids: Vec<u64> = events.iter().map(|(id, ..)| *id).collect();

    let of_b = events_of(&api, "/fleet/v1/events?follow=false&unit=b.*", None).await.ok().unwrap();
    assert_eq!(of_b.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), ids[1..]);
    let placed = events_of(&api, "/fleet/v1/events?follow=false&kind=placed,moved", None).await.ok().unwrap();
    assert!(placed.is_empty());
    let resumed = events_of(&api, &format!("/fleet/v1/events?follow=false&since={}", ids[1]), None).await.ok().unwrap();
    assert_eq!(resumed.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), ids[2..]);
    let by_header = events_of(&api, "/fleet/v1/events?follow=false&since=0", Some(ids[2])).await.ok().unwrap();
    assert_eq!(by_header.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), ids[3..], "Last-Event-ID resumes");
    // From a moment on: the events of its second and later (their time is shown to the second).
    let from = |time: &str| format!("/fleet/v1/events?follow=false&from={}", time.replace('+', "%2B"));
    let first_second = events[0].2["time"].as_str().unwrap().to_string();
    let since_first = events_of(&api, &from(&first_second), None).await.ok().unwrap();
    assert_eq!(since_first.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), ids);
    assert!(events_of(&api, &from("2999-01-01T00:00:00Z"), None).await.ok().unwrap().is_empty());
    let with_offset = events_of(&api, &from("2000-01-01T01:00:00+01:00"), None).await.ok().unwrap();
    assert_eq!(with_offset.len(), ids.len());

    let refusals = [
        (
            "/fleet/v1/events?kind=bogus",
            "invalid kind \"bogus\": one of placed, moved, unplaced, waiting, state, health, machine-joined, machine-lost, machine-revoked, drain, rollout, sync, write",
        ),
        ("/fleet/v1/events?since=soon", "invalid since \"soon\": an event index"),
        ("/fleet/v1/events?from=yesterday", "invalid from \"yesterday\": a time in RFC 3339 (2026-12-07T06:00:00Z)"),
        ("/fleet/v1/events?unit=%5B", "invalid unit pattern \"[\""),
        ("/fleet/v1/events?follow=maybe", "invalid follow \"maybe\": true or false"),
    ];
    for (path, message) in refusals {
        let refused = events_of(&api, path, None).await.err().unwrap();
        assert_eq!((refused.status, refused.body), (StatusCode::BAD_REQUEST, error(400, message)), "{path}");
    }

    // Trimmed to the newest: a reader from before it is told 410 and where to read from.
    api.registry.trim_events(1, 0).await.unwrap();
    let gone = events_of(&api, &format!("/fleet/v1/events?follow=false&since={}", ids[0]), None).await.err().unwrap();
    assert_eq!(gone.status, StatusCode::GONE);
    let from = ids[3] - 1;
    let message = format!(
        "events after {} are no longer kept; the oldest kept is after {from}: read again with since={from}",
        ids[0]
    );
    assert_eq!(gone.body, error(410, &message));
    let rest = events_of(&api, &format!("/fleet/v1/events?follow=false&since={from}"), None).await.ok().unwrap();
    assert_eq!(rest.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), ids[3..]);
}
