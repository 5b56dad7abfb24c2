//! Units that wait for units on other machines, on three real fleetds over a real etcd: an app
//! on the app member requires a db (with an HTTP health check) on one of two db members. The
//! app starts only once the db is healthy, its file naming where the db runs; a plan to stop the
//! db or drain its member says what the app would do. The db's member goes away: the db moves to
//! the other db member, and with `RequiresGrace=1s` the app is stopped while the db is down and
//! started again once it is back, its file naming the db's new machine and address. A rollout
//! of both replaces the db first, holding the app until the db is done on its new content.

use std::path::Path;
use std::time::Duration;

use fleet_e2e::{Cluster, binary, member_id, write_unit};
use fleet_testkit::free_port;

const WAIT: Duration = Duration::from_secs(120);

/// Members 0 and 1 run dbs, member 2 apps.
fn role(index: usize) -> &'static str {
    if index == 2 { "app" } else { "db" }
}

/// The db: it takes two seconds to start (so that it is down past the app's grace when it
/// moves), then serves `/health` on `port`.
fn db(dir: &Path, port: u16, version: u32) -> String {
    let server = binary("health-server");
    write_unit(
        dir,
        "db.service",
        &format!(
            "[Service]\nEnvironment=VERSION={version}\nExecStartPre=/bin/sleep 2\nExecStart={} {port} 200\n\
             [X-Fleet]\nMachineMetadata=role=db\nHealthCheck=http://127.0.0.1:{port}/health\n\
             HealthCheckInterval=1s\nHealthCheckTimeout=500ms\nHealthCheckThreshold=1\n",
            server.display()
        ),
    )
}

/// The app: at each start it logs `start` and the file of where the db runs into `<out>/app.log`.
fn app(dir: &Path, out: &Path, version: u32) -> String {
    let log = out.join("app.log");
    write_unit(
        dir,
        "app.service",
        &format!(
            "[Service]\nEnvironment=VERSION={version}\n\
             ExecStart=/bin/sh -c 'echo start $VERSION >> {log}; cat \"$CREDENTIALS_DIRECTORY/fleet-requires\" >> {log}; exec sleep 100200'\n\
             [X-Fleet]\nMachineMetadata=role=app\nRequires=db.service\nRequiresGrace=1s\n",
            log = log.display()
        ),
    )
}

/// Each start the app logged, with the lines its file held then.
fn starts(out: &Path) -> Vec<(String, Vec<String>)> {
    let mut starts: Vec<(String, Vec<String>)> = Vec::new();
    for line in std::fs::read_to_string(out.join("app.log")).unwrap_or_default().lines() {
        match line.strip_prefix("start ") {
            Some(version) => starts.push((version.to_string(), Vec::new())),
            None => {
                if let Some((_, file)) = starts.last_mut() {
                    file.push(line.to_string());
                }
            }
        }
    }
    starts
}

/// Where the cluster says `unit` runs (its machine's full ID), if it is active somewhere.
fn running_on(cluster: &Cluster, unit: &str) -> Option<String> {
    let listed = cluster.any().ok(&["list-units", "--no-legend", "--full", "--fields", "unit,machine,active"]).stdout;
    listed.lines().find_map(|line| {
        let cells: Vec<&str> = line.split_whitespace().collect();
        (cells.len() == 3 && cells[0] == unit && cells[2] == "active")
            .then(|| cells[1].split('/').next().unwrap_or_default().to_string())
    })
}

fn place(index: usize) -> String {
    format!("db.service {} 127.0.0.{}", member_id(index), index + 1)
}

#[test]
fn an_app_waits_for_its_db_on_another_member_follows_it_when_it_moves_and_is_rolled_out_after_it() {
    let mut cluster =
        Cluster::start(3, |index| vec![("metadata".to_string(), format!("member={index},role={}", role(index)))]);
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let port = free_port();
    let (db_file, app_file) = (db(dir.path(), port, 1), app(dir.path(), out.path(), 1));
    // The app first: it waits for a db not in the cluster, then for one not yet healthy.
    cluster.any().ok(&["start", "--no-block", &app_file]);
    cluster.wait_until("the app waits for the db", WAIT, |cluster| {
        let listed = cluster.any().ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout;
        listed.lines().any(|line| line.starts_with("app.service") && line.contains("waiting for db.service"))
    });
    cluster.any().ok(&["start", "--no-block", &db_file]);
    // (The app logs its start, then the file: both are awaited.)
    cluster.wait_until("the app started, told where the db runs", WAIT, |_| {
        starts(out.path()).first().is_some_and(|(_, file)| !file.is_empty())
    });
    let first = starts(out.path());
    let db_member = (0..2).find(|index| first[0].1 == [place(*index)]).unwrap_or_else(|| panic!("{first:?}"));
    assert_eq!(running_on(&cluster, "db.service").as_deref(), Some(member_id(db_member).as_str()));

    // A plan says what the app would do: taken off past its grace if the db stopped; restarted
    // once the db is up on the other member if the db's member were drained.
    let other = 1 - db_member;
    let planned = cluster.any().ok(&["plan", "stop", "db.service"]).stdout;
    let app_row = planned.lines().find(|line| line.starts_with("app.service")).unwrap_or_default();
    assert!(app_row.contains("affected"), "{planned}");
    assert!(app_row.ends_with("taken off if db.service is not up again within 1s (RequiresGrace=)"), "{planned}");
    let planned = cluster.any().ok(&["plan", "machine", "drain", &member_id(db_member)]).stdout;
    let app_row = planned.lines().find(|line| line.starts_with("app.service")).unwrap_or_default();
    assert!(app_row.ends_with(&format!("restarted once db.service is up on {}", &member_id(other)[..8])), "{planned}");

    // The db's member goes: the db moves; the app stops past its grace and starts again once
    // the db is healthy on the other member, told where.
    let mut gone = cluster.members.remove(db_member);
    gone.stop_with(libc::SIGTERM);
    cluster.wait_until("the app started again, told the db's new place", WAIT, |_| {
        starts(out.path()).last().is_some_and(|(_, file)| *file == [place(other)])
    });
    assert_eq!(starts(out.path()).len(), 2, "{:?}", starts(out.path()));
    let logs = cluster.logs();
    assert!(logs.contains("(RequiresGrace=1s passed)"), "the app was stopped for its db past its grace");

    // A rollout of both: the db first, the app held until the db is done on its new content.
    let (db_file, app_file) = (db(dir.path(), port, 2), app(dir.path(), out.path(), 2));
    let started = cluster.any().ok(&[
        "start",
        "--no-block",
        "--replace",
        "--max-unavailable",
        "2",
        "--min-ready",
        "1s",
        &db_file,
        &app_file,
    ]);
    let name = started
        .stderr
        .split_whitespace()
        .find(|word| word.starts_with("replace-"))
        .unwrap_or_else(|| panic!("{started:?}"))
        .to_string();
    let mut held = false;
    cluster.wait_until("the rollout is done", WAIT, |cluster| {
        let status = cluster.any().ok(&["rollout", "status", &name]).stdout;
        held |= status.contains("app.service waits for db.service, which it requires, to be done first");
        status.lines().any(|line| line.starts_with("State:") && line.ends_with(" done"))
    });
    assert!(held, "the app was held for the db");
    // Active is reported once its process runs, which may be before its shell logged the start.
    cluster.wait_until("the app logged its start on its new content", WAIT, |_| {
        starts(out.path()).last().is_some_and(|(version, file)| version == "2" && !file.is_empty())
    });
    assert_eq!(running_on(&cluster, "db.service").as_deref(), Some(member_id(other).as_str()));
}
