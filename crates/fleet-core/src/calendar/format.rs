//! The normalized form of an expression, as `systemd-analyze calendar` prints it
//! (`Mon..Fri *-*-* 02:00:00`), which fleet shows back to the operator.

use std::fmt::Write;

use super::{CalendarSpec, Chain, Zone};

const MICROS: i64 = 1_000_000;
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

pub(super) fn normalized(spec: &CalendarSpec) -> String {
    let mut text = String::new();
    if let Some(bits) = spec.weekdays {
        text.push_str(&weekdays(bits));
        text.push(' ');
    }
    chain(&mut text, 4, &spec.year, false);
    text.push('-');
    chain(&mut text, 2, &spec.month, false);
    text.push(if spec.end_of_month { '~' } else { '-' });
    chain(&mut text, 2, &spec.day, false);
    text.push(' ');
    chain(&mut text, 2, &spec.hour, false);
    text.push(':');
    chain(&mut text, 2, &spec.minute, false);
    text.push(':');
    chain(&mut text, 2, &spec.second, true);
    match &spec.zone {
        Zone::Unnamed => {}
        Zone::Utc => text.push_str(" UTC"),
        Zone::Named(name, _) => {
            text.push(' ');
            text.push_str(name);
        }
    }
    text
}

/// Runs of three days or more as `Mon..Wed`, of two as `Mon,Tue`.
fn weekdays(bits: u8) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for day in (0..DAYS.len()).filter(|day| bits & (1 << day) != 0) {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == day => *last = day,
            _ => runs.push((day, day)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .map(|&(first, last)| match last - first {
            0 => DAYS[first].to_string(),
            1 => format!("{},{}", DAYS[first], DAYS[last]),
            _ => format!("{}..{}", DAYS[first], DAYS[last]),
        })
        .collect();
    shown.join(",")
}

fn chain(text: &mut String, width: usize, chain: &Chain, micros: bool) {
    let unit = if micros { MICROS } else { 1 };
    if chain.is_empty()
        || (micros && chain.len() == 1 && chain[0].start == 0 && chain[0].stop < 0 && chain[0].repeat == MICROS)
    {
        text.push('*');
        return;
    }
    for (index, component) in chain.iter().enumerate() {
        if index > 0 {
            text.push(',');
        }
        let _ = write!(text, "{:0width$}", component.start / unit);
        fractional(text, component.start % unit);
        if component.stop > 0 {
            let _ = write!(text, "..{:0width$}", component.stop / unit);
        }
        fractional(text, component.stop % unit);
        if component.repeat > 0 && !(component.stop > 0 && component.repeat == unit) {
            let _ = write!(text, "/{}", component.repeat / unit);
        }
        fractional(text, component.repeat % unit);
    }
}

fn fractional(text: &mut String, micros: i64) {
    if micros > 0 {
        let _ = write!(text, ".{micros:06}");
    }
}
