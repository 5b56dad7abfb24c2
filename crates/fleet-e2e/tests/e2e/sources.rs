//! Desired state from git: real repositories made by the test (commits, a force-push), real
//! fleetds on one etcd. Units appear, change and go with commits; a file that does not read
//! is named with its line and the rest goes on; units a source owns are refused to hand
//! writes unless taken over; a new engine leader goes on syncing; bad sources say why.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fleet_e2e::webhook::{post, signature};
use fleet_e2e::{Cluster, Fleetd};
use fleet_testkit::GitRepo as Repo;

const WAIT: Duration = Duration::from_secs(30);
const HELLO: &str = "[Service]\nExecStart=/bin/sleep 600001\n";
const HELLO_2: &str = "[Service]\nExecStart=/bin/sleep 600002\n";
const WEB: &str = "[Service]\nExecStart=/bin/sleep 600%i\n";
const BATCH: &str = "[Service]\nExecStart=/bin/sleep 600003\n";

/// unit → (desired state, current state), from `list-unit-files`.
fn unit_files(fleet: &Fleetd) -> BTreeMap<String, (String, String)> {
    fleet
        .ok(&["list-unit-files", "--no-legend", "--fields", "unit,dstate,state"])
        .stdout
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            Some((cells.first()?.to_string(), (cells.get(1)?.to_string(), cells.get(2)?.to_string())))
        })
        .collect()
}

fn states(list: &[(&str, &str, &str)]) -> BTreeMap<String, (String, String)> {
    list.iter().map(|(unit, desired, current)| (unit.to_string(), (desired.to_string(), current.to_string()))).collect()
}

fn status(fleet: &Fleetd, source: &str) -> String {
    fleet.ok(&["source", "status", source]).stdout
}

fn wait_for_commit(fleet: &Fleetd, source: &str, commit: &str) {
    fleet.wait_until(&format!("source {source} synced {commit}"), WAIT, |fleet| {
        status(fleet, source).contains(&format!("Commit:    {commit}"))
    });
}

fn cluster() -> Cluster {
    Cluster::start(3, |_| vec![("unit_manager".into(), "native".into())])
}

fn source_add(fleet: &Fleetd, name: &str, repo: &Repo, extra: &[&str]) {
    let url = repo.url();
    let mut args = vec!["source", "add", "--repo", url.as_str(), "--interval", "1s"];
    args.extend_from_slice(extra);
    args.push(name);
    fleet.ok(&args);
}

#[test]
fn units_follow_the_repository_through_commits_a_force_push_and_a_new_leader() {
    let mut cluster = cluster();
    let repo = Repo::new();
    let first = repo.commit(
        &[
            ("units/hello.service", Some(HELLO)),
            ("units/web@.service", Some(WEB)),
            ("units/batch.service", Some(BATCH)),
            ("units/fleet-desired.conf", Some("batch.service = loaded\nweb@{1..2}.service = launched\n")),
            ("elsewhere/ignored.service", Some(HELLO)),
            ("units/README.md", Some("not a unit")),
        ],
        "first",
    );
    let fleet = cluster.any();
    source_add(fleet, "apps", &repo, &["--branch", "main", "--path", "units"]);
    wait_for_commit(fleet, "apps", &first);
    fleet.wait_until("the source's units run", WAIT, |fleet| {
        unit_files(fleet)
            == states(&[
                ("batch.service", "loaded", "loaded"),
                ("hello.service", "launched", "launched"),
                ("web@.service", "inactive", "inactive"),
                ("web@1.service", "launched", "launched"),
                ("web@2.service", "launched", "launched"),
            ])
    });
    let listed = fleet.ok(&["source", "list", "--no-legend"]).stdout;
    assert!(listed.contains("apps") && listed.contains("synced") && listed.contains(&first[..8]), "{listed}");

    // Hand writes are refused, and change nothing, unless they take the unit over.
    let refused = fleet.fleetctl(&["destroy", "hello.service"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("managed by source apps"), "{refused:?}");
    assert!(unit_files(fleet).contains_key("hello.service"));

    // A change, a removal and a file that does not read, in one commit: the change and the
    // removal go through, the bad file is named with its line and its unit is not made.
    let second = repo.commit(
        &[
            ("units/hello.service", Some(HELLO_2)),
            ("units/batch.service", None),
            ("units/bad.service", Some("[Service]\nExecStart=/bin/true\nnot an option\n")),
        ],
        "second",
    );
    wait_for_commit(fleet, "apps", &second);
    fleet.wait_until("the change and the removal are applied", WAIT, |fleet| {
        let files = unit_files(fleet);
        !files.contains_key("batch.service")
            && !files.contains_key("bad.service")
            && fleet.ok(&["cat", "hello.service"]).stdout.contains("600002")
    });
    let said = status(fleet, "apps");
    assert!(said.contains("Problem:   units/bad.service: line 3: expected \"Name=Value\""), "{said}");
    assert!(said.contains("State:     problems"), "{said}");

    // A force-push: the source follows the branch where it now points.
    repo.git(&["reset", "--quiet", "--hard", &first]);
    let pushed = repo.commit(&[("units/hello.service", Some(HELLO_2))], "rewritten");
    wait_for_commit(fleet, "apps", &pushed);
    fleet.wait_until("batch is back with the rewritten history", WAIT, |fleet| {
        unit_files(fleet).get("batch.service") == Some(&("loaded".to_string(), "loaded".to_string()))
    });

    // The engine leader dies: the next one goes on syncing.
    let leader = cluster.leader().expect("a leader");
    cluster.members[leader].stop_with(libc::SIGKILL);
    let fleet = cluster.any();
    let third = repo.commit(&[("units/late.service", Some(HELLO))], "third");
    wait_for_commit(fleet, "apps", &third);
    fleet.wait_until("the new leader's sync runs late.service", WAIT, |fleet| {
        unit_files(fleet).get("late.service").is_some_and(|(desired, _)| desired == "launched")
    });

    // Taken over by hand: the unit is the operator's, and the source leaves it alone.
    fleet.ok(&["--take-over", "stop", "late.service"]);
    fleet.ok(&["source", "sync", "apps"]);
    fleet.wait_until("the source reports the unit it no longer owns", WAIT, |fleet| {
        status(fleet, "apps").contains("Out of sync: late.service: held elsewhere (made by hand)")
    });
    assert_eq!(unit_files(fleet).get("late.service").map(|(desired, _)| desired.as_str()), Some("loaded"));
    // Changed by hand: the source says how, on request, and list-unit-files marks it.
    let dir = tempfile::tempdir().unwrap();
    let late = fleet_e2e::write_unit(dir.path(), "late.service", HELLO_2);
    fleet.ok(&["load", "--replace", &late]);
    fleet.ok(&["source", "sync", "apps"]);
    fleet.wait_until("the diff shows the hand-made change", WAIT, |fleet| {
        let diff = fleet.ok(&["source", "status", "--diff", "apps"]).stdout;
        diff.contains("--- late.service (cluster)\n+++ late.service (source)\n [Service]\n-ExecStart=/bin/sleep 600002\n+ExecStart=/bin/sleep 600001\n")
    });
    let listed = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,source,sync"]).stdout;
    let row = |unit: &str| -> Vec<String> {
        let line = listed.lines().find(|line| line.starts_with(unit)).unwrap_or_default();
        line.split('\t').filter(|cell| !cell.is_empty()).map(str::to_string).collect()
    };
    assert_eq!(row("late.service"), ["late.service", "-", "held elsewhere (made by hand)"], "{listed}");
    assert_eq!(row("hello.service"), ["hello.service", "apps", "in sync"], "{listed}");
    let plain = fleet.ok(&["list-unit-files"]);
    assert!(plain.stderr.contains("1 unit(s) are out of sync with their source"), "{plain:?}");

    // Removing the source destroys its units.
    fleet.ok(&["source", "remove", "apps"]);
    fleet.wait_until("the source's units are gone", WAIT, |fleet| unit_files(fleet).keys().eq(["late.service"]));
    assert_eq!(fleet.ok(&["source", "list", "--no-legend"]).stdout, "");
}

#[test]
fn bad_sources_say_why_and_leave_the_cluster_as_it_was() {
    let cluster = cluster();
    let fleet = cluster.any();
    let repo = Repo::new();
    let first = repo.commit(&[("hello.service", Some(HELLO))], "first");
    source_add(fleet, "good", &repo, &[]);
    wait_for_commit(fleet, "good", &first);

    // Refused where they enter, with a 400 that says why.
    for (args, why) in [
        (vec!["--repo", "http://git.example/x"], "unsupported repository scheme \"http\""),
        (vec!["--repo", "https://me:secret@git.example/x"], "must not hold credentials"),
        (vec!["--repo", "file:///x", "--branch=--upload-pack=evil"], "invalid branch"),
        (vec!["--repo", "file:///x", "--path", "../etc"], "invalid path"),
        (vec!["--repo", "file:///x", "--credentials", "../../etc/shadow"], "invalid credentials name"),
    ] {
        let mut command = vec!["source", "add"];
        command.extend(args);
        command.push("bad");
        let refused = fleet.fleetctl(&command);
        assert_ne!(refused.code, 0, "{command:?}: {refused:?}");
        assert!(refused.stderr.contains(why), "{command:?}: {refused:?}");
        assert!(!refused.stderr.contains("secret"), "no secret in an error: {refused:?}");
    }

    // Unreachable, a missing branch, a missing credentials file: a clear error, nothing changes.
    fleet.ok(&["source", "add", "--repo", "file:///nowhere/at/all", "gone"]);
    let other = Repo::new();
    other.commit(&[("x.service", Some(HELLO))], "x");
    source_add(fleet, "branchless", &other, &["--branch", "no-such-branch"]);
    source_add(fleet, "locked", &other, &["--credentials", "missing-file"]);
    fleet.wait_until("the failing sources say why", WAIT, |fleet| {
        status(fleet, "gone").contains("Error:     cannot fetch file:///nowhere/at/all")
            && status(fleet, "branchless").contains("Error:     ")
            && status(fleet, "locked").contains("Error:     cannot read credentials file")
    });
    assert!(fleet.ok(&["source", "list"]).stdout.contains("failing"));

    // A unit another source owns is not taken without --take-over; a paused source syncs not.
    let rival = Repo::new();
    rival.commit(&[("hello.service", Some(HELLO_2))], "rival");
    source_add(fleet, "rival", &rival, &[]);
    fleet.wait_until("the rival reports the unit it may not take", WAIT, |fleet| {
        status(fleet, "rival").contains("Out of sync: hello.service: held elsewhere (source good)")
    });
    fleet.ok(&["source", "pause", "good"]);
    let paused_commit = repo.commit(&[("paused.service", Some(HELLO))], "while paused");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!unit_files(fleet).contains_key("paused.service"), "a paused source does not sync");
    fleet.ok(&["source", "resume", "good"]);
    wait_for_commit(fleet, "good", &paused_commit);

    // Removed with --keep-units: the units stay, made by hand now.
    fleet.ok(&["source", "remove", "--keep-units", "good"]);
    fleet.ok(&["destroy", "paused.service"]);
    assert!(unit_files(fleet).contains_key("hello.service"));
    assert!(Path::new(&fleet.state_dir()).join("sources").exists());
}

#[test]
fn a_signed_push_webhook_syncs_at_once_and_nothing_else_gets_in() {
    let secrets = tempfile::tempdir().expect("a secrets dir");
    std::fs::write(secrets.path().join("hook"), "s3cret\n").expect("the webhook secret");
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let secrets_dir = secrets.path().display().to_string();
    let fleet = Fleetd::start(
        "e2e0webhook00001",
        &[
            ("api_listen", listen.as_str()),
            ("source_credentials_dir", secrets_dir.as_str()),
            ("unit_manager", "native"),
        ],
    );
    let repo = Repo::new();
    let first = repo.commit(&[("hello.service", Some(HELLO))], "first");
    let url = repo.url();
    fleet.ok(&["source", "add", "--repo", &url, "--interval", "1h", "--webhook-secret", "hook", "apps"]);
    wait_for_commit(&fleet, "apps", &first);
    let pushed = repo.commit(&[("late.service", Some(HELLO_2))], "pushed");
    let path = "/fleet/v1/sources/apps/webhook";
    let body = format!("{{\"ref\":\"refs/heads/main\",\"after\":\"{pushed}\"}}");

    // Without a signature there is no credential at all; a wrong one, or one for a source
    // that has no webhook or does not exist, is the same 401: nobody.
    assert_eq!(post(port, path, &[], &body).0, 401);
    let wrong = signature("guess", &body);
    for target in [path, "/fleet/v1/sources/nothing/webhook"] {
        let (code, answer) = post(port, target, &[("X-Hub-Signature-256", wrong.as_str())], &body);
        assert_eq!(code, 401, "{answer}");
        assert!(answer.contains("webhook signature does not match"), "{answer}");
    }
    // A signature is no credential for anything else.
    let good = signature("s3cret", &body);
    assert_eq!(post(port, "/fleet/v1/sources/apps/sync", &[("X-Hub-Signature-256", good.as_str())], "").0, 401);
    assert!(!unit_files(&fleet).contains_key("late.service"), "nothing synced yet: the interval is an hour");

    let pushed_at = std::time::Instant::now();
    let (code, answer) = post(port, path, &[("X-Hub-Signature-256", good.as_str())], &body);
    assert_eq!(code, 202, "{answer}");
    fleet.wait_until("the pushed unit is in the cluster", WAIT, |fleet| unit_files(fleet).contains_key("late.service"));
    println!("webhook → unit in the cluster: {:?}", pushed_at.elapsed());
    assert!(fleet.log().contains("role=\"webhook(apps)\""), "the webhook is audited");
}

/// A desired-state file of 30 lines of 100,000 instances each took the engine leader to
/// 2.6 GB in 90 s and it was still going. The source is halted at `source_max_units` with the
/// line that crossed it named, nothing of it is written, and the leader stays small.
#[test]
fn a_source_that_names_millions_of_instances_is_halted_at_its_bound() {
    let cluster = Cluster::start(1, |_| vec![("unit_manager".into(), "native".into())]);
    let fleet = cluster.any();
    let repo = Repo::new();
    let desired = "web@{1..100000}.service = launched\n".repeat(30);
    repo.commit(&[("web@.service", Some(WEB)), ("fleet-desired.conf", Some(desired.as_str()))], "millions");
    source_add(fleet, "huge", &repo, &[]);
    let bound = "fleet-desired.conf: line 1: the source would hold more than 10000 units (source_max_units)";
    fleet.wait_until("the source is halted at its bound", WAIT, |fleet| status(fleet, "huge").contains(bound));
    assert!(!unit_files(fleet).keys().any(|unit| unit.starts_with("web@")), "nothing of the source was written");
    let peak = fleet_e2e::peak_resident_mib(fleet.pid());
    assert!(peak < 512.0, "the engine leader peaked at {peak} MiB");
}
