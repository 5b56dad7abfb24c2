//! Go's duration syntax (`30s`, `1m30s`, `500ms`, `24h`), as the original's options and
//! flags take it.

use std::time::Duration;

/// Why a duration cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("expected a duration such as 30s")]
    Syntax,
    #[error("duration out of range")]
    OutOfRange,
    #[error("must be longer than zero")]
    Zero,
}

/// A span in its largest whole unit, as a reason shows a wait: `10s`, `4m`, `1h`, `90s`.
pub fn short_span(span: Duration) -> String {
    match span.as_secs() {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Reads a positive Go duration.
pub fn parse_go_duration(value: &str) -> Result<Duration, DurationError> {
    let mut rest = value.trim();
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(DurationError::Syntax);
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().map_err(|_| DurationError::Syntax)?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return Err(DurationError::Syntax),
        };
        total = Duration::try_from_secs_f64(number * seconds)
            .ok()
            .and_then(|part| total.checked_add(part))
            .ok_or(DurationError::OutOfRange)?;
        rest = &rest[unit_len..];
    }
    if total.is_zero() {
        return Err(DurationError::Zero);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_span_is_shown_in_its_largest_whole_unit() {
        let shown = |seconds| super::short_span(std::time::Duration::from_secs(seconds));
        assert_eq!(
            (shown(240), shown(3600), shown(90), shown(10)),
            ("4m".into(), "1h".into(), "90s".into(), "10s".into())
        );
    }

    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("soon"), Err(DurationError::Syntax));
        assert_eq!(parse_go_duration("10"), Err(DurationError::Syntax));
        assert_eq!(parse_go_duration("0s"), Err(DurationError::Zero));
        assert_eq!(parse_go_duration("1e400h"), Err(DurationError::Syntax));
    }
}
