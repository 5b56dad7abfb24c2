//! A pull agent behind NAT: the manager (on a real etcd, reached over a private link) in one
//! network namespace, the agent in another, and a router between them that masquerades the agent's connections and drops every connection
//! opened towards the agent. The manager cannot reach the agent, and still the agent joins,
//! is scheduled onto, runs its unit, reports, and is seen in the cluster.

use std::time::Duration;

use fleet_e2e::nat::{AGENT_IP, MANAGER_IP, NatLab, STORE_IP};
use fleet_e2e::pki::{ManagerPki, pairs};
use fleet_e2e::pull::PullFleetd;
use fleet_e2e::{Fleetd, Launcher};

#[test]
fn a_pull_agent_behind_nat_works_though_the_manager_cannot_reach_it() {
    let lab = NatLab::create();
    let pki = ManagerPki::new(&[MANAGER_IP]);
    let (dir, api_ca, api_ca_file) = (&pki.dir, &pki.api_ca, pki.api_ca_file.clone());
    let port = 4002;
    let etcd = fleet_e2e::EtcdServer::start_on(STORE_IP);
    let store = etcd.endpoint();
    let config = pki.manager_config(
        &format!("{MANAGER_IP}:{port}"),
        &[("public_ip", MANAGER_IP), ("agent_ttl", "2s"), ("etcd_servers", &store), ("etcd_request_timeout", "2")],
    );
    let launcher = Launcher { prefix: NatLab::exec(&lab.manager), env: Vec::new() };
    let manager = Fleetd::start_with("e2e0natmanager01", &pairs(&config), launcher);
    let token = manager.ok(&["registration-token", "create", "behind-nat"]).stdout.trim().to_string();
    let prefix = NatLab::exec(&lab.agent);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let agent = PullFleetd::start(&format!("https://{MANAGER_IP}:{port}"), &api_ca_file, Some(&token), None, &prefix);
    manager.wait_until("the agent behind NAT joins", Duration::from_secs(30), |manager| {
        manager.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });

    let units = tempfile::tempdir().expect("units");
    fleet_e2e::write_unit(
        units.path(),
        "natted.service",
        "[Service]\nExecStart=/bin/sleep 7777\n[X-Fleet]\nMachineID=pullfleetd000001\n",
    );
    manager.fleetctl_in(units.path(), &["start", "--no-block", "natted.service"]);
    manager.wait_until("the agent runs natted.service and says so", Duration::from_secs(30), |manager| {
        let rows = manager.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,sub"]).stdout;
        rows.lines()
            .any(|row| row.starts_with("natted.service") && row.contains("pullfleetd000001") && row.contains("running"))
    });

    // The manager cannot open a connection to anything on the agent's side: a listener there
    // (a fleetd of its own) answers its neighbours but never the manager.
    let probe_cert = api_ca.server_for(dir.path(), "probe", &[AGENT_IP]);
    let (probe_cert_file, probe_key_file) =
        (probe_cert.cert.display().to_string(), probe_cert.key.display().to_string());
    let probe_listen = format!("unix://{{socket}},https://{AGENT_IP}:4003");
    let _probe = Fleetd::start_with(
        "e2e0natprobe0001",
        &[
            ("api_listen", &probe_listen),
            ("api_tls_cert_file", &probe_cert_file),
            ("api_tls_key_file", &probe_key_file),
            ("unit_manager", "native"),
        ],
        Launcher { prefix: NatLab::exec(&lab.agent), env: Vec::new() },
    );
    assert!(lab.can_connect(&lab.agent, AGENT_IP, 4003), "the probe listens on the agent's side");
    assert!(!lab.can_connect(&lab.manager, AGENT_IP, 4003), "the NAT lets the manager reach the agent's side");
    assert!(lab.can_connect(&lab.manager, MANAGER_IP, port), "the probe itself works");
    assert!(!agent.log().contains(&token[9..]), "the token reached the agent's log");

    // Offline for twice agent_ttl: the cluster loses the machine, the unit keeps running on
    // it; back online, the machine returns and the unit is placed on it again. The agent beats
    // every 5 minutes (the default agent_heartbeat) and its link goes without a word: only the
    // kernel's probes of the stream's connection can tell the manager it is gone.
    lab.agent_online(false);
    let offline = std::time::Instant::now();
    manager.wait_until("the offline agent is lost", Duration::from_secs(10), |manager| {
        !manager.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    println!("a pull agent cut off behind its NAT was lost {:?} after (agent_ttl 2 s)", offline.elapsed());
    assert!(manager.log().contains("pull agent silent for agent_ttl"), "{}", manager.log());
    std::thread::sleep(Duration::from_secs(2));
    let sleeper = ["/bin/sleep", "7777"];
    assert!(fleet_e2e::process_running(&sleeper), "the unit keeps running while the agent is offline");

    // Killed and restarted while offline: the unit comes back from the copy on disk.
    let kept = agent.kill();
    fleet_e2e::poll_until(
        "the killed fleetd's unit ends with it",
        Duration::from_secs(15),
        || !fleet_e2e::process_running(&sleeper),
        String::new,
    );
    let agent = PullFleetd::start(&format!("https://{MANAGER_IP}:{port}"), &api_ca_file, None, Some(kept), &prefix);
    fleet_e2e::poll_until(
        "the unit comes back offline",
        Duration::from_secs(30),
        || fleet_e2e::process_running(&sleeper),
        || agent.log(),
    );
    lab.agent_online(true);
    manager.wait_until("the agent is back and runs natted.service again", Duration::from_secs(60), |manager| {
        let rows = manager.ok(&["list-units", "--full", "--no-legend", "--fields", "unit,machine,sub"]).stdout;
        rows.lines()
            .any(|row| row.starts_with("natted.service") && row.contains("pullfleetd000001") && row.contains("running"))
    });
    assert!(fleet_e2e::process_running(&sleeper));

    // Revoked behind its NAT: it leaves the cluster and stays out.
    manager.ok(&["machine", "revoke", "pullfleetd000001"]);
    manager.wait_until("the revoked agent leaves", Duration::from_secs(10), |manager| {
        !manager.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !manager.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullfleetd000001"),
        "a revoked agent came back"
    );
}
