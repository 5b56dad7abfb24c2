//! What systemd's watchdog says of a `Type=notify` service with `WatchdogSec=`: it fired
//! (`Result=watchdog`, the service killed and not started again), or the service is late
//! with its pings (more than two thirds of its watchdog time since the last one: a service is
//! meant to ping every half, so it missed one and systemd is about to kill it), or all is
//! well.

use zbus::Connection;
use zbus_systemd::systemd1::ServiceProxy;

/// What systemd holds of a service's watchdog. Times in microseconds of the monotonic clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub result: String,
    /// When the service last pinged (or its watchdog started); 0 when never.
    pub last_ping: u64,
    /// Its watchdog time (`WatchdogSec=`, or what the service set); 0 when it has none.
    pub timeout: u64,
}

/// What is wrong at `now`, if anything.
pub fn trouble(reading: &Reading, now: u64) -> Option<String> {
    if reading.result == "watchdog" {
        return Some("systemd's watchdog fired".to_string());
    }
    if reading.timeout == 0 || reading.last_ping == 0 {
        return None;
    }
    let since = now.saturating_sub(reading.last_ping);
    (since.saturating_mul(3) > reading.timeout.saturating_mul(2)).then(|| {
        format!(
            "no watchdog ping for {:.1}s (its watchdog is {:.1}s)",
            since as f64 / 1e6,
            reading.timeout as f64 / 1e6
        )
    })
}

/// The monotonic clock now, in microseconds: the clock systemd's timestamps are on.
pub fn now() -> u64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given, and nothing else.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) } != 0 {
        return 0;
    }
    let seconds = u64::try_from(time.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(time.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

/// Reads the watchdog of the service at `path` (its object path).
pub async fn read(connection: Connection, path: String) -> zbus::Result<Reading> {
    let no_cache = zbus::proxy::CacheProperties::No;
    let service = ServiceProxy::builder(&connection).path(path).cache_properties(no_cache).build().await?;
    Ok(Reading {
        result: service.result().await?,
        last_ping: service.watchdog_timestamp_monotonic().await?,
        timeout: service.watchdog_u_sec().await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(result: &str, last_ping: u64, timeout: u64) -> Reading {
        Reading { result: result.to_string(), last_ping, timeout }
    }

    #[test]
    fn a_service_is_in_trouble_once_its_watchdog_fired_or_it_is_late_with_its_pings() {
        let second = 1_000_000;
        assert_eq!(trouble(&reading("success", 100 * second, 30 * second), 110 * second), None, "pinged 10 s ago");
        assert_eq!(trouble(&reading("success", 100 * second, 30 * second), 115 * second), None, "half: on time");
        assert_eq!(
            trouble(&reading("success", 100 * second, 30 * second), 121 * second).as_deref(),
            Some("no watchdog ping for 21.0s (its watchdog is 30.0s)")
        );
        assert_eq!(trouble(&reading("watchdog", 0, 0), 1).as_deref(), Some("systemd's watchdog fired"));
        assert_eq!(trouble(&reading("success", 0, 30 * second), 1_000 * second), None, "no watchdog started");
        assert_eq!(trouble(&reading("success", 100 * second, 0), 1_000 * second), None, "no watchdog");
        assert_eq!(trouble(&reading("success", 100 * second, 30 * second), 50 * second), None, "a clock behind");
    }
}
