//! The wall clock as fleet keeps times in its records: microseconds since the epoch. Read here,
//! at the edge, and handed to the pure decisions of `fleet-core`, which never read a clock.

/// Microseconds since the epoch now (0 for a clock before 1970).
pub fn now_micros() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}
