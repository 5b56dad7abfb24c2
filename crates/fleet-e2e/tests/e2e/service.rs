//! fleetd run the way it ships: scripts/install.sh stages the binaries, units, manuals,
//! completions and a sample configuration; the shipped fleet.service and fleet.socket run
//! under a real systemd user instance (Type=notify, socket activation, watchdog), with
//! drop-ins for the paths of the test only.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_e2e::{SystemdUser, binary, binary_dir, examples_dir, poll_until, unit_processes};

const WAIT: Duration = Duration::from_secs(30);

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs scripts/install.sh into `dest` with the binaries the tests use.
fn install_into(dest: &Path) {
    let ran = Command::new(repository().join("scripts/install.sh"))
        .env("DESTDIR", dest)
        .env("PREFIX", "/usr/local")
        .env("FLEET_BINARIES", binary_dir())
        .output()
        .expect("run scripts/install.sh");
    assert!(
        ran.status.success(),
        "install.sh: {}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|error| panic!("{path:?}: {error}")).permissions().mode() & 0o7777
}

#[test]
fn the_install_script_stages_everything_with_safe_modes() {
    let dest = tempfile::tempdir().expect("staging dir");
    install_into(dest.path());
    let root = dest.path();
    assert_eq!(mode(&root.join("usr/local/bin/fleetd")), 0o755);
    assert_eq!(mode(&root.join("usr/local/bin/fleetctl")), 0o755);
    assert_eq!(mode(&root.join("etc/fleet")), 0o700);
    assert_eq!(mode(&root.join("etc/fleet/fleet.conf")), 0o600, "the configuration may hold secrets");
    let service = std::fs::read_to_string(root.join("etc/systemd/system/fleet.service")).expect("fleet.service");
    assert!(service.contains("ExecStart=/usr/local/bin/fleetd\n") && service.contains("Type=notify"), "{service}");
    assert!(root.join("etc/systemd/system/fleet.socket").is_file());
    assert!(root.join("usr/local/share/man/man8/fleetd.8").is_file());
    assert!(root.join("usr/local/share/man/man1/fleetctl-list-units.1").is_file());
    assert!(root.join("usr/local/share/bash-completion/completions/fleetctl").is_file());
    assert!(root.join("usr/local/share/zsh/site-functions/_fleetctl").is_file());
    // The sample configuration is fleetd's own, and a second install keeps the operator's.
    let sample = std::fs::read_to_string(root.join("etc/fleet/fleet.conf")).expect("fleet.conf");
    assert!(sample.contains("#etcd_servers = \n") && sample.contains("#agent_ttl = 30s\n"), "{sample}");
    std::fs::write(root.join("etc/fleet/fleet.conf"), "metadata = region=mine\n").expect("edit fleet.conf");
    install_into(dest.path());
    assert_eq!(
        std::fs::read_to_string(root.join("etc/fleet/fleet.conf")).expect("fleet.conf"),
        "metadata = region=mine\n"
    );
}

struct Service {
    systemd: SystemdUser,
    socket: PathBuf,
    state_dir: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Service {
    /// The shipped units under a user instance, with drop-ins for this test's paths.
    fn start() -> Self {
        let systemd = SystemdUser::start();
        let scratch = tempfile::tempdir().expect("scratch dir");
        install_into(&scratch.path().join("root"));
        let units = systemd.runtime_dir().join("systemd/user");
        std::fs::create_dir_all(units.join("fleet.service.d")).expect("unit dirs");
        std::fs::create_dir_all(units.join("fleet.socket.d")).expect("unit dirs");
        for unit in ["fleet.service", "fleet.socket"] {
            std::fs::copy(scratch.path().join("root/etc/systemd/system").join(unit), units.join(unit))
                .expect("copy unit");
        }
        let socket = scratch.path().join("fleet.sock");
        let state_dir = scratch.path().join("state");
        let config = scratch.path().join("fleet.conf");
        std::fs::write(
            &config,
            format!(
                "machine_id = 5e7c1ce000000000000000000000000a\nstate_dir = {}\nunit_manager = native\nmetadata = role=service\n",
                state_dir.display()
            ),
        )
        .expect("fleet.conf");
        std::fs::write(
            units.join("fleet.service.d/test.conf"),
            format!(
                "[Service]\nExecStart=\nExecStart={} -config {}\nStateDirectory=\nWatchdogSec=3s\nTimeoutAbortSec=3s\nRestartSec=1s\n",
                binary("fleetd").display(),
                config.display()
            ),
        )
        .expect("service drop-in");
        std::fs::write(
            units.join("fleet.socket.d/test.conf"),
            format!("[Socket]\nListenStream=\nListenStream={}\nSocketUser=\nSocketGroup=\n", socket.display()),
        )
        .expect("socket drop-in");
        let service = Self { systemd, socket, state_dir, _scratch: scratch };
        service.systemctl(&["daemon-reload"]);
        service.systemctl(&["start", "fleet.socket"]);
        service
    }

    fn systemctl(&self, args: &[&str]) {
        let ran = self.systemd.systemctl(args);
        assert!(
            ran.status.success(),
            "systemctl --user {args:?}: {}\n{}",
            String::from_utf8_lossy(&ran.stderr),
            self.journal()
        );
    }

    fn journal(&self) -> String {
        let status = self.systemd.systemctl(&["status", "--no-pager", "-l", "fleet.service"]);
        format!("{}\nsystemd log:\n{}", String::from_utf8_lossy(&status.stdout), self.systemd.log())
    }

    fn fleetctl(&self, args: &[&str]) -> (i32, String, String) {
        let ran = Command::new(binary("fleetctl"))
            .arg(format!("--endpoint=unix://{}", self.socket.display()))
            .args(["--request-timeout", "10"])
            .args(args)
            .output()
            .expect("run fleetctl");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
        (ran.status.code().unwrap_or(-1), text(&ran.stdout), text(&ran.stderr))
    }

    fn main_pid(&self) -> i32 {
        self.systemd.show("fleet.service", "MainPID").parse().unwrap_or(0)
    }
}

#[test]
fn fleet_service_is_ready_when_its_api_answers_and_the_watchdog_restarts_a_wedged_fleetd() {
    let service = Service::start();
    // Type=notify: `systemctl start` returns once fleetd said READY=1, which it says only
    // once its API answers, so the first request succeeds at once.
    service.systemctl(&["start", "fleet.service"]);
    let (code, machines, stderr) = service.fleetctl(&["list-machines", "--no-legend"]);
    assert_eq!(code, 0, "{stderr}\n{}", service.journal());
    assert!(machines.contains("role=service"), "{machines}");
    let status = service.systemd.show("fleet.service", "StatusText");
    assert!(status.contains("API on unix://") && status.contains("units on this machine"), "{status}");

    let hello = examples_dir().join("hello.service").display().to_string();
    let (code, _, stderr) = service.fleetctl(&["start", &hello]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!unit_processes(&service.state_dir).is_empty(), "hello runs under the native supervisor");

    // A wedged fleetd (stopped, so it pings no more) is killed by the watchdog and started
    // again; the native supervisor's keeper ends the units of the dead fleetd, and the new
    // one starts them again.
    let wedged = service.main_pid();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(wedged, libc::SIGSTOP) };
    poll_until(
        "the watchdog restarts fleetd",
        WAIT,
        || {
            let pid = service.main_pid();
            pid != 0 && pid != wedged && service.systemd.show("fleet.service", "ActiveState") == "active"
        },
        || service.journal(),
    );
    assert!(service.systemd.show("fleet.service", "NRestarts").parse::<u32>().unwrap_or(0) >= 1);
    poll_until(
        "hello runs again under the new fleetd",
        WAIT,
        || service.fleetctl(&["list-units", "--no-legend", "--fields", "unit,active"]).1 == "hello.service\tactive\n",
        || service.journal(),
    );
    assert!(!unit_processes(&service.state_dir).is_empty());

    // A clean stop ends fleetd (and its units) with success, and its socket with it
    // (PartOf=): a stopped fleet stays stopped. With the socket alone started, the first
    // connection starts fleetd.
    service.systemctl(&["stop", "fleet.service"]);
    assert_eq!(service.systemd.show("fleet.service", "ActiveState"), "inactive");
    assert_eq!(service.systemd.show("fleet.service", "Result"), "success");
    assert_eq!(service.systemd.show("fleet.socket", "ActiveState"), "inactive");
    service.systemctl(&["start", "fleet.socket"]);
    assert_eq!(service.systemd.show("fleet.service", "ActiveState"), "inactive");
    let started = Instant::now();
    let (code, _, stderr) = service.fleetctl(&["list-machines"]);
    assert_eq!(code, 0, "socket activation: {stderr}\n{}", service.journal());
    assert!(started.elapsed() < Duration::from_secs(10));
    // fleetd says READY=1 once its own probe of its API is answered, which may come just
    // after fleetctl's answer: waited for, not assumed.
    poll_until(
        "the socket-activated fleet.service is active",
        WAIT,
        || service.systemd.show("fleet.service", "ActiveState") == "active",
        || service.journal(),
    );
}

#[test]
fn logs_carry_syslog_priorities_when_stderr_is_the_journal() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).expect("stderr file");
    let metadata = file.metadata().expect("its metadata");
    let config = dir.path().join("fleet.conf");
    std::fs::write(
        &config,
        format!(
            "machine_id = 10910910900000000000000000000001\nstate_dir = {0}/state\napi_listen = unix://{0}/fleet.sock\nunit_manager = native\n",
            dir.path().display()
        ),
    )
    .expect("fleet.conf");
    let mut fleetd = Command::new(binary("fleetd"))
        .args(["-config", &config.display().to_string()])
        .env("JOURNAL_STREAM", format!("{}:{}", metadata.dev(), metadata.ino()))
        .stderr(file)
        .spawn()
        .expect("start fleetd");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    poll_until("fleetd logs that it started", WAIT, || read().contains("starting"), read);
    let _ = fleetd.kill();
    let _ = fleetd.wait();
    let text = read();
    assert!(text.lines().all(|line| line.starts_with('<')), "{text}");
    assert!(text.lines().any(|line| line.starts_with("<6>") && line.contains("fleetd")), "{text}");
    assert!(!text.contains("\u{1b}["), "no colours in the journal: {text}");
}
