//! An original fleet's registry, written as the original kept it under etcd's v2 keys
//! (compat.md §6), and its agent's part on a machine: for the tests and the benchmark of
//! `fleetctl import-original`, without the original's binaries.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleet_core::UnitFile;

/// The prefix the original kept its registry under.
pub const ORIGINAL_PREFIX: &str = "/_coreos.com/fleet/";

/// How many writes to etcd's v2 API are in flight at once.
const IN_FLIGHT: usize = 64;

/// One unit as the original's registry holds it.
pub struct OriginalJob {
    pub name: String,
    pub text: String,
    pub target_state: String,
    pub target: Option<String>,
}

/// Writes the v2 keys of an original fleet's registry into the etcd at `endpoint`.
pub struct OriginalRegistryWriter {
    endpoint: String,
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
}

/// `text` with every byte but unreserved ones percent-encoded, for a form's value.
fn form_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The hash the original kept `text` under: the bytes of its SHA-1, as Go's `[20]byte` is
/// written in JSON.
pub fn unit_hash_bytes(text: &str) -> Vec<u8> {
    let hex = UnitFile::parse(text).expect("a unit file").hash().to_string();
    (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex")).collect()
}

impl OriginalRegistryWriter {
    pub fn new(endpoint: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        Self { endpoint: endpoint.to_string(), runtime, http: reqwest::Client::new() }
    }

    /// Sets every key of `keys` (under the prefix), many at once.
    pub fn put_all(&self, keys: Vec<(String, String)>) {
        let http = Arc::new(self.http.clone());
        let endpoint = self.endpoint.clone();
        self.runtime.block_on(async move {
            let mut in_flight = tokio::task::JoinSet::new();
            for (key, value) in keys {
                if in_flight.len() >= IN_FLIGHT {
                    in_flight.join_next().await.expect("a write").expect("a write task");
                }
                let (http, url) = (http.clone(), format!("{endpoint}/v2/keys{ORIGINAL_PREFIX}{key}"));
                in_flight.spawn(async move {
                    let answer = http
                        .put(&url)
                        .header("Content-Type", "application/x-www-form-urlencoded")
                        .body(format!("value={}", form_encoded(&value)))
                        .send()
                        .await
                        .expect("etcd's v2 API answers");
                    assert!(answer.status().is_success(), "PUT {url}: {}", answer.status());
                });
            }
            while let Some(done) = in_flight.join_next().await {
                done.expect("a write task");
            }
        });
    }

    /// Removes the directory `key` (under the prefix) and all it holds.
    pub fn delete_dir(&self, key: &str) {
        let url = format!("{}/v2/keys{ORIGINAL_PREFIX}{key}?recursive=true", self.endpoint);
        let answer = self.runtime.block_on(self.http.delete(&url).send()).expect("etcd's v2 API answers");
        assert!(answer.status().is_success(), "DELETE {url}: {}", answer.status());
    }

    /// Writes `jobs` as the original's API and engine did: each job's object, target state
    /// and target, and each content once; and `machines` with their metadata.
    pub fn write(&self, jobs: &[OriginalJob], machines: &[(&str, BTreeMap<String, String>)]) {
        let mut keys = Vec::new();
        let mut contents = BTreeMap::new();
        for job in jobs {
            let hash = unit_hash_bytes(&job.text);
            let hex: String = hash.iter().map(|byte| format!("{byte:02x}")).collect();
            contents.entry(hex).or_insert_with(|| serde_json::json!({"Raw": job.text}).to_string());
            let object = serde_json::json!({"Name": job.name, "UnitHash": hash}).to_string();
            keys.push((format!("job/{}/object", job.name), object));
            keys.push((format!("job/{}/target-state", job.name), job.target_state.clone()));
            if let Some(target) = &job.target {
                keys.push((format!("job/{}/target", job.name), target.clone()));
            }
        }
        keys.extend(contents.into_iter().map(|(hex, body)| (format!("unit/{hex}"), body)));
        for (id, metadata) in machines {
            let object =
                serde_json::json!({"ID": id, "PublicIP": "127.0.0.1", "Metadata": metadata, "Version": "1.0.0"});
            keys.push((format!("machines/{id}/object"), object.to_string()));
        }
        keys.push(("engine/version".to_string(), "1".to_string()));
        self.put_all(keys);
    }
}
