//! Many hosts on one machine: each node (an etcd member, a fleetd) in its own network
//! namespace with its own IP, all joined by veth pairs to one bridge (in a namespace of its
//! own), and this machine on the bridge too (`host_ip`). Traffic between any two nodes can be
//! cut, healed, or made to lose a share of its packets, by nftables rules in the nodes'
//! namespaces (`numgen random mod 100 < N drop`). The kernel has no `netem`, so delay comes from
//! [`crate::delay_proxy`] on the host. Torn down when dropped; needs root, `ip` and `nft`.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;

fn run(args: &[&str]) {
    let output = Command::new(args[0]).args(&args[1..]).output().expect("run a network command");
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A node: its namespace and its address on the bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub namespace: String,
    pub ip: String,
}

impl Node {
    /// The command prefix that runs a program in the node's namespace.
    pub fn prefix(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.namespace.clone()]
    }
}

/// What a node's firewall does to traffic with one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Cut,
    /// Drops this share of packets, in percent.
    Lose(u8),
}

pub struct NetLab {
    suffix: String,
    /// The first three octets of the lab's /24.
    subnet: String,
    switch: String,
    nodes: Mutex<Vec<Node>>,
    /// Per node namespace: the faults towards each peer IP.
    faults: Mutex<BTreeMap<String, BTreeMap<String, Fault>>>,
}

impl NetLab {
    pub fn create() -> Self {
        let pid = std::process::id();
        let suffix = format!("{}", pid % 100_000);
        let subnet = format!("10.{}.{}", 100 + pid % 100, (pid / 100) % 250);
        let lab = Self {
            switch: format!("fls{suffix}"),
            suffix,
            subnet,
            nodes: Mutex::new(Vec::new()),
            faults: Mutex::new(BTreeMap::new()),
        };
        let _ = Command::new("ip").args(["netns", "del", &lab.switch]).output();
        run(&["ip", "netns", "add", &lab.switch]);
        run(&["ip", "-n", &lab.switch, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &lab.switch, "link", "set", "br0", "up"]);
        // This machine's own leg: the tests, proxies and clients reach the nodes through it.
        let (host_side, switch_side) = (format!("flh{}", lab.suffix), format!("flH{}", lab.suffix));
        let _ = Command::new("ip").args(["link", "del", &host_side]).output();
        run(&["ip", "link", "add", &host_side, "type", "veth", "peer", "name", &switch_side]);
        run(&["ip", "link", "set", &switch_side, "netns", &lab.switch]);
        run(&["ip", "-n", &lab.switch, "link", "set", &switch_side, "master", "br0", "up"]);
        run(&["ip", "addr", "add", &format!("{}/24", lab.host_ip()), "dev", &host_side]);
        run(&["ip", "link", "set", &host_side, "up"]);
        lab
    }

    /// This machine's address on the lab's bridge.
    pub fn host_ip(&self) -> String {
        format!("{}.254", self.subnet)
    }

    /// Adds a node with the next address.
    pub fn node(&self, name: &str) -> Node {
        let mut nodes = self.nodes.lock().expect("nodes");
        let index = nodes.len() + 1;
        let node = Node {
            name: name.to_string(),
            namespace: format!("fl{}-{name}", self.suffix),
            ip: format!("{}.{index}", self.subnet),
        };
        let _ = Command::new("ip").args(["netns", "del", &node.namespace]).output();
        run(&["ip", "netns", "add", &node.namespace]);
        let (outer, inner) = (format!("fl{}x{index}", self.suffix), format!("fl{}y{index}", self.suffix));
        run(&["ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner]);
        run(&["ip", "link", "set", &outer, "netns", &self.switch]);
        run(&["ip", "-n", &self.switch, "link", "set", &outer, "master", "br0", "up"]);
        run(&["ip", "link", "set", &inner, "netns", &node.namespace]);
        run(&["ip", "-n", &node.namespace, "link", "set", &inner, "name", "eth0"]);
        run(&["ip", "-n", &node.namespace, "addr", "add", &format!("{}/24", node.ip), "dev", "eth0"]);
        run(&["ip", "-n", &node.namespace, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", &node.namespace, "link", "set", "lo", "up"]);
        nodes.push(node.clone());
        node
    }

    fn set(&self, a: &Node, peer_ip: &str, fault: Option<Fault>) {
        let mut faults = self.faults.lock().expect("faults");
        let of_node = faults.entry(a.namespace.clone()).or_default();
        match fault {
            Some(fault) => of_node.insert(peer_ip.to_string(), fault),
            None => of_node.remove(peer_ip),
        };
        apply(&a.namespace, of_node);
    }

    /// Cuts all traffic between `a` and `b`, both ways.
    pub fn cut(&self, a: &Node, b: &Node) {
        self.set(a, &b.ip, Some(Fault::Cut));
        self.set(b, &a.ip, Some(Fault::Cut));
    }

    /// Cuts `a` from every node in `others`.
    pub fn isolate(&self, a: &Node, others: &[&Node]) {
        for other in others {
            self.cut(a, other);
        }
    }

    /// Lets traffic between `a` and `b` through again.
    pub fn heal(&self, a: &Node, b: &Node) {
        self.set(a, &b.ip, None);
        self.set(b, &a.ip, None);
    }

    /// Removes every fault of the lab.
    pub fn heal_all(&self) {
        let mut faults = self.faults.lock().expect("faults");
        for (namespace, of_node) in faults.iter_mut() {
            of_node.clear();
            apply(namespace, of_node);
        }
    }

    /// Makes `a` drop `percent` of its packets to and from `peer_ip` (another node's, or the
    /// host's for traffic through a proxy), at random.
    pub fn lose(&self, a: &Node, peer_ip: &str, percent: u8) {
        self.set(a, peer_ip, Some(Fault::Lose(percent)));
    }
}

/// Replaces the node's firewall with its faults.
fn apply(namespace: &str, faults: &BTreeMap<String, Fault>) {
    let mut rules = String::from("table inet fleetlab\ndelete table inet fleetlab\ntable inet fleetlab {\n");
    for (chain, hook, field) in [("incoming", "input", "saddr"), ("outgoing", "output", "daddr")] {
        rules.push_str(&format!("  chain {chain} {{\n    type filter hook {hook} priority 0; policy accept;\n"));
        for (peer, fault) in faults {
            match fault {
                Fault::Cut => rules.push_str(&format!("    ip {field} {peer} drop\n")),
                Fault::Lose(percent) => {
                    rules.push_str(&format!("    ip {field} {peer} numgen random mod 100 < {percent} drop\n"))
                }
            }
        }
        rules.push_str("  }\n");
    }
    rules.push_str("}\n");
    let mut nft = Command::new("ip")
        .args(["netns", "exec", namespace, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nft");
    nft.stdin.take().expect("nft stdin").write_all(rules.as_bytes()).expect("feed nft");
    let done = nft.wait_with_output().expect("nft ends");
    assert!(done.status.success(), "nft in {namespace}: {}\n{rules}", String::from_utf8_lossy(&done.stderr));
}

impl Drop for NetLab {
    fn drop(&mut self) {
        let nodes = self.nodes.lock().map(|nodes| nodes.clone()).unwrap_or_default();
        for node in nodes {
            let _ = Command::new("ip").args(["netns", "del", &node.namespace]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.switch]).output();
        let _ = Command::new("ip").args(["link", "del", &format!("flh{}", self.suffix)]).output();
    }
}
