//! Pull agents join with a registration token: a real fleetd with an agent CA signs a
//! certificate over the agent's own key for its machine ID, counts the token's uses, refuses
//! replays, bad requests and live machine IDs without using the token, and renews the
//! certificate for the machine that holds it. A machine certificate opens nothing else.

use std::time::Duration;

use fleet_e2e::Fleetd;
use fleet_e2e::https::{Caller, Credentials};
use fleet_e2e::pki::{ManagerPki, pairs};
use rcgen::{CertificateParams, DistinguishedName, KeyPair};

use fleet_testkit::free_port;

/// A key pair and a certificate signing request over it, as an agent makes them.
fn key_and_csr() -> (KeyPair, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name = DistinguishedName::new();
    let csr = params.serialize_request(&key).expect("csr").pem().expect("pem");
    (key, csr)
}

fn join_body(machine: &str, csr: &str) -> String {
    serde_json::json!({ "machineID": machine, "csr": csr }).to_string()
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_default()
}

#[test]
fn agents_join_with_a_registration_token_and_renew_their_certificate() {
    let pki = ManagerPki::local();
    let (dir, api_ca, agent_ca, api_ca_file) = (&pki.dir, &pki.api_ca, &pki.agent_ca, pki.api_ca_file.clone());
    let port = free_port();
    let client_ca = api_ca_file.display().to_string();
    let config = pki.manager_config(
        &format!("127.0.0.1:{port}"),
        &[("api_tls_client_ca_file", client_ca.as_str()), ("agent_cert_lifetime", "1h")],
    );
    let fleetd = Fleetd::start("e2e0manager00001", &pairs(&config));
    let base = format!("https://localhost:{port}");
    let token = fleetd.ok(&["registration-token", "create", "--max-uses", "1", "--metadata", "rack=r1", "rack1"]);
    let token = token.stdout.trim().to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let joiner = |token: &str| {
        Caller::new(&base, Some(&api_ca_file), Credentials { token: Some(token), certificate: None }).expect("caller")
    };
    let call = |caller: &Caller, method: &str, path: &str, body: Option<&str>| {
        rt.block_on(caller.call(method, path, body)).expect("an answer")
    };

    // Refused before the token is used: a bad request, a machine ID alive in the cluster.
    let caller = joiner(&token);
    let bad = call(&caller, "POST", "/fleet/v1/agents/join", Some(&join_body("agent-1", "not a csr")));
    assert_eq!(bad.status, 400, "{}", bad.body);
    let (_, csr) = key_and_csr();
    let live = call(&caller, "POST", "/fleet/v1/agents/join", Some(&join_body("e2e0manager00001", &csr)));
    assert_eq!(live.status, 409, "{}", live.body);
    let bad_id = call(&caller, "POST", "/fleet/v1/agents/join", Some(&join_body("../etc", &csr)));
    assert_eq!(bad_id.status, 400, "{}", bad_id.body);
    // A registration token is no credential for anything but the join.
    assert_eq!(call(&caller, "GET", "/fleet/v1/units", None).status, 401);

    // The join: a certificate for this machine over the agent's own key, and the token's metadata.
    let (agent_key, csr) = key_and_csr();
    let joined = call(&caller, "POST", "/fleet/v1/agents/join", Some(&join_body("agent-1", &csr)));
    assert_eq!(joined.status, 201, "{}", joined.body);
    let answer = json(&joined.body);
    assert_eq!(answer["machineID"], "agent-1");
    assert_eq!(answer["metadata"]["rack"], "r1");
    assert_eq!(answer["caCertificate"].as_str(), Some(agent_ca.cert_pem.as_str()));
    let certificate = answer["certificate"].as_str().expect("certificate").to_string();
    let listed = fleetd.ok(&["registration-token", "list", "--no-legend"]).stdout;
    assert!(listed.contains("1/1"), "one use counted: {listed}");

    // A replay, an unknown token: refused.
    let (_, csr) = key_and_csr();
    let replay = call(&caller, "POST", "/fleet/v1/agents/join", Some(&join_body("agent-2", &csr)));
    assert_eq!(replay.status, 401, "{}", replay.body);
    assert!(replay.body.contains("used up"), "{}", replay.body);
    let unknown = joiner(&format!("fleetreg_{}", "A".repeat(43)));
    let refused = call(&unknown, "POST", "/fleet/v1/agents/join", Some(&join_body("agent-2", &csr)));
    assert_eq!(refused.status, 401, "{}", refused.body);

    // With its certificate the machine renews it, and can do nothing else here.
    let (cert_file, key_file) = (dir.path().join("agent-1.pem"), dir.path().join("agent-1-key.pem"));
    std::fs::write(&cert_file, &certificate).expect("certificate");
    std::fs::write(&key_file, agent_key.serialize_pem()).expect("key");
    let machine =
        Caller::new(&base, Some(&api_ca_file), Credentials { token: None, certificate: Some((&cert_file, &key_file)) })
            .expect("caller");
    let (_, csr) = key_and_csr();
    let renewed =
        call(&machine, "POST", "/fleet/v1/agents/renew", Some(&serde_json::json!({ "csr": csr }).to_string()));
    assert_eq!(renewed.status, 200, "{}", renewed.body);
    assert_eq!(json(&renewed.body)["machineID"], "agent-1");
    assert_ne!(json(&renewed.body)["certificate"].as_str(), Some(certificate.as_str()));
    for (method, path) in [("GET", "/fleet/v1/units"), ("GET", "/fleet/v1/machines"), ("GET", "/fleet/v1/tokens")] {
        assert_eq!(call(&machine, method, path, None).status, 403, "{method} {path}");
    }

    // Revoked: the certificate is refused within a second, and the ID cannot join again.
    fleetd.ok(&["machine", "revoke", "agent-1"]);
    let revoked_at = std::time::Instant::now();
    let renew = serde_json::json!({ "csr": csr }).to_string();
    loop {
        let answer = call(&machine, "POST", "/fleet/v1/agents/renew", Some(&renew));
        if answer.status == 401 {
            assert!(answer.body.contains("revoked machine certificate"), "{}", answer.body);
            break;
        }
        assert!(revoked_at.elapsed() < Duration::from_secs(1), "the revocation took more than a second");
        std::thread::sleep(Duration::from_millis(20));
    }
    let again = fleetd.ok(&["registration-token", "create", "again"]).stdout.trim().to_string();
    let rejoin = call(&joiner(&again), "POST", "/fleet/v1/agents/join", Some(&join_body("agent-1", &csr)));
    assert_eq!(rejoin.status, 403, "{}", rejoin.body);
    let listed = fleetd.ok(&["registration-token", "list", "--no-legend"]).stdout;
    let uses = listed.lines().find(|line| line.starts_with("again")).and_then(|line| line.split_whitespace().nth(1));
    assert_eq!(uses, Some("0"), "the refused join used nothing: {listed}");

    // A certificate that claims to be a machine's but comes from another CA opens nothing.
    let forged = api_ca.client(dir.path(), "agent-1", Some("machine"), None);
    let forger = Caller::new(
        &base,
        Some(&api_ca_file),
        Credentials { token: None, certificate: Some((&forged.cert, &forged.key)) },
    )
    .expect("caller");
    let answer = call(&forger, "POST", "/fleet/v1/agents/renew", Some(&serde_json::json!({ "csr": csr }).to_string()));
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(answer.body.contains("only the agent CA issues machine certificates"), "{}", answer.body);

    // An expired registration token.
    let brief = fleetd.ok(&["registration-token", "create", "--ttl", "1s", "brief"]).stdout.trim().to_string();
    std::thread::sleep(Duration::from_millis(2100));
    let (_, csr) = key_and_csr();
    let expired = call(&joiner(&brief), "POST", "/fleet/v1/agents/join", Some(&join_body("agent-3", &csr)));
    assert_eq!(expired.status, 401, "{}", expired.body);

    let log = fleetd.log();
    assert!(!log.contains(&token[9..]) && !log.contains(&brief[9..]), "a registration token reached the log");
    assert!(log.contains("machine joined with a registration token"), "{log}");
}

/// The agent's side: `fleet_pull_agent::Manager` joins, keeps the credentials (0600), renews them
/// with the certificate, and reports a refusal without the token in it.
#[test]
fn the_agent_side_joins_keeps_and_renews_its_credentials() {
    let pki = ManagerPki::local();
    let api_ca_file = pki.api_ca_file.clone();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[("agent_cert_lifetime", "1h")]);
    let fleetd = Fleetd::start("e2e0manager00002", &pairs(&config));
    let token = fleetd.ok(&["registration-token", "create", "--max-uses", "1", "--metadata", "zone=a", "z"]).stdout;
    let token = token.trim();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let manager = fleet_pull_agent::Manager::new(
        &format!("https://localhost:{port}"),
        Some(std::fs::read(&api_ca_file).expect("CA")),
        Duration::from_secs(10),
    )
    .expect("manager");
    let (credentials, metadata) = rt.block_on(manager.join(token, "agent-7")).expect("join");
    assert_eq!(metadata.get("zone").map(String::as_str), Some("a"));
    assert_eq!(credentials.machine_id, "agent-7");
    assert_eq!(credentials.not_after - credentials.not_before, 3600 + 300, "an hour, from five minutes back");
    assert!(!credentials.renewal_due(std::time::SystemTime::now()));

    let state = tempfile::tempdir().expect("state");
    credentials.save(state.path()).expect("save");
    let loaded = fleet_pull_agent::MachineCredentials::load(state.path()).expect("load").expect("kept");
    let renewed = rt.block_on(manager.renew(&loaded)).expect("renew");
    assert_eq!(renewed.machine_id, "agent-7");
    assert_ne!(renewed.key, loaded.key, "a new key pair");

    let refused = rt.block_on(manager.join(token, "agent-8")).expect_err("used up");
    assert!(matches!(refused, fleet_pull_agent::ManagerError::Refused { status: 401, .. }), "{refused}");
    assert!(!refused.to_string().contains(&token[9..]), "the token is in the error: {refused}");
}

/// The agent's join and renewal as fleetd runs them: `fleet_pull_agent::join` keeps the signed
/// credentials on disk; a renewal that is due renews at once, keeps the new certificate on
/// disk, and puts it in the credentials shared with the renewal a reload starts (which would
/// otherwise renew the certificate fleetd started with, expired in time).
#[test]
fn a_due_certificate_is_renewed_kept_and_shared_with_the_next_renewal() {
    use std::sync::{Arc, Mutex};
    let pki = ManagerPki::local();
    let port = free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let fleetd = Fleetd::start("e2e0manager00032", &pairs(&config));
    let token = fleetd.ok(&["registration-token", "create", "renewing"]).stdout.trim().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let manager = Arc::new(
        fleet_pull_agent::Manager::new(
            &format!("https://localhost:{port}"),
            Some(std::fs::read(&pki.api_ca_file).expect("CA")),
            Duration::from_secs(10),
        )
        .expect("manager"),
    );
    let state = tempfile::tempdir().expect("state");
    let joined = runtime
        .block_on(fleet_pull_agent::join(manager.clone(), &token, "renewing-1", state.path().to_path_buf()))
        .expect("joined");
    let kept = fleet_pull_agent::MachineCredentials::load(state.path()).expect("load").expect("kept");
    assert_eq!(kept.key, joined.key, "the join keeps what it was signed");
    let registry = {
        let _entered = runtime.enter();
        fleet_pull_agent::RemoteRegistry::new(&manager, &joined, None).expect("remote store")
    };
    // Due now: its recorded life ends a second after it began (five minutes ago).
    let due = fleet_pull_agent::MachineCredentials { not_after: joined.not_before + 1, ..joined.clone() };
    let shared = Arc::new(Mutex::new(due));
    let (lifecycle, running) = tokio::sync::watch::channel(fleet_agent::Lifecycle::Running);
    let renewing = runtime.spawn(fleet_pull_agent::keep_renewing(
        manager.clone(),
        registry.clone(),
        shared.clone(),
        state.path().to_path_buf(),
        running,
    ));
    let now = || shared.lock().expect("lock").clone();
    fleet_e2e::poll_until(
        "the due certificate is renewed",
        Duration::from_secs(30),
        || now().key != joined.key,
        || fleetd.log(),
    );
    let renewed = now();
    assert!(!renewed.renewal_due(std::time::SystemTime::now()), "the new one is not due");
    let on_disk = fleet_pull_agent::MachineCredentials::load(state.path()).expect("load").expect("kept");
    assert_eq!(on_disk.key, renewed.key, "kept on disk");
    lifecycle.send_replace(fleet_agent::Lifecycle::Reloading);
    runtime.block_on(renewing).expect("the renewal ends with its lifecycle");
}
