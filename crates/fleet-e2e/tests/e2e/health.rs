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
    // Issue 68: the wait said nothing while it waited, and a reverted rollout read "3/3 done".
    assert!(waited.stderr.lines().all(|line| line.starts_with("Rollout web: ")), "progress as it goes: {waited:?}");
    assert!(waited.stderr.contains("Rollout web: reverted (4/4 back on their old content"), "{waited:?}");
    assert!(waited.stdout.contains("Units:           4/4 back on their old content"), "{waited:?}");
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

/// A `health-server` the test runs itself (not a unit), killed when dropped.
struct Server(std::process::Child);

impl Server {
    fn start(port: u16, status: &str) -> Self {
        let child = std::process::Command::new(binary("health-server"))
            .args([port.to_string(), status.to_string()])
            .spawn()
            .expect("start health-server");
        Self(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Regression (issue 68): two instances of one template on one machine were probed through
/// the check of whichever was followed first, so one that failed its check was reported and
/// gated as healthy. Here both listen (a TCP check passes for both); their new content checks
/// over HTTP, which only the first instance answers with 200: the rollout stops at the second,
/// naming it and its own port, and each is reported with its own health.
#[test]
fn two_instances_on_one_machine_are_each_reported_and_gated_on_their_own_health() {
    let fleet = Fleetd::start("e2e0health000002", &[]);
    let dir = tempfile::tempdir().expect("a dir");
    // The instance that stays healthy goes first in the rollout (instances go in name order).
    let (mut good, mut bad) = (free_port(), free_port());
    if bad.to_string() < good.to_string() {
        std::mem::swap(&mut good, &mut bad);
    }
    let _servers = [Server::start(good, "200"), Server::start(bad, "500")];
    let version = |name: &str, check: &str| {
        let path = dir.path().join(name).join("chk@.service");
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a dir");
        let text = format!(
            "[Service]\nExecStart=/bin/sleep 100000\n[X-Fleet]\nHealthCheck={check}\nHealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n"
        );
        std::fs::write(&path, text).expect("write the template");
        path.display().to_string()
    };
    let first = version("tcp", "tcp://127.0.0.1:%i");
    let (good_unit, bad_unit) = (format!("chk@{good}.service"), format!("chk@{bad}.service"));
    fleet.ok(&["submit", &first]);
    fleet.ok(&["start", "--no-block", &good_unit, &bad_unit]);
    fleet.wait_until("both instances are reported healthy", WAIT, |fleet| healths(fleet) == ["healthy", "healthy"]);

    let second = version("http", "http://127.0.0.1:%i/health");
    fleet.ok(&["rollout", "start", "--max-unavailable", "1", "--min-ready", "1s", "--deadline", "6s", &second]);
    let waited = fleet.fleetctl(&["rollout", "status", "--wait", "chk"]);
    assert_eq!(waited.code, 1, "the second instance fails its gate: {waited:?}");
    assert!(waited.stdout.contains("State:           failed"), "{waited:?}");
    let why = waited.stdout.lines().find(|line| line.starts_with("Why:")).unwrap_or_default().to_string();
    assert!(why.contains(&bad_unit) && why.contains("HTTP 500"), "the failing instance is named: {waited:?}");
    let listed = fleet.ok(&["list-units", "--no-legend", "--fields", "unit,health"]).stdout;
    let health_of = |unit: &str| {
        let line = listed.lines().find(|line| line.split_whitespace().next() == Some(unit));
        line.and_then(|line| line.split_whitespace().nth(1)).map(str::to_string)
    };
    assert_eq!(health_of(&good_unit).as_deref(), Some("healthy"), "{listed}");
    assert_eq!(health_of(&bad_unit).as_deref(), Some("unhealthy:"), "with why: {listed}");
}

/// The `Attempted:` line of `source status`: when its last sync ran.
fn attempted(status: &str) -> String {
    status.lines().find(|line| line.starts_with("Attempted:")).unwrap_or_default().to_string()
}

/// Regression (issue 68): a source with auto-revert rolled the same bad commit out again two
/// seconds after each revert, forever. Now the source halts on the commit its rollout
/// reverted, says so, and rolls nothing out until a forced sync (which tries the same commit
/// once more) or a new commit.
#[test]
fn a_sources_reverted_commit_stays_reverted_until_forced_or_replaced() {
    use fleet_testkit::GitRepo;
    let fleet = Fleetd::start("e2e0health000003", &[]);
    let ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let server = binary("health-server");
    let version = |status: u16| {
        format!(
            "[Service]\nExecStart={} %i {status}\n[X-Fleet]\nHealthCheck=http://127.0.0.1:%i/health\nHealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n",
            server.display()
        )
    };
    let desired = format!("web@{}.service = launched\nweb@{}.service = launched\n", ports[0], ports[1]);
    let repo = GitRepo::new();
    repo.commit(&[("web@.service", Some(&version(200))), ("fleet-desired.conf", Some(&desired))], "v1");
    let url = repo.url();
    let add = format!(
        "source add --repo {url} --interval 1s --max-unavailable 1 --min-ready 1s --deadline 5s --auto-revert web"
    );
    let add: Vec<&str> = add.split_whitespace().collect();
    fleet.ok(&add);
    fleet.wait_until("the instances serve version 1", WAIT, |_| all_serve(&fleet.state_dir(), &ports, "200"));

    let bad = repo.commit(&[("web@.service", Some(&version(500)))], "v2: broken");
    fleet.wait_until("the source rolls v2 out", WAIT, |fleet| {
        fleet.fleetctl(&["rollout", "status", "source-web"]).code == 0
    });
    let waited = fleet.fleetctl(&["rollout", "status", "--wait", "source-web"]);
    assert_eq!(waited.code, 1, "a reverted rollout is a failure: {waited:?}");
    assert!(waited.stdout.contains("State:           reverted"), "{waited:?}");
    assert!(waited.stdout.contains("HTTP 500"), "the gate that failed is named: {waited:?}");
    fleet.wait_until("the instances serve version 1 again", WAIT, |_| all_serve(&fleet.state_dir(), &ports, "200"));
    let halted = |fleet: &Fleetd| {
        let status = fleet.ok(&["source", "status", "web"]).stdout;
        (status.contains("State:     halted") && status.contains(&format!("halted on commit {}", &bad[..12])))
            .then_some(status)
    };
    let mut first = None;
    fleet.wait_until("the source says it halted on v2", WAIT, |fleet| {
        first = halted(fleet);
        first.is_some()
    });
    let first = first.unwrap_or_default();
    assert!(first.contains("source sync --force web"), "it says how to go on: {first}");
    // Later syncs find the same commit and leave the reverted rollout as it is.
    fleet.wait_until("the source syncs again", WAIT, |fleet| {
        halted(fleet).is_some_and(|status| attempted(&status) != attempted(&first))
    });
    let after = fleet.ok(&["rollout", "status", "source-web"]).stdout;
    assert!(after.contains("State:           reverted"), "still reverted after later syncs: {after}");
    // The source's name stands for its rollout (issue 68: `rollout status web` was "not found"),
    // and the rollout reads as JSON too.
    let by_source = fleet.ok(&["rollout", "status", "-o", "json", "web"]);
    let json: serde_json::Value = serde_json::from_str(&by_source.stdout).expect("JSON");
    assert_eq!(
        (json["name"].as_str(), json["state"].as_str()),
        (Some("source-web"), Some("reverted")),
        "{by_source:?}"
    );
    assert!(by_source.stderr.contains("Rollout source-web (of source web)"), "{by_source:?}");
    assert!(all_serve(&fleet.state_dir(), &ports, "200"), "no unit runs v2 again");

    // A forced sync rolls the same commit out once more: it fails again and halts again.
    fleet.ok(&["source", "sync", "--force", "web"]);
    fleet.wait_until("v2 runs again after the forced sync", WAIT, |_| {
        serving(&fleet.state_dir()).iter().any(|(_, status)| status == "500")
    });
    fleet.wait_until("the source halts on v2 again", WAIT, |fleet| {
        halted(fleet).is_some() && all_serve(&fleet.state_dir(), &ports, "200")
    });

    // A new commit ends the halt and goes out.
    repo.commit(&[("web@.service", Some(&version(204)))], "v3: fixed");
    fleet.wait_until("v3 reaches every instance", WAIT, |_| all_serve(&fleet.state_dir(), &ports, "204"));
    let waited = fleet.fleetctl(&["rollout", "status", "--wait", "source-web"]);
    assert_eq!(waited.code, 0, "{waited:?}");
    let status = fleet.ok(&["source", "status", "web"]).stdout;
    assert!(!status.contains("Halted:"), "{status}");
}
