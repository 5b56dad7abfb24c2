//! The API fails closed, tried as an outsider would: forged identities on a real manager on
//! real etcd, and a page of another site in a real browser riding on an operator's access.

use std::io::{Read, Write};
use std::time::Duration;

use fleet_e2e::Fleetd;
use fleet_e2e::browser::Browser;
use fleet_e2e::https::{Caller, Credentials};
use fleet_e2e::pki::ManagerPki;

const WAIT: Duration = Duration::from_secs(30);

fn machines(fleetd: &Fleetd) -> String {
    fleetd.ok(&["list-machines", "--full", "--no-legend"]).stdout
}

/// Anyone who reached a manager's HTTPS listener could make it hold any machine ID present,
/// by a request of any method under `/agents/<id>/` with a header shaped like a webhook
/// signature or a registration token; one `agent_ttl` later the manager gave every such ID
/// up, its own machine included. Now such requests are refused before anything happens, and
/// the manager's presence table holds only machines that spoke with their own certificate.
#[test]
fn forged_identities_make_no_machine_present_and_the_manager_keeps_its_own() {
    let pki = ManagerPki::local();
    let port = fleet_testkit::free_port();
    let cluster =
        fleet_e2e::Cluster::start(1, |_| pki.manager_config(&format!("127.0.0.1:{port}"), &[("agent_ttl", "2s")]));
    let manager = &cluster.members[0];
    let own = manager.machine_id.clone();
    assert!(machines(manager).contains(&own));
    let base = format!("https://localhost:{port}");
    let outsider =
        Caller::new(&base, Some(&pki.api_ca_file), Credentials { token: None, certificate: None }).expect("caller");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let forged_registration = format!("Bearer fleetreg_{}", "A".repeat(43));
    let forgeries: [(&str, &str); 3] =
        [("X-Hub-Signature-256", "sha256=00"), ("Authorization", forged_registration.as_str()), ("X-Nothing", "-")];
    let mut ids: Vec<String> = (0..200).map(|n| format!("forged-{n}")).collect();
    ids.push(own.clone());
    for id in &ids {
        for (name, value) in forgeries {
            for (method, part, want) in [("PATCH", "work", 405), ("GET", "work", 401), ("PUT", "machine", 401)] {
                let path = format!("/fleet/v1/agents/{id}/{part}");
                let body = (method == "PUT").then_some(r#"{"publicIP":"10.0.0.9"}"#);
                let answer = rt.block_on(outsider.call_with(method, &path, body, &[(name, value)])).expect("answer");
                assert_eq!(answer.status, want, "{method} {path} with {name}: {}", answer.body);
            }
        }
    }
    let present = |manager: &Fleetd| fleet_e2e::metric_value(&manager.metrics(), "fleet_pull_agents_present");
    assert_eq!(present(manager), Some(0.0), "no forged request made a machine present");

    // A real machine, by its own certificate, is present; silent, it is given up after
    // agent_ttl. Once that happened, any forged presence would have been given up too.
    let token = manager.ok(&["registration-token", "create", "real"]).stdout.trim().to_string();
    let joiner =
        fleet_pull_agent::Manager::new(&base, Some(pki.api_ca_pem()), Duration::from_secs(10)).expect("manager");
    let (credentials, _) = rt.block_on(joiner.join(&token, "real-1")).expect("join");
    let (cert, key) = (pki.path().join("real-1.pem"), pki.path().join("real-1-key.pem"));
    std::fs::write(&cert, &credentials.certificate).expect("certificate");
    std::fs::write(&key, &credentials.key).expect("key");
    let real =
        Caller::new(&base, Some(&pki.api_ca_file), Credentials { token: None, certificate: Some((&cert, &key)) })
            .expect("caller");
    let work = rt.block_on(real.call("GET", "/fleet/v1/agents/real-1/work", None)).expect("answer");
    assert_eq!(work.status, 200, "{}", work.body);
    assert_eq!(present(manager), Some(1.0));
    manager.wait_until("the silent real machine is given up", WAIT, |manager| {
        manager.log().contains("machine=\"real-1\"") && manager.log().contains("pull agent silent for agent_ttl")
    });
    assert_eq!(present(manager), Some(0.0));
    let log = manager.log();
    assert!(!log.contains("forged-"), "no forged ID reached the log or the presence table: {log}");
    assert!(machines(manager).contains(&own), "the manager keeps its own machine");
}

/// Serves `page` to every request on a port of its own: another site.
fn serve_page(page: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    port
}

/// A page of another site tries every write a browser lets it send without asking the
/// server first (no-cors forms and fetches: `text/plain`, form-encoded, no body) and those
/// it must ask for (JSON, PUT, DELETE, PATCH), against a fleetd whose loopback listener
/// grants anonymous callers the admin role. Every one reaches fleetd and is refused;
/// nothing changes.
#[test]
fn a_page_of_another_site_changes_nothing() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let machine = "0e0e0e0e0000000000000000000000c5";
    let fleet = Fleetd::start(machine, &[("api_listen", listen.as_str()), ("api_anonymous_role", "admin")]);
    fleet.ok(&["start", &fleet_e2e::examples_dir().join("hello.service").display().to_string()]);
    let unit =
        r#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/sleep 99"}]}"#;
    let tries = serde_json::json!([
        ["POST", "/fleet/v1/tokens", r#"{"name":"evil","role":"admin"}"#, "text/plain"],
        ["POST", "/fleet/v1/registration-tokens", r#"{"name":"evil"}"#, "text/plain"],
        ["POST", format!("/fleet/v1/agents/{machine}/revoke"), null, null],
        [
            "POST",
            "/fleet/v1/units",
            format!(r#"{{"units":[{{"name":"evil.service","unit":{unit}}}]}}"#),
            "application/x-www-form-urlencoded"
        ],
        ["POST", "/fleet/v1/units", "units=evil", "multipart/form-data; boundary=x"],
        ["POST", "/fleet/v1/sources/apps/sync", null, null],
        ["POST", "/fleet/v1/rollouts/r/pause", null, null],
        ["PUT", "/fleet/v1/units/evil.service", unit, "application/json"],
        ["DELETE", "/fleet/v1/units/hello.service", null, null],
        [
            "PATCH",
            "/fleet/v1/machines",
            format!(r#"[{{"op":"add","path":"/{machine}/metadata/evil","value":"1"}}]"#),
            "application/json"
        ],
    ]);
    let script = format!(
        r#"(async () => {{
            const results = [];
            for (const [method, path, body, type] of {tries}) {{
                const simple = method === "POST" && (type === null || !type.startsWith("application/json"));
                const init = {{ method, mode: simple ? "no-cors" : "cors", credentials: "include" }};
                if (body !== null) {{ init.body = body; init.headers = {{ "Content-Type": type }}; }}
                try {{ const r = await fetch("http://127.0.0.1:{port}" + path, init); results.push(method + " " + path + " " + r.type + " " + r.status); }}
                catch (e) {{ results.push(method + " " + path + " failed"); }}
            }}
            return results.join("\n");
        }})()"#
    );
    let other_site = serve_page("<!doctype html><title>another site</title><p>hello".to_string());
    let page = format!("http://localhost:{other_site}/");
    let mut browser = Browser::open(&page, 800, 600);
    browser.wait_until_loaded(&page);
    let results = browser.evaluate_async(&script);
    let results = results.as_str().unwrap_or_default().to_string();
    // No answer was readable by the page: opaque, or failed (a preflight refused).
    assert!(!results.contains(" basic ") && !results.contains(" cors 2"), "{results}");

    // Each write arrived and was refused: the audit trail has it.
    let log = fleet.log();
    let audit: Vec<&str> = log.lines().filter(|line| line.contains("fleet::audit")).collect();
    for (method, path) in [
        ("POST", "/fleet/v1/tokens"),
        ("POST", "/fleet/v1/registration-tokens"),
        ("POST", "/fleet/v1/agents/{machine}/revoke"),
        ("POST", "/fleet/v1/units"),
        ("POST", "/fleet/v1/sources/{name}/sync"),
        ("POST", "/fleet/v1/rollouts/{name}/pause"),
    ] {
        assert!(
            audit.iter().any(|line| line.contains(&format!("method={method}"))
                && line.contains(&format!("path=\"{path}\""))
                && line.contains("status=403")),
            "{method} {path} was not refused as a cross-site write:\n{results}\n{log}"
        );
    }
    // And nothing changed.
    assert_eq!(fleet.ok(&["token", "list", "--no-legend"]).stdout.trim(), "", "no token made");
    assert_eq!(fleet.ok(&["registration-token", "list", "--no-legend"]).stdout.trim(), "", "no registration token");
    let listed = machines(&fleet);
    assert!(listed.contains(&machine[..8]) && !listed.contains("evil"), "{listed}");
    let units = fleet.ok(&["list-unit-files", "--no-legend"]).stdout;
    assert!(units.contains("hello.service") && !units.contains("evil"), "{units}");
    // The same write from a program on the same listener is let through: the refusals
    // above were the browser's doing, not the listener's.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "PUT /fleet/v1/units/fine.service HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{unit}",
        unit.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.0 201") || answer.starts_with("HTTP/1.1 201"), "{answer}");
}
