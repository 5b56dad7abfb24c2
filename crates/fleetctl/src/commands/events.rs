//! `fleetctl events`: what happens in the cluster, from the events it keeps on, and with
//! `--follow` as it happens (our addition; `GET /fleet/v1/events`).

use std::io::Write;

use fleet_api_schema::ClusterEvent;
use fleet_client::EventQuery;

use crate::Outcome;
use crate::context::Context;
use crate::output::OutputFormat;

/// What `fleetctl events` was asked.
pub struct EventsAsked {
    pub query: EventQuery,
    pub output: OutputFormat,
    pub full: bool,
    pub no_legend: bool,
}

const LEGEND: &str = "INDEX\tTIME\tKIND\tUNIT\tMACHINE\tMESSAGE";

/// One line of the table: tab-separated, so a line is printed as its event comes.
fn line(event: &ClusterEvent, full: bool) -> String {
    let machine = event.machine_id.as_deref().unwrap_or("-");
    let machine = if full { machine } else { machine.get(..8).unwrap_or(machine) };
    let by = event.by.as_deref().map(|by| format!(" (by {by})")).unwrap_or_default();
    format!("{}\t{}\t{}\t{}\t{machine}\t{}{by}", event.index, event.time, event.kind, units(event, full), event.message)
}

/// The unit column: the event's unit, or of several the first and how many more (all of
/// them, comma-separated, with `--full`).
fn units(event: &ClusterEvent, full: bool) -> String {
    match (&event.unit, event.units.as_slice()) {
        (Some(unit), _) => unit.clone(),
        (None, []) => "-".to_string(),
        (None, units) if full => units.join(","),
        (None, [first, rest @ ..]) => format!("{first} (+{})", rest.len()),
    }
}

/// What `--since` asks for: an event index (digits), or a moment, the API's `from`: a span
/// back from `now` (microseconds since the epoch), as systemd writes spans (`10m`, `2h`,
/// `1d 12h`), or an RFC 3339 time.
pub fn since_of(text: &str, now: i64) -> Result<(u64, Option<String>), String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        return text.parse().map(|index| (index, None)).map_err(|_| format!("invalid --since {text:?}: too large"));
    }
    if fleet_core::civil_time::micros_of_rfc3339(text).is_some() {
        return Ok((0, Some(text.to_string())));
    }
    match fleet_core::service_values::parse_timespan(text) {
        Ok(Some(span)) => {
            let back = i64::try_from(span.as_micros()).unwrap_or(i64::MAX);
            Ok((0, Some(fleet_core::civil_time::rfc3339_of_micros(now.saturating_sub(back)))))
        }
        _ => Err(format!(
            "invalid --since {text:?}: an event index, a span of time back from now (10m, 2h, 1d) or a time (2026-12-07T06:00:00Z)"
        )),
    }
}

pub async fn events(context: &Context, asked: &EventsAsked) -> Outcome {
    let mut out = std::io::stdout().lock();
    if asked.output != OutputFormat::Json && !asked.no_legend && writeln!(out, "{LEGEND}").is_err() {
        return Outcome::Success;
    }
    let shown = |event: ClusterEvent| {
        let text = match asked.output {
            OutputFormat::Json => serde_json::to_string(&event).unwrap_or_default(),
            _ => line(&event, asked.full),
        };
        // A reader that went away (a pipe closed) ends it.
        writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
    };
    match context.client.events(&asked.query, shown).await {
        Ok(()) => Outcome::Success,
        Err(error) => {
            eprintln!("Error reading events: {error}");
            Outcome::Failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_an_index_a_span_back_from_now_or_a_time() {
        let now = fleet_core::civil_time::micros_of_rfc3339("2026-12-07T06:30:00Z").unwrap();
        assert_eq!(since_of("0", now), Ok((0, None)));
        assert_eq!(since_of("120003", now), Ok((120_003, None)));
        assert_eq!(since_of("10m", now), Ok((0, Some("2026-12-07T06:20:00Z".into()))));
        assert_eq!(since_of("1d 2h", now), Ok((0, Some("2026-12-06T04:30:00Z".into()))));
        assert_eq!(since_of("2026-12-07T06:00:00+01:00", now), Ok((0, Some("2026-12-07T06:00:00+01:00".into()))));
        for bad in ["", "yesterday", "-5", "5 parsecs", "99999999999999999999999"] {
            assert!(since_of(bad, now).is_err_and(|message| message.starts_with("invalid --since")), "{bad}");
        }
    }

    #[test]
    fn a_line_shortens_the_machine_unless_full_and_names_who_asked() {
        let event = ClusterEvent {
            index: 120_003,
            time: "2026-12-05T21:00:00.000000Z".into(),
            kind: "write".into(),
            unit: Some("web.service".into()),
            machine_id: Some("0123456789abcdef".into()),
            by: Some("token:ci".into()),
            message: "PUT /fleet/v1/units/web.service: 201 Created".into(),
            units: Vec::new(),
        };
        assert_eq!(
            line(&event, false),
            "120003\t2026-12-05T21:00:00.000000Z\twrite\tweb.service\t01234567\tPUT /fleet/v1/units/web.service: 201 Created (by token:ci)"
        );
        assert!(line(&event, true).contains("\t0123456789abcdef\t"));
        let bare = ClusterEvent { unit: None, machine_id: None, by: None, ..event };
        assert!(line(&bare, false).starts_with("120003\t2026-12-05T21:00:00.000000Z\twrite\t-\t-\tPUT"));
        let batch = ClusterEvent { units: vec!["a.service".into(), "b.service".into(), "c.service".into()], ..bare };
        assert!(line(&batch, false).contains("\twrite\ta.service (+2)\t-\t"), "{}", line(&batch, false));
        assert!(line(&batch, true).contains("\twrite\ta.service,b.service,c.service\t-\t"));
    }
}
