//! The desired-state file a source keeps beside its unit files, `fleet-desired.conf`:
//!
//! ```text
//! # PATTERN = STATE; later lines win; a unit no line matches is launched.
//! *.service        = launched
//! batch-*.service  = loaded
//! web@{1..12}.service = launched   # instances of the template web@.service
//! web@canary.service  = launched
//! ```
//!
//! A pattern is a unit-name glob (`*`, `?`, `[...]`) for the unit files of the source, or an
//! instance name (with an optional `{A..B}` range) of a template the source holds: such a line
//! makes those instances units of the source. STATE is `inactive`, `loaded` or `launched`.

use crate::DesiredState;
use crate::glob::Glob;
use crate::unit_name::{UnitNameInfo, validate_name};

/// The file's name, in each directory a source reads.
pub const DESIRED_FILE: &str = "fleet-desired.conf";
/// The most instances one range may name.
pub const RANGE_MAX: u64 = 100_000;

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DesiredLine {
    /// A glob over the source's unit files.
    Pattern { glob: String, state: DesiredState },
    /// Instances of a template, by name.
    Instances { names: Instances, state: DesiredState },
}

/// The instances a line names: one, or a range, which is only spelled out as it is used
/// (a file of a few lines must not make millions of names before anything counts them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Instances {
    One(String),
    /// `{head}{n}{tail}` for `n` from `from` to `to`, both included.
    Range {
        head: String,
        from: u64,
        to: u64,
        tail: String,
    },
}

impl Instances {
    /// The names, in order.
    pub fn names(&self) -> Box<dyn Iterator<Item = String> + '_> {
        match self {
            Self::One(name) => Box::new(std::iter::once(name.clone())),
            Self::Range { head, from, to, tail } => Box::new((*from..=*to).map(move |n| format!("{head}{n}{tail}"))),
        }
    }
}

/// A line that does not read, by number (from 1).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct DesiredFileError {
    pub line: usize,
    pub problem: String,
}

/// Reads the file into its lines, each with its number (from 1); the first bad line fails it
/// whole (a half-read file would change desired states the author did not mean to).
pub fn parse_desired_file(text: &str) -> Result<Vec<(usize, DesiredLine)>, DesiredFileError> {
    let mut lines = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let fail = |problem: String| DesiredFileError { line: index + 1, problem };
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let Some((pattern, state)) = content.split_once('=') else {
            return Err(fail(format!("expected \"PATTERN = STATE\", found {content:?}")));
        };
        let (pattern, state) = (pattern.trim(), state.trim());
        let state: DesiredState = state
            .parse()
            .map_err(|_| fail(format!("unknown desired state {state:?} (expected inactive, loaded or launched)")))?;
        lines.push((index + 1, parse_pattern(pattern, state).map_err(fail)?));
    }
    Ok(lines)
}

fn parse_pattern(pattern: &str, state: DesiredState) -> Result<DesiredLine, String> {
    if let Some((head, rest)) = pattern.split_once('{') {
        let (range, tail) = rest.split_once('}').ok_or_else(|| format!("unclosed range in {pattern:?}"))?;
        let (from, to) = range.split_once("..").ok_or_else(|| format!("expected {{A..B}} in {pattern:?}"))?;
        let number = |text: &str| text.trim().parse::<u64>().map_err(|_| format!("{text:?} is not a whole number"));
        let (from, to) = (number(from)?, number(to)?);
        if from > to || to - from >= RANGE_MAX {
            return Err(format!("range {{{from}..{to}}} must go upwards and name at most {RANGE_MAX} instances"));
        }
        let names = Instances::Range { head: head.to_string(), from, to, tail: tail.to_string() };
        // Every name of the range differs from these two only in its digits.
        check_instance(&format!("{head}{from}{tail}"))?;
        check_instance(&format!("{head}{to}{tail}"))?;
        return Ok(DesiredLine::Instances { names, state });
    }
    if UnitNameInfo::new(pattern).is_instance() && !pattern.contains(['*', '?', '[']) {
        check_instance(pattern)?;
        return Ok(DesiredLine::Instances { names: Instances::One(pattern.to_string()), state });
    }
    Glob::new(pattern).ok_or_else(|| format!("{pattern:?} is not a valid pattern"))?;
    Ok(DesiredLine::Pattern { glob: pattern.to_string(), state })
}

fn check_instance(name: &str) -> Result<(), String> {
    validate_name(name).map_err(|error| format!("{name:?}: {error}"))?;
    if !UnitNameInfo::new(name).is_instance() {
        return Err(format!("{name:?} is not an instance of a template (NAME@INSTANCE.TYPE)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_instances_and_ranges() {
        let lines: Vec<DesiredLine> = parse_desired_file(
            "# states\n*.service = loaded\nweb@{1..3}.service = launched # three\n\nweb@x.service=inactive\n",
        )
        .expect("a good file")
        .into_iter()
        .map(|(_, line)| line)
        .collect();
        assert_eq!(
            lines,
            vec![
                DesiredLine::Pattern { glob: "*.service".into(), state: DesiredState::Loaded },
                DesiredLine::Instances {
                    names: Instances::Range { head: "web@".into(), from: 1, to: 3, tail: ".service".into() },
                    state: DesiredState::Launched
                },
                DesiredLine::Instances { names: Instances::One("web@x.service".into()), state: DesiredState::Inactive },
            ]
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let error = |text: &str| parse_desired_file(text).expect_err("a bad file").to_string();
        assert_eq!(
            error("a.service = launched\nb.service\n"),
            "line 2: expected \"PATTERN = STATE\", found \"b.service\""
        );
        assert_eq!(
            error("a.service = running\n"),
            "line 1: unknown desired state \"running\" (expected inactive, loaded or launched)"
        );
        assert!(error("web@{3..1}.service = launched").starts_with("line 1: range {3..1} must go upwards"));
        assert!(error("web@{1..999999}.service = launched").contains("at most 100000"));
        assert!(error("web{1..2}.service = launched").contains("is not an instance of a template"));
    }
}
