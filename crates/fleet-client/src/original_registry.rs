//! The original fleet's registry as its etcd keeps it, under etcd's v2 keys API (compat.md
//! §6): read whole in one request ([`read_original_registry`]), then the units and machines
//! it holds found in that tree ([`registry_in`], pure). Nothing is written to it.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{ClientError, ClientOptions, Result, with_tls};

/// The largest registry read: 10,000 units with their files are some tens of MiB.
const MOST_REGISTRY_BYTES: usize = 512 * 1024 * 1024;

/// A node of etcd's v2 keys tree: a value, or a directory of nodes.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct V2Node {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub dir: bool,
    #[serde(default)]
    pub nodes: Vec<V2Node>,
}

#[derive(Deserialize)]
struct V2Answer {
    node: V2Node,
}

#[derive(Deserialize)]
struct V2Error {
    #[serde(rename = "errorCode")]
    error_code: u64,
    message: String,
}

/// One unit of the original's registry, or why it cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginalUnit {
    pub name: String,
    pub found: std::result::Result<FoundUnit, String>,
}

/// What the original holds of a unit it can read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundUnit {
    /// `inactive`, `loaded` or `launched`, as the original's `target-state` says.
    pub desired_state: String,
    /// The machine its engine scheduled it on (`target`).
    pub machine: Option<String>,
    /// The hash the original keeps it under (hex SHA-1 of the unit file).
    pub hash: String,
    /// The unit file, as the original serialized it.
    pub text: String,
}

/// A machine the original knows, with its metadata (its own and what the API set).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginalMachine {
    pub id: String,
    pub metadata: BTreeMap<String, String>,
}

/// Everything of the original's registry that an import takes over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginalRegistry {
    /// In name order.
    pub units: Vec<OriginalUnit>,
    pub machines: Vec<OriginalMachine>,
}

/// The original's job object (`job/<unit>/object`).
#[derive(Deserialize)]
struct JobObject {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "UnitHash")]
    unit_hash: Vec<u8>,
}

/// The original's unit object (`unit/<hash>`).
#[derive(Deserialize)]
struct UnitObject {
    #[serde(rename = "Raw")]
    raw: String,
}

/// The original's machine object (`machines/<id>/object`).
#[derive(Deserialize)]
struct MachineObject {
    #[serde(rename = "Metadata", default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// The last part of a node's key.
fn base_name(node: &V2Node) -> &str {
    node.key.rsplit('/').next().unwrap_or_default()
}

fn child<'a>(node: &'a V2Node, name: &str) -> Option<&'a V2Node> {
    node.nodes.iter().find(|child| base_name(child) == name)
}

fn value_of<'a>(node: &'a V2Node, name: &str) -> Option<&'a str> {
    child(node, name).and_then(|child| child.value.as_deref())
}

/// The units and machines in `root`, the tree etcd answered for the registry's prefix; an
/// error when the tree is no fleet registry (neither `job/`, `unit/` nor `machines/`).
pub fn registry_in(root: &V2Node) -> std::result::Result<OriginalRegistry, String> {
    let (jobs, bodies, machines) = (child(root, "job"), child(root, "unit"), child(root, "machines"));
    if jobs.is_none() && bodies.is_none() && machines.is_none() {
        return Err(format!("{} holds no fleet registry: it has no job/, unit/ or machines/ keys", root.key));
    }
    let bodies: BTreeMap<&str, &V2Node> =
        bodies.map(|dir| dir.nodes.iter().map(|node| (base_name(node), node)).collect()).unwrap_or_default();
    let mut units: Vec<OriginalUnit> = jobs
        .map(|dir| {
            dir.nodes
                .iter()
                .map(|job| OriginalUnit { name: base_name(job).to_string(), found: unit_in(job, &bodies) })
                .collect()
        })
        .unwrap_or_default();
    units.sort_by(|a, b| a.name.cmp(&b.name));
    let machines = machines.map(|dir| dir.nodes.iter().map(machine_in).collect()).unwrap_or_default();
    Ok(OriginalRegistry { units, machines })
}

/// The unit whose job directory is `job`, with its file from `bodies`.
fn unit_in(job: &V2Node, bodies: &BTreeMap<&str, &V2Node>) -> std::result::Result<FoundUnit, String> {
    let object = value_of(job, "object").ok_or("its job has no object (job/<unit>/object)")?;
    let object: JobObject =
        serde_json::from_str(object).map_err(|error| format!("its job object cannot be read: {error}"))?;
    if object.name != base_name(job) {
        return Err(format!("its job object names another unit, {}", object.name));
    }
    if object.unit_hash.len() != 20 {
        return Err(format!("its job object's UnitHash has {} bytes, not 20", object.unit_hash.len()));
    }
    let hash: String = object.unit_hash.iter().map(|byte| format!("{byte:02x}")).collect();
    let desired_state = value_of(job, "target-state").ok_or("its job has no target-state")?.to_string();
    let machine = value_of(job, "target").filter(|machine| !machine.is_empty()).map(str::to_string);
    let body = bodies.get(hash.as_str()).and_then(|node| node.value.as_deref());
    let body = body.ok_or_else(|| format!("its unit file (unit/{hash}) is missing"))?;
    let body: UnitObject =
        serde_json::from_str(body).map_err(|error| format!("its unit file (unit/{hash}) cannot be read: {error}"))?;
    Ok(FoundUnit { desired_state, machine, hash, text: body.raw })
}

/// The machine whose directory is `node`: its object's metadata, with what the API set over it
/// (`metadata/<key>`, an empty value taking the key away).
fn machine_in(node: &V2Node) -> OriginalMachine {
    let object = value_of(node, "object").and_then(|text| serde_json::from_str::<MachineObject>(text).ok());
    let mut metadata = object.and_then(|object| object.metadata).unwrap_or_default();
    for set in child(node, "metadata").map(|dir| dir.nodes.as_slice()).unwrap_or_default() {
        match set.value.as_deref() {
            Some("") | None => metadata.remove(base_name(set)),
            Some(value) => metadata.insert(base_name(set).to_string(), value.to_string()),
        };
    }
    OriginalMachine { id: base_name(node).to_string(), metadata }
}

/// Reads the registry under `prefix` from the etcd at `endpoint` (`http://host:2379`; TLS
/// settings from `options`) through its v2 keys API, in one request.
pub async fn read_original_registry(endpoint: &str, prefix: &str, options: &ClientOptions) -> Result<OriginalRegistry> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let endpoint = endpoint.trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(ClientError::Endpoint(format!("{endpoint}: an etcd endpoint is http:// or https://")));
    }
    let builder = reqwest::Client::builder().timeout(options.timeout).connect_timeout(options.timeout);
    let http = with_tls(builder, options)?.build().map_err(|error| ClientError::Transport(error.to_string()))?;
    let prefix = format!("/{}", prefix.trim_matches('/'));
    let url = format!("{endpoint}/v2/keys{prefix}?recursive=true&sorted=true");
    let response = http.get(&url).send().await.map_err(|error| {
        ClientError::Transport(format!("cannot read the original's registry from {endpoint}: {error}"))
    })?;
    let status = response.status();
    let mut bytes = Vec::new();
    let mut response = response;
    while let Some(chunk) = response.chunk().await.map_err(|error| ClientError::Transport(error.to_string()))? {
        if bytes.len() + chunk.len() > MOST_REGISTRY_BYTES {
            return Err(ClientError::Transport(format!(
                "the registry at {endpoint} is over {MOST_REGISTRY_BYTES} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(match serde_json::from_slice::<V2Error>(&bytes) {
            Ok(error) if error.error_code == 100 => ClientError::Endpoint(format!(
                "no fleet registry at {prefix} in the etcd at {endpoint}: {}",
                error.message
            )),
            Ok(error) => ClientError::Transport(format!("etcd at {endpoint} answered {status}: {}", error.message)),
            Err(_) => ClientError::Transport(format!(
                "etcd at {endpoint} answered {status} (is its v2 API on? etcd 3.4 needs --enable-v2)"
            )),
        });
    }
    let answer: V2Answer = serde_json::from_slice(&bytes)
        .map_err(|error| ClientError::Decode(format!("etcd's v2 answer cannot be read: {error}")))?;
    registry_in(&answer.node).map_err(ClientError::Endpoint)
}

#[cfg(test)]
mod tests;
