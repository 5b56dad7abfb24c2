//! A scheduled unit (`[X-Fleet] Schedule=`) run by fleetd through a real systemd (a user
//! instance in a private mount namespace): a run at each elapse, each once, its end read from
//! systemd and kept in the unit's job record, which the test reads from the embedded store
//! once fleetd has stopped.

use std::time::Duration;

use fleet_core::job::runs::{JobRecord, Outcome};
use fleet_e2e::{Fleetd, SystemdUser, write_unit};
use fleet_registry::EngineRegistry;
use fleet_store_embedded::EmbeddedRegistry;

const MACHINE: &str = "5d5d5d5d0000000000000000000000ab";
/// Long enough for several elapses every 2 s on a machine kept busy by something else.
const WAIT: Duration = Duration::from_secs(120);

fn record_after_stop(fleet: &mut Fleetd, unit: &str) -> JobRecord {
    fleet.stop_with(libc::SIGTERM);
    let registry =
        EmbeddedRegistry::open(&fleet.state_dir().join("registry.redb")).expect("the stopped fleetd's store");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let records = runtime.block_on(registry.job_records()).expect("job records");
    records.into_iter().find(|stored| stored.unit == unit).map(|stored| stored.record).expect("a record")
}

#[test]
fn a_scheduled_unit_runs_once_per_elapse_through_systemd_and_its_runs_are_kept() {
    let systemd = SystemdUser::start();
    let mut fleet = Fleetd::start_under(&systemd, MACHINE);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let failing = dir.path().join("fail");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo run >> {}; test ! -e {}'\n[X-Fleet]\nSchedule=*:*:0/2\n",
        ran.display(),
        failing.display()
    );
    let tick = write_unit(dir.path(), "tick.service", &text);
    let started = fleet.ok(&["start", &tick]);
    assert!(
        started.stdout.contains("Triggered unit tick.service start; it runs on *-*-* *:*:00/2, next at "),
        "{started:?}"
    );
    let lines = || std::fs::read_to_string(&ran).map_or(0, |text| text.lines().count());
    fleet.wait_until("two runs ran", WAIT, |_| lines() >= 2);
    // A run that fails says how.
    std::fs::write(&failing, "").unwrap();
    let failed_from = lines();
    fleet.wait_until("a failing run ran", WAIT, |_| lines() >= failed_from + 2);
    fleet.wait_until("fleetctl runs shows a failed run", WAIT, |f| {
        f.ok(&["runs", "tick.service"]).stdout.contains("failed (status 1)")
    });
    let shown = fleet.ok(&["runs", "tick.service"]).stdout;
    assert!(shown.starts_with("Schedule: *-*-* *:*:00/2\nNext run: "), "{shown}");
    assert!(shown.contains("\tsucceeded\n"), "{shown}");
    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["runs", "tick.service", "-o", "json"]).stdout).unwrap();
    assert_eq!(json["name"], "tick.service");
    assert!(json["runs"].as_array().is_some_and(|runs| runs.iter().any(|run| run["state"] == "succeeded")), "{json}");
    let listed = fleet.fleetctl(&["list-unit-files", "--no-legend", "--fields", "unit,schedule,next"]);
    assert!(listed.stdout.starts_with("tick.service\t*-*-* *:*:00/2\t"), "{listed:?}");
    assert!(listed.stdout.trim_end().ends_with(" UTC"), "the next elapse: {listed:?}");
    let hinted = fleet.fleetctl(&["list-unit-files"]);
    assert!(hinted.stderr.contains("1 unit(s) run on a calendar"), "{hinted:?}");
    let metrics = fleet.metrics();
    assert!(metrics.contains("fleet_scheduled_runs_total{result=\"succeeded\"}"), "{metrics}");
    assert!(metrics.contains("fleet_scheduled_runs_total{result=\"failed\"}"), "{metrics}");
    assert!(metrics.contains("fleet_scheduled_run_duration_seconds_count"), "{metrics}");
    let missing = fleet.fleetctl(&["runs", "nowhere.service"]);
    assert_eq!((missing.code, missing.stderr.as_str()), (1, "Unit nowhere.service does not exist.\n"));
    let record = record_after_stop(&mut fleet, "tick.service");

    let elapses: Vec<i64> = record.runs.iter().filter_map(|run| run.elapse).collect();
    assert!(elapses.windows(2).all(|pair| pair[0] < pair[1]), "each elapse runs once, in order: {record:?}");
    assert!(elapses.iter().all(|elapse| elapse % 2_000_000 == 0), "on the schedule: {elapses:?}");
    let ended: Vec<&Outcome> = record.runs.iter().filter_map(|run| run.outcome.as_ref()).collect();
    let ran_lines = std::fs::read_to_string(&ran).unwrap().lines().count();
    let started = record.runs.iter().filter(|run| run.started.is_some()).count();
    assert!(ran_lines <= started.max(1) + 1, "no run the record does not know of: {ran_lines} lines, {record:?}");
    assert!(ended.contains(&&Outcome::Succeeded), "{record:?}");
    assert!(
        ended.iter().any(|outcome| matches!(outcome, Outcome::Failed { status: Some(1), signal: None })),
        "a failed run's exit status is kept: {record:?}"
    );
    for run in record.runs.iter().filter(|run| run.outcome.is_some()) {
        assert_eq!(run.machine.as_deref(), Some(MACHINE), "{run:?}");
        let (started, ended) = (run.started.expect("started"), run.ended.expect("ended"));
        assert!(started <= ended && started >= run.elapse.expect("an elapse"), "{run:?}");
    }
}

/// A batch unit (`Batch=true`) through systemd: its start is one run; the run that fails is
/// retried after its delay and the retry's success kept; `fleetctl run` starts one more.
#[test]
fn a_batch_unit_runs_once_per_start_its_failed_run_is_retried_and_fleetctl_run_runs_it_again() {
    let systemd = SystemdUser::start();
    let mut fleet = Fleetd::start_under(&systemd, MACHINE);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let failed_once = dir.path().join("failed-once");
    // The first run fails with status 3; every later one succeeds.
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo migrating; echo run >> {ran}; test -e {marker} || {{ touch {marker}; exit 3; }}'\n\
         [X-Fleet]\nBatch=true\nRetries=2\nRetryDelay=1s\n",
        ran = ran.display(),
        marker = failed_once.display()
    );
    let migrate = write_unit(dir.path(), "migrate.service", &text);
    let started = fleet.ok(&["start", &migrate]);
    assert!(
        started.stdout.contains("Triggered unit migrate.service start; fleetctl runs migrate.service shows"),
        "{started:?}"
    );
    let succeeded = |f: &Fleetd| f.ok(&["runs", "migrate.service", "-o", "json"]).stdout;
    fleet.wait_until("the retry succeeded", WAIT, |f| {
        let json: serde_json::Value = serde_json::from_str(&succeeded(f)).unwrap();
        json["runs"].as_array().is_some_and(|runs| runs.iter().any(|run| run["state"] == "succeeded"))
    });
    let shown = fleet.ok(&["runs", "migrate.service"]).stdout;
    assert!(shown.starts_with("Unit migrate.service is a batch unit: each start is one run.\n"), "{shown}");
    assert!(shown.contains("failed (status 3)\n"), "{shown}");
    assert!(shown.contains("succeeded, attempt 2\n"), "{shown}");
    // The last lines of the latest run's log (systemd's own lines about the run at least), and
    // only that run's: none of the run before.
    let log = shown.split("'s log:\n").nth(1).expect("a run's log is shown");
    assert!(log.matches("migrating").count() <= 1, "{shown}");

    let again = fleet.ok(&["run", "migrate.service"]);
    assert!(again.stdout.starts_with("Started run 3 of migrate.service;"), "{again:?}");
    fleet.wait_until("the run by hand ran", WAIT, |_| {
        std::fs::read_to_string(&ran).map_or(0, |t| t.lines().count()) >= 3
    });
    let web = write_unit(dir.path(), "web.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleet.ok(&["submit", &web]);
    let refused = fleet.fleetctl(&["run", "web.service"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("neither Schedule= nor Batch=true"), "{refused:?}");
    fleet.wait_until("the run by hand is kept", WAIT, |f| {
        let json: serde_json::Value = serde_json::from_str(&succeeded(f)).unwrap();
        json["runs"].as_array().is_some_and(|runs| runs.len() == 3 && runs[2]["state"] == "succeeded")
    });
    let record = record_after_stop(&mut fleet, "migrate.service");
    let summary: Vec<(u64, u32, &str)> =
        record.runs.iter().map(|run| (run.id, run.attempt, run.outcome.as_ref().map_or("-", Outcome::word))).collect();
    assert_eq!(summary, vec![(1, 1, "failed"), (2, 2, "succeeded"), (3, 1, "succeeded")], "{record:?}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 3, "each run ran once");
}

#[test]
fn a_service_that_fails_is_tried_again_after_its_delay_and_then_left_off_saying_why() {
    let systemd = SystemdUser::start();
    let mut fleet = Fleetd::start_under(&systemd, MACHINE);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    // A service that dies at once, every time it is started.
    let text = format!(
        "[Service]\nExecStart=/bin/sh -c 'echo run >> {}; exit 3'\n[X-Fleet]\nRetries=1\nRetryDelay=1s\n",
        ran.display()
    );
    let web = write_unit(dir.path(), "crashy.service", &text);
    fleet.ok(&["start", "--no-block", &web]);
    let lines = || std::fs::read_to_string(&ran).map_or(0, |text| text.lines().count());
    let reason = |f: &Fleetd| f.ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout;
    fleet.wait_until("its one retry is spent, and the reason says so", WAIT, |f| {
        reason(f).contains("failed 2 times on 1 machine; Retries=1 spent: stop and start it to try again")
    });
    assert_eq!(lines(), 2, "started once, then once more after its delay");
    let shown = fleet.ok(&["runs", "crashy.service"]).stdout;
    assert!(
        shown.starts_with(
            "Unit crashy.service is a service that moves when it fails (Retries=1): each stay on a machine is a run.\n"
        ),
        "{shown}"
    );
    assert!(shown.contains("failed, attempt 2\n"), "{shown}");
    fleet.wait_until("its machine let it go", WAIT, |f| {
        !f.ok(&["list-units", "--no-legend"]).stdout.contains("crashy.service")
    });
    let record = record_after_stop(&mut fleet, "crashy.service");
    let summary: Vec<(u32, &str)> =
        record.runs.iter().map(|stay| (stay.attempt, stay.outcome.as_ref().map_or("-", Outcome::word))).collect();
    assert_eq!(summary, vec![(1, "failed"), (2, "failed")], "{record:?}");
}

#[test]
fn a_global_unit_on_a_calendar_runs_on_its_machine_at_each_elapse_once() {
    let systemd = SystemdUser::start();
    let mut fleet = Fleetd::start_under(&systemd, MACHINE);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo run >> {}'\n[X-Fleet]\nGlobal=true\nSchedule=*:*:0/2\n",
        ran.display()
    );
    let sweep = write_unit(dir.path(), "sweep.service", &text);
    fleet.ok(&["start", &sweep]);
    let lines = || std::fs::read_to_string(&ran).map_or(0, |text| text.lines().count());
    fleet.wait_until("three elapses ran", WAIT, |_| lines() >= 3);
    fleet.wait_until("fleetctl runs counts the machine's ends", WAIT, |f| {
        f.ok(&["runs", "sweep.service"]).stdout.contains("\tevery\t")
            && f.ok(&["runs", "sweep.service"]).stdout.contains("1 succeeded")
    });
    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["runs", "sweep.service", "-o", "json"]).stdout).unwrap();
    let runs = json["runs"].as_array().expect("runs");
    assert!(runs.iter().all(|run| run["state"] == "global"), "{json}");
    assert!(runs.iter().any(|run| run["machines"]["succeeded"] == 1), "{json}");
    let record = record_after_stop(&mut fleet, "sweep.service");
    let elapses: Vec<i64> = record.runs.iter().filter_map(|run| run.elapse).collect();
    assert!(elapses.windows(2).all(|pair| pair[0] < pair[1]), "each elapse claimed once: {record:?}");
    let counted: u32 = record.runs.iter().filter_map(|run| run.tally.as_deref()).map(|tally| tally.ended()).sum();
    let ran_lines = u32::try_from(std::fs::read_to_string(&ran).unwrap().lines().count()).unwrap();
    assert!(
        counted >= 1 && counted <= ran_lines,
        "each end counted once, none it did not run: {counted} of {ran_lines}"
    );
    assert!(
        ran_lines as usize <= record.runs.len() + 1,
        "at most one run per elapse claimed: {ran_lines} runs, {record:?}"
    );
}

#[test]
fn a_global_batch_unit_runs_once_per_start_on_its_machine() {
    let systemd = SystemdUser::start();
    let mut fleet = Fleetd::start_under(&systemd, MACHINE);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("patched");
    let text = format!(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo run >> {}'\n[X-Fleet]\nGlobal=true\nBatch=true\n",
        ran.display()
    );
    let patch = write_unit(dir.path(), "patch.service", &text);
    fleet.ok(&["start", &patch]);
    let counted = |f: &Fleetd, succeeded: u64| {
        let json: serde_json::Value =
            serde_json::from_str(&f.ok(&["runs", "patch.service", "-o", "json"]).stdout).unwrap();
        json["runs"].as_array().is_some_and(|runs| {
            runs.iter().map(|run| run["machines"]["succeeded"].as_u64().unwrap_or(0)).sum::<u64>() == succeeded
        })
    };
    fleet.wait_until("its run ended and was counted", WAIT, |f| counted(f, 1));
    let again = fleet.ok(&["run", "patch.service"]);
    assert!(again.stdout.starts_with("Started run 2 of patch.service"), "{again:?}");
    fleet.wait_until("the run by hand ended and was counted", WAIT, |f| counted(f, 2));
    let record = record_after_stop(&mut fleet, "patch.service");
    assert_eq!(record.runs.len(), 2, "{record:?}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2, "once per start, once by hand");
}
