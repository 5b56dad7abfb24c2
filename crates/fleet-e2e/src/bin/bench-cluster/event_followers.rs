//! With `events=N`: N followers of the engine fleetd's event stream during (a), each a real
//! `fleetctl events --follow -o json --kind placed` over HTTPS with a viewer token (eight a
//! token: a credential holds at most eight live feeds). Each counts the placements it is
//! told of; the bench waits until every one has all of them, and says how long after the
//! units were all launched that was, and what the followers cost.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_e2e::pki::Authority;
use fleet_e2e::{Fleetd, binary, cpu_seconds};

/// Followers one token serves (the API's bound per identity).
const PER_TOKEN: usize = 8;

/// The HTTPS listener the followers read through: its certificates and the config lines.
pub struct Listener {
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    port: u16,
    cert: PathBuf,
    key: PathBuf,
}

impl Listener {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a directory for the certificates");
        let ca = Authority::new("bench CA");
        let ca_file = ca.write(&dir.path().join("ca.pem"));
        let server = ca.server(dir.path(), "server");
        let port = fleet_testkit::free_port();
        Self { dir, ca_file, port, cert: server.cert, key: server.key }
    }

    /// fleet.conf lines for the engine fleetd: the harness's socket and this listener.
    pub fn config(&self) -> Vec<(String, String)> {
        vec![
            ("api_listen".into(), format!("unix://{{socket}},https://127.0.0.1:{}", self.port)),
            ("api_tls_cert_file".into(), self.cert.display().to_string()),
            ("api_tls_key_file".into(), self.key.display().to_string()),
        ]
    }

    fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("a token file");
    file.write_all(text.as_bytes()).expect("write the token");
}

pub struct Followers {
    children: Vec<Child>,
    told: Vec<Arc<AtomicU64>>,
}

impl Followers {
    /// `count` followers of `fleetd`'s stream through `listener`, from the first event on.
    pub fn start(fleetd: &Fleetd, listener: &Listener, count: usize) -> Self {
        let (mut children, mut told) = (Vec::new(), Vec::new());
        for token_index in 0..count.div_ceil(PER_TOKEN) {
            let name = format!("follower-{token_index}");
            let token = fleetd.ok(&["token", "create", "--role", "viewer", &name]).stdout.trim().to_string();
            let token_file = listener.dir().join(&name);
            write_private(&token_file, &token);
            for _ in 0..PER_TOKEN.min(count - token_index * PER_TOKEN) {
                let mut child = Command::new(binary("fleetctl"))
                    .args(["--endpoint", &listener.endpoint()])
                    .arg(format!("--ca-file={}", listener.ca_file.display()))
                    .arg(format!("--token-file={}", token_file.display()))
                    .args(["events", "--follow", "-o", "json", "--kind", "placed"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("fleetctl events --follow");
                let counted = Arc::new(AtomicU64::new(0));
                let (stdout, count_here) = (child.stdout.take().expect("its output"), counted.clone());
                std::thread::spawn(move || {
                    for _ in BufReader::new(stdout).lines().map_while(Result::ok) {
                        count_here.fetch_add(1, Ordering::Relaxed);
                    }
                });
                children.push(child);
                told.push(counted);
            }
        }
        Self { children, told }
    }

    /// Waits until every follower was told of `events` placements (at most `limit`); how
    /// long that took, or `None`.
    pub fn wait_for(&self, events: u64, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.told.iter().all(|told| told.load(Ordering::Relaxed) >= events) {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The fewest and the most placements a follower was told of.
    pub fn told(&self) -> (u64, u64) {
        let counts = self.told.iter().map(|told| told.load(Ordering::Relaxed));
        (counts.clone().min().unwrap_or(0), counts.max().unwrap_or(0))
    }

    /// The followers' CPU seconds so far, all together.
    pub fn cpu_seconds(&self) -> f64 {
        self.children.iter().map(|child| cpu_seconds(child.id())).sum()
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
