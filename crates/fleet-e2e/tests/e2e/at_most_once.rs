//! Units that asked to run at most once (`[X-Fleet] AtMostOnce=true`) under the faults of
//! the netns lab: a machine cut off from etcd, a frozen fleetd, a killed fleetd, and the etcd
//! leader killed. What runs is read from the machines' processes every 50 ms; such a unit
//! must never be seen on two machines, and must run once again after the fault.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fleet_e2e::lab::{Lab, lab};
use fleet_e2e::{AGENT_TTL_SECONDS, Fleetd, poll_until, unit_processes};

const AT_MOST_ONCE: &str = "[X-Fleet]\nAtMostOnce=true\n";
const SAMPLE: Duration = Duration::from_millis(50);

/// Six sleepers that asked to run at most once, running; the member that runs some, and
/// which.
fn started() -> (Lab, usize, BTreeSet<usize>) {
    let lab = lab(3);
    lab.start_sleepers_with(0, 0..6, AT_MOST_ONCE);
    let victim = 2;
    let held = lab.running()[victim].clone();
    assert!(!held.is_empty(), "least-loaded placement gave member 2 units: {:?}", lab.running());
    (lab, victim, held)
}

/// Samples until `done` holds of what runs, asserting at every sample that no sleeper runs
/// on two members; how long it took.
fn never_twice_until(lab: &Lab, what: &str, limit: Duration, done: impl Fn(&[BTreeSet<usize>]) -> bool) -> Duration {
    let began = Instant::now();
    loop {
        let running = lab.running();
        for unit in 0..6 {
            let on: Vec<usize> = (0..running.len()).filter(|member| running[*member].contains(&unit)).collect();
            assert!(on.len() <= 1, "sleeper {unit} runs on members {on:?} at once:\n{}", lab.logs());
        }
        if done(&running) {
            return began.elapsed();
        }
        assert!(began.elapsed() < limit, "{what}: not within {limit:?}: {running:?}\n{}", lab.logs());
        std::thread::sleep(SAMPLE);
    }
}

/// Whether every unit of `held` runs on a member other than `victim`.
fn moved(running: &[BTreeSet<usize>], victim: usize, held: &BTreeSet<usize>) -> bool {
    held.iter().all(|unit| (0..running.len()).any(|member| member != victim && running[member].contains(unit)))
}

const MOVE_LIMIT: Duration = Duration::from_secs(AGENT_TTL_SECONDS * 3 + 20);

#[test]
fn a_machine_cut_off_stops_them_before_they_start_elsewhere() {
    let (lab, victim, held) = started();
    let etcd_nodes: Vec<_> = lab.etcd.members.iter().collect();
    lab.net.isolate(&lab.members[victim].node, &etcd_nodes);
    let took = never_twice_until(&lab, "the cut-off machine's units run elsewhere", MOVE_LIMIT, |running| {
        moved(running, victim, &held)
    });
    println!("AtMostOnce, cut off: running elsewhere {took:?} after the cut, never on two machines");
    assert!(took >= Duration::from_secs(AGENT_TTL_SECONDS), "moved before the lease could expire: {took:?}");
    lab.net.heal_all();
    never_twice_until(&lab, "after healing each runs once", Duration::from_secs(30), |_| lab.each_runs_once(0..6));
}

#[test]
fn a_frozen_fleetd_cannot_keep_them_running_its_keeper_stops_them() {
    let (lab, victim, held) = started();
    lab.members[victim].fleetd.signal(libc::SIGSTOP);
    let took = never_twice_until(&lab, "the frozen machine's units run elsewhere", MOVE_LIMIT, |running| {
        moved(running, victim, &held)
    });
    println!("AtMostOnce, fleetd frozen: running elsewhere {took:?} after the freeze, never on two machines");
    let woke = Instant::now();
    lab.members[victim].fleetd.signal(libc::SIGCONT);
    never_twice_until(&lab, "after waking each runs once", Duration::from_secs(30), |_| lab.each_runs_once(0..6));
    // Watched a while longer: the woken fleetd starts none of what it lost.
    never_twice_until(&lab, "a few seconds after waking", Duration::from_secs(10), |_| {
        woke.elapsed() > Duration::from_secs(AGENT_TTL_SECONDS + 2)
    });
}

#[test]
fn a_killed_fleetd_takes_them_down_and_they_move() {
    let (mut lab, victim, held) = started();
    lab.members[victim].fleetd.stop_with(libc::SIGKILL);
    let took = never_twice_until(&lab, "the killed fleetd's units run elsewhere", MOVE_LIMIT, |running| {
        moved(running, victim, &held)
    });
    println!("AtMostOnce, fleetd killed: running elsewhere {took:?} after the kill, never on two machines");
    lab.members[victim].fleetd.launch();
    never_twice_until(&lab, "after the restart each runs once", Duration::from_secs(30), |_| lab.each_runs_once(0..6));
}

#[test]
fn an_etcd_election_moves_nothing_and_runs_nothing_twice() {
    let (mut lab, _, _) = started();
    let leader = lab.etcd.leader().expect("etcd has a leader");
    lab.etcd.kill(leader);
    poll_until("etcd elects a new leader", Duration::from_secs(30), || lab.etcd.leader().is_some(), || lab.logs());
    let since = Instant::now();
    never_twice_until(&lab, "ten seconds after the election", Duration::from_secs(30), |_| {
        since.elapsed() > Duration::from_secs(10)
    });
    lab.etcd.restart(leader);
    never_twice_until(&lab, "after the member is back each runs once", Duration::from_secs(30), |_| {
        lab.each_runs_once(0..6)
    });
}

/// On one machine on the embedded store the presence never lapses: such a unit just runs,
/// and the fence of the native supervisor is never in force.
#[test]
fn on_one_machine_it_runs_as_any_unit() {
    let fleet = Fleetd::start("e2e0atmostonce01", &[]);
    let dir = tempfile::tempdir().expect("scratch dir");
    let path = dir.path().join("once.service");
    std::fs::write(&path, format!("[Service]\nExecStart=/bin/sleep 600\n{AT_MOST_ONCE}")).expect("unit file");
    let started = fleet.fleetctl(&["start", &path.display().to_string()]);
    assert_eq!(started.code, 0, "{started:?}");
    assert!(started.stderr.is_empty(), "fleetctl knows the option: {started:?}");
    assert_eq!(fleet.unit_rows(), vec![("once.service".into(), "active".into(), "running".into())]);
    assert_eq!(unit_processes(&fleet.state_dir()).len(), 1);
}
