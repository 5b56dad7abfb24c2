//! The values of `[Service]` directives: time spans, signals, booleans and the enumerated
//! settings, read with systemd's grammar. One parser per kind of value, used both where a unit
//! is submitted (so a value no manager could use is refused with the directive's name) and by
//! the native supervisor that runs it.

use std::str::FromStr;
use std::time::Duration;

use crate::UnitFile;

/// The longest time span systemd represents (`usec_t` of microseconds).
const MAX_TIMESPAN: Duration = Duration::from_micros(u64::MAX);

/// Why a time span cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimespanError {
    #[error("empty time span")]
    Empty,
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("unknown time unit {0:?}")]
    UnknownUnit(String),
    #[error("time span out of range")]
    OutOfRange,
}

/// Reads a systemd time span (`90`, `5s`, `100ms`, `1min 30s`, `1.5h`); `infinity` is `None`.
/// A span beyond what systemd can represent is an error, never a panic.
pub fn parse_timespan(text: &str) -> Result<Option<Duration>, TimespanError> {
    let text = text.trim();
    if text == "infinity" {
        return Ok(None);
    }
    if text.is_empty() {
        return Err(TimespanError::Empty);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if digits == 0 {
            // A word with no number before it (`abc`, `s`, `+5`) is named whole; it is never
            // read as a number, which would consume nothing and loop.
            let word = rest.split_whitespace().next().unwrap_or(rest);
            return Err(TimespanError::NotANumber(word.to_string()));
        }
        let number_text = &rest[..digits];
        let number: f64 = number_text.parse().map_err(|_| TimespanError::NotANumber(number_text.to_string()))?;
        rest = rest[digits..].trim_start();
        let unit_len = rest.find(|c: char| !c.is_alphabetic()).unwrap_or(rest.len());
        let seconds_per = match &rest[..unit_len] {
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "ms" | "msec" => 1e-3,
            "us" | "usec" | "µs" => 1e-6,
            "ns" | "nsec" => 1e-9,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            "M" | "month" | "months" => 2_629_800.0,
            "y" | "year" | "years" => 31_557_600.0,
            unit => return Err(TimespanError::UnknownUnit(unit.to_string())),
        };
        let part = Duration::try_from_secs_f64(number * seconds_per).map_err(|_| TimespanError::OutOfRange)?;
        total = total.checked_add(part).filter(|total| *total <= MAX_TIMESPAN).ok_or(TimespanError::OutOfRange)?;
        rest = rest[unit_len..].trim_start();
    }
    Ok(Some(total))
}

/// Linux's signal numbers by name (x86 and ARM numbering).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
    ("IO", 29),
    ("PWR", 30),
    ("SYS", 31),
];

/// Reads a signal as systemd's `KillSignal=` does: `SIGTERM`, `TERM` or a number.
pub fn parse_signal(text: &str) -> Option<i32> {
    let text = text.trim();
    let name = text.strip_prefix("SIG").unwrap_or(text);
    match SIGNALS.iter().find(|(known, _)| *known == name) {
        Some((_, number)) => Some(*number),
        None => name.parse().ok().filter(|number| (1..=64).contains(number)),
    }
}

/// A signal's name as systemd prints it (`SIGKILL` for 9); `SIG<number>` for one it has no
/// name for here.
pub fn signal_name(number: i32) -> String {
    match SIGNALS.iter().find(|(_, known)| *known == number) {
        Some((name, _)) => format!("SIG{name}"),
        None => format!("SIG{number}"),
    }
}

/// Reads a boolean with systemd's grammar (`yes`/`no`, `true`/`false`, `on`/`off`, `1`/`0`).
pub fn parse_systemd_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" | "y" | "t" => Some(true),
        "0" | "no" | "false" | "off" | "n" | "f" => Some(false),
        _ => None,
    }
}

/// `Type=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    Simple,
    Exec,
    Oneshot,
    Forking,
    Notify,
    NotifyReload,
    Dbus,
    Idle,
}

/// `Restart=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    No,
    Always,
    OnSuccess,
    OnFailure,
    OnAbnormal,
    OnWatchdog,
    OnAbort,
}

/// `KillMode=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillMode {
    ControlGroup,
    Mixed,
    Process,
    None,
}

/// How a main process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    Timeout,
}

impl Exit {
    /// systemd's clean exits: status 0, or SIGHUP, SIGINT, SIGTERM or SIGPIPE.
    pub fn is_clean(self) -> bool {
        matches!(self, Exit::Code(0) | Exit::Signal(1 | 2 | 13 | 15))
    }
}

impl RestartPolicy {
    /// Whether a main process that ended with `exit` is restarted.
    pub fn restarts_after(self, exit: Exit) -> bool {
        let clean = exit.is_clean();
        match self {
            Self::No => false,
            Self::Always => true,
            Self::OnSuccess => clean,
            Self::OnFailure => !clean,
            Self::OnAbnormal | Self::OnWatchdog => matches!(exit, Exit::Signal(_) | Exit::Timeout) && !clean,
            Self::OnAbort => matches!(exit, Exit::Signal(_)) && !clean,
        }
    }
}

/// A word that is not one of an enumerated setting's values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {0:?}")]
pub struct UnknownValue(pub String);

macro_rules! word_enum {
    ($type:ty { $($word:literal => $variant:expr),+ $(,)? }) => {
        impl FromStr for $type {
            type Err = UnknownValue;
            fn from_str(text: &str) -> Result<Self, UnknownValue> {
                match text.trim() {
                    $($word => Ok($variant),)+
                    other => Err(UnknownValue(other.to_string())),
                }
            }
        }
    };
}

word_enum!(ServiceType {
    "simple" => ServiceType::Simple,
    "exec" => ServiceType::Exec,
    "oneshot" => ServiceType::Oneshot,
    "forking" => ServiceType::Forking,
    "notify" => ServiceType::Notify,
    "notify-reload" => ServiceType::NotifyReload,
    "dbus" => ServiceType::Dbus,
    "idle" => ServiceType::Idle,
});

word_enum!(RestartPolicy {
    "no" => RestartPolicy::No,
    "always" => RestartPolicy::Always,
    "on-success" => RestartPolicy::OnSuccess,
    "on-failure" => RestartPolicy::OnFailure,
    "on-abnormal" => RestartPolicy::OnAbnormal,
    "on-watchdog" => RestartPolicy::OnWatchdog,
    "on-abort" => RestartPolicy::OnAbort,
});

word_enum!(KillMode {
    "control-group" => KillMode::ControlGroup,
    "mixed" => KillMode::Mixed,
    "process" => KillMode::Process,
    "none" => KillMode::None,
});

/// A `[Service]` directive whose value cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for {directive}=: {reason}")]
pub struct DirectiveError {
    pub directive: String,
    pub value: String,
    pub reason: String,
}

/// An integer from `low` to `high`, written as one (no sign games, no exponent, no NaN).
fn check_integer(value: &str, low: i64, high: i64) -> Result<(), String> {
    let expected = || format!("expected an integer from {low} to {high}");
    let number: i64 = value.parse().map_err(|_| expected())?;
    if (low..=high).contains(&number) { Ok(()) } else { Err(expected()) }
}

/// A resource limit (`LimitNOFILE=`, `LimitAS=` …): `soft[:hard]`, each `infinity` or a
/// count with an optional binary suffix (`K`, `M`, `G`, `T`, `P`, `E`); for the limits that
/// are times (`LimitCPU=`, `LimitRTTIME=`), each `infinity` or a time span.
fn check_limit(directive: &str, value: &str) -> Result<(), String> {
    let timed = matches!(directive, "LimitCPU" | "LimitRTTIME");
    let one = |part: &str| -> Result<(), String> {
        if part == "infinity" {
            return Ok(());
        }
        if timed {
            return parse_timespan(part).map(drop).map_err(|error| error.to_string());
        }
        let digits = part.trim_end_matches(['K', 'M', 'G', 'T', 'P', 'E']);
        let scale = match part.len() - digits.len() {
            0 => 0,
            1 => "KMGTPE".find(&part[digits.len()..]).map_or(0, |at| 10 * (at as u32 + 1)),
            _ => return Err("expected a count with at most one suffix (K, M, G, T, P, E), or infinity".into()),
        };
        let count: u64 = digits.parse().map_err(|_| "expected a count, or infinity".to_string())?;
        count.checked_mul(1u64 << scale).map(drop).ok_or_else(|| "too large".to_string())
    };
    match value.split_once(':') {
        Some((soft, hard)) => one(soft).and_then(|()| one(hard)),
        None => one(value),
    }
}

/// A memory limit as systemd reads it: a size, `infinity`, or a percentage of the machine.
fn check_memory_limit(value: &str) -> Result<(), String> {
    if let Some(percent) = value.trim().strip_suffix('%') {
        return match percent.parse::<f64>() {
            Ok(share) if (0.0..=100.0).contains(&share) => Ok(()),
            _ => Err("expected a size, a percentage from 0% to 100%, or infinity".into()),
        };
    }
    crate::resources::parse_bytes(value).map(drop).map_err(|error| error.to_string())
}

/// The directives whose values have a grammar, and the check for each.
fn check_value(directive: &str, value: &str) -> Option<Result<(), String>> {
    let result = match directive {
        "StartLimitBurst" => check_integer(value, 0, i64::from(u32::MAX)),
        "StartLimitIntervalSec" => parse_timespan(value).map(drop).map_err(|error| error.to_string()),
        "Nice" => check_integer(value, -20, 19),
        "OOMScoreAdjust" => check_integer(value, -1000, 1000),
        "MemoryMax" | "MemoryHigh" | "MemoryLow" | "MemoryMin" | "MemorySwapMax" => check_memory_limit(value),
        "CPUQuota" => crate::resources::parse_cpu_quota(value).map(drop).map_err(|error| error.to_string()),
        limit if limit.starts_with("Limit") => check_limit(limit, value),
        "RestartSec" | "TimeoutStartSec" | "TimeoutStopSec" | "TimeoutSec" | "TimeoutAbortSec" | "RuntimeMaxSec"
        | "WatchdogSec" => parse_timespan(value).map(drop).map_err(|error| error.to_string()),
        "Type" => value.parse::<ServiceType>().map(drop).map_err(|error| error.to_string()),
        "Restart" => value.parse::<RestartPolicy>().map(drop).map_err(|error| error.to_string()),
        "KillMode" => value.parse::<KillMode>().map(drop).map_err(|error| error.to_string()),
        "KillSignal" | "FinalKillSignal" | "RestartKillSignal" => {
            parse_signal(value).map(drop).ok_or_else(|| "unknown signal".to_string())
        }
        "RemainAfterExit" | "SendSIGKILL" | "SendSIGHUP" | "GuessMainPID" => {
            parse_systemd_bool(value).map(drop).ok_or_else(|| "expected a boolean".to_string())
        }
        _ => return None,
    };
    Some(result)
}

/// Checks every `[Service]` directive with a known grammar (and `[Unit]`'s start limits). An
/// empty value resets a setting in systemd, so it is accepted.
pub fn check_service_directives(file: &UnitFile) -> Result<(), DirectiveError> {
    let checked =
        |section: &str, name: &str| section == "Service" || (section == "Unit" && name.starts_with("StartLimit"));
    for option in file.options().iter().filter(|option| checked(&option.section, &option.name)) {
        if option.value.trim().is_empty() {
            continue;
        }
        if let Some(Err(reason)) = check_value(&option.name, &option.value) {
            return Err(DirectiveError { directive: option.name.clone(), value: option.value.clone(), reason });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_spans() {
        assert_eq!(parse_timespan("5"), Ok(Some(Duration::from_secs(5))));
        assert_eq!(parse_timespan("2h 1s"), Ok(Some(Duration::from_secs(7201))));
        assert_eq!(parse_timespan("1min30s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_timespan("1.5s"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_timespan("infinity"), Ok(None));
        assert_eq!(parse_timespan("5 parsecs"), Err(TimespanError::UnknownUnit("parsecs".into())));
        assert_eq!(parse_timespan(""), Err(TimespanError::Empty));
        assert_eq!(parse_timespan("."), Err(TimespanError::NotANumber(".".into())));
        // Regression: a word was named as an empty number (`"" is not a number`).
        assert_eq!(parse_timespan("abc"), Err(TimespanError::NotANumber("abc".into())));
        assert_eq!(parse_timespan("5s soon"), Err(TimespanError::NotANumber("soon".into())));
        // Regression (found by the fuzz target `service_directives`): a sign before a number
        // read as a number of no digits, and the parse never moved on.
        assert_eq!(parse_timespan("+5"), Err(TimespanError::NotANumber("+5".into())));
        assert_eq!(parse_timespan("1s +5"), Err(TimespanError::NotANumber("+5".into())));
    }

    /// Regression: a span too large for a `Duration` panicked inside the agent.
    #[test]
    fn spans_that_do_not_fit_are_errors() {
        for text in ["99999999999999999999999", "99999999999999999999999s", "1e400", "584543y", "9e18 9e18"] {
            assert!(parse_timespan(text).is_err(), "{text}");
        }
        assert!(parse_timespan("584541y").is_ok());
    }

    /// Regression: these took `NaN`, `-1` and `1e23` and handed them on to systemd.
    #[test]
    fn numbers_and_limits_are_read_strictly() {
        let refused = |section: &str, name: &str, value: &str| {
            let file = UnitFile::parse(&format!("[{section}]\n{name}={value}\n")).expect("a unit file");
            check_service_directives(&file).err().map(|error| error.to_string())
        };
        for (name, value) in [
            ("StartLimitBurst", "NaN"),
            ("StartLimitBurst", "-1"),
            ("StartLimitBurst", "1e23"),
            ("Nice", "NaN"),
            ("Nice", "-21"),
            ("Nice", "20"),
            ("Nice", "1e23"),
            ("OOMScoreAdjust", "-1001"),
            ("OOMScoreAdjust", "NaN"),
            ("LimitNOFILE", "-1"),
            ("LimitNOFILE", "NaN"),
            ("LimitNOFILE", "1e23"),
            ("LimitNOFILE", "99999999999999999999999"),
            ("LimitAS", "16EE"),
            ("LimitAS", "17179869184G"),
            ("LimitNOFILE", "1024:x"),
            ("LimitCPU", "forever"),
        ] {
            let message = refused("Service", name, value);
            assert!(
                message.as_deref().is_some_and(|m| m.starts_with(&format!("invalid value {value:?} for {name}="))),
                "{name}={value}: {message:?}"
            );
        }
        assert!(refused("Unit", "StartLimitBurst", "-1").is_some());
        for (name, value) in [
            ("StartLimitBurst", "5"),
            ("Nice", "-20"),
            ("Nice", "19"),
            ("OOMScoreAdjust", "-1000"),
            ("LimitNOFILE", "65536"),
            ("LimitNOFILE", "1024:524288"),
            ("LimitNOFILE", "infinity"),
            ("LimitAS", "4G"),
            ("LimitCPU", "30min"),
            ("LimitCORE", "0:infinity"),
        ] {
            assert_eq!(refused("Service", name, value), None, "{name}={value}");
        }
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("KILL"), Some(9));
        assert_eq!(parse_signal("SIGTERM"), Some(15));
        assert_eq!(parse_signal("15"), Some(15));
        assert_eq!(parse_signal("SIGBOGUS"), None);
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("65"), None);
    }

    #[test]
    fn submitted_directives_are_checked_by_name() {
        let file = |text: &str| UnitFile::parse(text).unwrap();
        assert_eq!(check_service_directives(&file("[Service]\nExecStart=/bin/true\nTimeoutStartSec=5min\n")), Ok(()));
        let error =
            check_service_directives(&file("[Service]\nTimeoutStartSec=99999999999999999999999\n")).unwrap_err();
        assert_eq!(error.directive, "TimeoutStartSec");
        assert_eq!(
            error.to_string(),
            "invalid value \"99999999999999999999999\" for TimeoutStartSec=: time span out of range"
        );
        assert_eq!(check_service_directives(&file("[Service]\nRestart=sometimes\n")).unwrap_err().directive, "Restart");
        assert_eq!(
            check_service_directives(&file("[Service]\nKillSignal=SIGNOPE\n")).unwrap_err().directive,
            "KillSignal"
        );
        // Outside [Service], and empty resets, are not ours to refuse.
        assert_eq!(check_service_directives(&file("[Unit]\nTimeoutStartSec=x\n[Service]\nRestartSec=\n")), Ok(()));
    }
}
