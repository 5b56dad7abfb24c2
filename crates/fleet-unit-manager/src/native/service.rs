//! What the native supervisor reads from a unit file: the `[Service]` directives it
//! supports, and a warning for everything it does not. Pure.

use std::time::Duration;

use fleet_core::UnitFile;
pub use fleet_core::service_values::{Exit, KillMode, RestartPolicy, ServiceType};
use fleet_core::service_values::{parse_signal, parse_systemd_bool, parse_timespan};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    pub kind: ServiceType,
    pub exec_start_pre: Vec<String>,
    pub exec_start: Vec<String>,
    pub exec_start_post: Vec<String>,
    pub exec_stop: Vec<String>,
    pub exec_stop_post: Vec<String>,
    pub exec_reload: Vec<String>,
    pub restart: RestartPolicy,
    pub restart_sec: Duration,
    pub environment: Vec<String>,
    pub environment_files: Vec<String>,
    pub working_directory: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    pub kill_signal: i32,
    pub kill_mode: KillMode,
    pub timeout_start: Option<Duration>,
    pub timeout_stop: Option<Duration>,
    pub remain_after_exit: bool,
    pub pid_file: Option<String>,
}

/// What a unit of type `kind` may do instead under the native supervisor.
fn instead_of(kind: &str) -> &'static str {
    match kind {
        "timer" => {
            "; a service on a calendar runs under it with [X-Fleet] Schedule= (OnCalendar='s syntax) instead of a timer"
        }
        _ => "",
    }
}

/// A unit the native supervisor cannot run, with systemd's kind of wording.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("unit type {0:?} is not supported by the native unit manager (only .service){hint}", hint = instead_of(.0))]
    UnsupportedType(String),
    #[error("Service has no ExecStart= setting, which is only allowed for Type=oneshot services. Refusing.")]
    NoExecStart,
    #[error("Service has more than one ExecStart= setting, which is only allowed for Type=oneshot services. Refusing.")]
    SeveralExecStart,
    #[error("invalid value {value:?} for {key}=")]
    BadValue { key: &'static str, value: String },
}

/// `[Unit]` keys that only describe the unit; nothing to run.
const DESCRIPTIVE_UNIT_KEYS: &[&str] = &["Description", "Documentation"];

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

impl ServiceConfig {
    /// What a unit gets for every setting it does not make.
    fn defaults() -> Self {
        Self {
            kind: ServiceType::Simple,
            exec_start_pre: Vec::new(),
            exec_start: Vec::new(),
            exec_start_post: Vec::new(),
            exec_stop: Vec::new(),
            exec_stop_post: Vec::new(),
            exec_reload: Vec::new(),
            restart: RestartPolicy::No,
            restart_sec: Duration::from_millis(100),
            environment: Vec::new(),
            environment_files: Vec::new(),
            working_directory: None,
            user: None,
            group: None,
            kill_signal: libc::SIGTERM,
            kill_mode: KillMode::ControlGroup,
            timeout_start: Some(DEFAULT_TIMEOUT),
            timeout_stop: Some(DEFAULT_TIMEOUT),
            remain_after_exit: false,
            pid_file: None,
        }
    }

    /// Resets the setting `key` to its default; false for a key that is not a plain setting.
    fn reset(&mut self, key: &str) -> bool {
        let defaults = Self::defaults();
        match key {
            "Type" => self.kind = defaults.kind,
            "Restart" => self.restart = defaults.restart,
            "RestartSec" => self.restart_sec = defaults.restart_sec,
            "WorkingDirectory" => self.working_directory = defaults.working_directory,
            "User" => self.user = defaults.user,
            "Group" => self.group = defaults.group,
            "KillSignal" => self.kill_signal = defaults.kill_signal,
            "KillMode" => self.kill_mode = defaults.kill_mode,
            "TimeoutStartSec" => self.timeout_start = defaults.timeout_start,
            "TimeoutStopSec" => self.timeout_stop = defaults.timeout_stop,
            "TimeoutSec" => (self.timeout_start, self.timeout_stop) = (defaults.timeout_start, defaults.timeout_stop),
            "RemainAfterExit" => self.remain_after_exit = defaults.remain_after_exit,
            "PIDFile" => self.pid_file = defaults.pid_file,
            "Environment" => self.environment.clear(),
            "EnvironmentFile" => self.environment_files.clear(),
            _ => return false,
        }
        true
    }

    /// Reads the unit `name` into what the supervisor runs, and the warnings for the
    /// directives it ignores.
    pub fn from_unit(name: &str, file: &UnitFile) -> Result<(Self, Vec<String>), ServiceError> {
        if !name.ends_with(".service") {
            let kind = name.rsplit_once('.').map_or(name, |(_, kind)| kind);
            return Err(ServiceError::UnsupportedType(kind.to_string()));
        }
        let mut config = Self::defaults();
        let mut warnings = Vec::new();
        let bad = |key: &'static str, value: &str| ServiceError::BadValue { key, value: value.to_string() };
        for option in file.options() {
            let value = option.value.as_str();
            // An empty assignment resets a setting to its default, as in systemd (for the
            // Exec*= lists, below, it empties the list).
            if option.section == "Service" && value.trim().is_empty() && config.reset(&option.name) {
                continue;
            }
            match (option.section.as_str(), option.name.as_str()) {
                ("Service", "Type") => {
                    config.kind = match value.parse().map_err(|_| bad("Type", value))? {
                        ServiceType::Notify | ServiceType::NotifyReload | ServiceType::Dbus | ServiceType::Idle => {
                            warnings.push(format!("Type={value} is run as Type=simple by the native unit manager"));
                            ServiceType::Simple
                        }
                        kind => kind,
                    }
                }
                // An empty assignment resets the list, as in systemd.
                (
                    "Service",
                    key @ ("ExecStartPre" | "ExecStart" | "ExecStartPost" | "ExecStop" | "ExecStopPost" | "ExecReload"),
                ) => {
                    let list = match key {
                        "ExecStartPre" => &mut config.exec_start_pre,
                        "ExecStart" => &mut config.exec_start,
                        "ExecStartPost" => &mut config.exec_start_post,
                        "ExecStop" => &mut config.exec_stop,
                        "ExecReload" => &mut config.exec_reload,
                        _ => &mut config.exec_stop_post,
                    };
                    if value.trim().is_empty() {
                        list.clear();
                    } else {
                        list.push(value.to_string());
                    }
                }
                ("Service", "Restart") => {
                    config.restart = value.parse().map_err(|_| bad("Restart", value))?;
                }
                ("Service", "RestartSec") => {
                    config.restart_sec =
                        parse_timespan(value).map_err(|_| bad("RestartSec", value))?.unwrap_or(Duration::MAX)
                }
                ("Service", "Environment") => config.environment.push(value.to_string()),
                ("Service", "EnvironmentFile") => config.environment_files.push(value.to_string()),
                ("Service", "WorkingDirectory") => config.working_directory = Some(value.to_string()),
                ("Service", "User") => config.user = Some(value.to_string()),
                ("Service", "Group") => config.group = Some(value.to_string()),
                ("Service", "KillSignal") => {
                    config.kill_signal = parse_signal(value).ok_or_else(|| bad("KillSignal", value))?
                }
                ("Service", "KillMode") => {
                    config.kill_mode = value.parse().map_err(|_| bad("KillMode", value))?;
                }
                ("Service", "TimeoutStartSec") => {
                    config.timeout_start = parse_timespan(value).map_err(|_| bad("TimeoutStartSec", value))?
                }
                ("Service", "TimeoutStopSec") => {
                    config.timeout_stop = parse_timespan(value).map_err(|_| bad("TimeoutStopSec", value))?
                }
                ("Service", "TimeoutSec") => {
                    let timeout = parse_timespan(value).map_err(|_| bad("TimeoutSec", value))?;
                    config.timeout_start = timeout;
                    config.timeout_stop = timeout;
                }
                ("Service", "RemainAfterExit") => {
                    config.remain_after_exit = parse_systemd_bool(value).ok_or_else(|| bad("RemainAfterExit", value))?
                }
                ("Service", "PIDFile") => config.pid_file = Some(value.to_string()),
                // The runner applies these as cgroup limits (`fleet_core::requirements::limits_of`).
                ("Service", "MemoryMax" | "CPUQuota") => {}
                ("Unit", key) if DESCRIPTIVE_UNIT_KEYS.contains(&key) => {}
                ("X-Fleet", _) => {}
                (section, key) => {
                    warnings.push(format!("[{section}] {key}= is not supported by the native unit manager, ignoring"))
                }
            }
        }
        match (config.kind, config.exec_start.len()) {
            (ServiceType::Oneshot, _) => {}
            (_, 0) => return Err(ServiceError::NoExecStart),
            (_, 1) => {}
            _ => return Err(ServiceError::SeveralExecStart),
        }
        if config.kind == ServiceType::Oneshot && config.timeout_start == Some(DEFAULT_TIMEOUT) {
            // systemd does not time out oneshot services by default.
            config.timeout_start = None;
        }
        Ok((config, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str, text: &str) -> Result<(ServiceConfig, Vec<String>), ServiceError> {
        ServiceConfig::from_unit(name, &UnitFile::parse(text).unwrap())
    }

    #[test]
    fn reads_the_supported_directives() {
        let (config, warnings) = read(
            "a.service",
            "[Unit]\nDescription=x\nAfter=b.service\n[Service]\nType=oneshot\nExecStart=/bin/true\nExecStart=/bin/false\nRestart=on-failure\nRestartSec=1min 30s\nKillSignal=SIGINT\nKillMode=mixed\nTimeoutStopSec=500ms\nRemainAfterExit=yes\nBogus=1\n[X-Fleet]\nGlobal=true\n",
        )
        .unwrap();
        assert_eq!(config.kind, ServiceType::Oneshot);
        assert_eq!(config.exec_start.len(), 2);
        assert_eq!(config.restart, RestartPolicy::OnFailure);
        assert_eq!(config.restart_sec, Duration::from_secs(90));
        assert_eq!(config.kill_signal, libc::SIGINT);
        assert_eq!(config.kill_mode, KillMode::Mixed);
        assert_eq!(config.timeout_stop, Some(Duration::from_millis(500)));
        assert!(config.remain_after_exit);
        assert_eq!(
            warnings,
            vec![
                "[Unit] After= is not supported by the native unit manager, ignoring",
                "[Service] Bogus= is not supported by the native unit manager, ignoring"
            ]
        );
    }

    /// Regression: a time span too large for a `Duration` panicked inside the agent; it is
    /// a bad value of the directive that names it.
    #[test]
    fn a_time_span_that_does_not_fit_is_a_bad_value() {
        for key in ["TimeoutStartSec", "RestartSec", "TimeoutStopSec", "TimeoutSec"] {
            let error = read("a.service", &format!("[Service]\nExecStart=/bin/true\n{key}=99999999999999999999999\n"))
                .unwrap_err();
            assert_eq!(error, ServiceError::BadValue { key, value: "99999999999999999999999".into() }, "{key}");
        }
    }

    /// Found by fuzzing: `RestartSec=` (empty) passed the API's check but the supervisor
    /// refused it; an empty assignment resets a setting, as in systemd.
    #[test]
    fn an_empty_assignment_resets_a_setting() {
        let (config, _) =
            read("a.service", "[Service]\nExecStart=/bin/true\nRestartSec=5\nRestartSec=\nKillSignal=\nUser=\n")
                .unwrap();
        assert_eq!(config.restart_sec, Duration::from_millis(100));
        assert_eq!(config.kill_signal, libc::SIGTERM);
        assert_eq!(config.user, None);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        assert_eq!(read("a.service", "[Service]\nType=simple\n").unwrap_err(), ServiceError::NoExecStart);
        assert_eq!(
            read("a.service", "[Service]\nExecStart=a\nExecStart=b\n").unwrap_err(),
            ServiceError::SeveralExecStart
        );
        assert_eq!(
            read("a.socket", "[Socket]\nListenStream=1\n").unwrap_err().to_string(),
            "unit type \"socket\" is not supported by the native unit manager (only .service)"
        );
        assert_eq!(
            read("a.timer", "[Timer]\nOnCalendar=daily\n").unwrap_err().to_string(),
            "unit type \"timer\" is not supported by the native unit manager (only .service); a service on a calendar runs under it with [X-Fleet] Schedule= (OnCalendar='s syntax) instead of a timer"
        );
        assert_eq!(
            read("a.service", "[Service]\nExecStart=a\nRestart=sometimes\n").unwrap_err().to_string(),
            "invalid value \"sometimes\" for Restart="
        );
        // An empty ExecStart= resets the list.
        assert!(read("a.service", "[Service]\nExecStart=a\nExecStart=\nExecStart=b\n").is_ok());
    }

    #[test]
    fn restart_policies() {
        use Exit::*;
        assert!(RestartPolicy::Always.restarts_after(Code(0)));
        assert!(!RestartPolicy::OnFailure.restarts_after(Code(0)));
        assert!(RestartPolicy::OnFailure.restarts_after(Code(1)));
        assert!(RestartPolicy::OnFailure.restarts_after(Signal(libc::SIGKILL)));
        assert!(!RestartPolicy::OnFailure.restarts_after(Signal(libc::SIGTERM)));
        assert!(!RestartPolicy::OnAbnormal.restarts_after(Code(1)));
        assert!(RestartPolicy::OnAbnormal.restarts_after(Timeout));
        assert!(RestartPolicy::OnAbort.restarts_after(Signal(libc::SIGSEGV)));
        assert!(RestartPolicy::OnSuccess.restarts_after(Code(0)));
        assert!(!RestartPolicy::No.restarts_after(Code(1)));
    }
}
