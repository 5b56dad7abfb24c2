//! Health on a real fleetd (embedded store, native supervisor): instances of a template serve
//! HTTP on their own port (`health-server PORT STATUS`) and declare an HTTP health check. They
//! are reported healthy; a rollout of a version that answers 500 is stopped at its canary and
//! reverted by itself, touching one unit; a version that works is promoted after its bake and
//! completes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fleet_e2e::{Fleetd, binary, unit_processes};
use fleet_testkit::free_port;

const WAIT: Duration = Duration::from_secs(90);

/// The template answering `status`, checked every second (one result flips it).
fn template(dir: &Path, status: u16) -> String {
    let server = binary("health-server");
    let text = format!(
        "[Service]\nExecStart={} %i {status}\n[X-Fleet]\nHealthCheck=http://127.0.0.1:%i/health\nHealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n",
        server.display()
    );
    std::fs::write(dir.join("web@.service"), text).expect("write the template");
    dir.join("web@.service").display().to_string()
}

/// The (port, status) of every health server the supervisor runs.
fn serving(state_dir: &Path) -> BTreeSet<(String, String)> {
    unit_processes(state_dir)
        .into_iter()
        .filter_map(|pid| {
            let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let arguments: Vec<String> =
                command.split(|byte| *byte == 0).map(|part| String::from_utf8_lossy(part).into_owned()).collect();
            Some((arguments.get(1)?.clone(), arguments.get(2)?.clone()))
        })
        .collect()
}

fn all_serve(state_dir: &Path, ports: &[u16], status: &str) -> bool {
    let serving = serving(state_dir);
    ports.iter().all(|port| serving.contains(&(port.to_string(), status.to_string())))
        && serving.iter().all(|(_, serves)| serves == status)
}

fn healths(fleet: &Fleetd) -> Vec<String> {
    let listed = fleet.ok(&["list-units", "--no-legend", "--fields", "unit,health"]).stdout;
    listed.lines().map(|line| line.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")).collect()
}

/// Counts, every 100 ms until stopped, the most units seen serving `status` at once.
struct Sampler {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(state_dir: PathBuf, status: &'static str) -> Self {
        let (stop, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let thread = {
            let (stop, most) = (stop.clone(), most.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let count = serving(&state_dir).iter().filter(|(_, serves)| serves == status).count();
                    most.fetch_max(count, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self { stop, most, thread }
    }

    fn finish(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        self.most.load(Ordering::SeqCst)
    }
}

#[test]
fn a_failing_version_is_stopped_at_its_canary_and_reverted_and_a_good_one_completes() {
    let fleet = Fleetd::start("e2e0health000001", &[]);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("a dir")).collect();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let first = template(dirs[0].path(), 200);
    let instances: Vec<String> =
        ports.iter().map(|port| dirs[0].path().join(format!("web@{port}.service")).display().to_string()).collect();
    let mut start = vec!["start", "--no-block"];
    start.extend(instances.iter().map(String::as_str));
    fleet.ok(&start);
    fleet.ok(&["submit", &first]);
    fleet.wait_until("every instance is reported healthy", WAIT, |fleet| {
        let healths = healths(fleet);
        healths.len() == ports.len() && healths.iter().all(|health| health == "healthy")
    });
    let status = fleet.fleetctl(&["status", &format!("web@{}.service", ports[0])]).stdout;
    assert!(status.contains("Health: healthy"), "{status}");

    // A version whose health endpoint fails: its canary never becomes healthy, the gate fails
    // at the deadline, and the rollout undoes itself.
    let bad = template(dirs[1].path(), 500);
    let sampler = Sampler::start(fleet.state_dir(), "500");
    fleet.ok(&[
        "rollout",
        "start",
        "--max-unavailable",
        "2",
        "--min-ready",
        "1s",
        "--deadline",
        "6s",
        "--canary",
        "1",
        "--bake",
        "3s",
        "--auto-revert",
        &bad,
    ]);
    let waited = fleet.fleetctl(&["rollout", "status", "--wait", "web"]);
    assert_eq!(waited.code, 1, "a reverted rollout settles as a failure: {waited:?}");
    assert!(waited.stdout.contains("State:           reverted"), "{waited:?}");
    assert!(
        waited.stdout.contains("was still unhealthy on its new content after 6s: HTTP 500"),
        "the gate that failed is recorded: {waited:?}"
    );
    fleet.wait_until("every instance runs the old version again", WAIT, |_| {
        all_serve(&fleet.state_dir(), &ports, "200")
    });
    assert_eq!(sampler.finish(), 1, "only the canary ever ran the bad version");
    fleet.wait_until("every instance is healthy again", WAIT, |fleet| healths(fleet).iter().all(|h| h == "healthy"));

    // A version that works: the canary bakes, the rest follow by themselves.
    let good = template(dirs[2].path(), 204);
    fleet.ok(&[
        "rollout",
        "start",
        "--max-unavailable",
        "2",
        "--min-ready",
        "1s",
        "--canary",
        "1",
        "--bake",
        "2s",
        &good,
    ]);
    let waited = fleet.fleetctl(&["rollout", "status", "--wait", "web"]);
    assert_eq!(waited.code, 0, "{waited:?}");
    assert!(waited.stdout.contains("State:           done") && waited.stdout.contains("promoted"), "{waited:?}");
    assert!(all_serve(&fleet.state_dir(), &ports, "204"), "every instance runs the new version");
}
