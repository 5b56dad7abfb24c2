//! The cluster's events, end to end: a unit started leaves its write, its placement and its
//! state changes in `fleetctl events`, filtered by unit and kind; a follower (`--follow`)
//! sees a stop as it happens. On three fleetds over etcd every member shows the same events
//! in the same order, and a reader that read part of them through one member, which then
//! died, reads the rest through another from its last index and misses nothing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fleet_e2e::{Cluster, Fleetd, binary, write_unit};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

/// The events `fleetctl events -o json` prints through `fleet` (one JSON object a line).
fn events(fleet: &Fleetd, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["events", "-o", "json"];
    all.extend(args);
    let ran = fleet.ok(&all);
    ran.stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect()
}

fn text(event: &Value, field: &str) -> String {
    event[field].as_str().unwrap_or_default().to_string()
}

/// (index, kind, unit, message) of each event.
fn summary(events: &[Value]) -> Vec<(u64, String, String, String)> {
    events
        .iter()
        .map(|e| (e["index"].as_u64().unwrap_or_default(), text(e, "kind"), text(e, "unit"), text(e, "message")))
        .collect()
}

#[test]
fn a_started_unit_leaves_its_write_placement_and_states_and_a_follower_sees_its_stop() {
    let fleet = Fleetd::start("e2e0events000001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let unit = write_unit(dir.path(), "ev.service", "[Service]\nExecStart=/bin/sleep 100500\n");
    fleet.ok(&["start", &unit]);
    fleet.wait_until("ev.service's start is an event", WAIT, |fleet| {
        events(fleet, &["--unit", "ev.*", "--kind", "state"])
            .iter()
            .any(|e| text(e, "message").starts_with("active/running"))
    });
    let of_unit = events(&fleet, &["--unit", "ev.service"]);
    let kinds: Vec<String> = of_unit.iter().map(|e| text(e, "kind")).collect();
    for kind in ["placed", "state"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in {:?}", summary(&of_unit));
    }
    let placed = of_unit.iter().find(|e| text(e, "kind") == "placed").expect("placed");
    assert_eq!(text(placed, "message"), format!("placed on {}", fleet.machine_id));
    assert_eq!(text(placed, "machineID"), fleet.machine_id);
    // `fleetctl start` writes its units in one batch, whose event names them.
    let writes = events(&fleet, &["--kind", "write", "--unit", "ev.service"]);
    let batch = writes.iter().find(|e| text(e, "message").starts_with("POST /fleet/v1/units: 20")).expect("a batch");
    assert_eq!(text(batch, "by"), "unix:uid=0");
    let indexes: Vec<u64> = of_unit.iter().map(|e| e["index"].as_u64().unwrap_or_default()).collect();
    assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "{indexes:?}");
    let none = events(&fleet, &["--unit", "other*"]);
    assert!(none.is_empty(), "{none:?}");
    let table = fleet.ok(&["events", "--unit", "ev.service", "--kind", "placed"]).stdout;
    assert!(table.starts_with("INDEX\tTIME\tKIND\tUNIT\tMACHINE\tMESSAGE\n"), "{table}");
    let refused = fleet.fleetctl(&["events", "--kind", "nonsense"]);
    assert!(refused.code != 0 && refused.stderr.contains("invalid kind \"nonsense\""), "{refused:?}");
    // From a span back from now, or a time on: the unit's events are within the last hour, and
    // none is after a time to come.
    assert_eq!(summary(&events(&fleet, &["--unit", "ev.service", "--since", "1h"])), summary(&of_unit));
    assert!(events(&fleet, &["--since", "2999-01-01T00:00:00Z"]).is_empty());
    let refused = fleet.fleetctl(&["events", "--since", "yesterday"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.starts_with("invalid --since \"yesterday\": an event index, a span"), "{refused:?}");

    // A follower from the last index read sees the stop as it happens.
    let last = *indexes.last().expect("an event");
    let mut follower = Command::new(binary("fleetctl"))
        .arg(format!("--endpoint=unix://{}", fleet.socket().display()))
        .args(["events", "--follow", "-o", "json", "--since", &last.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("fleetctl events --follow");
    let (lines, seen) = mpsc::channel();
    let stdout = follower.stdout.take().expect("its output");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    fleet.ok(&["stop", "ev.service"]);
    let deadline = std::time::Instant::now() + WAIT;
    let mut followed = Vec::new();
    let stopped = |e: &Value| text(e, "unit") == "ev.service" && text(e, "message").starts_with("inactive");
    while !followed.iter().any(|e: &Value| text(e, "kind") == "state" && stopped(e)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = seen.recv_timeout(left).unwrap_or_else(|_| panic!("no stop followed: {:?}", summary(&followed)));
        followed.push(serde_json::from_str(&line).expect("a JSON event"));
    }
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(followed.iter().all(|e| e["index"].as_u64().unwrap_or_default() > last), "{:?}", summary(&followed));
    assert!(
        followed.iter().any(|e| text(e, "kind") == "write" && text(e, "message").contains("/fleet/v1/units")),
        "the stop's write is there too: {:?}",
        summary(&followed)
    );
}

#[test]
fn every_member_shows_one_order_and_a_reader_resumes_through_another_member() {
    let mut cluster = Cluster::start(3, |_| Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let first = write_unit(dir.path(), "one.service", "[Service]\nExecStart=/bin/sleep 100501\n");
    cluster.any().ok(&["start", &first]);
    cluster.wait_until("one.service runs", WAIT, |cluster| {
        events(cluster.any(), &["--unit", "one.service", "--kind", "state"])
            .iter()
            .any(|e| text(e, "message").starts_with("active/running"))
    });
    // Read through the first member, then through each other: the same events in the same
    // order (the others may have seen more since).
    let read_first = summary(&events(&cluster.members[0], &[]));
    for member in &cluster.members[1..] {
        member.wait_until("this member shows what the first showed", WAIT, |member| {
            let shown = summary(&events(member, &[]));
            shown.len() >= read_first.len() && shown[..read_first.len()] == read_first[..]
        });
    }

    // The member read from dies; the reader goes on through another from its last index.
    let last = read_first.last().map(|(index, ..)| *index).expect("events");
    cluster.members[0].stop_with(libc::SIGKILL);
    let second = write_unit(dir.path(), "two.service", "[Service]\nExecStart=/bin/sleep 100502\n");
    cluster.members[1].ok(&["start", &second]);
    cluster.wait_until("two.service runs", WAIT, |cluster| {
        events(&cluster.members[1], &["--unit", "two.service", "--kind", "state"])
            .iter()
            .any(|e| text(e, "message").starts_with("active/running"))
    });
    let rest = summary(&events(&cluster.members[2], &["--since", &last.to_string()]));
    let everything = summary(&events(&cluster.members[2], &[]));
    let mut resumed = read_first.clone();
    resumed.extend(rest.iter().cloned());
    assert_eq!(resumed[..], everything[..resumed.len()], "nothing missed, nothing twice");
    assert!(rest.iter().any(|(_, kind, unit, _)| kind == "placed" && unit == "two.service"), "{rest:?}");
    // The member gone is an event too, once its presence lapsed.
    let gone = cluster.members[0].machine_id.clone();
    cluster.wait_until("the member killed is lost", WAIT, |cluster| {
        events(&cluster.members[1], &["--kind", "machine-lost"]).iter().any(|e| text(e, "machineID") == gone)
    });
}
