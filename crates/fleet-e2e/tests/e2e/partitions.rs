//! fleet under network faults, on a real multi-host topology on one machine: a three-member
//! etcd and three fleetds, each in its own network namespace on one bridge
//! (`fleet_e2e::netlab`). What runs is read from the machines' processes, not from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fleet_e2e::AGENT_TTL_SECONDS;
use fleet_e2e::delay_proxy::DelayProxy;
use fleet_e2e::lab::{Lab, lab, lab_with};
use fleet_e2e::lab_etcd::LabEtcd;
use fleet_e2e::lab_fleet::{LabMember, lab_member};
use fleet_e2e::netlab::NetLab;
use fleet_e2e::{member_id, metric_value, poll_until};

const PREFIX: &str = "/_coreos.com/fleet/";

const SAMPLE: Duration = Duration::from_millis(100);

#[test]
fn a_machine_cut_off_from_etcd_keeps_its_units_and_gives_up_the_moved_ones_on_healing() {
    let lab = lab(3);
    lab.start_sleepers(0, 0..6);
    let victim = 2;
    let held: BTreeSet<usize> = lab.running()[victim].clone();
    assert!(!held.is_empty(), "least-loaded placement gave member 2 units: {:?}", lab.running());
    let etcd_nodes: Vec<_> = lab.etcd.members.iter().collect();
    let before_cut = lab.etcd.revision();
    let cut = Instant::now();
    lab.net.isolate(&lab.members[victim].node, &etcd_nodes);

    // Cut off, the victim keeps its units; once its lease expired the others run them too.
    let mut elsewhere: BTreeMap<usize, Duration> = BTreeMap::new();
    while elsewhere.len() < held.len() {
        let running = lab.running();
        assert!(held.is_subset(&running[victim]), "the cut-off machine stopped a unit: {running:?}");
        for unit in &held {
            if running.iter().enumerate().any(|(index, on)| index != victim && on.contains(unit)) {
                elsewhere.entry(*unit).or_insert_with(|| cut.elapsed());
            }
        }
        assert!(
            cut.elapsed() < Duration::from_secs(AGENT_TTL_SECONDS + 20),
            "units never moved: {running:?}\n{}",
            lab.logs()
        );
        std::thread::sleep(SAMPLE);
    }
    let moved_after = elsewhere.values().max().copied().unwrap_or_default();
    // No unit was placed elsewhere before the victim's presence went with its lease (when it
    // expires depends on when it was last renewed, between agent_ttl / 2 and agent_ttl before
    // the cut: the store's history says the order, whatever the times).
    let history = lab.etcd.history(PREFIX, before_cut);
    let presence = format!("{PREFIX}machines/{}", member_id(victim));
    let gone = history.iter().find(|change| change.key == presence && change.value.is_none());
    let gone = gone.map(|change| change.revision).expect("the cut-off machine's presence expired");
    let victim_id = member_id(victim);
    let placed_elsewhere: Vec<_> = history
        .iter()
        .filter(|change| held.iter().any(|n| change.key == format!("{PREFIX}placement/sleeper-{n}.service")))
        .filter(|change| change.value.as_deref().is_some_and(|machine| machine != victim_id))
        .collect();
    assert!(placed_elsewhere.len() >= held.len(), "the store shows every held unit placed elsewhere: {history:?}");
    for change in placed_elsewhere {
        assert!(
            change.revision > gone,
            "a unit was placed elsewhere at revision {} before the cut-off machine's presence expired at {gone}: {change:?}",
            change.revision
        );
    }

    // Healed, it learns its units moved and stops them.
    std::thread::sleep(Duration::from_secs(2));
    let healed = Instant::now();
    lab.net.heal_all();
    poll_until(
        "the healed machine stops the units it lost",
        Duration::from_secs(20),
        || lab.running()[victim].is_disjoint(&held),
        || format!("{:?}\n{}", lab.running(), lab.logs()),
    );
    let stopped_after_heal = healed.elapsed();
    let double_run = healed.duration_since(cut) - moved_after + stopped_after_heal;
    println!(
        "cut-off machine: units moved {moved_after:?} after the cut (agent_ttl {AGENT_TTL_SECONDS} s); \
         stopped on the cut-off machine {stopped_after_heal:?} after healing; ran twice for {double_run:?}"
    );
    assert!(lab.each_runs_once(0..6), "every unit runs once again: {:?}", lab.running());
}

#[test]
fn a_cut_off_engine_leader_is_replaced_in_time_and_writes_nothing_after() {
    let lab = lab(3);
    lab.start_sleepers(0, 0..3);
    let all = [0, 1, 2];
    let deposed = lab.engine_leader(&all).expect("one engine leads");
    let others: Vec<usize> = all.iter().copied().filter(|index| *index != deposed).collect();
    let etcd_nodes: Vec<_> = lab.etcd.members.iter().collect();
    let before_cut = lab.etcd.revision();
    let cut = Instant::now();
    lab.net.isolate(&lab.members[deposed].node, &etcd_nodes);
    let mut successor = None;
    while successor.is_none() {
        assert!(cut.elapsed() < Duration::from_secs(15), "no engine took over:\n{}", lab.logs());
        successor = lab.engine_leader(&others);
        std::thread::sleep(SAMPLE);
    }
    let takeover = cut.elapsed();
    let successor = successor.unwrap_or_default();
    // The engine's lease lasts five reconcile intervals (2.5 s here, granted in whole seconds).
    assert!(takeover < Duration::from_secs(4), "takeover took {takeover:?}");
    // The new leader works: the cut-off machine's units move, a new one is placed.
    lab.start_sleepers(successor, 3..4);
    poll_until(
        "the deposed leader's units run elsewhere",
        Duration::from_secs(AGENT_TTL_SECONDS + 20),
        || {
            let running = lab.running();
            (0..4).all(|n| others.iter().any(|index| running[*index].contains(&n)))
        },
        || format!("{:?}\n{}", lab.running(), lab.logs()),
    );
    lab.net.heal_all();
    poll_until(
        "the deposed leader gives up the units that moved",
        Duration::from_secs(20),
        || lab.running()[deposed].is_empty(),
        || format!("{:?}\n{}", lab.running(), lab.logs()),
    );
    std::thread::sleep(Duration::from_secs(2));

    // The store's history since the cut: every engine write (placements, schedules, reasons)
    // happened while the successor held the leader key, none under the deposed leader.
    let history = lab.etcd.history(PREFIX, before_cut);
    let leader_key = format!("{PREFIX}engine/leader");
    let mut holder: Option<String> = Some(member_id(deposed));
    let mut engine_writes = 0;
    for change in &history {
        if change.key == leader_key {
            holder = change.value.clone();
            continue;
        }
        let engine_key =
            ["placement/", "reasons/"].iter().any(|kind| change.key.starts_with(&format!("{PREFIX}{kind}")));
        if engine_key {
            engine_writes += 1;
            assert_eq!(
                holder.as_deref(),
                Some(member_id(successor).as_str()),
                "an engine write at revision {} under {holder:?}: {change:?}",
                change.revision
            );
        }
    }
    assert!(engine_writes > 0, "the successor placed the moved units: {history:?}");
    println!(
        "engine leader cut off: member {successor} led {takeover:?} after the cut; {engine_writes} engine writes since, all under it"
    );
}

#[test]
fn losing_one_etcd_member_then_the_leading_member_stops_and_moves_nothing() {
    let mut lab = lab(3);
    lab.start_sleepers(0, 0..6);
    let (placed, processes) = (lab.running(), lab.processes());
    let leader = lab.etcd.leader().expect("etcd has a leader");
    let follower = (leader + 1) % 3;
    lab.etcd.kill(follower);
    lab.start_sleepers(0, 6..8);
    lab.etcd.restart(follower);
    let leader = lab.etcd.leader().expect("etcd has a leader");
    lab.etcd.kill(leader);
    poll_until(
        "the two members left elect a leader",
        Duration::from_secs(20),
        || lab.etcd.leader().is_some_and(|now| now != leader),
        String::new,
    );
    lab.start_sleepers(0, 8..10);
    lab.etcd.restart(leader);
    // Nothing that ran was stopped, restarted or moved.
    let (running, now) = (lab.running(), lab.processes());
    for (index, before) in placed.iter().enumerate() {
        assert!(before.is_subset(&running[index]), "member {index} lost units: {placed:?} → {running:?}");
        assert!(processes[index].is_subset(&now[index]), "member {index}'s unit processes changed");
    }
    assert!(lab.each_runs_once(0..10), "{running:?}");
}

#[test]
fn a_minority_partition_of_etcd_stops_no_unit_on_its_side() {
    let lab = lab(3);
    lab.start_sleepers(0, 0..6);
    let (minority_member, minority_etcd) = (2, 2);
    let held = lab.running()[minority_member].clone();
    let minority_processes = lab.processes()[minority_member].clone();
    // etcd member 3 alone on one side, with fleetd member 2 that reaches only it.
    let majority: Vec<_> = lab.etcd.members.iter().take(2).collect();
    lab.net.isolate(&lab.etcd.members[minority_etcd], &majority);
    lab.net.isolate(&lab.members[minority_member].node, &majority);
    let cut = Instant::now();
    // Watched for at least agent_ttl and a margin, and until the majority runs the minority
    // machine's units (how soon depends on how soon etcd ends the watches its cut-off member
    // held, and on the machine's load): no unit on the minority side stops meanwhile.
    let mut moved_after = None;
    while moved_after.is_none() || cut.elapsed() < Duration::from_secs(AGENT_TTL_SECONDS + 6) {
        let now = lab.processes()[minority_member].clone();
        assert!(minority_processes.is_subset(&now), "a unit on the minority side was stopped");
        let running = lab.running();
        if moved_after.is_none() && held.iter().all(|unit| running[..2].iter().any(|on| on.contains(unit))) {
            moved_after = Some(cut.elapsed());
        }
        assert!(
            cut.elapsed() < Duration::from_secs(AGENT_TTL_SECONDS + 60),
            "the majority never ran the minority machine's units: {running:?}\n{}",
            lab.logs()
        );
        std::thread::sleep(SAMPLE);
    }
    assert!(!lab.etcd.healthy(minority_etcd), "the minority member has no quorum");
    println!("minority partition: the majority ran the cut-off machine's units {moved_after:?} after the cut");
    lab.net.heal_all();
    lab.wait_each_runs_once("after healing every unit runs once", 0..6);
}

#[test]
fn latency_jitter_and_packet_loss_to_etcd_flap_nothing() {
    let net = NetLab::create();
    let etcd = LabEtcd::start(&net, 3);
    // Every machine reaches etcd through proxies that add 200 ms ± 50 ms each way, and its
    // link to them drops 5% of packets.
    let proxies: Vec<DelayProxy> = etcd
        .members
        .iter()
        .map(|member| {
            let target = format!("{}:2379", member.ip).parse().expect("an address");
            DelayProxy::start(&net.host_ip(), target, Duration::from_millis(200), Duration::from_millis(50))
        })
        .collect();
    let endpoints = proxies.iter().map(|proxy| format!("http://{}", proxy.address)).collect::<Vec<_>>().join(",");
    let members: Vec<LabMember> = (0..3).map(|index| lab_member(&net, index, &endpoints, &[])).collect();
    for member in &members {
        net.lose(&member.node, &net.host_ip(), 5);
    }
    let lab = Lab { members, etcd, net, scratch: tempfile::tempdir().expect("scratch dir") };
    lab.start_sleepers(0, 0..6);
    let (placed, processes) = (lab.running(), lab.processes());
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(20) {
        assert_eq!(lab.running(), placed, "a unit moved:\n{}", lab.logs());
        assert_eq!(lab.processes(), processes, "a unit restarted");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The engine leader counts the machines.
    let machines = lab
        .members
        .iter()
        .filter_map(|member| metric_value(&member.fleetd.metrics(), "fleet_machines"))
        .max_by(f64::total_cmp);
    assert_eq!(machines, Some(3.0), "no machine was lost");
    let lost = lab.logs().matches("lease expired").count();
    assert_eq!(lost, 0, "no lease expired:\n{}", lab.logs());
    drop(proxies);
}

#[test]
fn with_stop_units_when_cut_off_a_cut_off_machine_stops_its_units_as_they_move() {
    let lab = lab_with(3, &[("stop_units_when_cut_off", "true")]);
    lab.start_sleepers(0, 0..6);
    let victim = 2;
    let held: BTreeSet<usize> = lab.running()[victim].clone();
    assert!(!held.is_empty(), "{:?}", lab.running());
    let etcd_nodes: Vec<_> = lab.etcd.members.iter().collect();
    let cut = Instant::now();
    lab.net.isolate(&lab.members[victim].node, &etcd_nodes);
    let (mut stopped, mut elsewhere): (Option<Duration>, Option<Duration>) = (None, None);
    let mut longest_double = Duration::ZERO;
    let mut doubled_since: BTreeMap<usize, Instant> = BTreeMap::new();
    while stopped.is_none() || elsewhere.is_none() {
        let running = lab.running();
        let now = Instant::now();
        if stopped.is_none() && running[victim].is_disjoint(&held) {
            stopped = Some(cut.elapsed());
        }
        let moved = held.iter().all(|unit| (0..3).any(|index| index != victim && running[index].contains(unit)));
        if elsewhere.is_none() && moved {
            elsewhere = Some(cut.elapsed());
        }
        for unit in &held {
            let copies = running.iter().filter(|on| on.contains(unit)).count();
            if copies > 1 {
                doubled_since.entry(*unit).or_insert(now);
            } else if let Some(since) = doubled_since.remove(unit) {
                longest_double = longest_double.max(now - since);
            }
        }
        assert!(cut.elapsed() < Duration::from_secs(AGENT_TTL_SECONDS + 20), "{running:?}\n{}", lab.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    for since in doubled_since.values() {
        longest_double = longest_double.max(since.elapsed());
    }
    let (stopped, elsewhere) = (stopped.unwrap_or_default(), elsewhere.unwrap_or_default());
    println!(
        "stop_units_when_cut_off: stopped on the cut-off machine {stopped:?} after the cut, running elsewhere after \
         {elsewhere:?}; longest double run {longest_double:?}"
    );
    assert!(
        stopped >= Duration::from_secs(AGENT_TTL_SECONDS) - Duration::from_millis(1500),
        "stopped too early: {stopped:?}"
    );
    assert!(longest_double < Duration::from_secs(1), "ran twice for {longest_double:?}");
    lab.net.heal_all();
    lab.wait_each_runs_once("after healing every unit runs once", 0..6);
}

/// A fleetd frozen (SIGSTOP) past its lease wakes to find its units placed elsewhere: it must
/// stop them at once, not re-register and carry on with what its copy of the schedule still
/// says. (The chaos run found machines back in touch with etcd whose units ran twice.)
#[test]
fn with_stop_units_when_cut_off_a_fleetd_frozen_past_its_lease_stops_its_units_when_it_wakes() {
    let lab = lab_with(3, &[("stop_units_when_cut_off", "true")]);
    lab.start_sleepers(0, 0..6);
    let victim = 2;
    let held: BTreeSet<usize> = lab.running()[victim].clone();
    assert!(!held.is_empty(), "{:?}", lab.running());
    lab.members[victim].fleetd.signal(libc::SIGSTOP);
    // While it is frozen its units keep running, and the others take them once its lease lapses.
    poll_until(
        "the frozen machine's units run elsewhere too",
        Duration::from_secs(AGENT_TTL_SECONDS + 20),
        || {
            let running = lab.running();
            held.iter().all(|unit| (0..3).any(|index| index != victim && running[index].contains(unit)))
        },
        || format!("{:?}\n{}", lab.running(), lab.logs()),
    );
    let woke = Instant::now();
    lab.members[victim].fleetd.signal(libc::SIGCONT);
    poll_until(
        "the woken machine stops the units it lost",
        Duration::from_secs(10),
        || lab.running()[victim].is_disjoint(&held),
        || format!("{:?}\n{}", lab.running(), lab.logs()),
    );
    let stopped = woke.elapsed();
    println!("a fleetd frozen past its lease stopped its moved units {stopped:?} after it woke");
    assert!(stopped < Duration::from_secs(3), "stopped {stopped:?} after waking");
    lab.wait_each_runs_once("after waking every unit runs once", 0..6);
}
