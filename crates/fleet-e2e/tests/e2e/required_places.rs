//! Where what a unit requires runs, as the unit learns it without asking the API: fleetd on the
//! embedded store with the native unit manager writes `$CREDENTIALS_DIRECTORY/fleet-requires`
//! (one line per instance up: unit, machine ID, IP) and writes it again when they change,
//! then restarts the unit, reloads it or does nothing, as `RequiresChange=` says. The same
//! places are in `GET /units/{name}`.

use std::path::Path;
use std::time::Duration;

use fleet_e2e::{Fleetd, write_unit};

const MACHINE: &str = "e2e0requires0001";
const WAIT: Duration = Duration::from_secs(60);

/// A unit that waits for `db@*.service` and logs, at each start, `start PID` then the file,
/// and at each `SIGHUP` (its `ExecReload=`), `reload PID` then the file, into `<out>/<name>.log`.
fn app(out: &Path, name: &str, on_change: &str) -> String {
    let log = out.join(format!("{name}.log"));
    let script = out.join(format!("{name}.sh"));
    std::fs::write(
        &script,
        format!(
            "log={log}\n\
             show() {{ echo \"$1 $$\" >> \"$log\"; cat \"$CREDENTIALS_DIRECTORY/fleet-requires\" >> \"$log\"; }}\n\
             trap 'show reload' HUP\n\
             show start\n\
             while :; do sleep 0.1; done\n",
            log = log.display()
        ),
    )
    .expect("the script");
    write_unit(
        out,
        name,
        &format!(
            "[Service]\nExecStart=/bin/sh {}\nExecReload=/bin/kill -HUP $MAINPID\n\
             [X-Fleet]\nRequires=db@*.service\nRequiresChange={on_change}\n",
            script.display()
        ),
    )
}

fn log_of(out: &Path, name: &str) -> String {
    std::fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default()
}

/// The lines the file held after each `start`/`reload` line of the log, in turn.
fn shown(out: &Path, name: &str) -> Vec<(String, Vec<String>)> {
    let mut shown: Vec<(String, Vec<String>)> = Vec::new();
    for line in log_of(out, name).lines() {
        match line.split_once(' ') {
            Some((what @ ("start" | "reload"), _pid)) => shown.push((what.to_string(), Vec::new())),
            _ => {
                if let Some((_, lines)) = shown.last_mut() {
                    lines.push(line.to_string());
                }
            }
        }
    }
    shown
}

fn place(unit: &str) -> String {
    format!("{unit} {MACHINE} 127.0.0.1")
}

#[test]
fn a_unit_is_told_where_what_it_requires_runs_and_restarts_reloads_or_not_as_it_asks() {
    let credentials = tempfile::tempdir().unwrap();
    let base = credentials.path().display().to_string();
    let fleet = Fleetd::start(MACHINE, &[("unit_manager", "native"), ("credentials_dir", &base)]);
    let out = tempfile::tempdir().unwrap();
    let db = write_unit(out.path(), "db@.service", "[Service]\nExecStart=/bin/sleep 100100\n");
    let apps = [app(out.path(), "restart.service", "restart"), app(out.path(), "reload.service", "reload")];
    let quiet = app(out.path(), "none.service", "none");
    fleet.ok(&["submit", &db]);
    // They wait for a db: `start` does not wait for them to run.
    let mut start = vec!["start".to_string(), "--no-block".to_string()];
    start.extend(apps.iter().cloned());
    start.push(quiet.clone());
    fleet.ok(&start.iter().map(String::as_str).collect::<Vec<_>>());
    fleet.wait_until("the apps wait for a db", WAIT, |f| {
        f.fleetctl(&["list-unit-files", "--fields", "unit,reason", "--no-legend"])
            .stdout
            .lines()
            .filter(|line| line.contains("waiting for db@*.service"))
            .count()
            == 3
    });

    let listed = fleet.ok(&["list-unit-files", "--fields", "unit,requires", "--no-legend"]).stdout;
    assert!(
        listed.lines().any(|line| line.contains("reload.service") && line.ends_with("db@*.service (reload)")),
        "{listed}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["list-unit-files", "-o", "json"]).stdout).expect("json");
    let reload = json.as_array().and_then(|rows| rows.iter().find(|row| row["unit"] == "reload.service")).cloned();
    assert_eq!(
        reload.map(|row| row["requires"].clone()),
        Some(serde_json::json!({"requires": ["db@*.service"], "after": [], "grace": null, "onChange": "reload"}))
    );

    // One db: each app starts once, its file naming it.
    fleet.ok(&["start", "db@1.service"]);
    let one = vec![place("db@1.service")];
    for name in ["restart.service", "reload.service", "none.service"] {
        fleet.wait_until(&format!("{name} started, told where db@1 runs"), WAIT, |_| {
            shown(out.path(), name) == [("start".to_string(), one.clone())]
        });
    }
    let answer = fleet.api("GET", "/fleet/v1/units/restart.service", "");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let unit: serde_json::Value = serde_json::from_str(body).expect("a unit");
    assert_eq!(
        unit["requiredAt"],
        serde_json::json!([{"unit": "db@1.service", "machineID": MACHINE, "primaryIP": "127.0.0.1"}]),
        "{body}"
    );

    // A second db: restarted with both, reloaded with both, or only its file written.
    fleet.ok(&["start", "db@2.service"]);
    let two = vec![place("db@1.service"), place("db@2.service")];
    fleet.wait_until("restart.service started again, told both", WAIT, |_| {
        shown(out.path(), "restart.service") == [("start".to_string(), one.clone()), ("start".to_string(), two.clone())]
    });
    fleet.wait_until("reload.service reloaded, told both", WAIT, |_| {
        shown(out.path(), "reload.service") == [("start".to_string(), one.clone()), ("reload".to_string(), two.clone())]
    });
    let file = credentials.path().join(MACHINE).join("none.service/fleet-requires");
    fleet.wait_until("none.service's file names both", WAIT, |_| {
        std::fs::read_to_string(&file).unwrap_or_default() == format!("{}\n", two.join("\n"))
    });
    assert_eq!(
        shown(out.path(), "none.service"),
        [("start".to_string(), one.clone())],
        "neither restarted nor reloaded"
    );
    let reloaded = log_of(out.path(), "reload.service");
    let pids: Vec<&str> = reloaded
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(what, _)| ["start", "reload"].contains(what))
        .map(|(_, pid)| pid)
        .collect();
    assert!(pids.windows(2).all(|pair| pair[0] == pair[1]), "reloaded, not restarted: {reloaded}");

    // A bad value is refused at submission, naming the option.
    let bad = write_unit(
        out.path(),
        "bad.service",
        "[Service]\nExecStart=/bin/true\n[X-Fleet]\nRequires=db@*.service\nRequiresChange=reload\n",
    );
    let refused = fleet.fleetctl(&["submit", &bad]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("RequiresChange=reload needs an ExecReload="), "{refused:?}");
}
