//! `[X-Fleet] LostAfter=never` on a three-member etcd cluster in the netns lab: the units of a
//! member whose fleetd is frozen wait for it, listed as waiting on a machine out of touch, and
//! run there again once it thaws, never on another member meanwhile.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fleet_e2e::lab::{Lab, lab};
use fleet_e2e::{AGENT_TTL_SECONDS, poll_until};

const WAIT_FOR_IT: &str = "[X-Fleet]\nLostAfter=never\n";

/// Fails if any of `held` runs on a member other than `victim`.
fn nowhere_else(lab: &Lab, victim: usize, held: &BTreeSet<usize>) -> bool {
    let running = lab.running();
    for (member, on) in running.iter().enumerate().filter(|(member, _)| *member != victim) {
        let moved: Vec<&usize> = on.intersection(held).collect();
        assert!(
            moved.is_empty(),
            "sleepers {moved:?} of frozen member {victim} run on member {member}:\n{}",
            lab.logs()
        );
    }
    true
}

#[test]
fn a_unit_with_lost_after_never_waits_for_its_frozen_machine_and_runs_there_again() {
    let lab = lab(3);
    lab.start_sleepers_with(0, 0..6, WAIT_FOR_IT);
    let victim = 2;
    let held = lab.running()[victim].clone();
    assert!(!held.is_empty(), "least-loaded placement gave member 2 units: {:?}", lab.running());
    let asked = &lab.members[0].fleetd;
    let first = format!("sleeper-{}.service", held.iter().next().expect("one at least"));
    let rows: serde_json::Value =
        serde_json::from_str(&asked.ok(&["list-units", "-o", "json"]).stdout).expect("list-units -o json");
    let victim_id = rows
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["unit"] == first.as_str()))
        .and_then(|row| row["machine"].as_str())
        .expect("the victim's machine")
        .to_string();
    lab.members[victim].fleetd.signal(libc::SIGSTOP);
    let frozen = Instant::now();

    // Out of touch once its presence lapses: listed so, its units unknown and waiting for it.
    let limit = Duration::from_secs(AGENT_TTL_SECONDS * 3 + 20);
    poll_until(
        "the frozen member is listed out of touch",
        limit,
        || {
            nowhere_else(&lab, victim, &held);
            let machines = asked.ok(&["list-machines", "--full", "--fields", "machine,state"]).stdout;
            machines.lines().any(|line| line.starts_with(&victim_id) && line.contains("out of touch since"))
        },
        || lab.logs(),
    );
    let units = asked.ok(&["list-units", "--fields", "unit,active"]).stdout;
    for sleeper in &held {
        let line = units.lines().find(|line| line.starts_with(&format!("sleeper-{sleeper}."))).unwrap_or_default();
        assert!(line.contains("unknown (machine out of touch since"), "sleeper {sleeper}: {units}");
    }
    // The engine says why at its pass after the lapse, which may come after the listing does.
    poll_until(
        "each of its units waits, saying so",
        limit,
        || {
            let files = asked.ok(&["list-unit-files", "--fields", "unit,reason"]).stdout;
            files.matches("waits for it to come back (LostAfter=never)").count() == held.len()
        },
        || asked.ok(&["list-unit-files", "--fields", "unit,reason"]).stdout,
    );
    let json = asked.ok(&["list-machines", "-o", "json"]).stdout;
    assert!(json.contains("\"outOfTouchSince\""), "{json}");

    // Well past every span the engine could have counted: still nowhere else.
    poll_until(
        "three times agent_ttl past the freeze",
        limit,
        || nowhere_else(&lab, victim, &held) && frozen.elapsed() > Duration::from_secs(AGENT_TTL_SECONDS * 3),
        || lab.logs(),
    );

    lab.members[victim].fleetd.signal(libc::SIGCONT);
    poll_until(
        "the thawed member is back and runs its units again",
        limit,
        || {
            nowhere_else(&lab, victim, &held);
            let machines = asked.ok(&["list-machines", "--full", "--fields", "machine,state"]).stdout;
            let back = machines.lines().any(|line| line.starts_with(&victim_id) && line.contains("present"));
            back && held.is_subset(&lab.running()[victim]) && lab.each_runs_once(0..6)
        },
        || lab.logs(),
    );
    poll_until(
        "nothing waits any more",
        limit,
        || !asked.ok(&["list-unit-files", "--fields", "unit,reason"]).stdout.contains("out of touch"),
        || asked.ok(&["list-unit-files", "--fields", "unit,reason"]).stdout,
    );
}
