//! What a unit asks to be checked by, read from its `[X-Fleet]` section:
//!
//! - `HealthCheck=`: `http://host[:port]/path` or `https://…` (healthy on a 2xx or 3xx
//!   answer), `tcp://host:port` (healthy when a connection opens), or `exec:/path args…` (run
//!   as the unit's `User=`; healthy on exit 0). The unit's specifiers (`%i`, `%n`, `%p`, `%N`)
//!   are substituted.
//! - `HealthCheckInterval=` (default 10 s), `HealthCheckTimeout=` (default 5 s, at most the
//!   interval), `HealthCheckThreshold=` (consecutive results that flip the state, default 3),
//!   `HealthCheckStartPeriod=` (failures after a start do not count for this long, default 0),
//!   `HealthCheckRestart=` (restart the unit once it turns unhealthy, within a budget).
//!
//! A `Type=notify` service with `WatchdogSec=` and no `HealthCheck=` is checked by systemd's
//! watchdog: unhealthy once the service is late with its pings, or the watchdog fired. Values are systemd's time spans and booleans.

use std::time::Duration;

use crate::service_values::{parse_systemd_bool, parse_timespan};
use crate::unit_file::UnitOption;
use crate::unit_file::X_FLEET as SECTION;
use crate::unit_name::{UnitNameInfo, expand_specifiers};

/// The keys of `[X-Fleet]` a health check is declared with.
pub const KEYS: &[&str] = &[
    "HealthCheck",
    "HealthCheckInterval",
    "HealthCheckTimeout",
    "HealthCheckThreshold",
    "HealthCheckStartPeriod",
    "HealthCheckRestart",
];

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_THRESHOLD: u32 = 3;
const SHORTEST_INTERVAL: Duration = Duration::from_secs(1);
const LONGEST_SPAN: Duration = Duration::from_secs(86_400);
const MOST_THRESHOLD: u32 = 100;
const LONGEST_TARGET: usize = 1024;
const MOST_ARGUMENTS: usize = 64;

/// How a unit is probed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Probe {
    /// A GET of `path` on `host:port`, over TLS when `tls`: healthy on 2xx and 3xx.
    Http { tls: bool, host: String, port: u16, path: String },
    /// A TCP connection to `host:port`.
    Tcp { host: String, port: u16 },
    /// A command (an absolute path and its arguments) run as the unit's user: exit 0.
    Exec { argv: Vec<String> },
    /// systemd's watchdog of a `Type=notify` service: unhealthy once the service is late with
    /// its pings, or the watchdog fired.
    Watchdog,
}

/// A unit's health check, with every value bounded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HealthCheck {
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
    pub threshold: u32,
    pub start_period: Duration,
    /// Restart the unit when it turns unhealthy (within the restart budget).
    pub restart: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HealthCheckError {
    #[error("invalid value {value:?} for [X-Fleet] {option}: {why}")]
    Invalid { option: &'static str, value: String, why: String },
    #[error("[X-Fleet] {0} needs HealthCheck= (or a Type=notify service with WatchdogSec=)")]
    Alone(&'static str),
}

/// The health check of the unit named `unit_name` with these options: `Ok(None)` when it
/// declares none. Every value is checked here, so a unit that enters the cluster has a check
/// its machine can run.
pub fn check_of(unit_name: &str, options: &[UnitOption]) -> Result<Option<HealthCheck>, HealthCheckError> {
    let fleet = |name: &str| crate::unit_file::last_value(options, SECTION, name);
    let probe = match fleet("HealthCheck") {
        Some(value) => Some(parse_probe(&expand_specifiers(value, &UnitNameInfo::new(unit_name)))?),
        None => has_watchdog(options).then_some(Probe::Watchdog),
    };
    let Some(probe) = probe else {
        return match KEYS[1..].iter().find(|key| fleet(key).is_some()) {
            Some(key) => Err(HealthCheckError::Alone(key)),
            None => Ok(None),
        };
    };
    let span = |option: &'static str, default: Duration, least: Duration| -> Result<Duration, HealthCheckError> {
        let Some(value) = fleet(option) else { return Ok(default) };
        let invalid = |why: &str| HealthCheckError::Invalid { option, value: value.to_string(), why: why.to_string() };
        match parse_timespan(value) {
            Ok(Some(span)) if span >= least && span <= LONGEST_SPAN => Ok(span),
            Ok(_) => Err(invalid(&format!(
                "expected a time span from {} to 1d",
                if least.is_zero() { "0".to_string() } else { format!("{}ms", least.as_millis()) }
            ))),
            Err(error) => Err(invalid(&error.to_string())),
        }
    };
    let interval = span("HealthCheckInterval", DEFAULT_INTERVAL, SHORTEST_INTERVAL)?;
    let timeout = span("HealthCheckTimeout", DEFAULT_TIMEOUT.min(interval), Duration::from_millis(1))?;
    if timeout > interval {
        return Err(HealthCheckError::Invalid {
            option: "HealthCheckTimeout",
            value: fleet("HealthCheckTimeout").unwrap_or_default().to_string(),
            why: format!("longer than the interval ({}s)", interval.as_secs_f64()),
        });
    }
    let start_period = span("HealthCheckStartPeriod", Duration::ZERO, Duration::ZERO)?;
    let threshold = match fleet("HealthCheckThreshold") {
        None => DEFAULT_THRESHOLD,
        Some(value) => {
            value.trim().parse::<u32>().ok().filter(|n| (1..=MOST_THRESHOLD).contains(n)).ok_or_else(|| {
                HealthCheckError::Invalid {
                    option: "HealthCheckThreshold",
                    value: value.to_string(),
                    why: format!("expected a whole number from 1 to {MOST_THRESHOLD}"),
                }
            })?
        }
    };
    let restart = match fleet("HealthCheckRestart") {
        None => false,
        Some(value) => parse_systemd_bool(value).ok_or_else(|| HealthCheckError::Invalid {
            option: "HealthCheckRestart",
            value: value.to_string(),
            why: "expected a boolean (yes or no)".to_string(),
        })?,
    };
    Ok(Some(HealthCheck { probe, interval, timeout, threshold, start_period, restart }))
}

/// Whether a service is watched by systemd's watchdog: `Type=notify` (or `notify-reload`)
/// with a `WatchdogSec=` above zero.
fn has_watchdog(options: &[UnitOption]) -> bool {
    let notify =
        crate::unit_file::last_value(options, "Service", "Type").is_some_and(|kind| kind.starts_with("notify"));
    let watchdog = crate::unit_file::last_value(options, "Service", "WatchdogSec")
        .and_then(|value| parse_timespan(value).ok())
        .is_some_and(|span| span.is_some_and(|span| !span.is_zero()));
    notify && watchdog
}

fn parse_probe(value: &str) -> Result<Probe, HealthCheckError> {
    let invalid = |why: &str| HealthCheckError::Invalid {
        option: "HealthCheck",
        value: value.chars().take(LONGEST_TARGET).collect(),
        why: why.to_string(),
    };
    if value.len() > LONGEST_TARGET {
        return Err(invalid(&format!("longer than {LONGEST_TARGET} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid("contains a control character"));
    }
    if let Some(command) = value.strip_prefix("exec:") {
        let argv = split_command(command).map_err(|why| invalid(&why))?;
        return match argv.first() {
            None => Err(invalid("expected a command after exec:")),
            Some(program) if !program.starts_with('/') => {
                Err(invalid("the command must be an absolute path (exec:/usr/bin/check …)"))
            }
            Some(_) if argv.len() > MOST_ARGUMENTS => Err(invalid(&format!("more than {MOST_ARGUMENTS} arguments"))),
            Some(_) => Ok(Probe::Exec { argv }),
        };
    }
    let (scheme, rest) = value.split_once("://").ok_or_else(|| {
        invalid("expected http://host[:port]/path, https://…, tcp://host:port or exec:/path/to/command")
    })?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(invalid("credentials in the address are not taken (a check must carry no secret)"));
    }
    if path.contains(' ') || path.contains('#') {
        return Err(invalid("the path may hold no space or fragment"));
    }
    let default_port = match scheme {
        "http" => Some(80),
        "https" => Some(443),
        "tcp" => None,
        other => return Err(invalid(&format!("unknown scheme {other:?}: http, https, tcp or exec:"))),
    };
    let (host, port) = host_and_port(authority, default_port).map_err(|why| invalid(&why))?;
    if scheme == "tcp" {
        if !path.is_empty() && path != "/" {
            return Err(invalid("a tcp:// check takes no path"));
        }
        return Ok(Probe::Tcp { host, port });
    }
    let path = match path {
        "" => "/".to_string(),
        path if path.starts_with('?') => format!("/{path}"),
        path => path.to_string(),
    };
    Ok(Probe::Http { tls: scheme == "https", host, port, path })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; the port is required without a default.
fn host_and_port(authority: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or("an IPv6 address needs its closing ]")?;
        if host.parse::<core::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        (host, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_';
    if host.is_empty() || (!authority.starts_with('[') && !host.chars().all(name_char)) {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port = match (port, default_port) {
        (Some(port), _) => {
            port.parse::<u16>().ok().filter(|port| *port != 0).ok_or(format!("invalid port {port:?}"))?
        }
        (None, Some(port)) => port,
        (None, None) => return Err("expected a port (tcp://host:port)".to_string()),
    };
    Ok((host.to_string(), port))
}

/// Splits a command line on spaces, keeping what single or double quotes hold together.
fn split_command(command: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(open), c) if c == open => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ' | '\t') => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if quote.is_some() {
        return Err("a quote is not closed".to_string());
    }
    words.extend(word);
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UnitFile;

    fn check(text: &str) -> Result<Option<HealthCheck>, HealthCheckError> {
        check_of("web@8080.service", UnitFile::parse(text).expect("a unit").options())
    }

    fn probe(value: &str) -> Result<Probe, String> {
        check(&format!("[X-Fleet]\nHealthCheck={value}\n"))
            .map(|check| check.expect("a check").probe)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn every_kind_of_probe_reads() {
        assert_eq!(
            probe("http://127.0.0.1:%i/health?deep=1"),
            Ok(Probe::Http { tls: false, host: "127.0.0.1".into(), port: 8080, path: "/health?deep=1".into() })
        );
        assert_eq!(
            probe("https://web.local"),
            Ok(Probe::Http { tls: true, host: "web.local".into(), port: 443, path: "/".into() })
        );
        assert_eq!(probe("tcp://[::1]:5432"), Ok(Probe::Tcp { host: "::1".into(), port: 5432 }));
        assert_eq!(
            probe("exec:/usr/bin/pg_isready -h 'local host' -q"),
            Ok(Probe::Exec { argv: vec!["/usr/bin/pg_isready".into(), "-h".into(), "local host".into(), "-q".into()] })
        );
    }

    #[test]
    fn bad_probes_are_refused_with_the_option_named() {
        for (value, says) in [
            ("ftp://host/", "unknown scheme"),
            ("tcp://host", "expected a port"),
            ("http://user:pw@host/", "credentials"),
            ("http://ho st/", "not a host"),
            ("http://host:99999/", "invalid port"),
            ("exec:check.sh", "absolute path"),
            ("exec:/bin/sh -c 'oops", "quote is not closed"),
            ("exec:", "expected a command"),
            ("localhost:80", "expected http://"),
        ] {
            let error = probe(value).expect_err(value);
            assert!(error.contains("[X-Fleet] HealthCheck") && error.contains(says), "{value}: {error}");
        }
        assert!(probe(&format!("http://h/{}", "a".repeat(2000))).is_err_and(|error| error.contains("longer than")));
    }

    #[test]
    fn tuning_has_defaults_and_bounds() {
        let default = check("[X-Fleet]\nHealthCheck=tcp://h:1\n").expect("valid").expect("a check");
        assert_eq!(
            (default.interval, default.timeout, default.threshold, default.start_period, default.restart),
            (DEFAULT_INTERVAL, DEFAULT_TIMEOUT, DEFAULT_THRESHOLD, Duration::ZERO, false)
        );
        let tuned = check(
            "[X-Fleet]\nHealthCheck=tcp://h:1\nHealthCheckInterval=2s\nHealthCheckThreshold=1\nHealthCheckStartPeriod=1min\nHealthCheckRestart=yes\n",
        )
        .expect("valid")
        .expect("a check");
        assert_eq!(tuned.timeout, Duration::from_secs(2), "the default timeout is at most the interval");
        assert_eq!((tuned.threshold, tuned.start_period, tuned.restart), (1, Duration::from_secs(60), true));
        for (tuning, says) in [
            ("HealthCheckInterval=0", "HealthCheckInterval"),
            ("HealthCheckInterval=2d", "HealthCheckInterval"),
            ("HealthCheckInterval=soon", "HealthCheckInterval"),
            ("HealthCheckTimeout=20s", "longer than the interval"),
            ("HealthCheckThreshold=0", "HealthCheckThreshold"),
            ("HealthCheckThreshold=many", "HealthCheckThreshold"),
            ("HealthCheckRestart=perhaps", "HealthCheckRestart"),
        ] {
            let error = check(&format!("[X-Fleet]\nHealthCheck=tcp://h:1\n{tuning}\n")).expect_err(tuning);
            assert!(error.to_string().contains(says), "{tuning}: {error}");
        }
        assert_eq!(
            check("[X-Fleet]\nHealthCheckInterval=5s\n"),
            Err(HealthCheckError::Alone("HealthCheckInterval")),
            "tuning without a check is a mistake worth naming"
        );
        assert_eq!(check("[Service]\nExecStart=/bin/true\n"), Ok(None));
    }

    #[test]
    fn a_notify_service_with_a_watchdog_is_checked_by_it() {
        let watched = check("[Service]\nType=notify\nWatchdogSec=30s\n[X-Fleet]\nHealthCheckThreshold=1\n");
        assert_eq!(
            watched.map(|check| check.map(|check| (check.probe, check.threshold))),
            Ok(Some((Probe::Watchdog, 1)))
        );
        assert_eq!(check("[Service]\nType=simple\nWatchdogSec=30s\n"), Ok(None));
        assert_eq!(check("[Service]\nType=notify\nWatchdogSec=0\n"), Ok(None));
        let both = check("[Service]\nType=notify\nWatchdogSec=30s\n[X-Fleet]\nHealthCheck=tcp://h:1\n");
        assert!(matches!(both, Ok(Some(HealthCheck { probe: Probe::Tcp { .. }, .. }))), "its own check wins");
    }
}
