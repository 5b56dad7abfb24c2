//! Benchmark: a rolling upgrade of a three-member etcd cluster, member by member, while units
//! are submitted. Each member runs its units under a real systemd (a user instance each) and
//! runs fleetd from a copy of the previous release's binary; the upgrade puts the current
//! binary in its place as a package does (a new file renamed over it) and sends SIGUSR2. A
//! release that upgrades in place replaces itself; one that does not (0.1.0 has no SIGUSR2
//! handler and dies of it, its units and lease left behind) is started again on the new
//! binary, as systemd's `Restart=always` would. Throughout, every member's API is asked
//! `GET /fleet/v1/machines` every 100 ms.
//!
//! Prints: units restarted (systemd's MainPID or ActiveEnterTimestamp changed) and lost (not
//! running at the end), each member's longest time without an answer, the polls no member
//! answered, and how long each member took to come back.
//!
//! Run: `cargo build --workspace --bins && target/debug/bench-upgrade [FROM_FLEETD] [UNITS] [BURST]`
//! (FROM_FLEETD: the previous release's fleetd; default the workspace's own, which CI runs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fleet_e2e::{EtcdServer, Fleetd, Launcher, SystemdUser, binary, install_binary, socket_answers};

const MEMBERS: usize = 3;
const WAIT: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(100);

struct Member {
    systemd: SystemdUser,
    fleet: Fleetd,
    /// The copy of fleetd it runs, which the upgrade replaces.
    installed: PathBuf,
    _bin: tempfile::TempDir,
}

/// What a unit looked like under systemd: its main process and when it became active.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Running {
    main_pid: String,
    since: String,
}

/// The `up@N` units each systemd runs, with their main process and start.
fn running_units(members: &[Member]) -> BTreeMap<String, Running> {
    let mut units = BTreeMap::new();
    for member in members {
        let listed = member.systemd.systemctl(&["list-units", "--no-legend", "--plain", "--state=running", "up@*"]);
        for line in String::from_utf8_lossy(&listed.stdout).lines() {
            let Some(name) = line.split_whitespace().next() else { continue };
            let show = member.systemd.systemctl(&["show", name, "--property=MainPID,ActiveEnterTimestamp"]);
            let text = String::from_utf8_lossy(&show.stdout).into_owned();
            let value = |key: &str| {
                text.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix('=')).unwrap_or("").to_string()
            };
            units
                .insert(name.to_string(), Running { main_pid: value("MainPID"), since: value("ActiveEnterTimestamp") });
        }
    }
    units
}

fn wait_for_running(members: &[Member], count: usize, what: &str) -> BTreeMap<String, Running> {
    let deadline = Instant::now() + WAIT;
    loop {
        let running = running_units(members);
        if running.len() >= count {
            return running;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = members.iter().map(|member| member.fleet.log()).collect();
            panic!("{what}: {} of {count} units running; logs:\n{}", running.len(), logs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every member's API asked every [`POLL`] until `done`: per member, the longest time it
/// did not answer; and how many rounds no member answered.
fn poll_apis(sockets: Vec<PathBuf>, done: Arc<AtomicBool>) -> (Vec<Duration>, usize, usize) {
    let mut last_answer = vec![Instant::now(); sockets.len()];
    let mut longest = vec![Duration::ZERO; sockets.len()];
    let (mut rounds, mut unanswered) = (0, 0);
    while !done.load(Ordering::Relaxed) {
        let mut any = false;
        for (index, socket) in sockets.iter().enumerate() {
            if socket_answers(socket, "/fleet/v1/machines") {
                any = true;
                last_answer[index] = Instant::now();
            } else {
                longest[index] = longest[index].max(last_answer[index].elapsed());
            }
        }
        rounds += 1;
        if !any {
            unanswered += 1;
        }
        std::thread::sleep(POLL);
    }
    (longest, rounds, unanswered)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let from = args.next().map_or_else(|| binary("fleetd"), PathBuf::from);
    let units: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(30);
    let burst: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(30);
    let to = binary("fleetd");
    let new_binary = std::fs::read(&to).expect("this build's fleetd");
    let version = |program: &Path| {
        let output = std::process::Command::new(program).arg("--version").output().expect("fleetd --version");
        String::from_utf8_lossy(&output.stdout).lines().next().unwrap_or("").to_string()
    };
    println!("bench-upgrade: from {} ({}) to {} ({})", from.display(), version(&from), to.display(), version(&to));

    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|index| {
            let systemd = SystemdUser::start();
            let units_directory = systemd.units_directory().display().to_string();
            let config = [
                ("unit_manager", "systemd"),
                ("systemd_user", "true"),
                ("units_directory", units_directory.as_str()),
                ("etcd_servers", endpoint.as_str()),
            ];
            let bin = tempfile::tempdir().expect("temporary directory");
            let installed = bin.path().join("fleetd");
            install_binary(&installed, &std::fs::read(&from).expect("the previous fleetd"));
            let launcher = Launcher { prefix: systemd.enter_prefix(), env: systemd.env() };
            let fleet = Fleetd::start_from(&format!("upgrade{index}0bench000000"), &config, launcher, &installed);
            Member { systemd, fleet, installed, _bin: bin }
        })
        .collect();

    let files = tempfile::tempdir().expect("temporary directory");
    std::fs::write(files.path().join("up@.service"), "[Service]\nExecStart=/bin/sleep 100000\n").expect("unit file");
    let names: Vec<String> =
        (1..=units + burst).map(|n| files.path().join(format!("up@{n}.service")).display().to_string()).collect();
    let mut start = vec!["start", "--no-block"];
    start.extend(names[..units].iter().map(String::as_str));
    members[0].fleet.ok(&start);
    let before = wait_for_running(&members, units, "before the upgrade");
    println!("{units} units running on {MEMBERS} members");

    let done = Arc::new(AtomicBool::new(false));
    let sockets = members.iter().map(|member| member.fleet.socket()).collect();
    let poller = std::thread::spawn({
        let done = done.clone();
        move || poll_apis(sockets, done)
    });
    let per_member = burst.div_ceil(MEMBERS);
    let upgrade_started = Instant::now();
    let mut back_after = Vec::new();
    // The engine leader last: first an old leader with new members, then the other way round.
    let leader = members[0].fleet.fleetctl(&["list-machines"]).stderr;
    let mut order: Vec<usize> = (0..MEMBERS).collect();
    order.sort_by_key(|index| leader.contains(&members[*index].fleet.machine_id[..8]));
    for index in order {
        // Part of the burst goes to another member while this one is upgraded.
        let submit_to = (index + 1) % MEMBERS;
        let batch: Vec<&str> =
            names[units..].iter().skip(index * per_member).take(per_member).map(String::as_str).collect();
        let mut submit = std::process::Command::new(binary("fleetctl"));
        submit.arg(format!("--endpoint=unix://{}", members[submit_to].fleet.socket().display()));
        submit.args(["start", "--no-block"]).args(batch);
        let submitting = std::thread::spawn(move || submit.output());
        let leader = members[submit_to].fleet.fleetctl(&["list-machines"]).stderr;
        println!("member {index}: upgrading; {}", leader.trim());
        let member = &mut members[index];
        let started = Instant::now();
        install_binary(&member.installed, &new_binary);
        let pid = member.fleet.pid();
        member.fleet.signal(libc::SIGUSR2);
        let short = member.fleet.machine_id[..8].to_string();
        let deadline = started + WAIT;
        let mut relaunched = false;
        loop {
            if !relaunched && member.fleet.exited_on_its_own().is_some() {
                // A release without the upgrade in place died of the signal: systemd would
                // start the new binary.
                member.fleet.relaunch();
                relaunched = true;
            }
            // Back: the new image (or process) took the machine's lease over and answers.
            let up = member.fleet.is_running()
                && member.fleet.log().contains("taking over the machine lease")
                && member.fleet.fleetctl(&["list-machines", "--no-legend"]).stdout.contains(&short);
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "member {index} did not come back; log:\n{}", member.fleet.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        let back = started.elapsed();
        let how = if relaunched { "restarted on the new binary" } else { "replaced in place" };
        println!("member {index}: back after {:.2} s ({how}; pid {pid} -> {})", back.as_secs_f64(), member.fleet.pid());
        back_after.push(back);
        let submitted = submitting.join().expect("fleetctl start").expect("running fleetctl");
        assert!(submitted.status.success(), "{}", String::from_utf8_lossy(&submitted.stderr));
    }
    let after = wait_for_running(&members, units + burst, "after the upgrade");
    let upgrade_took = upgrade_started.elapsed();
    done.store(true, Ordering::Relaxed);
    let (longest, rounds, unanswered) = poller.join().expect("the API poller");

    let restarted: Vec<&String> = before
        .iter()
        .filter(|(name, was)| after.get(*name).is_some_and(|now| now != *was))
        .map(|(name, _)| name)
        .collect();
    let lost = units + burst - after.len();
    println!(
        "upgrade of {MEMBERS} members: {:.1} s, with {burst} units submitted meanwhile",
        upgrade_took.as_secs_f64()
    );
    println!("units restarted by the upgrade: {} of {units} {restarted:?}", restarted.len());
    println!("units lost: {lost} of {}", units + burst);
    for (index, longest) in longest.iter().enumerate() {
        println!("member {index}: longest without an API answer {} ms", longest.as_millis());
    }
    println!("API polls with no member answering: {unanswered} of {rounds}");
    assert!(restarted.is_empty() && lost == 0 && unanswered == 0, "the upgrade was not seamless");
}
