//! Units on a calendar and batch units on three fleetds over a three-member etcd (the netns
//! lab, under the native supervisor): a unit every 2 s goes on while the engine leader's fleetd
//! is killed and then the fleetd of the machine running a run is frozen. Every run appends a
//! line to a file all machines share, so what ran is counted apart from fleet's own record: no
//! more lines than runs placed (none ran twice), no elapse claimed twice, and every elapse
//! between the first and the last run was run or skipped with its reason. A batch unit whose
//! first run fails is retried on another machine, and both results are listed. A global unit on
//! a calendar runs on all three machines at each elapse.

use std::collections::BTreeSet;
use std::time::Duration;

use fleet_e2e::lab::lab;
use fleet_e2e::{AGENT_TTL_SECONDS, write_unit};

const WAIT: Duration = Duration::from_secs(120);

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// `fleetctl runs UNIT -o json` through member `via`.
fn runs(lab: &fleet_e2e::lab::Lab, via: usize, unit: &str) -> serde_json::Value {
    let shown = lab.members[via].fleetd.ok(&["runs", unit, "-o", "json"]).stdout;
    serde_json::from_str(&shown).expect("runs as JSON")
}

/// RFC 3339 in UTC as the API writes it (`2026-12-04T16:40:02Z`, maybe with a fraction), as
/// whole seconds since the epoch.
fn seconds(text: &str) -> i64 {
    let number = |range: std::ops::Range<usize>| -> i64 { text[range].parse().expect("a number in a time") };
    let days = fleet_core::civil_time::days_from_civil(number(0..4), number(5..7) as u32, number(8..10) as u32);
    days * 86_400 + number(11..13) * 3600 + number(14..16) * 60 + number(17..19)
}

#[test]
fn each_elapse_runs_at_most_once_across_a_killed_leader_and_a_frozen_machine() {
    let mut lab = lab(3);
    let ran = lab.scratch.path().join("ran");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo run >> {}; sleep 1'\n\
         [X-Fleet]\nSchedule=*:*:0/2\nKeepRuns=100\n",
        ran.display()
    );
    let tick = write_unit(lab.scratch.path(), "tick.service", &text);
    lab.members[0].fleetd.ok(&["start", &tick]);
    let member = |lab: &fleet_e2e::lab::Lab, what: &str, at_least: usize| {
        lab.members[0].fleetd.wait_until(what, WAIT, |_| lines(&ran) >= at_least);
    };
    member(&lab, "three runs ran", 3);

    // The engine leader's fleetd killed: another member's engine takes the schedule over.
    let leader = lab.engine_leader(&[0, 1, 2]).expect("an engine leader");
    lab.members[leader].fleetd.stop_with(libc::SIGKILL);
    let alive: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let before = lines(&ran);
    lab.members[alive[0]].fleetd.wait_until("runs go on under another leader", WAIT, |_| lines(&ran) >= before + 3);

    // The fleetd of the machine that holds a run frozen mid-run: its presence lapses, the run
    // is recorded lost and never run again; the next elapses run on the other machine.
    let via = alive[0];
    let mut frozen = None;
    lab.members[via].fleetd.wait_until("a run is running on a member still up", WAIT, |_| {
        let shown = runs(&lab, via, "tick.service");
        let running = shown["runs"].as_array().and_then(|runs| {
            runs.iter().rev().find(|run| run["state"] == "running").and_then(|run| run["machineID"].as_str())
        });
        frozen =
            running.and_then(|machine| alive.iter().copied().find(|index| fleet_e2e::member_id(*index) == machine));
        frozen.is_some()
    });
    let frozen = frozen.expect("a member to freeze");
    let other = alive.iter().copied().find(|index| *index != frozen).expect("a member left");
    lab.members[frozen].fleetd.signal(libc::SIGSTOP);
    let before = lines(&ran);
    lab.members[other].fleetd.wait_until(
        "runs go on while a machine is frozen",
        WAIT + Duration::from_secs(AGENT_TTL_SECONDS * 3),
        |_| lines(&ran) >= before + 3,
    );
    lab.members[frozen].fleetd.signal(libc::SIGCONT);
    let before = lines(&ran);
    lab.members[other].fleetd.wait_until("runs go on once it thawed", WAIT, |_| lines(&ran) >= before + 2);
    lab.members[other].fleetd.ok(&["stop", "tick.service"]);
    lab.members[other].fleetd.wait_until("the last run ended", WAIT, |_| {
        let shown = runs(&lab, other, "tick.service");
        shown["runs"].as_array().is_some_and(|runs| runs.iter().all(|run| run["state"] != "running"))
    });

    let shown = runs(&lab, other, "tick.service");
    let all = shown["runs"].as_array().expect("runs");
    let elapses: Vec<i64> =
        all.iter().filter(|run| run["attempt"] == 1).filter_map(|run| run["elapse"].as_str().map(seconds)).collect();
    let distinct: BTreeSet<i64> = elapses.iter().copied().collect();
    assert_eq!(distinct.len(), elapses.len(), "no elapse claimed twice: {shown}");
    let placed = all.iter().filter(|run| run["machineID"].is_string()).count();
    let executed = lines(&ran);
    assert!(executed <= placed, "{executed} runs ran for {placed} placed: one ran twice: {shown}");
    assert!(all.iter().any(|run| run["state"] == "lost"), "the frozen machine's run was lost: {shown}");
    let skipped: Vec<(i64, i64)> = shown["skipped"]
        .as_array()
        .map(|ranges| {
            ranges
                .iter()
                .filter_map(|range| Some((seconds(range["first"].as_str()?), seconds(range["last"].as_str()?))))
                .collect()
        })
        .unwrap_or_default();
    let (first, last) = (elapses.first().copied().unwrap_or(0), elapses.last().copied().unwrap_or(0));
    for elapse in (first..=last).step_by(2) {
        let accounted = distinct.contains(&elapse) || skipped.iter().any(|(from, to)| *from <= elapse && elapse <= *to);
        assert!(accounted, "elapse {elapse} was neither run nor skipped: {shown}");
    }

    // A batch unit that fails on its first machine: retried on another one.
    let marker = lab.scratch.path().join("failed-once");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'test -e {m} || {{ touch {m}; exit 3; }}'\n\
         [X-Fleet]\nBatch=true\nRetries=2\nRetryDelay=1s\n",
        m = marker.display()
    );
    let migrate = write_unit(lab.scratch.path(), "migrate.service", &text);
    lab.members[other].fleetd.ok(&["start", &migrate]);
    lab.members[other].fleetd.wait_until("the retry succeeded", WAIT, |_| {
        let shown = runs(&lab, other, "migrate.service");
        shown["runs"].as_array().is_some_and(|runs| runs.iter().any(|run| run["state"] == "succeeded"))
    });
    let shown = runs(&lab, other, "migrate.service");
    let all = shown["runs"].as_array().expect("runs");
    assert_eq!(all[0]["state"], "failed", "{shown}");
    assert_eq!(all[0]["status"], 3, "{shown}");
    assert_eq!(all[1]["attempt"], 2, "{shown}");
    assert_ne!(all[0]["machineID"], all[1]["machineID"], "retried on another machine: {shown}");
    let listed = lab.members[other].fleetd.ok(&["runs", "migrate.service"]).stdout;
    assert!(listed.contains("failed (status 3)") && listed.contains("succeeded, attempt 2"), "{listed}");
    lab.members[leader].fleetd.relaunch();
}

/// A global unit on a calendar runs on all three machines at each elapse, each machine's end
/// counted once: a run's tally reaches three successes, and the lines the machines wrote are
/// never more than three for each run claimed.
#[test]
fn a_global_unit_on_a_calendar_runs_on_every_machine_at_each_elapse() {
    let lab = lab(3);
    let ran = lab.scratch.path().join("swept");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo run >> {}'\n[X-Fleet]\nGlobal=true\nSchedule=*:*:0/2\n",
        ran.display()
    );
    let sweep = write_unit(lab.scratch.path(), "sweep.service", &text);
    lab.members[0].fleetd.ok(&["start", &sweep]);
    lab.members[1].fleetd.wait_until("a run ended on every machine", WAIT, |_| {
        let shown = runs(&lab, 1, "sweep.service");
        shown["runs"].as_array().is_some_and(|runs| runs.iter().any(|run| run["machines"]["succeeded"] == 3))
    });
    lab.members[2].fleetd.ok(&["stop", "sweep.service"]);
    let shown = runs(&lab, 2, "sweep.service");
    let all = shown["runs"].as_array().expect("runs");
    assert!(all.iter().all(|run| run["state"] == "global" && run["machineID"].is_null()), "{shown}");
    let elapses: Vec<i64> = all.iter().filter_map(|run| run["elapse"].as_str().map(seconds)).collect();
    let distinct: BTreeSet<i64> = elapses.iter().copied().collect();
    assert_eq!(distinct.len(), elapses.len(), "no elapse claimed twice: {shown}");
    // The runs still under way when it stopped may add their lines after the count.
    // Runs are numbered from 1: the latest number is how many were claimed (only the latest
    // 20 are kept).
    let claimed = all.iter().filter_map(|run| run["id"].as_u64()).max().unwrap_or(0);
    let written = u64::try_from(lines(&ran)).unwrap_or(0);
    assert!(written <= 3 * claimed, "{written} lines for {claimed} runs on 3 machines: one ran twice: {shown}");
    let counted: u64 = all
        .iter()
        .map(|run| {
            ["succeeded", "failed", "lost", "stopped"]
                .iter()
                .map(|key| run["machines"][key].as_u64().unwrap_or(0))
                .sum::<u64>()
        })
        .sum();
    assert!(counted <= written, "{counted} ends counted for {written} runs that wrote their line: {shown}");
}
