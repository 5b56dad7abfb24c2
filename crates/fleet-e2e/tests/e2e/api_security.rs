//! Who may do what, end to end: real fleetds with real certificates (made by rcgen) and
//! tokens made through the Unix socket, on the embedded store and on etcd with two fleetds.
//! Every endpoint is tried with every role; credentials that are missing, malformed,
//! unknown, expired, revoked or signed by another CA are refused; certificates rotate on
//! SIGHUP; no credential reaches a log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleet_e2e::https::{Answer, Caller, Credentials};
use fleet_e2e::pki::{Authority, Pair};
use fleet_e2e::{Cluster, Fleetd, member_id};

use fleet_testkit::free_port;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// The certificates of one test.
struct Pki {
    dir: tempfile::TempDir,
    ca: Authority,
    ca_file: PathBuf,
    server: Pair,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca = Authority::new("fleet test CA");
        let ca_file = ca.write(&dir.path().join("ca.pem"));
        let server = ca.server(dir.path(), "server");
        Self { dir, ca, ca_file, server }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// fleet.conf lines for an HTTPS listener on `port` beside the harness's Unix socket.
    fn config(&self, port: u16) -> Vec<(String, String)> {
        vec![
            ("api_listen".into(), format!("unix://{{socket}},https://127.0.0.1:{port}")),
            ("api_tls_cert_file".into(), self.server.cert.display().to_string()),
            ("api_tls_key_file".into(), self.server.key.display().to_string()),
            ("api_tls_client_ca_file".into(), self.ca_file.display().to_string()),
        ]
    }
}

fn pairs(config: &[(String, String)]) -> Vec<(&str, &str)> {
    config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Makes a token through the Unix socket (where the caller is an administrator).
fn make_token(fleetd: &Fleetd, name: &str, role: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", "--role", role];
    args.extend_from_slice(extra);
    args.push(name);
    let ran = fleetd.ok(&args);
    let token = ran.stdout.trim().to_string();
    assert!(token.starts_with("fleet_") && token.len() == 49, "{ran:?}");
    assert!(ran.stderr.contains("shown only now"), "{ran:?}");
    token
}

const UNIT: &str =
    r#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/sleep 1000"}]}"#;

/// One row of the matrix: a request, and the status each role gets.
struct Case {
    method: &'static str,
    path: String,
    body: Option<String>,
    /// admin, operator, operator limited to `web-*`, viewer.
    expected: [u16; 4],
}

fn case(method: &'static str, path: &str, body: Option<&str>, expected: [u16; 4]) -> Case {
    Case { method, path: path.to_string(), body: body.map(str::to_string), expected }
}

/// Every endpoint, with what each role may do. Writes use a unit of the role's own (so one
/// role's write does not change another's answer); `web-1` and `db` exist and run.
fn matrix(role: usize, machine: &str) -> Vec<Case> {
    let own = ["web-admin", "web-operator", "web-scoped", "web-viewer"][role];
    let patch = format!(r#"[{{"op":"add","path":"/{machine}/metadata/touched","value":"{own}"}}]"#);
    let token = format!(r#"{{"name":"made-by-{own}","role":"viewer"}}"#);
    let registration = format!(r#"{{"name":"joined-by-{own}","maxUses":1}}"#);
    let own_batch = format!(
        r#"{{"units":[{{"name":"{own}-batch.service","desiredState":"inactive","options":[{{"section":"Service","name":"ExecStart","value":"/bin/sleep 1000"}}]}}]}}"#
    );
    let db_batch = r#"{"units":[{"name":"db.service","desiredState":"launched"}]}"#;
    let secret = r#"{"value":"aGVsbG8="}"#;
    vec![
        case("GET", "/fleet/v1/discovery", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/units", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/units/web-1.service", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/units/db.service", None, [200, 200, 404, 200]),
        case("PUT", &format!("/fleet/v1/units/{own}.service"), Some(UNIT), [201, 201, 201, 403]),
        case("PUT", "/fleet/v1/units/db.service", Some(r#"{"desiredState":"loaded"}"#), [204, 204, 403, 403]),
        case("PUT", "/fleet/v1/units/db.service", Some(r#"{"desiredState":"launched"}"#), [204, 204, 403, 403]),
        case("DELETE", &format!("/fleet/v1/units/{own}.service"), None, [204, 204, 204, 403]),
        case("DELETE", "/fleet/v1/units/nothing.service", None, [404, 404, 403, 403]),
        case("POST", "/fleet/v1/units", Some(&own_batch), [200, 200, 200, 403]),
        case("POST", "/fleet/v1/units", Some(db_batch), [200, 200, 403, 403]),
        case("GET", "/fleet/v1/state", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/state/web-1.service", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/state/db.service", None, [200, 200, 404, 200]),
        case("GET", "/fleet/v1/machines", None, [200, 200, 200, 200]),
        case("PATCH", "/fleet/v1/machines", Some(&patch), [204, 204, 403, 403]),
        case("GET", "/fleet/v1/journal/web-1.service", None, [200, 200, 200, 200]),
        case("GET", "/fleet/v1/journal/db.service", None, [200, 200, 404, 200]),
        case("GET", "/fleet/v1/tokens", None, [200, 403, 403, 403]),
        case("POST", "/fleet/v1/tokens", Some(&token), [201, 403, 403, 403]),
        case("DELETE", "/fleet/v1/tokens/made-by-web-admin", None, [204, 403, 403, 403]),
        case("GET", "/fleet/v1/registration-tokens", None, [200, 403, 403, 403]),
        case("POST", "/fleet/v1/registration-tokens", Some(&registration), [201, 403, 403, 403]),
        case("DELETE", "/fleet/v1/registration-tokens/joined-by-web-admin", None, [204, 403, 403, 403]),
        // Secrets: an operator holds those its secret pattern covers (`web-*` for the scoped
        // one; none for the other); everyone may list names.
        case("GET", "/fleet/v1/secrets", None, [200, 200, 200, 200]),
        case("PUT", &format!("/fleet/v1/secrets/{own}"), Some(secret), [201, 403, 201, 403]),
        case("PUT", "/fleet/v1/secrets/db-key", Some(secret), [201, 403, 403, 403]),
        case("DELETE", &format!("/fleet/v1/secrets/{own}"), None, [204, 403, 204, 403]),
        case("DELETE", "/fleet/v1/secrets/db-key", None, [204, 403, 403, 403]),
    ]
}

fn error_message(answer: &Answer) -> String {
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
    assert_eq!(body["error"]["code"], answer.status, "a JSON error body: {}", answer.body);
    body["error"]["message"].as_str().unwrap_or_default().to_string()
}

/// The tokens of the four roles, made on `maker`.
struct RoleTokens {
    tokens: [String; 4],
}

impl RoleTokens {
    fn make(maker: &Fleetd) -> Self {
        Self {
            tokens: [
                make_token(maker, "admin1", "admin", &[]),
                make_token(maker, "operator1", "operator", &[]),
                make_token(maker, "scoped1", "operator", &["--units", "web-*", "--secrets", "web-*"]),
                make_token(maker, "viewer1", "viewer", &["--ttl", "1h"]),
            ],
        }
    }
}

/// Submits and starts `web-1` and `db` through the Unix socket and waits for their states.
fn start_units(fleetd: &Fleetd) {
    let dir = tempfile::tempdir().expect("unit dir");
    for name in ["web-1.service", "db.service"] {
        fleet_e2e::write_unit(dir.path(), name, "[Service]\nExecStart=/bin/sleep 1000\n");
    }
    fleetd.fleetctl_in(dir.path(), &["start", "--no-block", "web-1.service", "db.service"]);
    fleetd.wait_until("both units report a state", Duration::from_secs(20), |fleetd| {
        let states = fleetd.api("GET", "/fleet/v1/state", "");
        states.contains("web-1.service") && states.contains("db.service")
    });
}

/// Runs the whole matrix against `base` (an HTTPS listener), then the unauthenticated row.
fn check_matrix(base: &str, pki: &Pki, tokens: &RoleTokens, machine: &str) {
    let rt = runtime();
    for (role, token) in tokens.tokens.iter().enumerate() {
        let caller = Caller::new(base, Some(&pki.ca_file), Credentials { token: Some(token), certificate: None })
            .expect("caller");
        for case in matrix(role, machine) {
            let answer = rt.block_on(caller.call(case.method, &case.path, case.body.as_deref())).expect("an answer");
            assert_eq!(
                answer.status, case.expected[role],
                "role #{role} {} {}: {}",
                case.method, case.path, answer.body
            );
            if answer.status >= 400 {
                error_message(&answer);
            }
        }
    }
    let scoped =
        Caller::new(base, Some(&pki.ca_file), Credentials { token: Some(&tokens.tokens[2]), certificate: None })
            .expect("caller");
    let listed = rt.block_on(scoped.call("GET", "/fleet/v1/units", None)).expect("an answer");
    assert!(listed.body.contains("web-1.service") && !listed.body.contains("db.service"), "{}", listed.body);
    let states = rt.block_on(scoped.call("GET", "/fleet/v1/state", None)).expect("an answer");
    assert!(states.body.contains("web-1.service") && !states.body.contains("db.service"), "{}", states.body);

    let nobody = Caller::new(base, Some(&pki.ca_file), Credentials::default()).expect("caller");
    for case in matrix(0, machine) {
        let answer = rt.block_on(nobody.call(case.method, &case.path, case.body.as_deref())).expect("an answer");
        assert_eq!(answer.status, 401, "no credential: {} {}", case.method, case.path);
        assert!(error_message(&answer).contains("credential required"), "{}", answer.body);
    }
}

/// Bad credentials of every kind: a 401 with a JSON body, and the server goes on. `expired`
/// was made with a TTL of one second.
fn check_bad_tokens(base: &str, pki: &Pki, expired: &str) {
    std::thread::sleep(Duration::from_millis(1100));
    let rt = runtime();
    let cases: [(String, &str); 5] = [
        ("fleet_short".into(), "malformed"),
        ("not-a-token-at-all".into(), "malformed"),
        (format!("fleet_{}", "A".repeat(43)), "unknown or revoked"),
        (expired.to_string(), "expired"),
        (format!("fleet_{}", "x".repeat(480)), "malformed"),
    ];
    for (token, says) in cases {
        let caller = Caller::new(base, Some(&pki.ca_file), Credentials { token: Some(&token), certificate: None })
            .expect("caller");
        let answer = rt.block_on(caller.call("GET", "/fleet/v1/units", None)).expect("an answer");
        assert_eq!(answer.status, 401, "{token}: {}", answer.body);
        assert!(error_message(&answer).contains(says), "{says}: {}", answer.body);
    }
}

#[test]
fn embedded_store_every_endpoint_every_role_and_every_bad_credential() {
    let pki = Pki::new();
    let port = free_port();
    let mut config = pki.config(port);
    config.push(("unit_manager".into(), "native".into()));
    let fleetd = Fleetd::start("e2e0security0001", &pairs(&config));
    let base = format!("https://localhost:{port}");
    let tokens = RoleTokens::make(&fleetd);
    let expired = make_token(&fleetd, "short-lived", "admin", &["--ttl", "1s"]);
    start_units(&fleetd);
    check_matrix(&base, &pki, &tokens, "e2e0security0001");
    check_bad_tokens(&base, &pki, &expired);

    let rt = runtime();
    // Client certificates: the subject names identity and role; a certificate without a
    // role gets 403; one from another CA never completes the handshake.
    let viewer = pki.ca.client(pki.path(), "carol", Some("viewer"), None);
    let caller = Caller::new(
        &base,
        Some(&pki.ca_file),
        Credentials { token: None, certificate: Some((&viewer.cert, &viewer.key)) },
    )
    .expect("caller");
    assert_eq!(rt.block_on(caller.call("GET", "/fleet/v1/units", None)).expect("answer").status, 200);
    assert_eq!(rt.block_on(caller.call("PUT", "/fleet/v1/units/x.service", Some(UNIT))).expect("answer").status, 403);
    let roleless = pki.ca.client(pki.path(), "dave", None, None);
    let caller = Caller::new(
        &base,
        Some(&pki.ca_file),
        Credentials { token: None, certificate: Some((&roleless.cert, &roleless.key)) },
    )
    .expect("caller");
    let answer = rt.block_on(caller.call("GET", "/fleet/v1/units", None)).expect("answer");
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(error_message(&answer).contains("grants no role"));
    let foreign_ca = Authority::new("someone else's CA");
    let foreign = foreign_ca.client(pki.path(), "mallory", Some("admin"), None);
    let caller = Caller::new(
        &base,
        Some(&pki.ca_file),
        Credentials { token: None, certificate: Some((&foreign.cert, &foreign.key)) },
    )
    .expect("caller");
    let refused = rt.block_on(caller.call("GET", "/fleet/v1/units", None));
    assert!(refused.is_err(), "a certificate from another CA is refused at the handshake: {refused:?}");
    let untrusting =
        Caller::new(&base, Some(&foreign_ca.write(&pki.path().join("foreign-ca.pem"))), Credentials::default())
            .expect("caller");
    assert!(rt.block_on(untrusting.call("GET", "/fleet/v1/units", None)).is_err(), "the server's CA is checked");

    // fleetctl speaks it: --ca-file and a token from the environment or a file.
    let fleetctl = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(fleet_e2e::binary("fleetctl"));
        command.arg(format!("--endpoint={base}")).arg(format!("--ca-file={}", pki.ca_file.display()));
        command.args(extra).env_remove("FLEETCTL_TOKEN").env_remove("FLEETCTL_ENDPOINT");
        command.envs(env.iter().copied());
        fleet_e2e::Ran::from(command.output().expect("fleetctl"))
    };
    let listed = fleetctl(&["list-unit-files", "--no-legend"], &[("FLEETCTL_TOKEN", &tokens.tokens[3])]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("web-1.service"), "{listed:?}");
    let token_file = pki.path().join("token");
    std::fs::write(&token_file, format!("{}\n", tokens.tokens[2])).expect("token file");
    let scoped = fleetctl(&[&format!("--token-file={}", token_file.display()), "list-unit-files", "--no-legend"], &[]);
    assert!(scoped.stdout.contains("web-1.service") && !scoped.stdout.contains("db.service"), "{scoped:?}");
    let denied = fleetctl(&["destroy", "db.service"], &[("FLEETCTL_TOKEN", &tokens.tokens[3])]);
    assert_ne!(denied.code, 0, "{denied:?}");
    let anonymous = fleetctl(&["list-units"], &[]);
    assert_ne!(anonymous.code, 0);
    assert!(anonymous.stderr.contains("401"), "{anonymous:?}");
    let with_cert = fleetctl(
        &[
            &format!("--cert-file={}", viewer.cert.display()),
            &format!("--key-file={}", viewer.key.display()),
            "list-machines",
        ],
        &[],
    );
    assert_eq!(with_cert.code, 0, "{with_cert:?}");
    // Regression (issue 68): plain HTTP to this HTTPS listener said "invalid HTTP version parsed".
    let plain = std::process::Command::new(fleet_e2e::binary("fleetctl"))
        .arg(format!("--endpoint={}", base.replace("https://", "http://")))
        .arg("list-machines")
        .env_remove("FLEETCTL_ENDPOINT")
        .output()
        .expect("fleetctl");
    let plain = fleet_e2e::Ran::from(plain);
    assert!(plain.code != 0 && plain.stderr.contains(&format!("Use {base}")), "{plain:?}");
    let token_list = fleetd.ok(&["token", "list"]);
    assert!(token_list.stdout.contains("scoped1") && token_list.stdout.contains("web-*"), "{token_list:?}");

    // The audit trail: writes and refusals, by identity and role, never a token.
    let log = fleetd.log();
    let audit: Vec<&str> = log.lines().filter(|line| line.contains("fleet::audit")).collect();
    assert!(
        audit.iter().any(|l| l.contains("token:viewer1") && l.contains("status=403") && l.contains("PUT")),
        "{log}"
    );
    assert!(audit.iter().any(|l| l.contains("token:scoped1") && l.contains(r#"unit="db.service""#)), "{log}");
    assert!(audit.iter().any(|l| l.contains(r#"identity="-""#) && l.contains("status=401")), "{log}");
    assert!(audit.iter().any(|l| l.contains("cert:carol")), "{log}");
    assert!(audit.iter().any(|l| l.contains("unix:uid=") && l.contains("POST")), "{log}");
    for secret in tokens.tokens.iter().chain([&expired]) {
        assert!(!log.contains(secret.as_str()), "a token reached the log");
        assert!(!log.contains(&secret[6..]), "a token reached the log");
    }
}

/// The certificate a fresh connection to `base` is served with.
fn served_certificate(base: &str, ca: &Path) -> Vec<u8> {
    let caller = Caller::new(base, Some(ca), Credentials::default()).expect("caller");
    runtime().block_on(caller.call("GET", "/fleet/v1/units", None)).expect("answer").server_certificate.expect("TLS")
}

#[test]
fn certificates_rotate_on_sighup_without_a_restart() {
    let pki = Pki::new();
    let port = free_port();
    let config = pki.config(port);
    let fleetd = Fleetd::start("e2e0rotation0001", &pairs(&config));
    let base = format!("https://localhost:{port}");
    assert_eq!(served_certificate(&base, &pki.ca_file), pki.server.der);
    let pid = fleetd.pid();

    let renewed = pki.ca.server(pki.path(), "renewed");
    std::fs::copy(&renewed.cert, &pki.server.cert).expect("replace certificate");
    std::fs::copy(&renewed.key, &pki.server.key).expect("replace key");
    fleetd.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while served_certificate(&base, &pki.ca_file) != renewed.der {
        assert!(Instant::now() < deadline, "the renewed certificate is not served; log:\n{}", fleetd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fleetd.pid(), pid, "no restart");
    assert!(fleetd.log().contains("API TLS certificates reloaded"));

    // A broken file on the next reload keeps the running certificate.
    std::fs::write(&pki.server.key, "not a key").expect("break key");
    fleetd.signal(libc::SIGHUP);
    fleetd.wait_until("the failed reload is logged", Duration::from_secs(10), |fleetd| {
        fleetd.log().contains("keeping the running API TLS certificates")
    });
    assert_eq!(served_certificate(&base, &pki.ca_file), renewed.der);
}

#[test]
fn insecure_listeners_are_refused_at_start() {
    let port = free_port();
    let (code, log) = Fleetd::start_refused("e2e0insecure0001", &[("api_listen", &format!("0.0.0.0:{port}"))]);
    assert_ne!(code, Some(0));
    assert!(log.contains(&format!("refusing plain HTTP on 0.0.0.0:{port}")), "{log}");
    assert!(log.contains("api_tls_cert_file") && log.contains("api_tls_key_file"), "{log}");
    let (code, log) =
        Fleetd::start_refused("e2e0insecure0001", &[("api_listen", &format!("https://127.0.0.1:{port}"))]);
    assert_ne!(code, Some(0));
    assert!(log.contains("no certificate: set api_tls_cert_file and api_tls_key_file"), "{log}");
}

/// The original fleetctl sends no credential: through the Unix socket it is an administrator;
/// over TCP it gets 401 unless the operator opts in to anonymous access, naming the role.
#[test]
fn credential_less_clients_need_the_anonymous_opt_in_on_tcp() {
    let run = |port: u16, args: &[&str]| {
        let ran = std::process::Command::new(fleet_e2e::binary("fleetctl"))
            .arg(format!("--endpoint=http://127.0.0.1:{port}"))
            .args(args)
            .env_remove("FLEETCTL_TOKEN")
            .output()
            .expect("fleetctl");
        fleet_e2e::Ran::from(ran)
    };
    let port = free_port();
    let listen = format!("unix://{{socket}},127.0.0.1:{port}");
    let closed = Fleetd::start("e2e0anonymous001", &[("api_listen", &listen)]);
    let refused = run(port, &["list-machines"]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("googleapi: Error 401: credential required"), "{refused:?}");
    assert!(closed.ok(&["list-machines"]).stdout.contains("e2e0anon"), "the Unix socket needs no credential");
    assert!(!closed.log().contains("anonymous API access is on"));
    drop(closed);

    let port = free_port();
    let listen = format!("unix://{{socket}},127.0.0.1:{port}");
    let open = Fleetd::start("e2e0anonymous001", &[("api_listen", &listen), ("api_anonymous_role", "viewer")]);
    assert!(open.log().contains("anonymous API access is on"), "fleetd warns while it is on");
    let listed = run(port, &["list-machines", "--no-legend"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("e2e0anon"));
    let dir = tempfile::tempdir().expect("unit dir");
    fleet_e2e::write_unit(dir.path(), "hello.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    let submit = std::process::Command::new(fleet_e2e::binary("fleetctl"))
        .current_dir(dir.path())
        .arg(format!("--endpoint=http://127.0.0.1:{port}"))
        .args(["submit", "hello.service"])
        .env_remove("FLEETCTL_TOKEN")
        .output()
        .expect("fleetctl");
    assert!(!submit.status.success(), "an anonymous viewer cannot write");
    assert!(String::from_utf8_lossy(&submit.stderr).contains("403"), "{submit:?}");
    // Nor stop what the socket's administrator started; said in words (it was "stoping").
    open.fleetctl_in(dir.path(), &["start", "--no-block", "hello.service"]);
    open.wait_until("hello.service runs", Duration::from_secs(30), |open| !open.unit_rows().is_empty());
    let stop = run(port, &["stop", "--no-block", "hello.service"]);
    assert_eq!(stop.code, 1, "{stop:?}");
    assert!(stop.stderr.starts_with("Error stopping units: googleapi: Error 403"), "{stop:?}");
}

/// On etcd with two fleetds: a token made on one works on the other, the whole matrix holds
/// there, and a revocation on one is refused by the other within a second.
#[test]
fn etcd_two_fleetds_share_tokens_and_revocations() {
    let pki = Pki::new();
    let ports = [free_port(), free_port()];
    // The members share the cluster's secrets key, as -make-certificates has it copied.
    let secrets_key = pki.path().join("secrets.key");
    fleet_secrets::ClusterKeys::generate().expect("a key").create(&secrets_key).expect("the key file");
    let cluster = Cluster::start(2, |index| {
        let mut config = pki.config(ports[index]);
        config.push(("unit_manager".into(), "native".into()));
        config.push(("secrets_key_file".into(), secrets_key.display().to_string()));
        config
    });
    let (maker, other) = (&cluster.members[0], &cluster.members[1]);
    let other_base = format!("https://localhost:{}", ports[1]);
    let tokens = RoleTokens::make(maker);
    let expired = make_token(maker, "short-lived", "admin", &["--ttl", "1s"]);
    // Both units must run where `other` can read their journal: pin them to it.
    let dir = tempfile::tempdir().expect("unit dir");
    let pinned = format!("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineID={}\n", member_id(1));
    for name in ["web-1.service", "db.service"] {
        fleet_e2e::write_unit(dir.path(), name, &pinned);
    }
    maker.fleetctl_in(dir.path(), &["start", "--no-block", "web-1.service", "db.service"]);
    other.wait_until("both units report a state", Duration::from_secs(30), |fleetd| {
        let states = fleetd.api("GET", "/fleet/v1/state", "");
        states.contains("web-1.service") && states.contains("db.service")
    });
    check_matrix(&other_base, &pki, &tokens, &member_id(1));
    check_bad_tokens(&other_base, &pki, &expired);

    let rt = runtime();
    let doomed = make_token(maker, "doomed", "viewer", &[]);
    let callers: Vec<Caller> = ports
        .iter()
        .map(|port| {
            let base = format!("https://localhost:{port}");
            Caller::new(&base, Some(&pki.ca_file), Credentials { token: Some(&doomed), certificate: None })
                .expect("caller")
        })
        .collect();
    // A token made on one fleetd reaches the others through the store's watch.
    for caller in &callers {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = rt.block_on(caller.call("GET", "/fleet/v1/units", None)).expect("answer").status;
            if status == 200 {
                break;
            }
            assert!(status == 401 && Instant::now() < deadline, "the new token is refused: {status}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    maker.ok(&["token", "revoke", "doomed"]);
    let revoked_at = Instant::now();
    for (index, caller) in callers.iter().enumerate() {
        loop {
            let status = rt.block_on(caller.call("GET", "/fleet/v1/units", None)).expect("answer").status;
            if status == 401 {
                break;
            }
            assert!(
                revoked_at.elapsed() < Duration::from_secs(1),
                "the revocation did not reach fleetd #{index} in 1 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for member in &cluster.members {
        let log = member.log();
        assert!(!log.contains(&doomed[6..]) && !log.contains(&tokens.tokens[0][6..]), "a token reached the log");
    }
}

/// Every process's argument list, for the check that no secret is in one.
fn all_command_lines() -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            all.push_str(&String::from_utf8_lossy(&bytes).replace('\0', " "));
            all.push('\n');
        }
    }
    all
}

/// An etcd password (and a wrong one) reaches neither fleetd's log, nor its errors, nor any
/// process's argument list.
#[test]
fn etcd_passwords_reach_no_log_and_no_argument_list() {
    let etcd = fleet_e2e::EtcdServer::start();
    let password = "s3cret-etcd-password-4711";
    runtime().block_on(async {
        let mut admin = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd");
        admin.user_add("root", password, None).await.expect("user");
        admin.user_grant_role("root", "root").await.expect("grant");
        admin.auth_enable().await.expect("auth");
    });
    let config = [
        ("etcd_servers", etcd.endpoint()),
        ("etcd_username", "root".to_string()),
        ("etcd_password", password.to_string()),
        ("unit_manager", "native".to_string()),
    ];
    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let fleetd = Fleetd::start("e2e0password0001", &pairs);
    let dir = tempfile::tempdir().expect("unit dir");
    fleet_e2e::write_unit(dir.path(), "quiet.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleetd.fleetctl_in(dir.path(), &["start", "--no-block", "quiet.service"]);
    fleetd.wait_until("the unit runs", Duration::from_secs(20), |fleetd| {
        fleetd.api("GET", "/fleet/v1/state", "").contains("quiet.service")
    });
    assert!(!all_command_lines().contains(password), "the password is in an argument list");
    assert!(!fleetd.log().contains(password), "the password is in fleetd's log");

    // A wrong password: fleetd keeps trying (a store outage stops nothing) and says why,
    // without the password.
    let wrong = "wrong-password-0815";
    let dir = tempfile::tempdir().expect("fleetd dir");
    let config_path = dir.path().join("fleet.conf");
    std::fs::write(
        &config_path,
        format!(
            "machine_id = e2e0password0002\nstate_dir = {}\napi_listen = unix://{}\netcd_servers = {}\n\
             etcd_username = root\netcd_password = {wrong}\nunit_manager = native\n",
            dir.path().join("state").display(),
            dir.path().join("api.sock").display(),
            etcd.endpoint()
        ),
    )
    .expect("fleet.conf");
    let log_path = dir.path().join("fleetd.log");
    let log_file = std::fs::File::create(&log_path).expect("log");
    let mut child = std::process::Command::new(fleet_e2e::binary("fleetd"))
        .arg("-config")
        .arg(&config_path)
        .stdout(log_file.try_clone().expect("log"))
        .stderr(log_file)
        .spawn()
        .expect("fleetd");
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.to_lowercase().contains("authentication failed") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let command_lines = all_command_lines();
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.to_lowercase().contains("authentication failed"), "fleetd says why: {log}");
    assert!(!log.contains(wrong), "the wrong password is in the log: {log}");
    assert!(!command_lines.contains(wrong), "the wrong password is in an argument list");
}
