//! How an inactive service got there: a pure rule over the times systemd keeps, the times as
//! systemd's signals told them, and the D-Bus reads of them.
//!
//! systemd records when a unit left the active state (`ActiveExitTimestampMonotonic`) and
//! when its main process exited (`ExecMainExitTimestampMonotonic`). A process that ends by
//! itself exits first and the unit leaves `active` because of it; a stop (`systemctl stop`,
//! a stop job) takes the unit out of `active` first and the process exits after the signal.
//! A oneshot without `RemainAfterExit=` never stays active: ending is what it does; a unit
//! with it stays active after its process ends, so only a stop makes it inactive.
//!
//! systemd forgets an inactive unit nobody references (it garbage-collects it) soon after it
//! stops, and the times with it; so the signal watcher keeps the last times each watched unit
//! announced ([`SeenEndings`]), and a live read is used only while systemd still has them.

use std::collections::HashMap;

use fleet_core::UnitFile;
use fleet_core::job::runs::Outcome;
use zbus::Connection;
use zbus_systemd::systemd1::{ServiceProxy, UnitProxy};

pub const MAIN_EXITED: &str = "ExecMainExitTimestampMonotonic";
pub const LEFT_ACTIVE: &str = "ActiveExitTimestampMonotonic";

/// Monotonic microseconds; 0 when it never happened (or systemd forgot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Times {
    pub main_exited_at: u64,
    pub left_active_at: u64,
}

impl Times {
    pub fn known(self) -> bool {
        self.main_exited_at != 0 || self.left_active_at != 0
    }
}

/// What is known of the end of a service's last run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    /// `Type=` (`simple`, `oneshot`, …).
    pub kind: String,
    pub remain_after_exit: bool,
    pub times: Times,
}

impl Ending {
    /// `file`'s service type, with the times systemd has now (`live`) or, once it forgot
    /// them, those its signals told (`seen`).
    pub fn of(file: &UnitFile, live: Times, seen: Times) -> Self {
        let last = |name: &str| file.values("Service", name).last().map(str::to_string);
        let remain_after_exit = last("RemainAfterExit")
            .is_some_and(|value| matches!(value.to_ascii_lowercase().as_str(), "yes" | "true" | "on" | "1"));
        Self {
            kind: last("Type").unwrap_or_else(|| "simple".to_string()),
            remain_after_exit,
            times: if live.known() { live } else { seen },
        }
    }

    /// Whether the service ended by itself rather than by a stop.
    pub fn by_itself(&self) -> bool {
        // With RemainAfterExit= the unit stays active after its process ends: only a stop
        // makes it inactive.
        if self.remain_after_exit {
            return false;
        }
        if self.kind == "oneshot" {
            return true;
        }
        self.times.main_exited_at != 0 && self.times.main_exited_at <= self.times.left_active_at
    }
}

/// The last times each watched unit's signals carried, by object path.
#[derive(Debug, Default)]
pub struct SeenEndings(HashMap<String, Times>);

impl SeenEndings {
    /// Takes the times among one `PropertiesChanged` signal's properties of `path`.
    pub fn record<'a>(&mut self, path: &str, changed: impl IntoIterator<Item = (&'a str, u64)>) {
        for (property, value) in changed {
            let slot: fn(&mut Times) -> &mut u64 = match property {
                MAIN_EXITED => |times| &mut times.main_exited_at,
                LEFT_ACTIVE => |times| &mut times.left_active_at,
                _ => continue,
            };
            // A unit systemd reloads announces zeros: what was seen before still holds.
            if value != 0 {
                *slot(self.0.entry(path.to_string()).or_default()) = value;
            }
        }
    }

    pub fn get(&self, path: &str) -> Times {
        self.0.get(path).copied().unwrap_or_default()
    }

    pub fn forget(&mut self, path: &str) {
        self.0.remove(path);
    }
}

/// Reads the times systemd has now for `path` (a service unit's object path).
pub async fn read(connection: Connection, path: String) -> zbus::Result<Times> {
    let no_cache = zbus::proxy::CacheProperties::No;
    let service = ServiceProxy::builder(&connection).path(path.clone()).cache_properties(no_cache).build().await?;
    let unit = UnitProxy::builder(&connection).path(path).cache_properties(no_cache).build().await?;
    Ok(Times {
        main_exited_at: service.exec_main_exit_timestamp_monotonic().await?,
        left_active_at: unit.active_exit_timestamp_monotonic().await?,
    })
}

/// How a run whose main process exited ended, from what systemd says of it: its `Result`,
/// and `ExecMainCode` (1: exited, 2: killed, 3: dumped core) with `ExecMainStatus` (the exit
/// status, or the signal's number).
pub fn outcome_of(result: &str, code: i32, status: i32) -> Outcome {
    match (result, code) {
        ("success", _) => Outcome::Succeeded,
        (_, 2 | 3) => Outcome::Failed { status: None, signal: Some(fleet_core::service_values::signal_name(status)) },
        (_, 1) => Outcome::Failed { status: Some(status), signal: None },
        _ => Outcome::Failed { status: None, signal: None },
    }
}

/// Reads how systemd says the last run of `path` ended: `Result`, `ExecMainCode`,
/// `ExecMainStatus`.
pub async fn read_outcome(connection: Connection, path: String) -> zbus::Result<Outcome> {
    let no_cache = zbus::proxy::CacheProperties::No;
    let service = ServiceProxy::builder(&connection).path(path).cache_properties(no_cache).build().await?;
    Ok(outcome_of(&service.result().await?, service.exec_main_code().await?, service.exec_main_status().await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> UnitFile {
        UnitFile::parse(text).expect("a unit file")
    }

    fn times(main_exited_at: u64, left_active_at: u64) -> Times {
        Times { main_exited_at, left_active_at }
    }

    #[test]
    fn a_process_that_exits_first_ended_by_itself_and_a_stop_comes_before_the_exit() {
        let simple = file("[Service]\nExecStart=/bin/sleep 1\n");
        let none = Times::default();
        assert!(Ending::of(&simple, times(1_000, 1_002), none).by_itself(), "exited, then the unit left active");
        assert!(!Ending::of(&simple, times(1_500, 1_000), none).by_itself(), "told to stop, then it exited");
        assert!(!Ending::of(&simple, none, none).by_itself(), "nothing known: not its own end");
        let oneshot = file("[Service]\nType=oneshot\nExecStart=/bin/true\n");
        assert!(Ending::of(&oneshot, none, none).by_itself(), "a oneshot is done when it ends");
        let remaining = file("[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n");
        assert!(!Ending::of(&remaining, times(1_000, 1_500), none).by_itself(), "a remaining oneshot, stopped");
    }

    #[test]
    fn a_run_ends_as_systemd_says_it_did() {
        assert_eq!(outcome_of("success", 1, 0), Outcome::Succeeded);
        assert_eq!(outcome_of("exit-code", 1, 3), Outcome::Failed { status: Some(3), signal: None });
        assert_eq!(outcome_of("signal", 2, 9), Outcome::Failed { status: None, signal: Some("SIGKILL".into()) });
        assert_eq!(outcome_of("core-dump", 3, 11), Outcome::Failed { status: None, signal: Some("SIGSEGV".into()) });
        assert_eq!(outcome_of("timeout", 0, 0), Outcome::Failed { status: None, signal: None });
    }

    #[test]
    fn times_seen_in_signals_stand_in_for_those_systemd_forgot() {
        let simple = file("[Service]\nExecStart=/bin/sleep 1\n");
        let mut seen = SeenEndings::default();
        let path = "/org/freedesktop/systemd1/unit/a_2eservice";
        seen.record(path, [(MAIN_EXITED, 1_000), ("ActiveState", 7)]);
        seen.record(path, [(LEFT_ACTIVE, 1_002)]);
        seen.record(path, [(MAIN_EXITED, 0), (LEFT_ACTIVE, 0)]);
        assert_eq!(seen.get(path), times(1_000, 1_002));
        assert!(Ending::of(&simple, Times::default(), seen.get(path)).by_itself());
        assert!(!Ending::of(&simple, times(1_500, 1_000), seen.get(path)).by_itself(), "live times win");
        seen.forget(path);
        assert_eq!(seen.get(path), Times::default());
    }
}
