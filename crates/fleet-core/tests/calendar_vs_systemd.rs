//! fleet's calendar expressions against systemd's own reading of them: every expression of
//! `calendar_corpus.txt`, from base times around daylight-saving changes in several zones,
//! through `systemd-analyze calendar --iterations=5` (systemd is installed for the suite). The
//! two must accept and refuse the same expressions, normalize them alike and find the same
//! next five elapses (to the second, as systemd prints them).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use fleet_core::calendar::CalendarSpec;
use jiff::tz::TimeZoneDatabase;

const ITERATIONS: usize = 5;

/// What systemd said of one expression: its normalized form and elapses (UTC, to the second).
#[derive(Debug, PartialEq, Eq)]
struct Reading {
    normalized: String,
    elapses: Vec<String>,
}

fn corpus() -> Vec<String> {
    let text = include_str!("calendar_corpus.txt");
    text.lines().filter(|line| !line.starts_with('#') && !line.is_empty()).map(str::to_string).collect()
}

/// The base times: ordinary, and around daylight-saving changes (Europe, North America, Lord
/// Howe's half hour, Chatham's 45 minutes) and a leap day.
const BASES: &[&str] = &[
    "2026-12-04T00:00:00Z",
    "2027-03-14T06:30:00Z",
    "2027-03-28T00:45:00Z",
    "2027-04-03T14:40:00Z",
    "2027-09-25T13:00:00Z",
    "2027-10-31T00:45:00Z",
    "2027-10-31T01:15:00Z",
    "2027-11-07T05:45:00Z",
    "2027-11-07T06:15:00Z",
    "2028-02-28T23:59:59Z",
];

/// systemd's readings of every expression it accepts (refused ones are left out), from `base`,
/// and the expressions it accepts but cannot find an elapse of ("Resource deadlock avoided":
/// systemd gives up where a daylight-saving change would move its search backwards, as on
/// Chatham's spring night; fleet moves on to the next day).
fn systemd_readings(expressions: &[String], base_seconds: i64) -> (BTreeMap<String, Reading>, BTreeSet<String>) {
    let output = Command::new("systemd-analyze")
        .arg("calendar")
        .arg(format!("--base-time=@{base_seconds}"))
        .arg(format!("--iterations={ITERATIONS}"))
        .arg("--")
        .args(expressions)
        .env("TZ", "UTC")
        .env("LC_ALL", "C")
        .env("SYSTEMD_COLORS", "0")
        .output()
        .expect("systemd-analyze, which the suite installs with systemd, runs");
    let stdout = String::from_utf8(output.stdout).expect("systemd-analyze prints UTF-8");
    let stderr = String::from_utf8(output.stderr).expect("systemd-analyze prints UTF-8");
    let undetermined = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("Failed to determine next elapse for '"))
        .filter_map(|rest| rest.rsplit_once("': ").map(|(expression, _)| expression.to_string()))
        .collect();
    // One block per expression it read, blocks apart by blank lines; the original form is left
    // out where it is the normalized form.
    let mut readings = BTreeMap::new();
    for block in stdout.split("\n\n") {
        let mut original = None;
        let mut reading = Reading { normalized: String::new(), elapses: Vec::new() };
        for line in block.lines().map(str::trim_start) {
            let iteration = line.split_once(": ").filter(|(label, _)| label.starts_with("Iter. #"));
            if let Some(text) = line.strip_prefix("Original form: ") {
                original = Some(text.to_string());
            } else if let Some(text) = line.strip_prefix("Normalized form: ") {
                reading.normalized = text.to_string();
            } else if let Some(elapse) = line.strip_prefix("Next elapse: ").or(iteration.map(|(_, rest)| rest))
                && elapse != "never"
            {
                reading.elapses.push(elapse.to_string());
            }
        }
        if !reading.normalized.is_empty() {
            readings.insert(original.unwrap_or_else(|| reading.normalized.clone()), reading);
        }
    }
    (readings, undetermined)
}

/// fleet's reading of `expression` from `base`, in systemd's words, with the zones of the
/// machine's database, which systemd reads (fleet itself reads the one compiled into it, whose
/// version may differ: Havana's and Casablanca's rules did between 2025b and 2026f).
fn fleet_reading(expression: &str, base_micros: i64, zones: &TimeZoneDatabase) -> Option<Reading> {
    let spec = CalendarSpec::parse_in(expression, zones).ok()?;
    let elapses = spec
        .elapses_after(base_micros, ITERATIONS)
        .into_iter()
        .map(|micros| {
            let moment = jiff::Timestamp::from_microsecond(micros).expect("an elapse in range");
            moment.strftime("%a %Y-%m-%d %H:%M:%S UTC").to_string()
        })
        .collect();
    Some(Reading { normalized: spec.to_string(), elapses })
}

#[test]
fn fleet_reads_every_calendar_expression_of_the_corpus_as_systemd_does() {
    let expressions = corpus();
    assert!(expressions.len() >= 200, "the corpus has {} expressions", expressions.len());
    let mut differences = Vec::new();
    let (mut compared, mut gave_up) = (0, 0);
    let zones = TimeZoneDatabase::from_dir("/usr/share/zoneinfo").expect("the machine's zone database (tzdata)");
    for base in BASES {
        let base: jiff::Timestamp = base.parse().expect("a base time");
        let (readings, undetermined) = systemd_readings(&expressions, base.as_second());
        assert!(readings.len() > expressions.len() / 2, "systemd-analyze read {} expressions", readings.len());
        for expression in &expressions {
            let systemd = readings.get(expression);
            let fleet = fleet_reading(expression, base.as_microsecond(), &zones);
            compared += 1;
            if undetermined.contains(expression) {
                if fleet.as_ref().is_none_or(|reading| reading.elapses.is_empty()) {
                    differences.push(format!("{expression:?} from {base}: systemd accepts it, fleet {fleet:?}"));
                }
                gave_up += 1;
            } else if systemd != fleet.as_ref() {
                differences.push(format!("{expression:?} from {base}:\n  systemd {systemd:?}\n  fleet   {fleet:?}"));
            }
        }
    }
    assert!(differences.is_empty(), "{} of {compared} readings differ:\n{}", differences.len(), differences.join("\n"));
    assert!(gave_up <= 2, "systemd found no elapse for {gave_up} readings; expected only Chatham's spring night");
}
