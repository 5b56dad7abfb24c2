//! A real etcd server for one test: its own data directory and loopback ports, stopped and
//! deleted when dropped. It can be stopped and started again on the same ports and data, to
//! test store outages.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

const ETCD: &str = "/usr/bin/etcd";
const START_TIMEOUT: Duration = Duration::from_secs(20);

static INSTALL: Once = Once::new();

/// Installs Debian's `etcd-server` when `/usr/bin/etcd` is missing. Panics with apt's output
/// when that fails: a test that needs etcd must not silently skip.
fn ensure_installed() {
    INSTALL.call_once(|| {
        if Path::new(ETCD).exists() {
            return;
        }
        let script = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server";
        let output = Command::new("sh").args(["-c", script]).output().expect("running apt-get");
        assert!(
            output.status.success() && Path::new(ETCD).exists(),
            "etcd is missing and installing etcd-server failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    });
}

pub struct EtcdServer {
    dir: tempfile::TempDir,
    /// The address clients reach it on.
    host: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// Serve clients over TLS, requiring a client certificate from this CA.
    tls: Option<crate::TestCertificates>,
    /// Run with the settings README recommends for a large cluster on etcd 3.4.
    tuned: bool,
    /// Serve etcd's v2 keys API too (where the original fleet kept its registry).
    v2: bool,
}

/// What README recommends for etcd 3.4 under a large cluster, as `(flag, environment)`: a
/// backend commit every 10 ms (etcd 3.4 copies its uncommitted writes into every read view,
/// so a short batch keeps each copy short) and Go's collector run a quarter as often.
pub const LARGE_CLUSTER_SETTINGS: (&str, (&str, &str)) = ("--backend-batch-interval=10ms", ("GOGC", "400"));

impl EtcdServer {
    /// Starts etcd and waits until it answers.
    pub fn start() -> Self {
        Self::start_on("127.0.0.1")
    }

    /// Starts etcd serving clients on `host` (an address of this machine, e.g. one a network
    /// namespace can reach) and waits until it answers.
    pub fn start_on(host: &str) -> Self {
        Self::start_with(host, false)
    }

    /// Starts etcd with its v2 keys API on as well (`--enable-v2`), as the original fleet's
    /// clusters ran it, and waits until it answers.
    pub fn start_with_v2_api() -> Self {
        let mut server = Self::unstarted("127.0.0.1", false);
        server.v2 = true;
        server.resume();
        server
    }

    /// Starts etcd with [`LARGE_CLUSTER_SETTINGS`] (the benchmarks at thousands of machines);
    /// `GOGC` set in the caller's environment still wins.
    pub fn start_for_scale() -> Self {
        Self::start_with("127.0.0.1", true)
    }

    fn start_with(host: &str, tuned: bool) -> Self {
        let mut server = Self::unstarted(host, tuned);
        server.resume();
        server
    }

    /// A server of its own directory and ports, not started yet.
    fn unstarted(host: &str, tuned: bool) -> Self {
        ensure_installed();
        let dir = tempfile::tempdir().expect("temporary directory for etcd");
        Self {
            dir,
            host: host.to_string(),
            client_port: crate::free_port(),
            peer_port: crate::free_port(),
            child: None,
            tls: None,
            tuned,
            v2: false,
        }
    }

    /// Starts etcd serving clients over TLS only, with client certificates required; the
    /// certificates are made fresh for it.
    pub fn start_tls() -> Self {
        let mut server = Self::unstarted("127.0.0.1", false);
        server.tls = Some(crate::TestCertificates::generate(server.dir.path()));
        server.resume();
        server
    }

    /// The certificates of a TLS server.
    pub fn certificates(&self) -> Option<&crate::TestCertificates> {
        self.tls.as_ref()
    }

    /// The client URL, for `etcd_servers`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.client_port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The value of one of etcd's own metrics without labels (e.g.
    /// `etcd_server_proposals_applied_total`, the writes it has carried out), read from its
    /// `/metrics`; `None` when it does not answer (or serves TLS).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let page = http_get(&format!("{}:{}", self.host, self.client_port), "/metrics")?;
        page.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The etcd process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills etcd (SIGKILL), keeping its data for [`EtcdServer::resume`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory, and waits until it answers.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("etcd log file");
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(ETCD);
        command
            .arg("--name=fleet-test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=fleet-test={peer}"))
            // Tests create many leases and watches at once; keep etcd's own chatter down.
            .arg("--log-level=warn")
            .arg("--logger=zap")
            .env_remove("ETCD_DATA_DIR");
        if self.tuned {
            let (flag, (variable, value)) = LARGE_CLUSTER_SETTINGS;
            command.arg(flag);
            if std::env::var_os(variable).is_none() {
                command.env(variable, value);
            }
        }
        // `FLEET_TEST_ETCD_PPROF=1`: serve /debug/pprof/ on the client URL, to read where etcd
        // spends its time. Off by default: etcd then samples its mutexes, which slows it.
        if std::env::var_os("FLEET_TEST_ETCD_PPROF").is_some_and(|value| value == "1") {
            command.arg("--enable-pprof");
        }
        if self.v2 {
            command.arg("--enable-v2");
        }
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.server_cert().display()))
                .arg(format!("--key-file={}", tls.server_key().display()))
                .arg(format!("--trusted-ca-file={}", tls.ca().display()))
                .arg("--client-cert-auth");
        }
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("etcd log file")).stderr(log);
        // SAFETY: prctl is async-signal-safe; it only asks for SIGKILL when the test dies.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn().expect("starting etcd");
        self.child = Some(child);
        self.wait_until_ready();
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let health = format!("{}:{}", self.host, self.client_port);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "etcd exited with {status} at start:\n{}",
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                );
            }
            let ready = if self.tls.is_some() {
                // Plain HTTP cannot ask a TLS server; an open port is enough, clients retry.
                std::net::TcpStream::connect(&health).is_ok()
            } else {
                health_ok(&health)
            };
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd did not answer within {START_TIMEOUT:?}:\n{}",
            std::fs::read_to_string(self.log_path()).unwrap_or_default()
        );
    }
}

/// What a plain HTTP GET of `path` from `address` answers (headers and body), or nothing.
fn http_get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).ok()?;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    Some(response)
}

/// Whether etcd's `/health` endpoint says it is healthy (a leader is elected).
fn health_ok(address: &str) -> bool {
    http_get(address, "/health").is_some_and(|response| response.contains("\"health\":\"true\""))
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
