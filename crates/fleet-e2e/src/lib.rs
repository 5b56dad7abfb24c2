//! A harness that runs the real `fleetd` and `fleetctl` binaries: each [`Fleetd`] gets its
//! own state directory, machine ID and API socket, and is stopped when dropped.
//!
//! The binaries are found beside the test executable (`target/<profile>/`), so the
//! workspace's binaries must be built first (`cargo build --workspace --bins`, which
//! `cargo test --workspace` and `cargo nextest run --workspace` do).

/// The benches' simulated machines run fleetd's agent in this process: they allocate as
/// fleetd does (`fleetd/src/main.rs`), so that what they cost the machine is what fleetd's would.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod browser;
pub mod cgroups;
pub mod chaos;
mod cluster;
pub mod cluster_bench;
pub mod connect_proxy;
pub mod delay_proxy;
pub mod https;
pub mod https_listener;
pub mod lab;
pub mod lab_etcd;
pub mod lab_fleet;
pub mod launched_units;
pub mod nat;
pub mod netlab;
pub mod original_fleet;
pub mod pki;
pub mod presence_log;
pub mod pull;
pub use fleet_testkit::Seeded;
pub mod sshd;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the workspace's binaries: the test's own directory, or its parent
/// when the test runs from `deps/`.
pub fn binary_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") { dir.parent().expect("profile directory").to_path_buf() } else { dir.to_path_buf() }
}

pub fn binary(name: &str) -> PathBuf {
    let path = binary_dir().join(name);
    assert!(path.exists(), "{} is missing: build the workspace binaries first", path.display());
    path
}

/// Sends one raw HTTP/1.0 request to an API's Unix socket; returns the whole answer.
fn raw_request(socket: &Path, method: &str, path: &str, json: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
        json.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Whether a `GET` of `path` on the API's Unix socket `socket` answers 200 (`false` while the
/// socket is not up).
pub fn socket_answers(socket: &Path, path: &str) -> bool {
    raw_request(socket, "GET", path, "").is_ok_and(|answer| answer.split(' ').nth(1) == Some("200"))
}

/// Puts `contents` in place of `path` as a package does: a new executable file beside it,
/// renamed over it (a running process keeps its old file; the path names the new one).
pub fn install_binary(path: &Path, contents: &[u8]) {
    let staged = path.with_extension("dpkg-new");
    std::fs::write(&staged, contents).expect("writing the new binary");
    std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    std::fs::rename(&staged, path).expect("installing the new binary");
}

/// The SHA-256 of `value`, in hex, as `sha256sum` prints it.
pub fn sha256_hex(value: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, value).as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The unit files shipped in `examples/`.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

pub struct Fleetd {
    pub dir: tempfile::TempDir,
    pub machine_id: String,
    child: Option<Child>,
    extra: Vec<(String, String)>,
    launcher: Launcher,
    /// The fleetd binary it runs, when not the workspace's own.
    program: Option<PathBuf>,
}

/// How fleetd is started: a command prefix (e.g. `nsenter ... --`) and extra environment.
#[derive(Clone, Debug, Default)]
pub struct Launcher {
    pub prefix: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What a fleetctl run printed and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Ran {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Fleetd {
    /// Starts a fleetd with `config` lines (fleet.conf syntax) on top of the harness's own.
    pub fn start(machine_id: &str, config: &[(&str, &str)]) -> Self {
        Self::start_with(machine_id, config, Launcher::default())
    }

    /// A fleetd whose units run under `systemd`'s user instance (in its namespace), on the
    /// embedded store.
    pub fn start_under(systemd: &SystemdUser, machine_id: &str) -> Self {
        let units = systemd.units_directory().display().to_string();
        let config = [("unit_manager", "auto"), ("systemd_user", "true"), ("units_directory", units.as_str())];
        Self::start_with(machine_id, &config, Launcher { prefix: systemd.enter_prefix(), env: systemd.env() })
    }

    /// As [`Fleetd::start`], started through `launcher`.
    pub fn start_with(machine_id: &str, config: &[(&str, &str)], launcher: Launcher) -> Self {
        let mut fleetd = Self::in_new_dir(machine_id, config, launcher);
        fleetd.launch();
        fleetd
    }

    /// As [`Fleetd::start_with`], running `program` rather than the workspace's fleetd.
    pub fn start_from(machine_id: &str, config: &[(&str, &str)], launcher: Launcher, program: &Path) -> Self {
        let mut fleetd = Self::in_new_dir(machine_id, config, launcher);
        fleetd.program = Some(program.to_path_buf());
        fleetd.launch();
        fleetd
    }

    /// A fleetd not started yet, in a directory of its own.
    fn in_new_dir(machine_id: &str, config: &[(&str, &str)], launcher: Launcher) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let extra = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { dir, machine_id: machine_id.to_string(), child: None, extra, launcher, program: None }
    }

    /// Runs a fleetd that is expected to refuse to start; returns its exit code and log.
    pub fn start_refused(machine_id: &str, config: &[(&str, &str)]) -> (Option<i32>, String) {
        let fleetd = Self::in_new_dir(machine_id, config, Launcher::default());
        fleetd.write_config();
        let output = fleetd.command().output().expect("run fleetd");
        let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code(), log)
    }

    /// Runs this (stopped) fleetd again in its directory, expecting it to refuse to start:
    /// its exit code and log.
    pub fn run_refused(&self) -> (Option<i32>, String) {
        assert!(self.child.is_none(), "stop the fleetd first");
        let output = self.command().output().expect("run fleetd");
        let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code(), log)
    }

    /// The fleetd command line for this directory, with no `FLEET_*` from the caller.
    fn command(&self) -> Command {
        let fleetd = self.program.clone().unwrap_or_else(|| binary("fleetd"));
        let mut command = match self.launcher.prefix.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(fleetd);
                command
            }
            None => Command::new(fleetd),
        };
        command.envs(self.launcher.env.iter().cloned());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("FLEET_") {
                command.env_remove(name);
            }
        }
        command.arg("-config").arg(self.config_path()).stdin(Stdio::null());
        // A test or benchmark that dies (killed, or a panic that skips drops) takes its
        // fleetds with it, rather than leaving them running.
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("fleet.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("fleetd.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("fleet.conf")
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("fleetd running").id()
    }

    fn write_config(&self) {
        let mut text = format!(
            "machine_id = {}\nstate_dir = {}\napi_listen = unix://{}\npublic_ip = 127.0.0.1\n",
            self.machine_id,
            self.state_dir().display(),
            self.socket().display()
        );
        // `{socket}` in a value stands for the harness's own socket path.
        let socket = self.socket().display().to_string();
        for (key, value) in &self.extra {
            text.push_str(&format!("{key} = {}\n", value.replace("{socket}", &socket)));
        }
        std::fs::write(self.config_path(), text).expect("write fleet.conf");
    }

    /// As [`Fleetd::start`], but waits only until its API answers on its socket, listing
    /// nothing through it: a list starts the cache of the whole cluster, which a
    /// measurement of what an agent-only fleetd holds must not include.
    pub fn start_unlisted(machine_id: &str, config: &[(&str, &str)]) -> Self {
        let mut fleetd = Self::in_new_dir(machine_id, config, Launcher::default());
        fleetd.spawn();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fleetd.answers("/fleet/v1/discovery") {
            assert!(Instant::now() < deadline, "fleetd's API did not answer; log:\n{}", fleetd.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        fleetd
    }

    /// Writes the configuration and starts the fleetd process, logging to its directory.
    fn spawn(&mut self) {
        self.write_config();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("log file");
        // Only the test's fleet.conf configures this fleetd.
        let child =
            self.command().stdout(log.try_clone().expect("log file")).stderr(log).spawn().expect("start fleetd");
        self.child = Some(child);
    }

    /// Starts the fleetd process again on the same directory and goes on at once: under
    /// faults (etcd without a leader, say) it may take any time to register, and what it does
    /// meanwhile is for the caller's checks to judge. A fleetd that exits at once is found
    /// by the caller's watch for fleetds that died on their own.
    pub fn relaunch(&mut self) {
        self.spawn();
    }

    /// (Re)starts the fleetd process on the same directory and waits for its API.
    pub fn launch(&mut self) {
        self.spawn();
        let deadline = Instant::now() + Duration::from_secs(20);
        let short = &self.machine_id[..8.min(self.machine_id.len())];
        while !self.fleetctl(&["list-machines", "--no-legend"]).stdout.contains(short) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                panic!("fleetd exited at start ({status}); log:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "fleetd's API did not answer; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` and waits for fleetd to exit; returns its exit code.
    pub fn stop_with(&mut self, signal: i32) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                // Where every thread of it stands: a fleetd that does not exit is wedged, and
                // its log cannot say where.
                let stacks = thread_stacks(child.id());
                let _ = child.kill();
                let _ = child.wait();
                panic!("fleetd did not exit after signal {signal}; its threads:\n{stacks}\nlog:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the fleetd process ended by itself (it was running and is no more); it is
    /// then marked stopped.
    pub fn exited_on_its_own(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten())?;
        self.child = None;
        Some(status)
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: as above.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    pub fn fleetctl(&self, args: &[&str]) -> Ran {
        self.fleetctl_in(Path::new("."), args)
    }

    /// Runs fleetctl in the working directory `dir`.
    pub fn fleetctl_in(&self, dir: &Path, args: &[&str]) -> Ran {
        Command::new(binary("fleetctl"))
            .current_dir(dir)
            .arg(format!("--endpoint=unix://{}", self.socket().display()))
            .args(args)
            .env_remove("FLEETCTL_ENDPOINT")
            .output()
            .expect("run fleetctl")
            .into()
    }

    /// Whether a `GET` of `path` on the API's Unix socket answers 200 (`false` while the
    /// socket is not up).
    fn answers(&self, path: &str) -> bool {
        socket_answers(&self.socket(), path)
    }

    /// Sends one raw HTTP/1.0 request to the API's Unix socket; returns the whole answer.
    pub fn api(&self, method: &str, path: &str, json: &str) -> String {
        self.try_api(method, path, json).expect("a request to the API over its socket")
    }

    /// [`Fleetd::api`], or the error of a fleetd not answering (one starting, say).
    pub fn try_api(&self, method: &str, path: &str, json: &str) -> std::io::Result<String> {
        raw_request(&self.socket(), method, path, json)
    }

    /// `GET /metrics` through the Unix socket, in the classic text format, after it passed
    /// `promtool check metrics` (Debian's `prometheus`).
    /// Every unit as `GET /fleet/v1/units` shows it, all pages (as far as they read).
    pub fn api_units(&self) -> Vec<serde_json::Value> {
        let mut units = Vec::new();
        let mut token = String::new();
        loop {
            let path = if token.is_empty() {
                "/fleet/v1/units".to_string()
            } else {
                format!("/fleet/v1/units?nextPageToken={token}")
            };
            let answer = self.api("GET", &path, "");
            let Some((_, body)) = answer.split_once("\r\n\r\n") else { return units };
            let Ok(page) = serde_json::from_str::<serde_json::Value>(body) else { return units };
            units.extend(page["units"].as_array().into_iter().flatten().cloned());
            match page["nextPageToken"].as_str() {
                Some(next) if !next.is_empty() => token = next.to_string(),
                _ => return units,
            }
        }
    }

    pub fn metrics(&self) -> String {
        let answer = self.api("GET", "/metrics", "");
        let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}\n\n{body}");
        promtool_check(body);
        body.to_string()
    }

    /// Runs fleetctl and insists that it succeeds.
    pub fn ok(&self, args: &[&str]) -> Ran {
        let ran = self.fleetctl(args);
        assert_eq!(ran.code, 0, "fleetctl {args:?} failed: {ran:#?}\nfleetd log:\n{}", self.log());
        ran
    }

    /// Polls `check` every 100 ms until it holds, or fails the test after `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}; fleetd log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `list-units` rows as (unit, active, sub).
    pub fn unit_rows(&self) -> Vec<(String, String, String)> {
        self.ok(&["list-units", "--no-legend", "--fields", "unit,active,sub"])
            .stdout
            .lines()
            .map(|line| {
                let cells: Vec<&str> = line.split('\t').filter(|cell| !cell.is_empty()).collect();
                (cells[0].to_string(), cells[1].to_string(), cells[2].to_string())
            })
            .collect()
    }
}

impl Drop for Fleetd {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_with(libc::SIGTERM);
        }
        // Signs of a fleetd that nearly wedged, printed even when its test passed (nextest
        // shows them with `--success-output`; scripts/stress-e2e.sh gathers them).
        for line in self.log().lines().filter(|line| STALL_SIGNS.iter().any(|sign| line.contains(sign))) {
            println!("{STALL_PREFIX}{line}");
        }
    }
}

/// What starts each line [`Fleetd`]'s drop prints of a stall its fleetd logged.
pub const STALL_PREFIX: &str = "fleetd stalled: ";

/// The warnings fleetd logs when something waits far longer than it should.
const STALL_SIGNS: &[&str] = &[
    "one pass has not ended",
    "components have not stopped yet",
    "the spawning thread has not come to it",
    "was not all read within",
    "a runtime worker has run without a break",
];

pub use cluster::{AGENT_TTL_SECONDS, Cluster, Placement, member_id};
pub use fleet_testkit::{EtcdServer, LARGE_CLUSTER_SETTINGS, SystemdUser};
pub use fleet_unit_manager::native::unit_processes;

/// Writes `text` to `dir/name`; returns the path, as fleetctl takes it.
pub fn write_unit(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write unit file");
    path.display().to_string()
}

/// Writes `bench@.service` (a long `sleep`) into `dir`; returns the paths of its instances
/// `1..=count`, as fleetctl takes them.
pub fn bench_instances(dir: &Path, count: usize) -> Vec<String> {
    write_unit(dir, "bench@.service", "[Service]\nExecStart=/bin/sleep 100000\n");
    (1..=count).map(|n| dir.join(format!("bench@{n}.service")).display().to_string()).collect()
}

/// A benchmark's positional argument `index` (from 1), or `default` when absent or not a value.
pub fn argument<T: std::str::FromStr>(index: usize, default: T) -> T {
    std::env::args().nth(index).and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Resident memory of a process, in MiB, from /proc; 0 when it is gone.
pub fn resident_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// User plus system CPU seconds a process has used, from /proc; 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    // After the command name: state is field 0, utime is 11, stime is 12.
    stat_seconds(pid, [11, 12])
}

/// CPU time, in seconds, of the children `pid` has waited for (those that ended, such as a
/// fleetctl run to its end), user and system.
pub fn waited_children_cpu_seconds(pid: u32) -> f64 {
    // cutime is field 13, cstime 14.
    stat_seconds(pid, [13, 14])
}

/// The sum of two clock-tick fields of `/proc/PID/stat`, in seconds; 0 when it is gone.
fn stat_seconds(pid: u32, fields_wanted: [usize; 2]) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields_wanted.iter().filter_map(|i| fields.get(*i)?.parse::<f64>().ok()).sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / per_second
}

/// The most memory a process has held resident (`VmHWM`), in MiB; 0 when it is gone.
pub fn peak_resident_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kib.unwrap_or(0.0) / 1024.0
}

/// Whether a process runs with exactly this argument list.
pub fn process_running(args: &[&str]) -> bool {
    process_with(args).is_some()
}

/// The ID of a process whose command line is exactly `args`, if one runs.
pub fn process_with(args: &[&str]) -> Option<u32> {
    let wanted = format!("{}\0", args.join("\0"));
    std::fs::read_dir("/proc").into_iter().flatten().flatten().find_map(|entry| {
        let pid = entry.file_name().to_str()?.parse().ok()?;
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| cmdline == wanted.as_bytes()).then_some(pid)
    })
}

/// Whether process `pid` still runs: it exists and is not a zombie. One file read, whatever
/// else runs on the machine (a walk of /proc under load can take longer than what it times).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command's name, which ends with the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Polls `check` every 100 ms until it holds, or fails the test after `timeout` with `what`
/// and `context()`.
pub fn poll_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool, context: impl Fn() -> String) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}\n{}", context());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `child`'s exit status once it exits by itself within `limit`; `None` if it did not, and
/// then it is killed: a test never leaves a process behind, whatever its outcome.
pub fn exit_within(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().ok().flatten() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Checks a scrape with `promtool check metrics`: the format parses and the names follow
/// Prometheus's conventions.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian's prometheus package)");
    promtool.stdin.take().expect("promtool's stdin").write_all(text.as_bytes()).expect("feed promtool");
    let done = promtool.wait_with_output().expect("promtool ends");
    assert!(
        done.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
}

/// The value of one sample of a classic-text scrape (`name{labels}` exactly as written).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// One plain `GET` over TCP with no credential; the whole answer.
pub fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the API");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read answer");
    answer
}

/// Every thread's stack of process `pid`, as gdb prints them (at most 600 lines; what went
/// wrong when gdb cannot attach).
pub fn thread_stacks(pid: u32) -> String {
    let pid = pid.to_string();
    let args = ["60", "gdb", "-p", pid.as_str(), "-batch", "-ex", "thread apply all bt"];
    match std::process::Command::new("timeout").args(args).output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> =
                text.lines().filter(|line| line.starts_with('#') || line.starts_with("Thread")).collect();
            match lines.is_empty() {
                true => format!("(gdb printed no stacks: {})", String::from_utf8_lossy(&out.stderr).trim()),
                false => lines.iter().take(600).copied().collect::<Vec<_>>().join("\n"),
            }
        }
        Err(error) => format!("(gdb could not be run: {error})"),
    }
}
