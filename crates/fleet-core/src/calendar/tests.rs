use super::*;

/// Microseconds since the epoch of a UTC time written `2027-03-28T01:00:00`.
fn at(text: &str) -> i64 {
    let moment: jiff::Timestamp = format!("{text}Z").parse().expect("a timestamp");
    moment.as_microsecond()
}

fn shown(micros: i64) -> String {
    jiff::Timestamp::from_microsecond(micros).expect("in range").strftime("%Y-%m-%dT%H:%M:%S").to_string()
}

fn elapses(expression: &str, after: &str, count: usize) -> Vec<String> {
    let spec = CalendarSpec::parse(expression).unwrap_or_else(|error| panic!("{expression}: {error}"));
    spec.elapses_after(at(after), count).into_iter().map(shown).collect()
}

#[test]
fn shorthands_and_common_forms_read_as_systemd_reads_them() {
    for (text, normalized) in [
        ("daily", "*-*-* 00:00:00"),
        ("weekly", "Mon *-*-* 00:00:00"),
        ("quarterly", "*-01,04,07,10-01 00:00:00"),
        ("*:0/15", "*-*-* *:00/15:00"),
        ("Mon..Fri *-*~1", "Mon..Fri *-*~01 00:00:00"),
        ("*-*-1..7 4:00", "*-*-01..07 04:00:00"),
        ("Sat,Sun 12:00 Europe/Berlin", "Sat,Sun *-*-* 12:00:00 Europe/Berlin"),
        ("Mon,Tue,Wed 9:30:15.25 UTC", "Mon..Wed *-*-* 09:30:15.250000 UTC"),
        ("27-3-28", "2027-03-28 00:00:00"),
        ("@1806000000", "2027-03-25 18:40:00 UTC"),
        ("*:*:*", "*-*-* *:*:*"),
    ] {
        let spec = CalendarSpec::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"));
        assert_eq!(spec.to_string(), normalized, "{text}");
    }
}

#[test]
fn elapses_follow_the_clock_through_daylight_saving_changes() {
    // As `systemd-analyze calendar --base-time=@1806000000 --iterations=12` printed them.
    assert_eq!(
        elapses("2027-03-28 *:0/30:00 Europe/Berlin", "2027-03-25T18:40:00", 8),
        [
            "2027-03-27T23:00:00",
            "2027-03-27T23:30:00",
            "2027-03-28T00:00:00",
            "2027-03-28T00:30:00",
            "2027-03-28T01:00:00",
            "2027-03-28T01:30:00",
            "2027-03-28T02:00:00",
            "2027-03-28T02:30:00"
        ]
    );
    assert_eq!(
        elapses("2027-10-31 *:0/30:00 Europe/Berlin", "2027-03-25T18:40:00", 8),
        [
            "2027-10-30T22:00:00",
            "2027-10-30T22:30:00",
            "2027-10-30T23:00:00",
            "2027-10-30T23:30:00",
            "2027-10-31T00:00:00",
            "2027-10-31T00:30:00",
            "2027-10-31T02:00:00",
            "2027-10-31T02:30:00"
        ]
    );
    // From inside the hour that occurs twice, its second occurrence is kept.
    assert_eq!(
        elapses("*:0/20 Europe/Berlin", "2027-10-31T01:10:00", 4),
        ["2027-10-31T01:20:00", "2027-10-31T01:40:00", "2027-10-31T02:00:00", "2027-10-31T02:20:00"]
    );
    // A time in the gap of the spring change never elapses that day.
    assert_eq!(
        elapses("02:30 Europe/Berlin", "2027-03-28T00:59:59", 2),
        ["2027-03-29T00:30:00", "2027-03-30T00:30:00"]
    );
}

#[test]
fn calendar_oddities_elapse_when_they_exist() {
    assert_eq!(elapses("*-02-29 12:00", "2026-12-04T00:00:00", 2), ["2028-02-29T12:00:00", "2032-02-29T12:00:00"]);
    assert_eq!(
        elapses("Mon..Fri *-*~1", "2026-12-04T00:00:00", 3),
        ["2026-12-31T00:00:00", "2027-03-31T00:00:00", "2027-04-30T00:00:00"]
    );
    assert!(CalendarSpec::parse("*-02-30").expect("systemd reads it").next_after(0).is_none());
    assert!(CalendarSpec::parse("2020-01-01").expect("a date").next_after(at("2026-01-01T00:00:00")).is_none());
}

#[test]
fn bad_expressions_say_what_is_wrong() {
    let error = |text: &str| CalendarSpec::parse(text).expect_err(text).to_string();
    assert_eq!(error(""), "the expression is empty");
    assert_eq!(error("Mon *-*-* 25:00"), "the hour 25 is outside 0..23");
    assert_eq!(error("*-13-01"), "the month 13 is outside 1..12");
    assert_eq!(
        error("Fri..Mon"),
        "the days of the week \"Fri..Mon\" do not form a list or a range such as Mon..Fri or Sat,Sun"
    );
    assert_eq!(error("Mondays"), "\"Mondays\" is not a day of the week (Mon, Tuesday, ...)");
    assert_eq!(error("*:0/0"), "a repetition of 0 (\"/0\") never moves on");
    assert_eq!(error("*:30/45"), "the minute repetition /45 does not fit between 0 and 59");
    assert_eq!(
        error("daily Mars/Olympus"),
        "\"Mars/Olympus\" is not a time zone fleet knows (an IANA name such as Europe/Berlin; the case matters)"
    );
    assert_eq!(
        error("12:00 europe/berlin"),
        "\"europe/berlin\" is not a time zone fleet knows (an IANA name such as Europe/Berlin; the case matters)"
    );
    assert!(error("tomorrow").contains("expected a number or *"));
}

#[test]
fn an_expression_that_fires_too_often_or_never_is_refused() {
    let check = |text: &str| CalendarSpec::parse(text).expect(text).check_interval();
    assert_eq!(check("*:*:0/2"), Ok(()));
    assert_eq!(check("daily"), Ok(()));
    assert_eq!(check("2020-01-01"), Ok(()), "a date past is no error: admitted once, admitted always");
    assert_eq!(check("*:*:*"), Err(CalendarError::TooOften { gap_micros: 1_000_000 }));
    assert_eq!(check("*:00:00,01"), Err(CalendarError::TooOften { gap_micros: 1_000_000 }));
    assert_eq!(check("2150-06-01 *:*:0/0.5"), Err(CalendarError::TooOften { gap_micros: 500_000 }));
    assert_eq!(check("*-02-30"), Err(CalendarError::NeverElapses));
    assert_eq!(
        check("*:*:*").expect_err("too often").to_string(),
        "it elapses 1 s after the elapse before it, more often than fleet runs a unit (every 2 s at most)"
    );
}

#[test]
fn the_last_elapse_before_a_moment_is_found_without_walking_every_elapse() {
    let spec = CalendarSpec::parse("*:*:0/2").expect("every 2 s");
    let week_later = at("2026-12-11T00:00:01");
    let last = spec.last_at_or_before(week_later, at("2026-12-04T00:00:00"));
    assert_eq!(last.map(shown).as_deref(), Some("2026-12-11T00:00:00"));
    let spec = CalendarSpec::parse("Mon 09:00 Europe/Berlin").expect("Mondays");
    assert_eq!(
        spec.last_at_or_before(at("2026-12-21T07:59:59"), at("2026-12-01T00:00:00")).map(shown).as_deref(),
        Some("2026-12-14T08:00:00")
    );
    assert_eq!(spec.last_at_or_before(at("2026-12-07T07:59:59"), at("2026-12-01T00:00:00")), None);
}
