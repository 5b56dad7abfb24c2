//! The README's steps as a newcomer follows them, taken from README.md itself: its minimal
//! fleet.conf files for one machine, for members of an etcd cluster and for a pull agent, the
//! TLS lines `fleetd -make-certificates` prints, and its fleetctl lines. Only this test's
//! addresses and paths are put in (each replaced text must be there), so a README that drifts
//! from what fleet does fails here. The quick start script has its own test (`quickstart.rs`).

use std::process::Command;
use std::time::Duration;

use fleet_e2e::pull::PullFleetd;
use fleet_e2e::{EtcdServer, Fleetd, Ran, binary, examples_dir};

fn readme() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The text of the README's fenced block of `kind` whose first line is `first`.
fn block(readme: &str, kind: &str, first: &str) -> String {
    let fence = format!("```{kind}\n{first}\n");
    let start = readme.find(&fence).unwrap_or_else(|| panic!("the README has no {kind} block starting {first:?}"));
    let body = &readme[start + format!("```{kind}\n").len()..];
    body[..body.find("```").expect("a closed block")].to_string()
}

/// `text` with each `(from, to)` put in; every `from` must be there.
fn put_in(text: &str, replacements: &[(&str, &str)]) -> String {
    replacements.iter().fold(text.to_string(), |text, (from, to)| {
        assert!(text.contains(from), "{from:?} is not in the README's text:\n{text}");
        text.replace(from, to)
    })
}

/// The `key = value` lines of a fleet.conf text, comments left out.
fn settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("not a fleet.conf line: {line}"));
            (key.trim().to_string(), value.trim().to_string())
        })
        .collect()
}

fn start(machine_id: &str, settings: &[(String, String)]) -> Fleetd {
    let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Fleetd::start(machine_id, &pairs)
}

/// `list-machines` rows of `machine,metadata,connection,leader`, sorted.
fn machines(fleetd: &Fleetd) -> Vec<String> {
    let listed =
        fleetd.ok(&["list-machines", "--full", "--no-legend", "--fields", "machine,metadata,connection,leader"]);
    let mut rows: Vec<String> =
        listed.stdout.lines().map(|row| row.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    rows.sort();
    rows
}

use fleet_testkit::free_port;

#[test]
fn one_machine_and_three_etcd_members_run_on_the_readme_s_fleet_conf() {
    let readme = readme();
    let one = start("e2e0readme000001", &settings(&block(&readme, "ini", "# one machine")));
    let hello = examples_dir().join("hello.service").display().to_string();
    one.ok(&["start", &hello]);
    assert_eq!(machines(&one), ["e2e0readme000001 role=web embedded engine"]);

    let etcd = EtcdServer::start();
    let member =
        block(&readme, "ini", "# a member of an etcd cluster (every member the same etcd, each its own machine ID)");
    let ids = ["e2e0readme000011", "e2e0readme000012", "e2e0readme000013"];
    let members: Vec<Fleetd> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            let ip = format!("127.0.0.{}", index + 1);
            let servers = "http://10.0.0.5:2379,http://10.0.0.6:2379,http://10.0.0.7:2379";
            let text = put_in(&member, &[(servers, &etcd.endpoint()), ("10.0.0.21", &ip)]);
            start(id, &settings(&text))
        })
        .collect();
    members[2].wait_until("every member is listed with its leader", Duration::from_secs(20), |fleetd| {
        let rows = machines(fleetd);
        rows.len() == 3 && rows.iter().any(|row| row.ends_with(" engine"))
    });
    let rows = machines(&members[2]);
    for (row, id) in rows.iter().zip(ids) {
        assert!(row.starts_with(&format!("{id} region=eu,role=web etcd ")), "{rows:?}");
    }
    assert_eq!(rows.iter().filter(|row| row.ends_with(" engine")).count(), 1, "one engine leads: {rows:?}");
    members[0].ok(&["start", &hello]);
    members[1].wait_until("hello runs on the cluster", Duration::from_secs(20), |fleetd| {
        fleetd.ok(&["list-units", "--no-legend", "--fields", "unit,active"]).stdout.contains("hello.service\tactive")
    });
}

#[test]
fn tls_made_in_one_step_and_a_pull_agent_join_as_the_readme_says() {
    let readme = readme();
    let dir = tempfile::tempdir().expect("dir");
    let tls = dir.path().join("tls").display().to_string();
    let made = Ran::from(
        Command::new(binary("fleetd"))
            .args(["-make-certificates", &tls, "-hosts", "localhost"])
            .output()
            .expect("run fleetd"),
    );
    assert_eq!(made.code, 0, "{made:?}");
    // The README's fleet.conf lines are the ones the command prints, in the README's directory.
    let server = block(&readme, "ini", "# fleet.conf of a fleetd serving the API over HTTPS");
    let server = put_in(&server, &[("/etc/fleet/tls", &tls)]);
    for line in server.lines().filter(|line| !line.starts_with('#')) {
        assert!(made.stdout.lines().any(|printed| printed == line), "{line:?} is not printed:\n{}", made.stdout);
    }
    let port = free_port();
    let listen = format!("unix://{{socket}},https://127.0.0.1:{port}");
    let server = put_in(&server, &[("unix:///var/run/fleet.sock,https://0.0.0.0:4002", &listen)]);
    let manager = start("e2e0readme000021", &settings(&server));

    let admin = block(
        &readme,
        "sh",
        "fleetctl --endpoint https://manager.example.com:4002 --ca-file /etc/fleet/tls/api-ca.pem --cert-file /etc/fleet/tls/admin.pem --key-file /etc/fleet/tls/admin-key.pem list-machines",
    );
    let admin = put_in(&admin, &[("manager.example.com:4002", &format!("localhost:{port}")), ("/etc/fleet/tls", &tls)]);
    let flags: Vec<&str> = admin.split_whitespace().skip(1).filter(|word| *word != "list-machines").collect();
    let fleetctl = |args: &[&str]| {
        Ran::from(
            Command::new(binary("fleetctl"))
                .args(&flags)
                .args(args)
                .env_remove("FLEETCTL_ENDPOINT")
                .env_remove("FLEETCTL_TOKEN")
                .output()
                .expect("run fleetctl"),
        )
    };
    let listed = fleetctl(&["list-machines", "--full"]);
    assert!(listed.code == 0 && listed.stdout.contains("e2e0readme000021"), "{listed:?}");

    // The README's registration token, made over HTTPS as the administrator.
    let create = "fleetctl registration-token create --ttl 24h --max-uses 10 --metadata rack=r1 rack1";
    assert!(readme.contains(&format!("`{create}`")), "the README shows {create:?}");
    let created = fleetctl(&create.split_whitespace().skip(1).collect::<Vec<_>>());
    assert_eq!(created.code, 0, "{created:?}");
    let token = created.stdout.trim();

    let agent_dir = tempfile::tempdir().expect("dir");
    let pull = block(&readme, "ini", "# a pull agent behind NAT (see \"Machines behind NAT\" for the manager's side)");
    let pull = put_in(
        &pull,
        &[
            ("https://manager.example.com:4002", &format!("https://localhost:{port}")),
            ("/etc/fleet/tls", &tls),
            ("fleetreg_…", token),
        ],
    );
    let config = format!(
        "machine_id = readme-edge-1\nstate_dir = {}\nunit_manager = native\n{pull}",
        agent_dir.path().join("state").display()
    );
    let agent = PullFleetd::start_configured(agent_dir, &config, &[], &[]);
    manager.wait_until("the pull agent joined", Duration::from_secs(20), |manager| {
        machines(manager).iter().any(|row| row.starts_with("readme-edge-1 "))
    });
    let rows = machines(&manager);
    assert!(rows.contains(&"readme-edge-1 rack=r1 pull -".to_string()), "{rows:?}\n{}", agent.log());
    drop(agent);
}
