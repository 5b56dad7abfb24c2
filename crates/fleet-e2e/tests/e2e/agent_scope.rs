//! What a pull agent's certificate opens, through a real manager on a real store: its own
//! presence, its own work, the bodies of the units it holds and the states of those units;
//! nothing of another machine's, and nothing at all once it is revoked.

use std::time::Duration;

use fleet_e2e::Fleetd;
use fleet_e2e::https::{Answer, Caller, Credentials};
use fleet_e2e::pki::{ManagerPki, pairs};

use fleet_testkit::free_port;

fn json(answer: &Answer) -> serde_json::Value {
    serde_json::from_str(&answer.body).unwrap_or_default()
}

/// An agent's caller: its certificate and key on disk.
fn agent_caller(
    dir: &std::path::Path,
    base: &str,
    ca: &std::path::Path,
    credentials: &fleet_pull_agent::MachineCredentials,
) -> Caller {
    let (cert, key) =
        (dir.join(format!("{}.pem", credentials.machine_id)), dir.join(format!("{}-key.pem", credentials.machine_id)));
    std::fs::write(&cert, &credentials.certificate).expect("certificate");
    std::fs::write(&key, &credentials.key).expect("key");
    Caller::new(base, Some(ca), Credentials { token: None, certificate: Some((&cert, &key)) }).expect("caller")
}

#[test]
fn a_machine_certificate_opens_only_that_machines_own_work() {
    let pki = ManagerPki::local();
    let (dir, api_ca_file) = (&pki.dir, pki.api_ca_file.clone());
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let fleetd = Fleetd::start("e2e0manager00003", &pairs(&config));
    let base = format!("https://localhost:{port}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let manager =
        fleet_pull_agent::Manager::new(&base, Some(std::fs::read(&api_ca_file).expect("CA")), Duration::from_secs(10))
            .expect("manager");
    let token = fleetd.ok(&["registration-token", "create", "--max-uses", "2", "--metadata", "kind=pull", "pair"]);
    let token = token.stdout.trim().to_string();
    let (a, _) = rt.block_on(manager.join(&token, "agent-a")).expect("join a");
    let (b, _) = rt.block_on(manager.join(&token, "agent-b")).expect("join b");
    let (agent_a, agent_b) =
        (agent_caller(dir.path(), &base, &api_ca_file, &a), agent_caller(dir.path(), &base, &api_ca_file, &b));
    let call = |caller: &Caller, method: &str, path: &str, body: Option<&str>| {
        rt.block_on(caller.call(method, path, body)).expect("an answer")
    };

    // Each announces itself, and only itself.
    let machine = r#"{"publicIP":"127.0.0.9","metadata":{"kind":"pull"},"version":"0.1.0"}"#;
    let announced = call(&agent_a, "PUT", "/fleet/v1/agents/agent-a/machine", Some(machine));
    assert_eq!(announced.status, 204);
    assert_eq!(announced.version, "HTTP/2.0", "agents speak HTTP/2 with their manager");
    assert_eq!(call(&agent_b, "PUT", "/fleet/v1/agents/agent-b/machine", Some(machine)).status, 204);
    assert_eq!(call(&agent_a, "PUT", "/fleet/v1/agents/agent-b/machine", Some(machine)).status, 403);
    let machines = fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout;
    assert!(
        machines.contains("agent-a") && machines.contains("agent-b") && machines.contains("kind=pull"),
        "{machines}"
    );

    // Units for each, and one for all.
    let units = tempfile::tempdir().expect("units");
    for (name, text) in [
        ("for-a.service", "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=agent-a\n"),
        ("for-b.service", "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID=agent-b\n"),
        (
            "everywhere.service",
            "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nGlobal=true\nMachineMetadata=kind=pull\n",
        ),
    ] {
        fleet_e2e::write_unit(units.path(), name, text);
    }
    fleetd.fleetctl_in(units.path(), &["start", "--no-block", "for-a.service", "for-b.service", "everywhere.service"]);
    let work =
        |caller: &Caller, machine: &str| json(&call(caller, "GET", &format!("/fleet/v1/agents/{machine}/work"), None));
    fleetd.wait_until("for-a and for-b are scheduled on their machines", Duration::from_secs(20), |_| {
        work(&agent_a, "agent-a")["scheduled"].as_array().is_some_and(|units| !units.is_empty())
            && work(&agent_b, "agent-b")["scheduled"].as_array().is_some_and(|units| !units.is_empty())
    });
    let mine = work(&agent_a, "agent-a");
    let names: Vec<&str> = mine["scheduled"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(mine["globals"].as_array().into_iter().flatten())
        .filter_map(|unit| unit["name"].as_str())
        .collect();
    assert_eq!(names, ["for-a.service", "everywhere.service"], "{mine}");
    assert_eq!(mine["machine"]["metadata"]["kind"], "pull");
    let hash_a = mine["scheduled"][0]["hash"].as_str().expect("hash").to_string();
    let hash_global = mine["globals"][0]["hash"].as_str().expect("hash").to_string();
    let hash_b = work(&agent_b, "agent-b")["scheduled"][0]["hash"].as_str().expect("hash").to_string();

    // Another machine's work and bodies are refused.
    assert_eq!(call(&agent_a, "GET", "/fleet/v1/agents/agent-b/work", None).status, 403);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies/{hash_a}"), None).status, 200);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies/{hash_global}"), None).status, 200);
    let body = call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies/{hash_a}"), None);
    assert!(body.body.contains("/bin/sleep 1000"), "{}", body.body);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies/{hash_b}"), None).status, 403);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-b/bodies/{hash_b}"), None).status, 403);
    assert_eq!(call(&agent_a, "GET", "/fleet/v1/agents/agent-a/bodies/nothex", None).status, 400);
    // Several bodies in one request: its own only, each once, and a bounded number of them.
    let both =
        call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies?hash={hash_a}&hash={hash_global}"), None);
    assert_eq!(both.status, 200, "{}", both.body);
    let sent: Vec<String> = json(&both)["bodies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|body| body["hash"].as_str().map(str::to_string))
        .collect();
    let mut asked = vec![hash_a.clone(), hash_global.clone()];
    asked.sort();
    asked.dedup();
    assert_eq!(sent, asked, "{}", both.body);
    assert!(both.body.contains("/bin/sleep 1000"), "{}", both.body);
    let with_b = format!("/fleet/v1/agents/agent-a/bodies?hash={hash_a}&hash={hash_b}");
    let refused = call(&agent_a, "GET", &with_b, None);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains(&hash_b) && !refused.body.contains("ExecStart"), "{}", refused.body);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-b/bodies?hash={hash_b}"), None).status, 403);
    assert_eq!(call(&agent_a, "GET", "/fleet/v1/agents/agent-a/bodies", None).status, 400);
    assert_eq!(call(&agent_a, "GET", "/fleet/v1/agents/agent-a/bodies?hash=nothex", None).status, 400);
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies?hash={hash_a}&x=1"), None).status, 400);
    let too_many = vec![format!("hash={hash_a}"); fleet_api::schema::MAX_BODIES_PER_REQUEST + 1].join("&");
    assert_eq!(call(&agent_a, "GET", &format!("/fleet/v1/agents/agent-a/bodies?{too_many}"), None).status, 400);
    assert_eq!(call(&agent_a, "POST", &format!("/fleet/v1/agents/agent-a/bodies?hash={hash_a}"), None).status, 405);

    // States: its own units only.
    let state = |name: &str, hash: &str| {
        serde_json::json!({ "set": [{ "name": name, "hash": hash, "systemdLoadState": "loaded",
            "systemdActiveState": "active", "systemdSubState": "running", "launched": true }] })
        .to_string()
    };
    assert_eq!(
        call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(&state("for-a.service", &hash_a))).status,
        204
    );
    let states = fleetd.api("GET", "/fleet/v1/state?machineID=agent-a", "");
    assert!(states.contains("for-a.service") && states.contains("running"), "{states}");
    assert_eq!(
        call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(&state("for-b.service", &hash_b))).status,
        403
    );
    assert_eq!(
        call(&agent_a, "POST", "/fleet/v1/agents/agent-b/states", Some(&state("for-b.service", &hash_b))).status,
        403
    );
    // A drift report travels with the state; an unknown kind of drift is refused.
    let drifted = |drift: &str| {
        serde_json::json!({ "set": [{ "name": "for-a.service", "hash": hash_a, "systemdLoadState": "loaded",
            "systemdActiveState": "inactive", "systemdSubState": "dead", "launched": true,
            "drift": { "drift": drift, "corrections": 1, "correcting": true, "givenUp": false } }] })
        .to_string()
    };
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(&drifted("stopped"))).status, 204);
    let states = fleetd.api("GET", "/fleet/v1/state?machineID=agent-a", "");
    assert!(states.contains(r#""drift":"stopped outside fleet; corrected (1 of 3 allowed in 10 min)""#), "{states}");
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(&drifted("wandered"))).status, 400);
    // A removal takes only the machine's own state of a unit, so any unit may be named (it is
    // mostly one the machine no longer holds): another machine's state of it stays.
    assert_eq!(
        call(&agent_b, "POST", "/fleet/v1/agents/agent-b/states", Some(&state("for-b.service", &hash_b))).status,
        204
    );
    let removed = r#"{"removed":["for-b.service"]}"#;
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(removed)).status, 204);
    let states = fleetd.api("GET", "/fleet/v1/state?machineID=agent-b", "");
    assert!(states.contains("for-b.service"), "{states}");
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-b/states", Some(removed)).status, 403);
    let bad_name = r#"{"removed":["../x"]}"#;
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some(bad_name)).status, 400);
    assert_eq!(call(&agent_a, "POST", "/fleet/v1/agents/agent-a/states", Some("{not json")).status, 400);
    // A long poll's wait is bounded where it enters: 1 to 600 seconds.
    for wait in ["0", "601", "-1", "ten", "99999999999999999999"] {
        let path = format!("/fleet/v1/agents/agent-a/changes?after=1&wait={wait}");
        let answer = call(&agent_a, "GET", &path, None);
        assert_eq!(answer.status, 400, "wait={wait}: {}", answer.body);
        assert!(answer.body.contains("invalid wait"), "{}", answer.body);
    }

    // Nobody else uses these endpoints: not an administrator, not a registration token.
    let admin = fleetd.ok(&["token", "create", "--role", "admin", "root"]).stdout.trim().to_string();
    let admin =
        Caller::new(&base, Some(&api_ca_file), Credentials { token: Some(&admin), certificate: None }).expect("caller");
    assert_eq!(call(&admin, "GET", "/fleet/v1/agents/agent-a/work", None).status, 403);

    // Revoked: its open long poll ends within a second, nothing more is served, the machine
    // leaves, and its unit waits for it.
    let revision =
        json(&call(&agent_a, "GET", "/fleet/v1/agents/agent-a/changes", None))["revision"].as_u64().expect("revision");
    let poll = {
        let (cert, key) = (dir.path().join("agent-a.pem"), dir.path().join("agent-a-key.pem"));
        let caller =
            Caller::new(&base, Some(&api_ca_file), Credentials { token: None, certificate: Some((&cert, &key)) })
                .expect("caller");
        let path = format!("/fleet/v1/agents/agent-a/changes?after={revision}");
        // On a thread of its own, so the poll is open (and waiting) before the revocation.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(caller.call("GET", &path, None))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    fleetd.ok(&["machine", "revoke", "agent-a"]);
    let revoked_at = std::time::Instant::now();
    // It ends at once with the change the revocation made (the machine left), or, failing
    // that, when its half-second check sees the revocation.
    let ended = poll.join().expect("the poll thread").expect("an answer");
    assert!(ended.status == 200 || ended.status == 401, "{}", ended.body);
    assert!(
        revoked_at.elapsed() < Duration::from_secs(1),
        "the open poll outlived the revocation by {:?}",
        revoked_at.elapsed()
    );
    fleetd.wait_until("agent-a's certificate is refused", Duration::from_secs(1), |_| {
        call(&agent_a, "GET", "/fleet/v1/agents/agent-a/work", None).status == 401
    });
    let machines = fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout;
    assert!(!machines.contains("agent-a") && machines.contains("agent-b"), "{machines}");
    fleetd.wait_until("for-a.service is unplaced", Duration::from_secs(20), |fleetd| {
        fleetd
            .ok(&["list-unit-files", "--no-legend", "--fields", "unit,tmachine"])
            .stdout
            .lines()
            .any(|line| line.starts_with("for-a.service") && line.ends_with('-'))
    });
}
