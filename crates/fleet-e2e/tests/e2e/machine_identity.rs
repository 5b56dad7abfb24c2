//! A pull agent's machine ID belongs to the key that first joined with it, and the machine
//! announces no more than it was granted: a real manager on real etcd, real joins.

use std::time::Duration;

use fleet_e2e::https::{Answer, Caller, Credentials};
use fleet_e2e::pki::ManagerPki;
use rcgen::{CertificateParams, DistinguishedName, KeyPair};

const WAIT: Duration = Duration::from_secs(30);

fn csr_over(key: &KeyPair) -> String {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name = DistinguishedName::new();
    params.serialize_request(key).expect("csr").pem().expect("pem")
}

fn join_body(machine: &str, csr: &str) -> String {
    serde_json::json!({ "machineID": machine, "csr": csr }).to_string()
}

fn machines(fleetd: &fleet_e2e::Fleetd) -> String {
    fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout
}

struct Lab {
    pki: ManagerPki,
    base: String,
    rt: tokio::runtime::Runtime,
}

impl Lab {
    fn call(&self, caller: &Caller, method: &str, path: &str, body: Option<&str>) -> Answer {
        self.rt.block_on(caller.call(method, path, body)).expect("an answer")
    }

    fn joiner(&self, token: &str) -> Caller {
        let credentials = Credentials { token: Some(token), certificate: None };
        Caller::new(&self.base, Some(&self.pki.api_ca_file), credentials).expect("caller")
    }

    /// Joins `machine` over `key` with `token`: the answer, and a caller holding the
    /// certificate it gave (when it gave one).
    fn join(&self, token: &str, machine: &str, key: &KeyPair) -> (Answer, Option<Caller>) {
        let answer =
            self.call(&self.joiner(token), "POST", "/fleet/v1/agents/join", Some(&join_body(machine, &csr_over(key))));
        let certificate = serde_json::from_str::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|body| body["certificate"].as_str().map(str::to_string));
        let caller = certificate.map(|certificate| {
            let stem = format!("{machine}-{}", &fleet_api::auth::tokens::digest(&certificate)[..8]);
            let (cert, key_file) =
                (self.pki.path().join(format!("{stem}.pem")), self.pki.path().join(format!("{stem}-key.pem")));
            std::fs::write(&cert, certificate).expect("certificate");
            std::fs::write(&key_file, key.serialize_pem()).expect("key");
            let credentials = Credentials { token: None, certificate: Some((&cert, &key_file)) };
            Caller::new(&self.base, Some(&self.pki.api_ca_file), credentials).expect("caller")
        });
        (answer, caller)
    }
}

/// The issue's findings: any holder of a registration token joined with the ID of a machine
/// that was offline and received its units; an agent joined with `rack=r9` announced
/// `role=db` and a new public IP, and units for `role=db` went to it.
#[test]
fn a_machine_id_and_its_grants_belong_to_the_key_that_joined() {
    let pki = ManagerPki::local();
    let port = fleet_testkit::free_port();
    let cluster = fleet_e2e::Cluster::start(1, |_| pki.manager_config(&format!("127.0.0.1:{port}"), &[]));
    let manager = &cluster.members[0];
    let lab = Lab {
        base: format!("https://localhost:{port}"),
        rt: tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
        pki,
    };
    let token =
        |args: &[&str]| manager.ok(&[&["registration-token", "create"], args].concat()).stdout.trim().to_string();
    let rack = token(&["--metadata", "rack=r9", "rack"]);
    let edge = token(&["--machine-ids", "edge-*", "edge"]);

    // The victim joins and announces what it was granted.
    let victim_key = KeyPair::generate().expect("key");
    let (joined, victim) = lab.join(&rack, "victim-1", &victim_key);
    assert_eq!(joined.status, 201, "{}", joined.body);
    let victim = victim.expect("a certificate");
    let announce =
        |caller: &Caller, body: &str| lab.call(caller, "PUT", "/fleet/v1/agents/victim-1/machine", Some(body));
    let granted = r#"{"publicIP":"10.0.0.1","metadata":{"rack":"r9"}}"#;
    assert_eq!(announce(&victim, granted).status, 204);

    // It cannot widen its grant, nor move its public IP.
    let widened = announce(&victim, r#"{"publicIP":"10.0.0.1","metadata":{"rack":"r9","role":"db"}}"#);
    assert_eq!(widened.status, 403, "{}", widened.body);
    assert!(widened.body.contains("role=db") && widened.body.contains("rack=r9"), "{}", widened.body);
    let moved = announce(&victim, r#"{"publicIP":"10.6.6.6","metadata":{"rack":"r9"}}"#);
    assert_eq!(moved.status, 403, "{}", moved.body);
    let listed = machines(manager);
    assert!(listed.contains("rack=r9") && !listed.contains("role=db") && !listed.contains("10.6.6.6"), "{listed}");
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "db.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=role=db\n",
    );
    manager.fleetctl_in(units.path(), &["start", "--no-block", "db.service"]);
    // The engine plans it and finds no machine: victim-1 has no role=db, whatever it said.
    let row = |manager: &fleet_e2e::Fleetd| {
        let rows = manager.ok(&["list-unit-files", "--no-legend", "--full", "--fields", "unit,tmachine,reason"]).stdout;
        rows.lines().find(|row| row.starts_with("db.service")).map(str::to_string).unwrap_or_default()
    };
    manager
        .wait_until("the engine says why db.service has no machine", WAIT, |manager| row(manager).contains("role=db"));
    assert!(!row(manager).contains("victim-1"), "{}", row(manager));

    // Offline (a clean leave); a holder of the token joins with its ID and another key.
    assert_eq!(lab.call(&victim, "DELETE", "/fleet/v1/agents/victim-1/machine", None).status, 204);
    manager.wait_until("the victim left", WAIT, |manager| !machines(manager).contains("victim-1"));
    let thief_key = KeyPair::generate().expect("key");
    let (taken, thief) = lab.join(&rack, "victim-1", &thief_key);
    assert_eq!(taken.status, 409, "{}", taken.body);
    assert!(taken.body.contains("belongs to another key") && thief.is_none(), "{}", taken.body);
    // The machine itself, with its own key, joins again.
    let (again, _) = lab.join(&rack, "victim-1", &victim_key);
    assert_eq!(again.status, 201, "{}", again.body);

    // A token that names the IDs it may create creates no other.
    let (other, _) = lab.join(&edge, "core-1", &KeyPair::generate().expect("key"));
    assert_eq!(other.status, 403, "{}", other.body);
    let (named, _) = lab.join(&edge, "edge-1", &KeyPair::generate().expect("key"));
    assert_eq!(named.status, 201, "{}", named.body);

    // Revoked, the ID is nobody's until an administrator forgets it; then a new key may have
    // it, and the old key stays refused.
    manager.ok(&["machine", "revoke", "victim-1"]);
    let (revoked, _) = lab.join(&rack, "victim-1", &thief_key);
    assert_eq!(revoked.status, 403, "{}", revoked.body);
    let forgotten = manager.fleetctl(&["machine", "forget", "core-1"]);
    assert_ne!(forgotten.code, 0, "only a revoked machine is forgotten: {forgotten:?}");
    manager.ok(&["machine", "forget", "victim-1"]);
    let (successor, successor_caller) = lab.join(&rack, "victim-1", &thief_key);
    assert_eq!(successor.status, 201, "{}", successor.body);
    let (old_key, _) = lab.join(&rack, "victim-1", &victim_key);
    assert_eq!(old_key.status, 403, "{}", old_key.body);
    assert!(old_key.body.contains("revoked with this key"), "{}", old_key.body);
    manager.wait_until("the old certificate is refused", WAIT, |_| {
        lab.call(&victim, "GET", "/fleet/v1/agents/victim-1/work", None).status == 401
    });
    let work = lab.call(&successor_caller.expect("a certificate"), "GET", "/fleet/v1/agents/victim-1/work", None);
    assert_eq!(work.status, 200, "{}", work.body);
}

/// Regression (issue 67): an etcd member has no key on record, so once it was stopped any
/// holder of a registration token joined with its machine ID and was given its pinned units
/// and their bodies; the member then could not start again. A member's ID is bound to it
/// when it registers: the join is refused while it is away, and the member comes back.
#[test]
fn a_stopped_members_machine_id_is_not_joined_with_a_registration_token() {
    let pki = ManagerPki::local();
    let port = fleet_testkit::free_port();
    let mut cluster = fleet_e2e::Cluster::start(2, |index| match index {
        0 => pki.manager_config(&format!("127.0.0.1:{port}"), &[]),
        _ => vec![("unit_manager".into(), "native".into())],
    });
    let lab = Lab {
        base: format!("https://localhost:{port}"),
        rt: tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
        pki,
    };
    let member = fleet_e2e::member_id(1);
    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "pinned.service",
        &format!(
            "[Service]\nExecStart=/bin/sleep 1000\nEnvironment=DB_PASSWORD=hunter2\n[X-Fleet]\nMachineID={member}\n"
        ),
    );
    cluster.members[0].fleetctl_in(units.path(), &["start", "--no-block", "pinned.service"]);
    let manager = &cluster.members[0];
    manager.wait_until("the pinned unit runs on member 2", WAIT, |manager| {
        manager
            .ok(&["list-units", "--no-legend", "--full", "--fields", "unit,machine,active"])
            .stdout
            .contains("active")
    });
    let token = manager.ok(&["registration-token", "create", "plain"]).stdout.trim().to_string();

    // Member 2 dies; once its lease lapsed, a holder of the token asks for its ID.
    cluster.members[1].stop_with(libc::SIGKILL);
    let manager = &cluster.members[0];
    manager.wait_until("member 2 is gone", WAIT, |manager| !machines(manager).contains(&member));
    let thief_key = KeyPair::generate().expect("key");
    let (taken, thief) = lab.join(&token, &member, &thief_key);
    assert_eq!(taken.status, 409, "{}", taken.body);
    assert!(taken.body.contains("is a member of the cluster") && thief.is_none(), "{}", taken.body);

    // The member itself starts again and runs its unit.
    let config = cluster.member_config(1);
    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let returned = fleet_e2e::Fleetd::start(&member, &[pairs, vec![("unit_manager", "native")]].concat());
    returned.wait_until("member 2 is back", WAIT, |fleetd| machines(fleetd).contains(&member));
    drop(returned);

    // An administrator gives the ID up on purpose: revoked and forgotten, it may be joined.
    let manager = &cluster.members[0];
    manager.ok(&["machine", "revoke", &member]);
    manager.ok(&["machine", "forget", &member]);
    let (given, _) = lab.join(&token, &member, &thief_key);
    assert_eq!(given.status, 201, "{}", given.body);

    // Regression (issue 67): IDs that never existed were revoked with a 204.
    for id in ["..", "never-was"] {
        let refused = manager.fleetctl(&["machine", "revoke", id]);
        assert_ne!(refused.code, 0, "{id}: {refused:?}");
    }
    let unknown = manager.fleetctl(&["machine", "revoke", "never-was"]);
    assert!(unknown.stderr.contains("is not known to the cluster"), "{unknown:?}");
}
