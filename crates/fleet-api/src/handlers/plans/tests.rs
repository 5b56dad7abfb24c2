//! A plan against what then happens: over many generated clusters and changes, every unit a
//! plan names or moves ends where the plan said once the change is written and the engine's
//! planner has settled the cluster, when nothing else changed in between.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, header};
use fleet_core::MachineState;
use fleet_core::schedule::{ClusterSnapshot, RequirementsCache, plan};
use fleet_registry::{AgentRegistry, ApiRegistry, EngineLease, EngineRegistry};
use fleet_store_embedded::EmbeddedRegistry;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::auth::{Auth, Peer};
use crate::{ApiState, router};

/// A small deterministic generator: the same seed, the same scenario.
struct Seeded(u64);

impl Seeded {
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % bound as u64) as usize
    }
}

async fn call(router: &axum::Router, method: &str, path: &str, body: Value) -> (u16, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    request.extensions_mut().insert(Peer::Unix { uid: Some(0) });
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() })
}

/// Runs the engine's planner over the store until it decides nothing more, writing each plan.
async fn settle(registry: &EmbeddedRegistry, lease: &EngineLease, requirements: &mut RequirementsCache) {
    for _ in 0..10 {
        let snapshot = registry.snapshot().await.unwrap();
        let missing = requirements.missing(&snapshot.units);
        let bodies = EngineRegistry::unit_bodies(registry, &missing).await.unwrap();
        requirements.learn(&snapshot.units, &bodies);
        let cluster: ClusterSnapshot = requirements.cluster_snapshot(snapshot.machines, snapshot.units);
        let decided = plan(&cluster);
        if decided.decisions.is_empty() {
            return;
        }
        registry.apply(lease, &decided.decisions, &decided.reason_texts()).await.unwrap();
    }
    panic!("the engine's planner did not settle");
}

async fn placements(registry: &EmbeddedRegistry) -> BTreeMap<String, Option<String>> {
    let snapshot = registry.snapshot().await.unwrap();
    snapshot.units.into_iter().map(|unit| (unit.name, unit.machine_id)).collect()
}

const RULES: [&str; 5] =
    ["", "MachineMetadata=role=web", "MachineMetadata=role=db", "Conflicts=u*.service", "Replaces=u1.service"];

fn unit(name: &str, rule: &str, desired: &str) -> Value {
    let mut options = vec![json!({"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"})];
    if let Some((option, value)) = rule.split_once('=') {
        options.push(json!({"section": "X-Fleet", "name": option, "value": value}));
    }
    json!({"name": name, "desiredState": desired, "options": options})
}

#[tokio::test]
async fn a_plan_equals_what_the_change_then_does() {
    let (mut moved, mut waiting, mut placed, mut versioned) = (0, 0, 0, 0);
    for seed in 0..40u64 {
        let mut random = Seeded(seed);
        let dir = tempfile::tempdir().unwrap();
        let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
        let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
        let router = router(state);
        for index in 0..1 + random.below(4) {
            let role = if random.below(2) == 0 { "web" } else { "db" };
            let machine = MachineState {
                id: format!("m{index}"),
                metadata: [("role".to_string(), role.to_string())].into(),
                ..MachineState::default()
            };
            registry.register_machine(&machine).await.unwrap();
        }
        let lease = registry.acquire_leadership("m0").await.unwrap().unwrap();
        let mut requirements = RequirementsCache::default();
        let standing: Vec<Value> = (0..random.below(7))
            .map(|index| unit(&format!("u{index}.service"), RULES[random.below(3)], "launched"))
            .collect();
        if !standing.is_empty() {
            let (status, body) = call(&router, "POST", "/fleet/v1/units", json!({ "units": standing })).await;
            assert_eq!(status, 200, "{body}");
        }
        settle(&registry, &lease, &mut requirements).await;

        // The change: new units with any rule, a stop, a destroy.
        let mut units: Vec<Value> = (0..1 + random.below(4))
            .map(|index| unit(&format!("n{index}.service"), RULES[random.below(RULES.len())], "launched"))
            .collect();
        let mut destroy = Vec::new();
        if !standing.is_empty() {
            let stopped = random.below(standing.len());
            units.push(json!({"name": format!("u{stopped}.service"), "desiredState": "inactive"}));
            let destroyed = random.below(standing.len());
            if destroyed != stopped {
                destroy.push(format!("u{destroyed}.service"));
            }
        }
        let (status, planned) =
            call(&router, "POST", "/fleet/v1/plans", json!({"units": units, "destroy": destroy})).await;
        assert_eq!(status, 200, "seed {seed}: {planned}");

        let (status, body) = call(&router, "POST", "/fleet/v1/units", json!({ "units": units })).await;
        assert_eq!(status, 200, "seed {seed}: {body}");
        for name in &destroy {
            let (status, body) = call(&router, "DELETE", &format!("/fleet/v1/units/{name}"), Value::Null).await;
            assert_eq!(status, 204, "seed {seed}: {body}");
        }
        settle(&registry, &lease, &mut requirements).await;
        let after = placements(&registry).await;
        for unit in planned["units"].as_array().unwrap() {
            let name = unit["name"].as_str().unwrap();
            let said = unit.get("machine").and_then(Value::as_str);
            let became = after.get(name).cloned().flatten();
            assert_eq!(said, became.as_deref(), "seed {seed}: {name} planned {unit}, placed {after:?}");
            let version = registry.unit(name).await.unwrap().map(|view| view.versions.number());
            assert_eq!(unit.get("version").and_then(Value::as_u64), version, "seed {seed}: {name} planned {unit}");
            versioned += usize::from(unit["action"] == "set" && version.is_some_and(|number| number > 1));
            moved += usize::from(unit["action"] == "moved");
            waiting += usize::from(unit["waiting"].is_string());
            placed += usize::from(unit["action"] == "create" && said.is_some());
        }
    }
    // The scenarios hold every kind of outcome, or the comparison above proves little.
    assert!(
        moved > 0 && waiting > 0 && placed > 0 && versioned > 0,
        "moved {moved}, waiting {waiting}, placed {placed}, versions made {versioned}"
    );
}

#[test]
fn a_scoped_operator_plans_only_its_units_and_sees_only_those_a_change_moves() {
    let scoped = fleet_core::access::Role::parse("operator", Some("web-*")).expect("a role");
    let planned =
        |name: &str| crate::schema::PlannedUnit { name: name.into(), action: "moved".into(), ..Default::default() };
    let seen = super::seen_by(vec![planned("web-1.service"), planned("db.service")], &scoped);
    assert_eq!(seen, vec![planned("web-1.service")]);
    let all = super::seen_by(vec![planned("web-1.service"), planned("db.service")], &fleet_core::access::Role::Viewer);
    assert_eq!(all.len(), 2, "a viewer sees every unit");
    let refused = super::may(&scoped, "db.service", super::Permission::Plan).expect_err("outside its pattern");
    assert_eq!(refused.status, axum::http::StatusCode::FORBIDDEN);
    assert!(super::may(&fleet_core::access::Role::Viewer, "db.service", super::Permission::Plan).is_ok());
}

#[test]
fn at_most_two_plans_are_worked_out_at_once() {
    let under_way = std::sync::atomic::AtomicUsize::new(0);
    let first = super::PlanSlot::take(&under_way).expect("a first slot");
    let _second = super::PlanSlot::take(&under_way).expect("a second slot");
    let refused = super::PlanSlot::take(&under_way).err().expect("no third");
    assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    assert!(super::PlanSlot::take(&under_way).is_ok(), "a slot given back is taken again");
}

/// A unit on a calendar or a batch unit is placed only for a run, as the engine does: the plan
/// leaves it unplaced and says when it runs; a service beside it is placed as before, and one
/// that moves when it fails too, the plan saying so.
#[tokio::test]
async fn a_plan_places_units_whose_runs_are_kept_only_for_a_run_and_says_when() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    let router = router(state);
    registry.register_machine(&MachineState { id: "m0".into(), ..MachineState::default() }).await.unwrap();
    let job = |name: &str, key: &str, value: &str| {
        json!({"name": name, "desiredState": "launched", "options": [
            {"section": "Service", "name": "Type", "value": "oneshot"},
            {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
            {"section": "X-Fleet", "name": key, "value": value},
        ]})
    };
    let units = json!({"units": [
        job("backup.service", "Schedule", "*-*-* 02:00:00"),
        job("migrate.service", "Batch", "true"),
        unit("web.service", "", "launched"),
        {"name": "sweep.service", "desiredState": "launched", "options": [
            {"section": "Service", "name": "Type", "value": "oneshot"},
            {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
            {"section": "X-Fleet", "name": "Schedule", "value": "03:00"},
            {"section": "X-Fleet", "name": "Global", "value": "true"},
        ]},
        {"name": "api.service", "desiredState": "launched", "options": [
            {"section": "Service", "name": "ExecStart", "value": "/bin/api"},
            {"section": "X-Fleet", "name": "Retries", "value": "3"},
            {"section": "X-Fleet", "name": "RetryDelay", "value": "4m"},
        ]},
    ]});
    let (status, planned) = call(&router, "POST", "/fleet/v1/plans", units).await;
    assert_eq!(status, 200, "{planned}");
    let by_name = |name: &str| {
        planned["units"].as_array().unwrap().iter().find(|unit| unit["name"] == name).cloned().expect("planned")
    };
    let backup = by_name("backup.service");
    assert_eq!((backup["action"].as_str(), backup.get("machine")), (Some("create"), None), "{planned}");
    let runs = backup["runs"].as_str().unwrap_or_default();
    assert!(runs.starts_with("runs on *-*-* 02:00:00, next at 20") && runs.ends_with("T02:00:00Z"), "{planned}");
    assert_eq!(by_name("migrate.service")["runs"], "a batch unit: one run each start, placed when started");
    assert_eq!(by_name("migrate.service").get("machine"), None);
    assert_eq!(by_name("web.service")["machine"], "m0");
    assert_eq!(by_name("web.service").get("runs"), None);
    // A service that moves when it fails is placed as any service, and the plan says it moves.
    assert_eq!(by_name("api.service")["machine"], "m0");
    assert_eq!(by_name("api.service")["runs"], "moves when it fails: up to 3 times in a row, 4m apart and doubling");
    let sweep = by_name("sweep.service");
    let runs = sweep["runs"].as_str().unwrap_or_default();
    assert!(runs.starts_with("runs on every machine it may run on, on *-*-* 03:00:00, next at "), "{planned}");
}

/// A taint set or removed changes what a plan guards; a cluster without taints keeps the index
/// it had before taints were known (a plan made through an older member still guards a write).
#[test]
fn a_machines_taints_are_part_of_the_plan_index() {
    let machine = MachineState { id: "m0".into(), ..MachineState::default() };
    let untainted = super::standing_index(&[], std::slice::from_ref(&machine));
    assert_eq!(untainted, 1_434_608_290_969_155, "an untainted machine's index as before taints");
    let mut tainted = machine.clone();
    tainted.taints = fleet_core::taint::parse_taints("gpu=yes").expect("a taint");
    let with_taint = super::standing_index(&[], &[tainted.clone()]);
    assert_ne!(with_taint, untainted);
    tainted.taints = fleet_core::taint::parse_taints("gpu=yes:evict").expect("a taint");
    assert_ne!(super::standing_index(&[], &[tainted]), with_taint, "evicting or not is part of it");
}

/// A plan counts the disruption budgets as the cluster stands: a start whose preemption the
/// budget of the units it would take the room of holds is planned waiting, saying which budget.
#[tokio::test]
async fn a_plan_shows_a_preemption_a_disruption_budget_holds() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let mut state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    state.preemption = true;
    let router = router(state);
    let capacity = Some(fleet_core::Resources { memory: 1 << 30, cpu_millis: 1000 });
    for machine in ["m1", "m2"] {
        registry
            .register_machine(&MachineState { id: machine.into(), capacity, ..MachineState::default() })
            .await
            .unwrap();
    }
    let budgeted = |name: &str| {
        json!({"name": name, "desiredState": "launched", "options": [
            {"section": "Service", "name": "ExecStart", "value": "/bin/sleep 1000"},
            {"section": "X-Fleet", "name": "Memory", "value": "1G"},
            {"section": "X-Fleet", "name": "Priority", "value": "10"},
            {"section": "X-Fleet", "name": "DisruptionBudget", "value": "1"},
        ]})
    };
    let units = json!({"units": [budgeted("web@1.service"), budgeted("web@2.service"), budgeted("web@3.service")]});
    assert_eq!(call(&router, "POST", "/fleet/v1/units", units).await.0, 200);
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("the embedded store's leader");
    settle(&registry, &lease, &mut RequirementsCache::default()).await;
    let placed = placements(&registry).await;
    assert_eq!(placed["web@3.service"], None, "two machines of 1 GiB: the third waits, down");
    // The two placed run where they are: only web@3 is down, and the budget of 1 is spent.
    for name in ["web@1.service", "web@2.service"] {
        let on = placed[name].clone().expect("placed");
        let view = registry.unit(name).await.unwrap().expect("a unit");
        let running = fleet_core::UnitState {
            run: None,
            name: name.into(),
            machine_id: on.clone(),
            hash: view.hash,
            systemd: fleet_core::SystemdState::new("loaded", "active", "running"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
        };
        registry.report_states(&on, &[fleet_registry::StateReport::Set(running)]).await.unwrap();
    }

    let big = json!({"units": [{"name": "db.service", "desiredState": "launched", "options": [
        {"section": "Service", "name": "ExecStart", "value": "/bin/db"},
        {"section": "X-Fleet", "name": "Memory", "value": "1G"},
        {"section": "X-Fleet", "name": "Priority", "value": "900"},
    ]}]});
    let (status, planned) = call(&router, "POST", "/fleet/v1/plans", big).await;
    assert_eq!(status, 200, "{planned}");
    let db = planned["units"].as_array().unwrap().iter().find(|unit| unit["name"] == "db.service").cloned().unwrap();
    assert_eq!(db.get("machine"), None, "{planned}");
    let waiting = db["waiting"].as_str().unwrap_or_default();
    assert!(
        waiting.ends_with(
            "is held by the disruption budget of web@.service: 1 down of the 1 it allows (DisruptionBudget=1)"
        ),
        "{planned}"
    );
}

/// A unit that waits for units is planned as the engine would place it: unplaced, saying what
/// it waits for, until what it requires runs; then placed.
#[tokio::test]
async fn a_plan_leaves_a_unit_waiting_for_what_it_requires_as_the_engine_would() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    let router = router(state);
    registry.register_machine(&MachineState { id: "m0".into(), ..MachineState::default() }).await.unwrap();
    let app = json!({"units": [unit("app.service", "Requires=db.service", "launched")]});
    let (status, planned) = call(&router, "POST", "/fleet/v1/plans", app.clone()).await;
    assert_eq!(status, 200, "{planned}");
    let first = &planned["units"][0];
    assert_eq!((first["action"].as_str(), first.get("machine")), (Some("create"), None), "{planned}");
    assert_eq!(first["waiting"], "waiting for db.service: not in the cluster", "{planned}");

    // The db placed and running: the app is planned onto a machine.
    let lease = registry.acquire_leadership("m0").await.unwrap().unwrap();
    let db = fleet_core::UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    registry.put_unit("db.service", &db, fleet_core::DesiredState::Launched).await.unwrap();
    let placed = fleet_core::schedule::Decision::Schedule { unit: "db.service".into(), machine: "m0".into() };
    registry.apply(&lease, &[placed], &[]).await.unwrap();
    let (_, planned) = call(&router, "POST", "/fleet/v1/plans", app.clone()).await;
    assert_eq!(planned["units"][0]["waiting"], "waiting for db.service: not reported by m0", "{planned}");
    let running = fleet_core::UnitState {
        run: None,
        name: "db.service".into(),
        machine_id: "m0".into(),
        hash: db.hash(),
        systemd: fleet_core::SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    registry.report_states("m0", &[fleet_registry::StateReport::Set(running)]).await.unwrap();
    let (_, planned) = call(&router, "POST", "/fleet/v1/plans", app).await;
    assert_eq!((planned["units"][0]["machine"].as_str(), planned["units"][0].get("waiting")), (Some("m0"), None));
}

/// A plan of a source's sync is asked alone, of a fleetd that reads sources, for a source that
/// exists; anything else is refused before any fetch.
#[tokio::test]
async fn a_plan_of_a_sync_is_refused_with_other_writes_without_a_reader_or_a_source() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    let router = router(state);
    let unit =
        json!({"name": "a.service", "options": [{"section": "Service", "name": "ExecStart", "value": "/bin/true"}]});
    let (status, body) = call(&router, "POST", "/fleet/v1/plans", json!({"sourceSync": "apps", "units": [unit]})).await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (400, Some("sourceSync is planned alone: no units, destroy or drain with it"))
    );
    let (status, _) = call(&router, "POST", "/fleet/v1/plans", json!({"sourceSyncForce": true, "units": [unit]})).await;
    assert_eq!(status, 400);
    let (status, body) = call(&router, "POST", "/fleet/v1/plans", json!({"sourceSync": "apps"})).await;
    assert_eq!(status, 503, "{body}");
}

/// A write with the index of a plan of the cluster as it stands is made guarded by that plan
/// (the store then checks each unit it writes inside the write); a stale index is refused.
#[tokio::test]
async fn a_write_with_a_current_index_is_guarded_by_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    let file = fleet_core::UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
    registry.put_unit("a.service", &file, fleet_core::DesiredState::Launched).await.unwrap();
    let index = super::standing_index(&registry.units().await.unwrap(), &registry.machines().await.unwrap());
    let query = |index: String| vec![("ifUnchanged".to_string(), index)];
    let writer = fleet_registry::Writer::identity("token:ci", false);
    let unguarded = super::guarded(&state, writer.clone(), &[]).await.unwrap();
    assert!(unguarded.guard().is_none());
    let guarded = super::guarded(&state, writer.clone(), &query(index.to_string())).await.unwrap();
    assert_eq!(guarded.guard().map(|guard| guard.index), Some(index));
    registry.set_desired_state("a.service", fleet_core::DesiredState::Loaded).await.unwrap();
    let stale = super::guarded(&state, writer, &query(index.to_string())).await;
    assert_eq!(stale.err().map(|error| error.status.as_u16()), Some(409));
}

/// An operator scoped to some units may not plan a source's sync (a source's plan shows its
/// commit, its problems and who holds its units), and is refused before anything is read.
#[tokio::test]
async fn a_scoped_operator_may_not_plan_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let state = ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry.clone()), None));
    let scoped = fleet_core::access::Role::parse("operator", Some("web-*")).expect("a role");
    let body = json!({"sourceSync": "apps"}).to_string();
    let refused = super::post(&state, &scoped, body.as_bytes()).await.expect_err("refused");
    assert_eq!(refused.status, axum::http::StatusCode::FORBIDDEN);
    let viewer = super::post(&state, &fleet_core::access::Role::Viewer, body.as_bytes()).await.expect_err("no reader");
    assert_eq!(viewer.status, axum::http::StatusCode::SERVICE_UNAVAILABLE, "a viewer gets as far as the reader");
}
