//! A small network behind NAT, made of real network namespaces: a manager namespace, an agent
//! namespace, and a router namespace between them that masquerades the agent's connections
//! and drops every connection opened towards the agent, as a home or cloud NAT does. Torn
//! down when dropped. Needs root, `ip` and `iptables`.

use std::process::Command;

/// The manager's address, as the agent dials it.
pub const MANAGER_IP: &str = "10.214.0.2";
/// The agent's address, on its side of the NAT.
pub const AGENT_IP: &str = "10.213.0.2";
/// This machine's address on the manager's private link to it (where the store listens).
pub const STORE_IP: &str = "10.215.0.1";

pub struct NatLab {
    pub router: String,
    pub manager: String,
    pub agent: String,
    /// The agent namespace's link to the router.
    agent_link: String,
}

fn run(args: &[&str]) {
    let output = Command::new(args[0]).args(&args[1..]).output().expect("run a network command");
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

impl NatLab {
    pub fn create() -> Self {
        let suffix = std::process::id() % 100_000;
        let lab = Self {
            router: format!("fleet-r{suffix}"),
            manager: format!("fleet-m{suffix}"),
            agent: format!("fleet-a{suffix}"),
            agent_link: format!("ar{suffix}"),
        };
        for namespace in [&lab.router, &lab.manager, &lab.agent] {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
            run(&["ip", "netns", "add", namespace]);
        }
        let (router_m, manager_r) = (format!("rm{suffix}"), format!("mr{suffix}"));
        let (router_a, agent_r) = (format!("ra{suffix}"), format!("ar{suffix}"));
        run(&["ip", "link", "add", &router_m, "type", "veth", "peer", "name", &manager_r]);
        run(&["ip", "link", "add", &router_a, "type", "veth", "peer", "name", &agent_r]);
        run(&["ip", "link", "set", &router_m, "netns", &lab.router]);
        run(&["ip", "link", "set", &router_a, "netns", &lab.router]);
        run(&["ip", "link", "set", &manager_r, "netns", &lab.manager]);
        run(&["ip", "link", "set", &agent_r, "netns", &lab.agent]);
        let setup: [(&str, &str, &str, Option<&str>); 4] = [
            (&lab.router, &router_m, "10.214.0.1/24", None),
            (&lab.router, &router_a, "10.213.0.1/24", None),
            (&lab.manager, &manager_r, "10.214.0.2/24", Some("10.214.0.1")),
            (&lab.agent, &agent_r, "10.213.0.2/24", Some("10.213.0.1")),
        ];
        for (namespace, link, address, gateway) in setup {
            run(&["ip", "-n", namespace, "addr", "add", address, "dev", link]);
            run(&["ip", "-n", namespace, "link", "set", link, "up"]);
            run(&["ip", "-n", namespace, "link", "set", "lo", "up"]);
            if let Some(gateway) = gateway {
                run(&["ip", "-n", namespace, "route", "add", "default", "via", gateway]);
            }
        }
        // The manager's private link to this machine, where the store (etcd) listens.
        let (store_side, manager_side) = (format!("sm{suffix}"), format!("ms{suffix}"));
        run(&["ip", "link", "add", &store_side, "type", "veth", "peer", "name", &manager_side]);
        run(&["ip", "link", "set", &manager_side, "netns", &lab.manager]);
        run(&["ip", "addr", "add", "10.215.0.1/24", "dev", &store_side]);
        run(&["ip", "link", "set", &store_side, "up"]);
        run(&["ip", "-n", &lab.manager, "addr", "add", "10.215.0.2/24", "dev", &manager_side]);
        run(&["ip", "-n", &lab.manager, "link", "set", &manager_side, "up"]);
        let router = |args: &[&str]| {
            let mut full = vec!["ip", "netns", "exec", lab.router.as_str()];
            full.extend_from_slice(args);
            run(&full);
        };
        router(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        router(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "10.213.0.0/24",
            "-o",
            &router_m,
            "-j",
            "MASQUERADE",
        ]);
        router(&["iptables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]);
        router(&["iptables", "-A", "FORWARD", "-s", "10.213.0.0/24", "-j", "ACCEPT"]);
        router(&["iptables", "-P", "FORWARD", "DROP"]);
        lab
    }

    /// Cuts the agent off the network (`false`) or connects it again (`true`).
    pub fn agent_online(&self, online: bool) {
        let state = if online { "up" } else { "down" };
        run(&["ip", "-n", &self.agent, "link", "set", &self.agent_link, state]);
        if online {
            run(&["ip", "-n", &self.agent, "route", "replace", "default", "via", "10.213.0.1"]);
        }
    }

    /// The command prefix that runs a program in `namespace`.
    pub fn exec(namespace: &str) -> Vec<String> {
        ["ip", "netns", "exec", namespace].map(str::to_string).to_vec()
    }

    /// Whether a TCP connection from `namespace` to `address` opens (within 2 s).
    pub fn can_connect(&self, namespace: &str, address: &str, port: u16) -> bool {
        let script = format!("exec 3<>/dev/tcp/{address}/{port}");
        Command::new("ip")
            .args(["netns", "exec", namespace, "timeout", "2", "bash", "-c", &script])
            .output()
            .is_ok_and(|output| output.status.success())
    }
}

impl Drop for NatLab {
    fn drop(&mut self) {
        for namespace in [&self.agent, &self.manager, &self.router] {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
        }
    }
}
