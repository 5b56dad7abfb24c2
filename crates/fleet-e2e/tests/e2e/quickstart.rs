//! The README's first command, replayed from a clean state: `scripts/quickstart.sh` starts a
//! single-machine fleet on the binaries this build made, with `examples/hello.service`
//! running, and `scripts/quickstart.sh stop` ends it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use fleet_e2e::{binary, binary_dir};

struct Demo {
    dir: tempfile::TempDir,
}

impl Demo {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/quickstart.sh")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(Self::script())
            .args(args)
            .env("FLEET_BIN_DIR", binary_dir())
            .env("FLEET_DEMO_DIR", self.dir.path())
            .output()
            .expect("run the quick start")
    }

    fn fleetctl(&self, args: &[&str]) -> Output {
        Command::new(binary("fleetctl"))
            .arg(format!("--endpoint=unix://{}", self.dir.path().join("fleet.sock").display()))
            .args(args)
            .output()
            .expect("run fleetctl")
    }

    fn pid(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("fleetd.pid")).ok().map(|pid| pid.trim().to_string())
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.run(&["stop"]);
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_quick_start_runs_hello_and_stops() {
    let demo = Demo { dir: tempfile::tempdir().expect("a demo dir") };
    let started = demo.run(&[]);
    let said = text(&started);
    assert!(started.status.success(), "{said}");
    assert!(said.contains("Unit hello.service launched"), "{said}");
    assert!(said.contains("fleet is running"), "{said}");
    wait_until("hello.service says hello", || {
        String::from_utf8_lossy(&demo.fleetctl(&["journal", "hello.service"]).stdout).contains("Hello, World!")
    });
    let pid = demo.pid().expect("fleetd's pid file");
    let stopped = demo.run(&["stop"]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    wait_until("fleetd has stopped", || !Path::new(&format!("/proc/{pid}")).exists());
}
