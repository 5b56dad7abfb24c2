//! When an expression next elapses. The search is systemd's (calendarspec.c's `find_next`):
//! from the year down to the second, each field moves to its next matching value and the lower
//! fields restart; after each step the broken-down local time is normalized as glibc's
//! `mktime()` normalizes it, and a step that normalization moved restarts the search from
//! where it landed. So a time in a daylight-saving gap is never an elapse (02:30 on the night
//! the clocks jump from 02:00 to 03:00 is skipped, as systemd skips it), and a time that occurs
//! twice is read at the offset last used, as glibc reads it.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};

use super::{CalendarSpec, Chain};
use crate::civil_time::{civil_from_days, days_from_civil};

const MICROS: i64 = 1_000_000;
const MAX_YEAR: i64 = 2199;
/// The latest moment systemd computes an elapse from (9999-12-31 23:59:59 UTC).
const LATEST: i64 = 253_402_300_799_999_999;
/// A bound on the search's steps; no expression systemd accepts needs more than a few thousand.
const STEPS_MAX: usize = 100_000;
/// Fields beyond this are never the result of a search step, only of a bug: refused.
const FIELD_MAX: i64 = 1 << 40;

/// A broken-down local time, whose fields may be out of range until normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tm {
    year: i64,
    /// 0 to 11.
    month0: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
}

impl Tm {
    fn clear_time(&mut self) {
        self.hour = 0;
        self.minute = 0;
        self.second = 0;
    }
}

/// Local time in one zone, with the offset last used (glibc's `mktime()` reads a time that
/// occurs twice at the offset it used last).
struct Clock {
    zone: TimeZone,
    last_offset: Option<Offset>,
}

impl Clock {
    fn local(&mut self, at: Timestamp) -> Tm {
        let offset = self.zone.to_offset(at);
        self.last_offset = Some(offset);
        let civil = offset.to_datetime(at);
        Tm {
            year: i64::from(civil.year()),
            month0: i64::from(civil.month()) - 1,
            day: i64::from(civil.day()),
            hour: i64::from(civil.hour()),
            minute: i64::from(civil.minute()),
            second: i64::from(civil.second()),
        }
    }

    /// `mktime()`: out-of-range fields carried over, the result read in the zone (a time in a
    /// gap at the offset before it, so later; a time that occurs twice at the offset used last,
    /// else the first), and the fields of that moment.
    fn mktime(&mut self, tm: Tm) -> Option<(Tm, Timestamp)> {
        let civil = carried(tm)?;
        let offset = match self.zone.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset,
            AmbiguousOffset::Gap { before, .. } => before,
            AmbiguousOffset::Fold { before, after } => {
                if self.last_offset == Some(after) {
                    after
                } else {
                    before
                }
            }
        };
        let at = offset.to_timestamp(civil).ok()?;
        Some((self.local(at), at))
    }

    /// Whether `tm` needed no normalization. If normalization moved it forward, `tm` is moved
    /// there, with the field below the highest one that changed back at its start (March 33rd
    /// becomes April 1st, not 2nd, so that April 1st is not skipped). Backward (a time zone
    /// change that normalizes into the past) or past the last year: an error, after which the
    /// search moves on to the next value of the field above.
    fn within_bounds(&mut self, tm: &mut Tm) -> Result<bool, ()> {
        if tm.year > MAX_YEAR {
            return Err(());
        }
        let (mut normalized, _) = self.mktime(*tm).ok_or(())?;
        let order = if normalized.year != tm.year {
            normalized.month0 = 0;
            normalized.year.cmp(&tm.year)
        } else if normalized.month0 != tm.month0 {
            normalized.day = 1;
            normalized.month0.cmp(&tm.month0)
        } else if normalized.day != tm.day {
            normalized.hour = 0;
            normalized.day.cmp(&tm.day)
        } else if normalized.hour != tm.hour {
            normalized.minute = 0;
            normalized.hour.cmp(&tm.hour)
        } else if normalized.minute != tm.minute {
            normalized.second = 0;
            normalized.minute.cmp(&tm.minute)
        } else {
            normalized.second.cmp(&tm.second)
        };
        match order {
            std::cmp::Ordering::Equal => Ok(true),
            std::cmp::Ordering::Greater => {
                *tm = normalized;
                Ok(false)
            }
            std::cmp::Ordering::Less => Err(()),
        }
    }

    fn matches_weekday(&mut self, weekdays: Option<u8>, tm: Tm) -> bool {
        let Some(bits) = weekdays else { return true };
        let Some((normalized, _)) = self.mktime(tm) else { return false };
        let Ok(month) = u32::try_from(normalized.month0 + 1) else { return false };
        let Ok(day) = u32::try_from(normalized.day) else { return false };
        let monday_zero = (days_from_civil(normalized.year, month, day) + 3).rem_euclid(7);
        bits & (1 << monday_zero) != 0
    }
}

/// The civil date and time `tm` names once its fields are carried over, as `mktime()` does.
fn carried(tm: Tm) -> Option<DateTime> {
    let fields = [tm.year, tm.month0, tm.day, tm.hour, tm.minute, tm.second];
    if fields.iter().any(|field| field.abs() > FIELD_MAX) {
        return None;
    }
    let year = tm.year + tm.month0.div_euclid(12);
    let month = u32::try_from(tm.month0.rem_euclid(12) + 1).ok()?;
    let seconds = tm.hour * 3600 + tm.minute * 60 + tm.second;
    let days = days_from_civil(year, month, 1) + tm.day - 1 + seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let year = i16::try_from(year).ok().filter(|year| (1..=9999).contains(year))?;
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    DateTime::new(year, month as i8, day as i8, hour as i8, minute as i8, second as i8, 0).ok()
}

fn days_in_month(year: i64, month0: i64) -> i64 {
    let (next_year, next_month) = if month0 >= 11 { (year + 1, 1) } else { (year, month0 as u32 + 2) };
    days_from_civil(next_year, next_month, 1) - days_from_civil(year, month0 as u32 + 1, 1)
}

/// `~day`: the day `day - 1` days before the month's last, or -1 when there is none.
fn from_end_of_month(year: i64, month0: i64, day: i64) -> i64 {
    let length = days_in_month(year, month0);
    if (1..=length).contains(&day) { length - day + 1 } else { -1 }
}

/// Moves `value` to the next value of `chain` at or after it; `Ok(true)` when it moved,
/// `Err` when there is none. An empty chain takes any value. `end_of_month`: the day field of
/// a `~` expression, counted back from that month's end.
fn next_matching(chain: &Chain, value: &mut i64, end_of_month: Option<(i64, i64)>) -> Result<bool, ()> {
    if chain.is_empty() {
        return Ok(false);
    }
    let mut best: Option<i64> = None;
    for component in chain {
        let (mut start, mut stop) = (component.start, component.stop);
        if let Some((year, month0)) = end_of_month {
            start = from_end_of_month(year, month0, start);
            stop = from_end_of_month(year, month0, stop);
            if stop > 0 {
                std::mem::swap(&mut start, &mut stop);
            }
        }
        let candidate = if start >= *value {
            Some(start)
        } else if component.repeat > 0 {
            let steps = (*value - start + component.repeat - 1) / component.repeat;
            let next = start + component.repeat * steps;
            (stop < 0 || next <= stop).then_some(next)
        } else {
            None
        };
        if let Some(candidate) = candidate {
            best = Some(best.map_or(candidate, |best| best.min(candidate)));
        }
    }
    let found = best.ok_or(())?;
    let moved = *value != found;
    *value = found;
    Ok(moved)
}

/// A field of the search below the year.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Month,
    Day,
    Hour,
    Minute,
    Second,
}

/// After `field` moved to its next matching value (`moved`): the fields below it restart, and
/// whether the time so set needs no normalization. When the field has no matching value left
/// (or normalization would go back), the field above moves on and everything below restarts;
/// when normalization moved the time, the search restarts from there. `false` in both cases:
/// the search goes round again.
fn settled(clock: &mut Clock, tm: &mut Tm, micros: &mut i64, field: Field, moved: Result<bool, ()>) -> bool {
    if moved == Ok(true) {
        match field {
            Field::Month => {
                tm.day = 1;
                tm.clear_time();
            }
            Field::Day => tm.clear_time(),
            Field::Hour => {
                tm.minute = 0;
                tm.second = 0;
            }
            Field::Minute => tm.second = 0,
            Field::Second => {}
        }
        if field != Field::Second {
            *micros = 0;
        }
    }
    match moved.and_then(|_| clock.within_bounds(tm)) {
        Ok(within) => within,
        Err(()) => {
            match field {
                Field::Month => {
                    tm.year += 1;
                    tm.month0 = 0;
                    tm.day = 1;
                    tm.clear_time();
                }
                Field::Day => {
                    tm.month0 += 1;
                    tm.day = 1;
                    tm.clear_time();
                }
                Field::Hour => {
                    tm.day += 1;
                    tm.clear_time();
                }
                Field::Minute => {
                    tm.hour += 1;
                    tm.minute = 0;
                    tm.second = 0;
                }
                Field::Second => {
                    tm.minute += 1;
                    tm.second = 0;
                }
            }
            *micros = 0;
            false
        }
    }
}

/// The first elapse strictly after `after` (microseconds since the epoch, UTC).
pub(super) fn next_after(spec: &CalendarSpec, after: i64) -> Option<i64> {
    if after > LATEST {
        return None;
    }
    let from = after.max(-1) + 1;
    let mut clock = Clock { zone: spec.zone.time_zone(), last_offset: None };
    let start = Timestamp::from_second(from.div_euclid(MICROS)).ok()?;
    let tm = clock.local(start);
    let (tm, micros) = search(spec, &mut clock, tm, from.rem_euclid(MICROS))?;
    let (_, at) = clock.mktime(tm)?;
    Some(at.as_second() * MICROS + micros)
}

/// The search itself: the first time at or after `tm` and `micros` that every field matches.
fn search(spec: &CalendarSpec, clock: &mut Clock, mut tm: Tm, mut micros: i64) -> Option<(Tm, i64)> {
    for _ in 0..STEPS_MAX {
        tm = clock.mktime(tm)?.0;

        let moved = next_matching(&spec.year, &mut tm.year, None).ok()?;
        if moved {
            tm.month0 = 0;
            tm.day = 1;
            tm.clear_time();
            micros = 0;
        }
        if clock.within_bounds(&mut tm) != Ok(true) {
            return None;
        }

        let mut month = tm.month0 + 1;
        let moved = next_matching(&spec.month, &mut month, None);
        tm.month0 = month - 1;
        if !settled(clock, &mut tm, &mut micros, Field::Month, moved) {
            continue;
        }

        let end_of_month = spec.end_of_month.then_some((tm.year, tm.month0));
        let moved = next_matching(&spec.day, &mut tm.day, end_of_month);
        if !settled(clock, &mut tm, &mut micros, Field::Day, moved) {
            continue;
        }

        if !clock.matches_weekday(spec.weekdays, tm) {
            tm.day += 1;
            tm.clear_time();
            micros = 0;
            continue;
        }

        let moved = next_matching(&spec.hour, &mut tm.hour, None);
        if !settled(clock, &mut tm, &mut micros, Field::Hour, moved) {
            continue;
        }

        let moved = next_matching(&spec.minute, &mut tm.minute, None);
        if !settled(clock, &mut tm, &mut micros, Field::Minute, moved) {
            continue;
        }

        let mut second_micros = tm.second * MICROS + micros;
        let moved = next_matching(&spec.second, &mut second_micros, None);
        micros = second_micros % MICROS;
        tm.second = second_micros / MICROS;
        if !settled(clock, &mut tm, &mut micros, Field::Second, moved) {
            continue;
        }
        return Some((tm, micros));
    }
    None
}
