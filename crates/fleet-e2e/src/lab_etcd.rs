//! A real etcd cluster of several members, each in its own node of a [`NetLab`]: members can
//! be killed and restarted, partitioned from each other, and asked who leads.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netlab::{NetLab, Node};

const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct LabEtcd {
    pub members: Vec<Node>,
    children: Vec<Option<Child>>,
    dir: tempfile::TempDir,
}

fn client_url(node: &Node) -> String {
    format!("http://{}:2379", node.ip)
}

fn peer_url(node: &Node) -> String {
    format!("http://{}:2380", node.ip)
}

/// One plain HTTP request to `address`; the body of the answer, when it came.
fn http(address: &str, method: &str, path: &str, body: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect_timeout(&address.parse().ok()?, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

impl LabEtcd {
    /// Starts `size` members in new nodes of `lab` and waits until every one is healthy.
    pub fn start(lab: &NetLab, size: usize) -> Self {
        let members: Vec<Node> = (1..=size).map(|index| lab.node(&format!("etcd{index}"))).collect();
        let mut cluster = Self {
            children: members.iter().map(|_| None).collect(),
            members,
            dir: tempfile::tempdir().expect("etcd dirs"),
        };
        for index in 0..size {
            cluster.spawn(index);
        }
        for index in 0..size {
            cluster.wait_healthy(index);
        }
        cluster
    }

    /// Each member's client address (`ip:port`), for [`keys_under`].
    pub fn client_addresses(&self) -> Vec<String> {
        self.members.iter().map(|node| format!("{}:2379", node.ip)).collect()
    }

    /// The client URLs of every member, for `etcd_servers`.
    pub fn endpoints(&self) -> String {
        self.members.iter().map(client_url).collect::<Vec<_>>().join(",")
    }

    fn spawn(&mut self, index: usize) {
        let node = &self.members[index];
        let initial: Vec<String> =
            self.members.iter().map(|member| format!("{}={}", member.name, peer_url(member))).collect();
        let data = self.dir.path().join(&node.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", node.name)))
            .expect("etcd log");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &node.namespace, "/usr/bin/etcd"])
            .arg(format!("--name={}", node.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={}", client_url(node)))
            .arg(format!("--advertise-client-urls={}", client_url(node)))
            .arg(format!("--listen-peer-urls={}", peer_url(node)))
            .arg(format!("--initial-advertise-peer-urls={}", peer_url(node)))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=fleet-lab")
            .args(["--log-level=warn", "--logger=zap"])
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; it only asks for SIGKILL when the test dies.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.children[index] = Some(command.spawn().expect("start an etcd member"));
    }

    /// Whether member `index` says it is healthy (it has a leader and a quorum).
    pub fn healthy(&self, index: usize) -> bool {
        let address = format!("{}:2379", self.members[index].ip);
        http(&address, "GET", "/health", "").is_some_and(|body| body.contains("\"health\":\"true\""))
    }

    fn wait_healthy(&self, index: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.healthy(index) {
            assert!(Instant::now() < deadline, "etcd member {index} never became healthy:\n{}", self.log(index));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self, index: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.members[index].name))).unwrap_or_default()
    }

    /// Kills member `index` (SIGKILL); its data stays for [`LabEtcd::restart`].
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its data and waits until it is healthy.
    pub fn restart(&mut self, index: usize) {
        assert!(self.children[index].is_none(), "member {index} runs");
        self.spawn(index);
        self.wait_healthy(index);
    }

    /// The index of the member that leads, as the members that answer say.
    pub fn leader(&self) -> Option<usize> {
        for node in &self.members {
            let address = format!("{}:2379", node.ip);
            let Some(status) = http(&address, "POST", "/v3/maintenance/status", "{}") else {
                continue;
            };
            let status: serde_json::Value = serde_json::from_str(&status).ok()?;
            let leader = status["leader"].as_str()?.to_string();
            let members = http(&address, "POST", "/v3/cluster/member/list", "{}")?;
            let members: serde_json::Value = serde_json::from_str(&members).ok()?;
            let name = members["members"]
                .as_array()?
                .iter()
                .find(|member| member["ID"].as_str() == Some(leader.as_str()))?["name"]
                .as_str()?
                .to_string();
            return self.members.iter().position(|member| member.name == name);
        }
        None
    }
}

/// The keys under `prefix`, each with the revision it was created at (a key deleted and
/// made again between two reads shows a new one), read linearizably from the first member
/// at `addresses` that answers (a member without a quorum does not); `None` when none does.
pub fn keys_under(addresses: &[String], prefix: &str) -> Option<BTreeMap<String, i64>> {
    key_fields(addresses, prefix, "create_revision")
}

/// The keys under `prefix`, each with its version (how many times it was written since it
/// was created), read as [`keys_under`] reads.
pub fn key_versions(addresses: &[String], prefix: &str) -> Option<BTreeMap<String, i64>> {
    key_fields(addresses, prefix, "version")
}

/// The keys under `prefix` (which ends in `/`), each with one numeric field of its metadata.
fn key_fields(addresses: &[String], prefix: &str, field: &str) -> Option<BTreeMap<String, i64>> {
    use base64::Engine as _;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    // The prefixes here end in `/`: the range ends where `/` + 1 begins.
    let mut range_end = prefix.as_bytes().to_vec();
    if let Some(last) = range_end.last_mut() {
        *last += 1;
    }
    let request = serde_json::json!({
        "key": encode(prefix.as_bytes()),
        "range_end": encode(&range_end),
        "keys_only": true,
    })
    .to_string();
    addresses.iter().find_map(|address| {
        let answer = http(address, "POST", "/v3/kv/range", &request)?;
        let answer: serde_json::Value = serde_json::from_str(&answer).ok()?;
        answer.get("header")?;
        let keys = answer["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
        keys.iter()
            .map(|kv| {
                let key = base64::engine::general_purpose::STANDARD.decode(kv["key"].as_str()?).ok()?;
                let value = kv[field].as_str()?.parse().ok()?;
                Some((String::from_utf8(key).ok()?, value))
            })
            .collect()
    })
}

/// One change in etcd's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub revision: i64,
    pub key: String,
    /// `None` for a delete.
    pub value: Option<String>,
}

impl LabEtcd {
    /// etcd's current revision.
    pub fn revision(&self) -> i64 {
        self.with_client(|mut client| async move {
            let reply = client.get("/", None).await.expect("read etcd's revision");
            reply.header().map_or(0, |header| header.revision())
        })
    }

    /// Every change under `prefix` after `after` up to now, in order (etcd keeps its history
    /// until it is compacted; these tests never compact).
    pub fn history(&self, prefix: &str, after: i64) -> Vec<Change> {
        let prefix = prefix.to_string();
        let now = self.revision();
        self.with_client(|mut client| async move {
            let options = etcd_client::WatchOptions::new().with_prefix().with_start_revision(after + 1);
            let mut stream = client.watch(prefix, Some(options)).await.expect("watch etcd's history");
            let mut changes = Vec::new();
            let mut reached = after;
            while reached < now {
                // Long enough for a loaded machine: a history cut short hides the change the
                // report is printed for (a chaos run's trail stopped before a unit's destroy).
                let Ok(Ok(Some(reply))) = tokio::time::timeout(Duration::from_secs(15), stream.message()).await else {
                    break;
                };
                for event in reply.events() {
                    let Some(kv) = event.kv() else { continue };
                    let deleted = event.event_type() == etcd_client::EventType::Delete;
                    reached = reached.max(kv.mod_revision());
                    changes.push(Change {
                        revision: kv.mod_revision(),
                        key: String::from_utf8_lossy(kv.key()).into_owned(),
                        value: (!deleted).then(|| String::from_utf8_lossy(kv.value()).into_owned()),
                    });
                }
            }
            changes
        })
    }

    fn with_client<T, F, Fut>(&self, work: F) -> T
    where
        F: FnOnce(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let endpoints: Vec<String> = self.members.iter().map(client_url).collect();
        runtime.block_on(async move {
            let client = etcd_client::Client::connect(&endpoints, None).await.expect("connect to etcd");
            work(client).await
        })
    }
}

impl Drop for LabEtcd {
    fn drop(&mut self) {
        for index in 0..self.children.len() {
            self.kill(index);
        }
    }
}
