use std::time::{Duration, Instant};

use super::*;

fn manager(dir: &Path) -> NativeManager {
    manager_stopping_within(dir, Duration::from_secs(10))
}

fn manager_stopping_within(dir: &Path, stop_all_timeout: Duration) -> NativeManager {
    NativeManager::new(NativeOptions {
        state_dir: dir.to_path_buf(),
        machine_id: "m1".into(),
        hostname: "host".into(),
        keeper_program: None,
        log_limits: LogLimits::default(),
        stop_all_timeout,
        allow_without_cgroups: false,
        handover_nonce: None,
        credentials_dir: dir.join("credentials"),
    })
    .unwrap()
}

async fn state_of(manager: &NativeManager, name: &str) -> SystemdState {
    manager.units().await.unwrap()[name].state.clone()
}

async fn wait_for(manager: &NativeManager, name: &str, active: &str, sub: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = state_of(manager, name).await;
        if state.active == active && state.sub == sub {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stuck in {state:?}, wanted {active}/{sub}; journal:\n{}",
            manager.journal(name, 20).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn load(manager: &NativeManager, name: &str, text: &str) {
    manager.load(name, &UnitFile::parse(text).unwrap()).await.unwrap();
}

#[tokio::test]
async fn simple_service_starts_and_stops_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let tag = dir.path();
    let unit = "[Unit]\nDescription=Hello\n[Service]\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1001'\n";
    load(&manager, "hello.service", unit).await;
    assert_eq!(state_of(&manager, "hello.service").await, SystemdState::new("loaded", "inactive", "dead"));
    manager.start("hello.service").await.unwrap();
    wait_for(&manager, "hello.service", "active", "running").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(unit_processes(tag).len(), 2, "both the main process and its child run");
    manager.stop("hello.service").await.unwrap();
    wait_for(&manager, "hello.service", "inactive", "dead").await;
    assert!(unit_processes(tag).is_empty(), "stop kills the whole process group");
    let journal = manager.journal("hello.service", 10).await.unwrap();
    assert!(journal.contains("Started Hello."), "{journal}");
    assert!(journal.contains("Stopped Hello."), "{journal}");
}

#[tokio::test]
async fn output_environment_and_specifiers_reach_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let env_file = dir.path().join("env");
    std::fs::write(&env_file, "FROM_FILE=filed\n").unwrap();
    let unit = format!(
        "[Unit]\nDescription=Greeting %i\n[Service]\nType=oneshot\nRemainAfterExit=yes\nEnvironment=GREETING=hi\nEnvironmentFile={}\nEnvironmentFile=-/nonexistent\nExecStartPre=/bin/echo pre\nExecStart=/bin/sh -c 'echo $GREETING %i $FROM_FILE; echo oops >&2'\nExecStartPost=-/bin/false\n",
        env_file.display()
    );
    load(&manager, "greet@world.service", &unit).await;
    manager.start("greet@world.service").await.unwrap();
    wait_for(&manager, "greet@world.service", "active", "exited").await;
    let journal = manager.journal("greet@world.service", 20).await.unwrap();
    assert!(journal.contains("host echo["), "{journal}");
    assert!(journal.contains(": pre"), "{journal}");
    assert!(journal.contains(": hi world filed"), "{journal}");
    assert!(journal.contains(": oops"), "{journal}");
    // As systemd's lines: the description's specifiers expanded (it said "Starting Greeting %i").
    assert!(journal.contains("fleetd: Starting Greeting world..."), "{journal}");
    manager.stop("greet@world.service").await.unwrap();
    wait_for(&manager, "greet@world.service", "inactive", "dead").await;
}

#[tokio::test]
async fn failures_and_restart_limits() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    load(&manager, "fail.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n").await;
    manager.start("fail.service").await.unwrap();
    wait_for(&manager, "fail.service", "failed", "failed").await;

    load(&manager, "missing.service", "[Service]\nExecStart=/does/not/exist\n").await;
    manager.start("missing.service").await.unwrap();
    wait_for(&manager, "missing.service", "failed", "failed").await;
    assert!(manager.journal("missing.service", 5).await.unwrap().contains("Failed to execute /does/not/exist"));

    let counter = dir.path().join("count");
    let unit = format!(
        "[Service]\nExecStart=/bin/sh -c 'echo x >> {}; exit 3'\nRestart=on-failure\nRestartSec=50ms\n",
        counter.display()
    );
    load(&manager, "flaky.service", &unit).await;
    manager.start("flaky.service").await.unwrap();
    wait_for(&manager, "flaky.service", "failed", "failed").await;
    let runs = std::fs::read_to_string(&counter).unwrap().lines().count();
    assert_eq!(runs, 5, "the first start and four restarts, then the start limit");
    assert!(manager.journal("flaky.service", 50).await.unwrap().contains("Start request repeated too quickly."));
}

#[tokio::test]
async fn restart_always_brings_a_killed_service_back() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let tag = dir.path();
    load(&manager, "always.service", "[Service]\nExecStart=/bin/sleep 1000\nRestart=always\nRestartSec=0\n").await;
    manager.start("always.service").await.unwrap();
    wait_for(&manager, "always.service", "active", "running").await;
    let first = unit_processes(tag);
    assert_eq!(first.len(), 1);
    process::signal_process(first[0], libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while unit_processes(tag).first() == first.first() || unit_processes(tag).is_empty() {
        assert!(Instant::now() < deadline, "not restarted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&manager, "always.service", "active", "running").await;
    manager.stop_all().await.unwrap();
    assert_eq!(state_of(&manager, "always.service").await.active, "inactive");
}

#[tokio::test]
async fn stubborn_processes_are_killed_after_the_stop_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    // The unit says when it ignores SIGTERM: a stop sent before its shell set the trap would
    // end it at once.
    let ignoring = dir.path().join("ignores-term");
    let unit = format!(
        "[Service]\nExecStart=/bin/sh -c 'trap \"\" TERM; touch {}; while :; do sleep 0.1; done'\nTimeoutStopSec=2s\nExecStopPost=/bin/echo cleaned\n",
        ignoring.display()
    );
    load(&manager, "stubborn.service", &unit).await;
    manager.start("stubborn.service").await.unwrap();
    wait_for(&manager, "stubborn.service", "active", "running").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ignoring.exists() {
        assert!(Instant::now() < deadline, "the unit never set its trap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    manager.stop("stubborn.service").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "a stop does not wait for the unit");
    wait_for(&manager, "stubborn.service", "inactive", "dead").await;
    assert!(started.elapsed() >= Duration::from_secs(2), "killed only once its stop timed out");
    let journal = manager.journal("stubborn.service", 20).await.unwrap();
    assert!(journal.contains("timed out. Killing."), "{journal}");
    assert!(journal.contains(": cleaned"), "{journal}");
}

#[tokio::test]
async fn units_it_cannot_run_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    load(&manager, "empty.service", "[Service]\nUser=root\n").await;
    assert_eq!(state_of(&manager, "empty.service").await.load, "bad-setting");
    let error = manager.start("empty.service").await.unwrap_err().to_string();
    assert!(error.contains("no ExecStart="), "{error}");
    // The reason once (at load), then what systemd says at a start.
    let journal = manager.journal("empty.service", 10).await.unwrap();
    assert_eq!(journal.matches("no ExecStart=").count(), 1, "{journal}");
    assert!(
        journal.contains("empty.service: Unit configuration has fatal error, unit will not be started."),
        "{journal}"
    );
    load(&manager, "nouser.service", "[Service]\nExecStart=/bin/true\nUser=no-such-user-here\n").await;
    assert!(manager.start("nouser.service").await.is_err());
    assert_eq!(state_of(&manager, "nouser.service").await.active, "failed");
    assert!(matches!(manager.start("unknown.service").await, Err(UnitManagerError::NotLoaded(_))));
    manager.unload("nouser.service").await.unwrap();
    assert!(!manager.units().await.unwrap().contains_key("nouser.service"));
}

/// Regression: `TimeoutStartSec=99999999999999999999999` that reached the store anyway
/// panicked the agent; now the unit fails with the reason and the manager goes on.
#[tokio::test]
async fn a_value_that_does_not_fit_fails_the_unit_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    load(&manager, "huge.service", "[Service]\nExecStart=/bin/sleep 100\nTimeoutStartSec=99999999999999999999999\n")
        .await;
    assert_eq!(state_of(&manager, "huge.service").await, SystemdState::new("bad-setting", "inactive", "dead"));
    let refused = manager.start("huge.service").await.unwrap_err();
    assert!(refused.to_string().contains("TimeoutStartSec"), "{refused}");
    assert_eq!(state_of(&manager, "huge.service").await, SystemdState::new("bad-setting", "failed", "failed"));
    let journal = manager.journal("huge.service", 10).await.unwrap();
    assert!(journal.contains("invalid value \"99999999999999999999999\" for TimeoutStartSec="), "{journal}");
    load(&manager, "fine.service", "[Service]\nExecStart=/bin/sleep 100\n").await;
    manager.start("fine.service").await.unwrap();
    wait_for(&manager, "fine.service", "active", "running").await;
    manager.stop_all().await.unwrap();
}

/// Regression: one unit that ignores SIGTERM with `TimeoutStopSec=infinity` kept every other
/// unit from starting, and fleetd's shutdown hung on it.
#[tokio::test]
async fn a_unit_that_never_stops_holds_up_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager_stopping_within(dir.path(), Duration::from_millis(500));
    for (name, kind) in [("stubborn.service", "simple"), ("stubborn-fork.service", "forking")] {
        // The unit says when it ignores SIGTERM: a stop sent before its shell set the trap
        // would end it (that raced under load).
        let ignoring = dir.path().join(format!("{name}.ignores-term"));
        let unit = format!(
            "[Service]\nType={kind}\nExecStart=/bin/sh -c 'trap \"\" TERM; touch {}; while :; do sleep 0.1; done{}'\nTimeoutStopSec=infinity\n",
            ignoring.display(),
            if kind == "forking" { " & exit 0" } else { "" }
        );
        load(&manager, name, &unit).await;
        manager.start(name).await.unwrap();
        wait_for(&manager, name, "active", "running").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ignoring.exists() {
            assert!(Instant::now() < deadline, "{name} never set its trap");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // It returns without waiting for a unit that never stops (2 s: a bound, not a wait).
        tokio::time::timeout(Duration::from_secs(2), manager.stop(name)).await.expect("stop returns at once").unwrap();
    }
    load(&manager, "other.service", "[Service]\nExecStart=/bin/sleep 1000\n").await;
    manager.start("other.service").await.unwrap();
    wait_for(&manager, "other.service", "active", "running").await;
    // Still stopping: it ignores SIGTERM and has no stop timeout.
    wait_for(&manager, "stubborn.service", "deactivating", "stop-sigterm").await;
    // A restart of the stubborn unit waits for its old run instead of running beside it.
    manager.start("stubborn.service").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(state_of(&manager, "stubborn.service").await, SystemdState::new("loaded", "activating", "start"));
    let journal = manager.journal("stubborn.service", 50).await.unwrap();
    assert_eq!(journal.matches("Starting ").count(), 1, "the new run waits: {journal}");
    let started = Instant::now();
    manager.stop_all().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "shutdown is bounded: {:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !unit_processes(dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "what did not stop was killed: {:?}", unit_processes(dir.path()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Regression: units without `WorkingDirectory=` ran in fleetd's own working directory.
#[tokio::test]
async fn units_run_in_the_root_directory_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    load(&manager, "where.service", "[Service]\nType=oneshot\nExecStart=/bin/pwd\n").await;
    manager.start("where.service").await.unwrap();
    wait_for(&manager, "where.service", "inactive", "dead").await;
    let journal = manager.journal("where.service", 20).await.unwrap();
    assert!(journal.lines().any(|line| line.contains(" pwd[") && line.ends_with("]: /")), "{journal}");
}

/// `reload` runs a running unit's `ExecReload=` with `$MAINPID` its main process, and leaves
/// it running; a unit without one, or not running, is refused.
#[tokio::test]
async fn reload_runs_exec_reload_with_the_main_pid_and_leaves_the_unit_running() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let (out, ready) = (dir.path().join("reloaded"), dir.path().join("ready"));
    let unit = format!(
        "[Service]\nExecStart=/bin/sh -c 'trap \"echo hup >> {out}\" HUP; touch {ready}; while :; do sleep 0.1; done'\nExecReload=/bin/kill -HUP $MAINPID\n",
        out = out.display(),
        ready = ready.display()
    );
    load(&manager, "r.service", &unit).await;
    let refused = manager.reload("r.service").await.expect_err("not running");
    assert!(refused.to_string().contains("not running"), "{refused}");
    manager.start("r.service").await.unwrap();
    wait_for(&manager, "r.service", "active", "running").await;
    // Its trap is set before it says it is ready.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "{}", manager.journal("r.service", 20).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    manager.reload("r.service").await.unwrap();
    while std::fs::read_to_string(&out).unwrap_or_default() != "hup\n" {
        assert!(Instant::now() < deadline, "{}", manager.journal("r.service", 20).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&manager, "r.service", "active", "running").await;
    let journal = manager.journal("r.service", 20).await.unwrap();
    assert!(journal.contains("Reloaded "), "{journal}");
    load(&manager, "plain.service", "[Service]\nExecStart=/bin/sleep 1000\n").await;
    manager.start("plain.service").await.unwrap();
    let refused = manager.reload("plain.service").await.expect_err("no ExecReload=");
    assert!(refused.to_string().contains("ExecReload="), "{refused}");
    manager.stop_all().await.unwrap();
}

/// Regression: `fleetctl runs` showed, as a run's last lines, the lines of the runs before it.
#[tokio::test]
async fn a_runs_log_holds_the_lines_of_that_run_only() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let counter = dir.path().join("counter");
    let unit = format!(
        "[Unit]\nDescription=Counting\n[Service]\nType=oneshot\nExecStart=/bin/sh -c 'n=$(cat {0} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {0}; echo run $n'\n",
        counter.display()
    );
    load(&manager, "count.service", &unit).await;
    let mut logs = Vec::new();
    for _ in 0..2 {
        let since =
            i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros())
                .unwrap();
        manager.start("count.service").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while manager.run_end("count.service").await.unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the run never ended: {}",
                manager.journal("count.service", 20).await.unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        logs.push(manager.run_log("count.service", since, 20).await.unwrap());
    }
    assert!(logs[0].contains(": run 1"), "{}", logs[0]);
    assert!(logs[1].contains(": run 2"), "{}", logs[1]);
    assert!(logs[1].contains("fleetd: Starting Counting..."), "{}", logs[1]);
    assert!(!logs[1].contains(": run 1"), "the second run's log holds the first's lines:\n{}", logs[1]);
    assert_eq!(logs[1].matches("Starting Counting").count(), 1, "{}", logs[1]);
    // The unit's journal still holds both.
    let journal = manager.journal("count.service", 20).await.unwrap();
    assert!(journal.contains(": run 1") && journal.contains(": run 2"), "{journal}");
}

/// `status` says what `systemctl status` would: state and since when, the main process, the
/// unit's processes with what they hold, and its log's last lines.
#[tokio::test]
async fn status_reports_the_main_process_the_processes_and_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let unit =
        "[Unit]\nDescription=Status of %i\n[Service]\nExecStart=/bin/sh -c 'echo up; sleep 1000 & exec sleep 1001'\n";
    load(&manager, "st@one.service", unit).await;
    manager.start("st@one.service").await.unwrap();
    wait_for(&manager, "st@one.service", "active", "running").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let report = manager.status("st@one.service").await.unwrap().expect("a report of a loaded unit");
        if report.contains("Tasks: 2\n") && report.contains(": up\n") {
            break report;
        }
        assert!(Instant::now() < deadline, "never both processes and the log line:\n{report}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(report.starts_with("● st@one.service - Status of one\n"), "{report}");
    assert!(report.contains("     Loaded: loaded (fleet's native supervisor)\n"), "{report}");
    assert!(report.contains("     Active: active (running) since "), "{report}");
    let main = report.lines().find_map(|line| line.trim().strip_prefix("Main PID: ")).expect("a main PID");
    assert!(main.ends_with(" (sleep)"), "{report}");
    assert!(report.contains("sleep 1000") && report.contains("sleep 1001"), "{report}");
    assert!(report.contains("     Memory: ") && report.contains("        CPU: "), "{report}");
    manager.stop("st@one.service").await.unwrap();
    wait_for(&manager, "st@one.service", "inactive", "dead").await;
    let stopped = manager.status("st@one.service").await.unwrap().expect("a report");
    assert!(!stopped.contains("Main PID") && !stopped.contains("Tasks:"), "{stopped}");
    assert!(stopped.contains("Active: inactive (dead) since "), "{stopped}");
    assert_eq!(manager.status("nothing.service").await.unwrap(), None);
}

/// A stop gives up a start still waiting for the spawning thread (behind other starts), as
/// systemd's stop cancels a start job: the unit is inactive at once, and its process never
/// runs. (It waited for the thread, then ran, and a stop of it waited as long.)
#[tokio::test]
async fn a_stop_gives_up_a_start_still_waiting_for_the_spawning_thread() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path());
    let ran = dir.path().join("ran");
    let unit = format!("[Service]\nExecStart=/bin/sh -c 'touch {}; exec sleep 1000'\n", ran.display());
    load(&manager, "late.service", &unit).await;
    let held = manager.shared.spawner.hold();
    manager.start("late.service").await.unwrap();
    manager.stop("late.service").await.unwrap();
    wait_for(&manager, "late.service", "inactive", "dead").await;
    drop(held);
    // The thread takes its requests in order: once a unit started after runs, the first
    // request was dealt with.
    load(&manager, "next.service", "[Service]\nExecStart=/bin/sleep 1001\n").await;
    manager.start("next.service").await.unwrap();
    wait_for(&manager, "next.service", "active", "running").await;
    assert!(!ran.exists(), "the start given up never ran");
    let journal = manager.journal("late.service", 10).await.unwrap();
    assert!(!journal.contains("Started"), "{journal}");
    manager.stop_all().await.unwrap();
}
