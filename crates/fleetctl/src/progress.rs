//! Progress of a blocking command on a terminal: one line on stderr, redrawn as units move,
//! with how many reached the state waited for, the others by state and how many cannot be
//! placed; why a unit cannot be placed is a line of its own above it, never cut to the
//! terminal's width. Not on a terminal, nothing is drawn: the output stays the original's
//! lines.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What the line says: a pure function of the counts, tested without a terminal.
pub fn describe(target: &str, by_state: &BTreeMap<String, usize>, unplaced: usize) -> String {
    let others: Vec<String> = by_state
        .iter()
        .filter(|(state, count)| state.as_str() != target && **count > 0)
        .map(|(state, count)| format!("{count} {state}"))
        .collect();
    let mut text =
        if others.is_empty() { format!("waiting for {target}") } else { format!("waiting: {}", others.join(", ")) };
    if unplaced > 0 {
        text.push_str(&format!("; {unplaced} cannot be scheduled"));
    }
    text
}

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A progress line for `total` units on stderr, drawn only when stderr is a terminal.
    pub fn new(total: usize, what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr_with_hz(4));
        if let Ok(style) = ProgressStyle::with_template(&format!("{what} {{pos}}/{{len}} [{{elapsed}}] {{wide_msg}}")) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(250));
        Self { bar }
    }

    pub fn update(&self, done: usize, message: String) {
        self.bar.set_position(done as u64);
        self.bar.set_message(message);
    }

    /// Prints `line` on stderr, above the progress line when it is drawn. Without a terminal
    /// too (issue 68: a piped `start` of a unit that fits nowhere waited forever in silence);
    /// standard output stays the original's.
    pub fn note(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.suspend(|| eprintln!("{line}"));
        }
    }

    /// Prints a line of the command's output above the progress line.
    pub fn println(&self, line: &str) {
        if self.bar.is_hidden() {
            println!("{line}");
        } else {
            self.bar.suspend(|| println!("{line}"));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_units_by_state_and_the_unplaceable_ones() {
        let states =
            BTreeMap::from([("launched".to_string(), 3), ("inactive".to_string(), 2), ("loaded".to_string(), 1)]);
        assert_eq!(describe("launched", &states, 0), "waiting: 2 inactive, 1 loaded");
        assert_eq!(describe("launched", &states, 1), "waiting: 2 inactive, 1 loaded; 1 cannot be scheduled");
        assert_eq!(describe("loaded", &BTreeMap::new(), 0), "waiting for loaded");
    }
}
