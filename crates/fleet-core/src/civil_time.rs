//! Calendar dates and times in UTC from Unix seconds, for what fleet prints (journal lines,
//! token expiries), without a time-zone database.

/// A moment in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1 to 12.
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl CivilTime {
    /// The UTC date and time `seconds` after 1970-01-01.
    pub fn from_unix(seconds: u64) -> Self {
        let (days, rest) = (seconds / 86_400, seconds % 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        let rest = rest as u32;
        Self { year, month, day, hour: rest / 3600, minute: rest % 3600 / 60, second: rest % 60 }
    }

    /// `2026-11-22T10:37:33Z`.
    pub fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// `2026-11-22T10:37:33Z` for a moment in microseconds since the epoch (to the second; a
/// moment before the epoch is shown as the epoch).
pub fn rfc3339_of_micros(micros: i64) -> String {
    CivilTime::from_unix(u64::try_from(micros.div_euclid(1_000_000)).unwrap_or(0)).rfc3339()
}

/// The moment an RFC 3339 time names (`2026-12-07T06:00:00Z`, `2026-12-07T07:00:00+01:00`,
/// with a fraction or not), in microseconds since the epoch; `None` when `text` is not one.
pub fn micros_of_rfc3339(text: &str) -> Option<i64> {
    let moment: jiff::Timestamp = text.parse().ok()?;
    Some(moment.as_microsecond())
}

/// The date `days` after 1970-01-01 (negative: before), as year, month (1 to 12) and day
/// (Howard Hinnant's civil-from-days).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// How many days 1970-01-01 lies before `year`-`month`-`day` (month 1 to 12, day 1 to 31; the
/// inverse of [`civil_from_days`]).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_are_read_back_to_the_microsecond() {
        assert_eq!(micros_of_rfc3339("1970-01-01T00:00:01Z"), Some(1_000_000));
        assert_eq!(micros_of_rfc3339("2026-12-07T07:00:00.5+01:00"), Some(1_796_623_200_500_000));
        assert_eq!(rfc3339_of_micros(micros_of_rfc3339("2026-11-22T10:37:33Z").unwrap()), "2026-11-22T10:37:33Z");
        for not_one in ["", "yesterday", "2026-12-07", "2026-12-07T06:00:00", "10m"] {
            assert_eq!(micros_of_rfc3339(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(CivilTime::from_unix(0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(CivilTime::from_unix(1_709_251_199).rfc3339(), "2024-02-29T23:59:59Z");
        assert_eq!(CivilTime::from_unix(1_795_266_000).rfc3339(), "2026-11-21T13:00:00Z");
        assert_eq!(CivilTime::from_unix(951_782_400).rfc3339(), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn days_and_dates_are_inverses() {
        for days in -800_000..800_000 {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
