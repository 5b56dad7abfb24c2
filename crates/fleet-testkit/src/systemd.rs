//! A real systemd user instance for tests, in a private mount namespace (design.md §6):
//! a tmpfs on `/run/systemd` carries the "booted with systemd" marker and journald's sockets,
//! a session dbus-daemon listens in a temporary `XDG_RUNTIME_DIR`, and
//! `/usr/lib/systemd/systemd --user` runs on that bus. Processes join the namespace with
//! `nsenter`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SYSTEMD: &str = "/usr/lib/systemd/systemd";
const JOURNALD: &str = "/lib/systemd/systemd-journald";

pub struct SystemdUser {
    runtime: tempfile::TempDir,
    /// The namespace's first process, which becomes the systemd user instance.
    systemd: Child,
}

/// The shell that builds the namespace's contents and becomes systemd.
fn setup_script(runtime: &Path) -> String {
    let runtime = runtime.display();
    format!(
        "set -e
# A cgroup of its own, so two instances never share unit cgroups (stopping one instance's
# hello.service must not kill another's); a slice name, which journald skips when it finds
# the unit a message came from.
for tree in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
  if [ -f $tree/cgroup.procs ] && mkdir -p $tree/fleet-test-$$.slice; then
    echo $$ >$tree/fleet-test-$$.slice/cgroup.procs
    echo $tree/fleet-test-$$.slice >>{runtime}/cgroups
  fi
done
mount -t tmpfs tmpfs /run/systemd
mount -t tmpfs tmpfs /run/log
mkdir -p /run/systemd/system /run/systemd/journal
{JOURNALD} >{runtime}/journald.log 2>&1 &
echo $! >{runtime}/journald.pid
dbus-daemon --session --address=unix:path={runtime}/bus --fork --print-pid >{runtime}/dbus.pid
export XDG_RUNTIME_DIR={runtime} DBUS_SESSION_BUS_ADDRESS=unix:path={runtime}/bus
exec {SYSTEMD} --user >{runtime}/systemd.log 2>&1"
    )
}

impl SystemdUser {
    /// Starts the instance and waits until `systemctl --user` answers. Panics with the
    /// instance's log when it cannot start (tests that need it must not pass without it).
    pub fn start() -> Self {
        assert!(Path::new(SYSTEMD).exists(), "{SYSTEMD} is missing: install the systemd package");
        let runtime = tempfile::Builder::new().prefix("fleet-systemd-").tempdir().expect("runtime directory");
        std::fs::create_dir_all("/run/log").expect("/run/log");
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "sh", "-c", &setup_script(runtime.path())])
            .stdin(Stdio::null());
        // SAFETY: prctl is async-signal-safe; it only asks for SIGKILL when the test dies.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let systemd = command.spawn().expect("starting unshare");
        let instance = Self { runtime, systemd };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let state = instance.systemctl(&["is-system-running"]);
            let said = String::from_utf8_lossy(&state.stdout).trim().to_string();
            if said == "running" || said == "degraded" {
                return instance;
            }
            assert!(Instant::now() < deadline, "systemd --user did not start ({said}); log:\n{}", instance.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The PID of the systemd user instance.
    pub fn pid(&self) -> u32 {
        self.systemd.id()
    }

    pub fn runtime_dir(&self) -> &Path {
        self.runtime.path()
    }

    pub fn bus_address(&self) -> String {
        format!("unix:path={}/bus", self.runtime.path().display())
    }

    /// What a process needs to reach this instance.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("XDG_RUNTIME_DIR".into(), self.runtime.path().display().to_string()),
            ("DBUS_SESSION_BUS_ADDRESS".into(), self.bus_address()),
        ]
    }

    /// `nsenter` arguments that run a program in the instance's mount namespace.
    pub fn enter_prefix(&self) -> Vec<String> {
        vec!["nsenter".into(), format!("--target={}", self.pid()), "--mount".into(), "--".into()]
    }

    /// A command for `program` inside the namespace, with the instance's environment.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let prefix = self.enter_prefix();
        let mut command = Command::new(&prefix[0]);
        command.args(&prefix[1..]).arg(program.as_ref()).envs(self.env());
        command
    }

    /// Runs `systemctl --user` with `args`.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        self.command("systemctl").arg("--user").args(args).output().expect("running systemctl")
    }

    /// One property of a unit as systemd itself reports it (`systemctl --user show`).
    pub fn show(&self, unit: &str, property: &str) -> String {
        let output = self.systemctl(&["show", unit, "--property", property, "--value"]);
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The instance's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.runtime.path().join("systemd.log")).unwrap_or_default()
    }

    fn pid_in(&self, file: &str) -> Option<i32> {
        std::fs::read_to_string(self.runtime.path().join(file)).ok()?.trim().parse().ok()
    }

    fn dbus_pid(&self) -> Option<i32> {
        self.pid_in("dbus.pid")
    }

    /// Restarts the session bus: every D-Bus client loses its connection. When the instance
    /// runs the bus itself (`dbus.service`, from dbus-user-session), that unit is restarted
    /// and systemd reconnects on its own; otherwise the harness's dbus-daemon is replaced on
    /// the same address and systemd is told to reconnect (SIGUSR1).
    pub fn restart_bus(&self) {
        let own_bus =
            String::from_utf8_lossy(&self.systemctl(&["is-active", "dbus.service"]).stdout).trim() == "active";
        if own_bus {
            let restarted = self.systemctl(&["restart", "dbus.service"]);
            assert!(restarted.status.success(), "restarting dbus.service: {restarted:?}");
            return;
        }
        if let Some(pid) = self.dbus_pid() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let socket = self.runtime.path().join("bus");
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.dbus_pid().is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            assert!(Instant::now() < deadline, "dbus-daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&socket);
        let pid_file = std::fs::File::create(self.runtime.path().join("dbus.pid")).expect("dbus.pid");
        let status = self
            .command("dbus-daemon")
            .args(["--session", &format!("--address=unix:path={}", socket.display()), "--fork", "--print-pid"])
            .stdout(pid_file)
            .status()
            .expect("starting dbus-daemon");
        assert!(status.success(), "dbus-daemon did not start again");
        // SAFETY: as above.
        unsafe { libc::kill(self.pid() as i32, libc::SIGUSR1) };
    }

    /// The unit files directory a test fleetd should use: inside the runtime directory.
    pub fn units_directory(&self) -> PathBuf {
        self.runtime.path().join("fleet-units")
    }
}

impl Drop for SystemdUser {
    fn drop(&mut self) {
        // systemd stops its units on SIGTERM; then everything in the namespace goes.
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.systemd.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.systemd.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.systemd.kill();
        let _ = self.systemd.wait();
        for pid in [self.dbus_pid(), self.pid_in("journald.pid")].into_iter().flatten() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Remove the instance's cgroups, innermost first (best effort: the kernel refuses
        // while a process is still leaving).
        let roots = std::fs::read_to_string(self.runtime.path().join("cgroups")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(3);
        for root in roots.lines().map(Path::new) {
            remove_cgroup_tree(root);
            while root.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                remove_cgroup_tree(root);
            }
        }
    }
}

/// Removes a cgroup directory and the cgroups below it.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
