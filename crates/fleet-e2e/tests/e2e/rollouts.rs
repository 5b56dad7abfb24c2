//! Rollouts on real fleetds and etcd: twelve instances of a template get new content two at
//! a time (sampled from the machines' processes, never more than two down); a bad version
//! pauses the rollout with at most two units affected and undo brings the old content back;
//! a rollout whose engine leader dies is finished by the next one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_e2e::{Cluster, Fleetd, unit_processes};

const INSTANCES: usize = 12;
const WAIT: Duration = Duration::from_secs(120);

/// The template at `version`: instance i runs `sleep <version>0000<i>`, so its process says
/// which instance and which version it is.
fn template(dir: &std::path::Path, version: u32, exec: Option<&str>) -> String {
    let exec = exec.map_or(format!("/bin/sleep {version}0000%i"), str::to_string);
    std::fs::write(dir.join("web@.service"), format!("[Service]\nExecStart={exec}\n")).expect("write the template");
    dir.join("web@.service").display().to_string()
}

/// The `sleep` arguments running under each member.
fn running(state_dirs: &[PathBuf]) -> BTreeSet<String> {
    state_dirs
        .iter()
        .flat_map(|dir| unit_processes(dir))
        .filter_map(|pid| {
            let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let arguments: Vec<&[u8]> = command.split(|byte| *byte == 0).collect();
            Some(String::from_utf8_lossy(arguments.get(1)?).into_owned())
        })
        .collect()
}

/// How many of the twelve instances run some version among `versions`.
fn up(running: &BTreeSet<String>, versions: &[u32]) -> usize {
    up_of(running, versions, INSTANCES)
}

/// How many of instances `1..=count` run some version among `versions`.
fn up_of(running: &BTreeSet<String>, versions: &[u32], count: usize) -> usize {
    (1..=count).filter(|i| versions.iter().any(|version| running.contains(&format!("{version}0000{i}")))).count()
}

fn rollout_state(fleet: &Fleetd, name: &str) -> String {
    fleet.ok(&["rollout", "status", name]).stdout
}

/// Samples the machines every 100 ms until stopped; the most instances seen down at once.
struct Sampler {
    stop: Arc<AtomicBool>,
    worst: Arc<Mutex<usize>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Samples instances `1..=count`, counting one as up when it runs any of `versions`.
    fn start(state_dirs: Vec<PathBuf>, versions: Vec<u32>, count: usize) -> Self {
        let (stop, worst) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(0)));
        let thread = {
            let (stop, worst) = (stop.clone(), worst.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let down = count - up_of(&running(&state_dirs), &versions, count);
                    if let Ok(mut worst) = worst.lock() {
                        *worst = (*worst).max(down);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self { stop, worst, thread: Some(thread) }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.worst.lock().map(|worst| *worst).unwrap_or(usize::MAX)
    }
}

#[test]
fn waves_of_two_a_bad_version_paused_and_undone_and_a_new_leader_finishing() {
    let mut cluster = Cluster::start(3, |_| vec![("unit_manager".into(), "native".into())]);
    let dirs: Vec<PathBuf> = (0..4).map(|_| tempfile::tempdir().expect("a dir").keep()).collect();
    let first = template(&dirs[0], 1, None);
    let instances: Vec<String> =
        (1..=INSTANCES).map(|i| dirs[0].join(format!("web@{i}.service")).display().to_string()).collect();
    let mut start = vec!["start", "--no-block"];
    start.extend(instances.iter().map(String::as_str));
    cluster.any().ok(&start);
    cluster.any().ok(&["submit", &first]);
    let state_dirs: Vec<PathBuf> = cluster.members.iter().map(Fleetd::state_dir).collect();
    cluster.any().wait_until("the twelve instances run", WAIT, |_| up(&running(&state_dirs), &[1]) == INSTANCES);

    // Version 2, two at a time, each wave after the last stayed active for a second.
    let second = template(&dirs[1], 2, None);
    let sampler = Sampler::start(state_dirs.clone(), vec![1, 2], INSTANCES);
    cluster.any().ok(&["rollout", "start", "--max-unavailable", "2", "--min-ready", "1s", &second]);
    cluster
        .any()
        .wait_until("the rollout is done", WAIT, |fleet| rollout_state(fleet, "web").contains("State:           done"));
    let worst = sampler.finish();
    assert!(worst <= 2, "{worst} instances were down at once (max-unavailable 2)");
    assert_eq!(up(&running(&state_dirs), &[2]), INSTANCES, "every instance runs version 2");

    // A version that cannot start: the rollout pauses on it, having touched at most two.
    let bad = template(&dirs[2], 3, Some("/bin/false"));
    cluster.any().ok(&["rollout", "start", "--max-unavailable", "2", "--min-ready", "1s", "--deadline", "20s", &bad]);
    // `rollout status --wait` blocks until the rollout settles, and fails for a paused one.
    let waited = cluster.any().fleetctl(&["rollout", "status", "--wait", "web"]);
    assert_eq!(waited.code, 1, "{waited:?}");
    assert!(waited.stdout.contains("State:           failed") && waited.stdout.contains("Why:"), "{waited:?}");
    cluster.any().wait_until("the bad rollout pauses, failed", WAIT, |fleet| {
        rollout_state(fleet, "web").contains("State:           failed")
    });
    let status = rollout_state(cluster.any(), "web");
    assert!(status.contains("Why:             web@"), "the reason names the unit: {status}");
    let touched = status
        .lines()
        .filter(|line| line.starts_with("web@"))
        .filter(|line| line.split_whitespace().nth(1).is_some_and(|step| step != "waiting"))
        .count();
    assert!(touched <= 2, "at most two units affected: {status}");
    assert!(up(&running(&state_dirs), &[2]) >= INSTANCES - 2, "the others still run version 2");
    cluster.any().ok(&["rollout", "undo", "web"]);
    let waited = cluster.any().fleetctl(&["rollout", "status", "--wait", "web"]);
    assert_eq!(waited.code, 0, "the undo finishes: {waited:?}");
    cluster.any().wait_until("undo brings version 2 back", WAIT, |fleet| {
        rollout_state(fleet, "web").contains("State:           undone") && up(&running(&state_dirs), &[2]) == INSTANCES
    });

    // Version 4 with the engine leader killed once the first wave is under way.
    let fourth = template(&dirs[3], 4, None);
    cluster.any().ok(&["rollout", "start", "--max-unavailable", "2", "--min-ready", "2s", &fourth]);
    cluster.any().wait_until("the first wave is under way", WAIT, |_| up(&running(&state_dirs), &[4]) >= 1);
    let leader = cluster.leader().expect("a leader");
    cluster.members[leader].stop_with(libc::SIGKILL);
    let survivors: Vec<PathBuf> =
        cluster.members.iter().filter(|member| member.is_running()).map(Fleetd::state_dir).collect();
    cluster.any().wait_until("the next leader finishes the rollout", WAIT, |fleet| {
        rollout_state(fleet, "web").contains("State:           done") && up(&running(&survivors), &[4]) == INSTANCES
    });
    let listed = cluster.any().ok(&["rollout", "list", "--no-legend"]).stdout;
    assert!(listed.contains("web") && listed.contains("12/12 done"), "{listed}");
}

#[test]
fn a_sources_new_content_reaches_its_running_units_in_waves() {
    use fleet_testkit::GitRepo;
    let cluster = Cluster::start(3, |_| vec![("unit_manager".into(), "native".into())]);
    let fleet = cluster.any();
    let repo = GitRepo::new();
    let desired = "web@{1..4}.service = launched\n";
    repo.commit(
        &[("web@.service", Some("[Service]\nExecStart=/bin/sleep 50000%i\n")), ("fleet-desired.conf", Some(desired))],
        "v5",
    );
    let url = repo.url();
    fleet.ok(&[
        "source",
        "add",
        "--repo",
        &url,
        "--interval",
        "1s",
        "--max-unavailable",
        "1",
        "--min-ready",
        "1s",
        "apps",
    ]);
    let state_dirs: Vec<PathBuf> = cluster.members.iter().map(Fleetd::state_dir).collect();
    let runs = |version: u32| up_of(&running(&state_dirs), &[version], 4);
    fleet.wait_until("the instances run version 5", WAIT, |_| runs(5) == 4);
    let sampler = Sampler::start(state_dirs.clone(), vec![5, 6], 4);
    repo.commit(&[("web@.service", Some("[Service]\nExecStart=/bin/sleep 60000%i\n"))], "v6");
    fleet.wait_until("the source's rollout finishes", WAIT, |fleet| {
        fleet.fleetctl(&["rollout", "status", "source-apps"]).stdout.contains("State:           done") && runs(6) == 4
    });
    let worst = sampler.finish();
    assert!(worst <= 1, "{worst} instances were down at once (max-unavailable 1)");
    // The source synced every second meanwhile: the rollout kept every unit it touched.
    let status = fleet.ok(&["rollout", "status", "source-apps"]).stdout;
    for instance in 1..=4 {
        assert!(status.contains(&format!("web@{instance}.service")), "web@{instance} kept:\n{status}");
    }
    // With no canary, the rollout went machine by machine: it lists each machine's units side
    // by side (four instances on three machines: one holds two).
    let listed = fleet.ok(&["list-units", "--no-legend", "--fields", "unit,machine"]).stdout;
    let machine_of: BTreeMap<&str, &str> = listed
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?, fields.next()?))
        })
        .collect();
    let order: Vec<&str> = status
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|unit| unit.starts_with("web@"))
        .collect();
    let mut left = BTreeSet::new();
    for (unit, next) in order.iter().zip(order.iter().skip(1)) {
        let (machine, next_machine) = (machine_of[unit], machine_of[next]);
        if machine != next_machine {
            left.insert(machine);
        }
        assert!(!left.contains(next_machine), "{next} is apart from its machine's other units:\n{status}\n{listed}");
    }
}

#[test]
fn start_replace_with_max_unavailable_gives_running_units_new_content_in_waves() {
    const COUNT: usize = 6;
    let cluster = Cluster::start(3, |_| vec![("unit_manager".into(), "native".into())]);
    let (old, new) = (tempfile::tempdir().expect("a dir"), tempfile::tempdir().expect("a dir"));
    template(old.path(), 5, None);
    template(new.path(), 6, None);
    let instances = |dir: &std::path::Path| -> Vec<String> {
        (1..=COUNT).map(|i| dir.join(format!("web@{i}.service")).display().to_string()).collect()
    };
    let mut start = vec!["start".to_string(), "--no-block".to_string()];
    start.extend(instances(old.path()));
    cluster.any().ok(&start.iter().map(String::as_str).collect::<Vec<_>>());
    let state_dirs: Vec<PathBuf> = cluster.members.iter().map(Fleetd::state_dir).collect();
    cluster.any().wait_until("the instances run", WAIT, |_| up_of(&running(&state_dirs), &[5], COUNT) == COUNT);

    let sampler = Sampler::start(state_dirs.clone(), vec![5, 6], COUNT);
    let mut replace: Vec<String> =
        ["start", "--replace", "--max-unavailable", "1", "--min-ready", "1s"].map(str::to_string).to_vec();
    replace.extend(instances(new.path()));
    let ran = cluster.any().ok(&replace.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ran.stderr.contains("Rollout replace-") && ran.stderr.contains("6 running units"), "{ran:?}");
    // Like a plain start, it blocks: it returned once the rollout was done.
    let listed = cluster.any().ok(&["rollout", "list", "--no-legend"]).stdout;
    assert!(listed.contains("6/6 done"), "{listed}");
    cluster.any().wait_until("every instance runs the new content", WAIT, |_| {
        up_of(&running(&state_dirs), &[6], COUNT) == COUNT
    });
    let worst = sampler.finish();
    assert!(worst <= 1, "{worst} instances were down at once (max-unavailable 1)");
    let listed = cluster.any().ok(&["rollout", "list", "--no-legend"]).stdout;
    assert!(listed.contains("replace-"), "{listed}");
}
