//! Reading a calendar expression: the grammar of systemd.time(7), accepting and refusing what
//! systemd does, with errors that say which part is wrong.

use super::{CalendarSpec, Chain, Component, Zone};

/// At most this many values, ranges or repetitions in one field (systemd's bound).
const COMPONENTS_MAX: usize = 240;
const MICROS: i64 = 1_000_000;
const MIN_YEAR: i64 = 1970;
const MAX_YEAR: i64 = 2199;

/// Why a calendar expression cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    #[error("the expression is empty")]
    Empty,
    #[error("{0:?} is not a day of the week (Mon, Tuesday, ...)")]
    Weekday(String),
    #[error("the days of the week {0:?} do not form a list or a range such as Mon..Fri or Sat,Sun")]
    Weekdays(String),
    #[error("expected a number or * at {0:?}")]
    Number(String),
    #[error("unexpected {0:?}: a field ends with a space, ',', '-', '~' or ':'")]
    AfterValue(String),
    #[error("a repetition of 0 (\"/0\") never moves on")]
    ZeroRepeat,
    #[error("more than {COMPONENTS_MAX} values in one field")]
    TooManyValues,
    #[error("the date {0:?} is not year-month-day or month-day")]
    Date(String),
    #[error("the time {0:?} is not hour:minute or hour:minute:second")]
    Time(String),
    #[error("'~' (days from the end of the month) may only come before the day")]
    EndOfMonth,
    #[error("the {field} {value} is outside {from}..{to}")]
    OutOfRange { field: &'static str, value: String, from: i64, to: i64 },
    #[error("the {field} repetition /{repeat} does not fit between {from} and {to}")]
    Repeat { field: &'static str, repeat: String, from: i64, to: i64 },
    #[error("the {field} range {start}..{stop} is empty or too short for its repetition")]
    Range { field: &'static str, start: String, stop: String },
    #[error("{0} is out of range")]
    Timestamp(String),
    #[error("{0:?} is not a time zone fleet knows (an IANA name such as Europe/Berlin; the case matters)")]
    UnknownZone(String),
    #[error("it never elapses")]
    NeverElapses,
    #[error(
        "it elapses {} s after the elapse before it, more often than fleet runs a unit (every {} s at most)",
        *gap_micros as f64 / 1e6,
        super::MIN_INTERVAL_MICROS / 1_000_000
    )]
    TooOften { gap_micros: i64 },
}

/// The words systemd reads as whole expressions.
const SHORTHANDS: &[(&str, Shorthand)] = &[
    ("minutely", Shorthand { months: &[], day: None, weekly: false, hour: false, minute: false }),
    ("hourly", Shorthand { months: &[], day: None, weekly: false, hour: false, minute: true }),
    ("daily", Shorthand { months: &[], day: None, weekly: false, hour: true, minute: true }),
    ("monthly", Shorthand { months: &[], day: Some(1), weekly: false, hour: true, minute: true }),
    ("weekly", Shorthand { months: &[], day: None, weekly: true, hour: true, minute: true }),
    ("yearly", Shorthand { months: &[1], day: Some(1), weekly: false, hour: true, minute: true }),
    ("annually", Shorthand { months: &[1], day: Some(1), weekly: false, hour: true, minute: true }),
    ("anually", Shorthand { months: &[1], day: Some(1), weekly: false, hour: true, minute: true }),
    ("quarterly", Shorthand { months: &[1, 4, 7, 10], day: Some(1), weekly: false, hour: true, minute: true }),
    ("semiannually", Shorthand { months: &[1, 7], day: Some(1), weekly: false, hour: true, minute: true }),
    ("semi-annually", Shorthand { months: &[1, 7], day: Some(1), weekly: false, hour: true, minute: true }),
    ("biannually", Shorthand { months: &[1, 7], day: Some(1), weekly: false, hour: true, minute: true }),
    ("bi-annually", Shorthand { months: &[1, 7], day: Some(1), weekly: false, hour: true, minute: true }),
];

/// What a shorthand fixes: the months and day it names, Monday, and 0 for the hour and minute
/// (the second is always 0).
struct Shorthand {
    months: &'static [i64],
    day: Option<i64>,
    weekly: bool,
    hour: bool,
    minute: bool,
}

const WEEKDAYS: &[(&str, u8)] = &[
    ("monday", 0),
    ("mon", 0),
    ("tuesday", 1),
    ("tue", 1),
    ("wednesday", 2),
    ("wed", 2),
    ("thursday", 3),
    ("thu", 3),
    ("friday", 4),
    ("fri", 4),
    ("saturday", 5),
    ("sat", 5),
    ("sunday", 6),
    ("sun", 6),
];

fn constant(value: i64) -> Chain {
    vec![Component { start: value, stop: -1, repeat: 0 }]
}

/// Reads `text`; `zone_named` looks a time zone up by its exact name.
pub(super) fn parse(
    text: &str,
    zone_named: &dyn Fn(&str) -> Option<jiff::tz::TimeZone>,
) -> Result<CalendarSpec, CalendarError> {
    let (rest, zone) = split_zone(text, zone_named);
    if rest.is_empty() {
        return Err(CalendarError::Empty);
    }
    let mut spec = CalendarSpec {
        weekdays: None,
        year: Chain::new(),
        month: Chain::new(),
        day: Chain::new(),
        hour: Chain::new(),
        minute: Chain::new(),
        second: Chain::new(),
        end_of_month: false,
        zone,
    };
    if let Some((_, shorthand)) = SHORTHANDS.iter().find(|(word, _)| word.eq_ignore_ascii_case(rest)) {
        spec.month = shorthand.months.iter().flat_map(|month| constant(*month)).collect();
        spec.day = shorthand.day.map(constant).unwrap_or_default();
        spec.weekdays = shorthand.weekly.then_some(1);
        spec.hour = if shorthand.hour { constant(0) } else { Chain::new() };
        spec.minute = if shorthand.minute { constant(0) } else { Chain::new() };
        spec.second = constant(0);
    } else {
        let zone_was_read = rest.len() != text.len();
        let unknown_zone = || if zone_was_read { None } else { last_word_as_zone(text) };
        let mut cursor = Cursor { text: rest.as_bytes(), at: 0 };
        parse_weekdays(&mut cursor, &mut spec).map_err(|error| unknown_zone().unwrap_or(error))?;
        let timestamp = parse_date(&mut cursor, &mut spec).map_err(|error| unknown_zone().unwrap_or(error))?;
        if !timestamp {
            parse_time(&mut cursor, &mut spec).map_err(|error| unknown_zone().unwrap_or(error))?;
        }
        if !cursor.done() {
            return Err(unknown_zone().unwrap_or_else(|| CalendarError::AfterValue(cursor.rest())));
        }
    }
    normalize(&mut spec);
    validate(&spec)?;
    Ok(spec)
}

/// Splits a trailing ` UTC` or ` <zone name>` off `text`, as systemd does: the last word is a
/// zone only when it names one.
fn split_zone<'t>(text: &'t str, zone_named: &dyn Fn(&str) -> Option<jiff::tz::TimeZone>) -> (&'t str, Zone) {
    if text.len() >= 4 && text.is_char_boundary(text.len() - 4) && text[text.len() - 4..].eq_ignore_ascii_case(" UTC") {
        return (&text[..text.len() - 4], Zone::Utc);
    }
    if let Some((rest, last)) = text.rsplit_once(' ')
        && valid_zone_name(last)
        && let Some(zone) = zone_named(last).filter(|zone| zone.iana_name() == Some(last))
    {
        return (rest, Zone::Named(last.to_string(), zone));
    }
    (text, Zone::Unnamed)
}

/// A name that may be a file under /usr/share/zoneinfo (systemd's rules for one).
fn valid_zone_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('/')
        && !name.contains("..")
        && !name.contains("//")
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"/_-+".contains(&byte))
}

/// When an expression fails to read and its last word looks like a zone's name, that name is
/// the likelier mistake.
fn last_word_as_zone(text: &str) -> Option<CalendarError> {
    let (_, last) = text.rsplit_once(' ')?;
    let looks_like_zone = last.contains('/') && last.bytes().any(|byte| byte.is_ascii_alphabetic());
    (looks_like_zone && valid_zone_name(last)).then(|| CalendarError::UnknownZone(last.to_string()))
}

struct Cursor<'t> {
    text: &'t [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> u8 {
        self.text.get(self.at).copied().unwrap_or(0)
    }

    fn peek_at(&self, offset: usize) -> u8 {
        self.text.get(self.at + offset).copied().unwrap_or(0)
    }

    fn done(&self) -> bool {
        self.at >= self.text.len()
    }

    fn rest(&self) -> String {
        String::from_utf8_lossy(&self.text[self.at.min(self.text.len())..]).into_owned()
    }

    fn skip_spaces(&mut self) {
        while self.peek() == b' ' {
            self.at += 1;
        }
    }
}

fn parse_weekdays(cursor: &mut Cursor, spec: &mut CalendarSpec) -> Result<(), CalendarError> {
    let start = cursor.at;
    let mut bits = 0u8;
    let mut range_from: Option<u8> = None;
    let mut first = true;
    loop {
        let rest = &cursor.text[cursor.at..];
        let found = WEEKDAYS
            .iter()
            .find(|(name, _)| rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name.as_bytes()));
        let Some((name, day)) = found else {
            if first {
                return Ok(());
            }
            return Err(CalendarError::Weekdays(word_at(cursor.text, start)));
        };
        let after = rest.get(name.len()).copied().unwrap_or(0);
        if ![0, b'-', b'.', b',', b' '].contains(&after) {
            return Err(CalendarError::Weekday(word_at(cursor.text, cursor.at)));
        }
        bits |= 1 << day;
        if let Some(from) = range_from {
            if from > *day {
                return Err(CalendarError::Weekdays(word_at(cursor.text, start)));
            }
            for between in from + 1..*day {
                bits |= 1 << between;
            }
        }
        cursor.at += name.len();
        spec.weekdays = Some(bits);
        match cursor.peek() {
            0 => return Ok(()),
            b' ' => {
                cursor.skip_spaces();
                return Ok(());
            }
            b'.' => {
                if range_from.is_some() || cursor.peek_at(1) != b'.' {
                    return Err(CalendarError::Weekdays(word_at(cursor.text, start)));
                }
                range_from = Some(*day);
                cursor.at += 2;
            }
            b'-' => {
                if range_from.is_some() {
                    return Err(CalendarError::Weekdays(word_at(cursor.text, start)));
                }
                range_from = Some(*day);
                cursor.at += 1;
            }
            b',' => {
                range_from = None;
                cursor.at += 1;
            }
            _ => {}
        }
        if matches!(cursor.peek(), 0 | b' ') {
            cursor.skip_spaces();
            return match range_from {
                None => Ok(()),
                Some(_) => Err(CalendarError::Weekdays(word_at(cursor.text, start))),
            };
        }
        first = false;
    }
}

/// The word of `text` that starts at `at`.
fn word_at(text: &[u8], at: usize) -> String {
    let rest = &text[at.min(text.len())..];
    let end = rest.iter().position(|byte| *byte == b' ').unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).into_owned()
}

/// Reads the date, if there is one; `true` when it was `@SECONDS`, which fixes the time too.
fn parse_date(cursor: &mut Cursor, spec: &mut CalendarSpec) -> Result<bool, CalendarError> {
    if cursor.done() {
        return Ok(false);
    }
    let start = cursor.at;
    if cursor.peek() == b'@' {
        cursor.at += 1;
        let seconds = unsigned_number(cursor)?;
        set_from_timestamp(spec, seconds, &word_at(cursor.text, start))?;
        return Ok(true);
    }
    let mut probe = Cursor { text: cursor.text, at: cursor.at };
    let first = parse_chain(&mut probe, false)?;
    if matches!(probe.peek(), 0 | b':') {
        return Ok(false);
    }
    match probe.peek() {
        b'~' => spec.end_of_month = true,
        b'-' => {}
        _ => return Err(CalendarError::Date(word_at(cursor.text, start))),
    }
    probe.at += 1;
    let second = parse_chain(&mut probe, false)?;
    if matches!(probe.peek(), 0 | b' ') {
        probe.skip_spaces();
        cursor.at = probe.at;
        spec.month = first;
        spec.day = second;
        return Ok(false);
    }
    if spec.end_of_month {
        return Err(CalendarError::EndOfMonth);
    }
    match probe.peek() {
        b'~' => spec.end_of_month = true,
        b'-' => {}
        _ => return Err(CalendarError::Date(word_at(cursor.text, start))),
    }
    probe.at += 1;
    let third = parse_chain(&mut probe, false)?;
    if !matches!(probe.peek(), 0 | b' ') {
        return Err(CalendarError::Date(word_at(cursor.text, start)));
    }
    probe.skip_spaces();
    cursor.at = probe.at;
    spec.year = first;
    spec.month = second;
    spec.day = third;
    Ok(false)
}

/// `@SECONDS`: that moment in UTC, to the second.
fn set_from_timestamp(spec: &mut CalendarSpec, seconds: u64, text: &str) -> Result<(), CalendarError> {
    let out_of_range = || CalendarError::Timestamp(text.to_string());
    let seconds = i64::try_from(seconds).map_err(|_| out_of_range())?;
    let moment = jiff::Timestamp::from_second(seconds).map_err(|_| out_of_range())?;
    let civil = jiff::tz::TimeZone::UTC.to_datetime(moment);
    spec.year = constant(i64::from(civil.year()));
    spec.month = constant(i64::from(civil.month()));
    spec.day = constant(i64::from(civil.day()));
    spec.hour = constant(i64::from(civil.hour()));
    spec.minute = constant(i64::from(civil.minute()));
    spec.second = constant(i64::from(civil.second()) * MICROS);
    spec.zone = Zone::Utc;
    Ok(())
}

fn parse_time(cursor: &mut Cursor, spec: &mut CalendarSpec) -> Result<(), CalendarError> {
    if cursor.done() {
        spec.hour = constant(0);
        spec.minute = constant(0);
        spec.second = constant(0);
        return Ok(());
    }
    let start = cursor.at;
    let bad_time = || CalendarError::Time(word_at(cursor.text, start));
    let hour = parse_chain(cursor, false)?;
    if cursor.peek() != b':' {
        return Err(bad_time());
    }
    cursor.at += 1;
    let minute = parse_chain(cursor, false)?;
    let second = if cursor.done() {
        constant(0)
    } else {
        if cursor.peek() != b':' {
            return Err(CalendarError::Time(word_at(cursor.text, start)));
        }
        cursor.at += 1;
        let second = parse_chain(cursor, true)?;
        if !cursor.done() {
            return Err(CalendarError::Time(word_at(cursor.text, start)));
        }
        second
    };
    spec.hour = hour;
    spec.minute = minute;
    spec.second = second;
    Ok(())
}

/// One field: `*` or components separated by ','. Seconds (`micros`) read decimals and a `*`
/// that means every whole second.
fn parse_chain(cursor: &mut Cursor, micros: bool) -> Result<Chain, CalendarError> {
    if cursor.peek() == b'*' {
        cursor.at += 1;
        return Ok(if micros { vec![Component { start: 0, stop: -1, repeat: MICROS }] } else { Chain::new() });
    }
    let mut chain = Chain::new();
    loop {
        if chain.len() > COMPONENTS_MAX {
            return Err(CalendarError::TooManyValues);
        }
        let start = decimal(cursor, micros)?;
        let (mut stop, mut repeat) = (-1, 0);
        if cursor.peek() == b'.' && cursor.peek_at(1) == b'.' {
            cursor.at += 2;
            stop = decimal(cursor, micros)?;
            repeat = if micros { MICROS } else { 1 };
        }
        if cursor.peek() == b'/' {
            cursor.at += 1;
            repeat = decimal(cursor, micros)?;
            if repeat == 0 {
                return Err(CalendarError::ZeroRepeat);
            }
        }
        if ![0, b' ', b',', b'-', b'~', b':'].contains(&cursor.peek()) {
            return Err(CalendarError::AfterValue(word_at(cursor.text, cursor.at)));
        }
        chain.push(Component { start, stop, repeat });
        if cursor.peek() != b',' {
            return Ok(chain);
        }
        cursor.at += 1;
    }
}

fn unsigned_number(cursor: &mut Cursor) -> Result<u64, CalendarError> {
    let start = cursor.at;
    let mut value: u64 = 0;
    while cursor.peek().is_ascii_digit() {
        value = value
            .checked_mul(10)
            .and_then(|value| value.checked_add(u64::from(cursor.peek() - b'0')))
            .ok_or_else(|| CalendarError::Timestamp(word_at(cursor.text, start)))?;
        cursor.at += 1;
    }
    if cursor.at == start {
        return Err(CalendarError::Number(word_at(cursor.text, start)));
    }
    Ok(value)
}

/// A whole number, or for seconds a decimal with up to six places (rounded by the seventh, the
/// rest ignored), in microseconds. At most `i32::MAX`, as in systemd.
fn decimal(cursor: &mut Cursor, micros: bool) -> Result<i64, CalendarError> {
    let start = cursor.at;
    let too_large = |cursor: &Cursor| CalendarError::OutOfRange {
        field: "value",
        value: word_at(cursor.text, start),
        from: 0,
        to: i64::from(i32::MAX),
    };
    if !cursor.peek().is_ascii_digit() {
        return Err(CalendarError::Number(word_at(cursor.text, start)));
    }
    let whole = unsigned_number(cursor).map_err(|_| too_large(cursor))?;
    let mut value = whole;
    if micros {
        value = whole.checked_mul(MICROS as u64).ok_or_else(|| too_large(cursor))?;
        if cursor.peek() == b'.' && cursor.peek_at(1) != b'.' {
            cursor.at += 1;
            value += fraction(cursor)?;
        }
    }
    if value > i32::MAX as u64 {
        return Err(too_large(cursor));
    }
    Ok(value as i64)
}

fn fraction(cursor: &mut Cursor) -> Result<u64, CalendarError> {
    if !cursor.peek().is_ascii_digit() {
        return Err(CalendarError::Number(word_at(cursor.text, cursor.at)));
    }
    let (mut value, mut digits) = (0u64, 0);
    while digits < 6 && cursor.peek().is_ascii_digit() {
        value = value * 10 + u64::from(cursor.peek() - b'0');
        cursor.at += 1;
        digits += 1;
    }
    for _ in digits..6 {
        value *= 10;
    }
    if (b'5'..=b'9').contains(&cursor.peek()) {
        value += 1;
    }
    while cursor.peek().is_ascii_digit() {
        cursor.at += 1;
    }
    Ok(value)
}

/// systemd's normal form: two-digit years made whole, ranges cut to a multiple of their
/// repetition, components sorted with duplicates dropped, a week of every day is any day.
fn normalize(spec: &mut CalendarSpec) {
    if spec.weekdays.is_some_and(|bits| bits == 0 || bits >= 127) {
        spec.weekdays = None;
    }
    if spec.end_of_month && spec.day.is_empty() {
        spec.end_of_month = false;
    }
    for component in &mut spec.year {
        for value in [&mut component.start, &mut component.stop] {
            if (0..70).contains(value) {
                *value += 2000;
            } else if (70..100).contains(value) {
                *value += 1900;
            }
        }
    }
    for chain in [&mut spec.year, &mut spec.month, &mut spec.day, &mut spec.hour, &mut spec.minute, &mut spec.second] {
        for component in chain.iter_mut() {
            if component.stop > component.start && component.repeat > 0 {
                component.stop -= (component.stop - component.start) % component.repeat;
            }
            if component.stop == component.start {
                component.stop = -1;
                component.repeat = 0;
            }
        }
        chain.sort();
        chain.dedup();
    }
}

fn validate(spec: &CalendarSpec) -> Result<(), CalendarError> {
    check_chain(&spec.year, "year", MIN_YEAR, MAX_YEAR, false)?;
    check_chain(&spec.month, "month", 1, 12, false)?;
    check_chain(&spec.day, "day", 1, 31, spec.end_of_month)?;
    check_chain(&spec.hour, "hour", 0, 23, false)?;
    check_chain(&spec.minute, "minute", 0, 59, false)?;
    check_chain(&spec.second, "second", 0, 60 * MICROS - 1, false)
}

fn check_chain(
    chain: &Chain,
    field: &'static str,
    from: i64,
    to: i64,
    end_of_month: bool,
) -> Result<(), CalendarError> {
    let micros = field == "second";
    let shown = |value: i64| if micros { seconds_text(value) } else { value.to_string() };
    let to = if end_of_month { to - 3 } else { to };
    let (from_shown, to_shown) = if micros { (0, 59) } else { (from, to) };
    for component in chain {
        let out_of_range =
            |value: i64| CalendarError::OutOfRange { field, value: shown(value), from: from_shown, to: to_shown };
        let repeat_error =
            || CalendarError::Repeat { field, repeat: shown(component.repeat), from: from_shown, to: to_shown };
        if component.start < from || component.start > to {
            return Err(out_of_range(component.start));
        }
        if component.repeat > to - from {
            return Err(repeat_error());
        }
        if component.stop >= 0 {
            if component.stop < from || component.stop > to {
                return Err(out_of_range(component.stop));
            }
            if component.start + component.repeat > component.stop {
                return Err(CalendarError::Range { field, start: shown(component.start), stop: shown(component.stop) });
            }
        } else if (end_of_month && component.start - component.repeat < from)
            || (!end_of_month && component.start + component.repeat > to)
        {
            return Err(repeat_error());
        }
    }
    Ok(())
}

/// Microseconds as seconds: `5`, `0.25`.
fn seconds_text(micros: i64) -> String {
    if micros % MICROS == 0 {
        (micros / MICROS).to_string()
    } else {
        format!("{}.{:06}", micros / MICROS, micros % MICROS).trim_end_matches('0').to_string()
    }
}
