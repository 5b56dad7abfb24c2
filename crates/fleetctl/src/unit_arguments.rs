//! The units a lifecycle command names, beyond the original's one argument per unit: a
//! numeric range (`web@{1..100000}.service`, with the start's zero padding), a file of names
//! (`--from-file FILE`, `-` for standard input; one per line, `#` comments), and a pattern
//! (`'web@*.service'`) matched against the units in the cluster when no local file has that
//! name. A hundred thousand instances need no shell expansion and no argument list limit.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use clap::Args;
use fleet_core::glob::Glob;

/// The most units one range may name.
pub const MAX_RANGE: u64 = 1_000_000;

#[derive(Args, Debug, Clone, Default)]
pub struct UnitList {
    /// Units: names or unit files; NAME@{A..B}.service names instances A to B; a pattern
    /// (*, ?, [...]) names the units in the cluster that match it
    pub units: Vec<String>,
    /// Read more units from FILE, one per line (- for standard input; # starts a comment)
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<String>,
}

impl UnitList {
    /// The arguments with ranges expanded and the file's lines added, in order.
    pub fn arguments(&self) -> Result<Vec<String>, String> {
        let mut listed = self.units.clone();
        if let Some(file) = &self.from_file {
            listed.extend(read_list(file)?);
        }
        let mut expanded = Vec::with_capacity(listed.len());
        for argument in &listed {
            expand_range(argument, &mut expanded)?;
        }
        Ok(expanded)
    }
}

fn read_list(file: &str) -> Result<Vec<String>, String> {
    let mut text = String::new();
    let read = if file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::File::open(file).and_then(|mut opened| opened.read_to_string(&mut text)).map(|_| ())
    };
    read.map_err(|error| format!("cannot read the unit list {file}: {error}"))?;
    Ok(list_lines(&text))
}

/// The names in a unit list: one per line, blank lines and `#` comments skipped.
fn list_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split_once('#').map_or(line, |(before, _)| before).trim())
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

/// Appends `argument` to `out`, or each name its `{A..B}` range gives.
fn expand_range(argument: &str, out: &mut Vec<String>) -> Result<(), String> {
    let Some((prefix, rest)) = argument.split_once('{') else {
        out.push(argument.to_string());
        return Ok(());
    };
    let Some((range, suffix)) = rest.split_once('}') else {
        out.push(argument.to_string());
        return Ok(());
    };
    let Some((start, end)) = range.split_once("..") else {
        out.push(argument.to_string());
        return Ok(());
    };
    let bad = |why: &str| format!("invalid range {{{range}}} in {argument}: {why}");
    let number = |text: &str| {
        if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(bad("both ends must be non-negative whole numbers"));
        }
        text.parse::<u64>().map_err(|_| bad("a number is too large"))
    };
    let (first, last) = (number(start)?, number(end)?);
    if last < first {
        return Err(bad("the end is before the start"));
    }
    if last - first >= MAX_RANGE {
        return Err(bad(&format!("it names more than {MAX_RANGE} units")));
    }
    if suffix.contains('{') {
        return Err(bad("only one range per name"));
    }
    let width = if start.len() > 1 && start.starts_with('0') { start.len() } else { 0 };
    out.extend((first..=last).map(|n| format!("{prefix}{n:0width$}{suffix}")));
    Ok(())
}

/// Whether `argument` is a pattern over the cluster's units: it has a pattern character, no
/// directory, and no local file of that name.
pub fn is_pattern(argument: &str) -> bool {
    argument.contains(['*', '?', '[']) && !argument.contains('/') && !Path::new(argument).exists()
}

/// What patterns matched: the names, and the patterns that matched nothing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Matched {
    pub names: Vec<String>,
    pub unmatched: Vec<String>,
}

/// `arguments` with each pattern replaced by the names in `cluster` it matches (in name
/// order), and the patterns that matched nothing; a malformed pattern is an error.
pub fn match_patterns(arguments: &[String], cluster: &BTreeSet<String>) -> Result<Matched, String> {
    let mut matched = Matched { names: Vec::with_capacity(arguments.len()), unmatched: Vec::new() };
    for argument in arguments {
        if !is_pattern(argument) {
            matched.names.push(argument.clone());
            continue;
        }
        let glob = Glob::new(argument).ok_or_else(|| format!("invalid pattern {argument}"))?;
        let before = matched.names.len();
        matched.names.extend(cluster.iter().filter(|name| glob.matches(name)).cloned());
        if matched.names.len() == before {
            matched.unmatched.push(argument.clone());
        }
    }
    Ok(matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(argument: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        expand_range(argument, &mut out).map(|()| out)
    }

    #[test]
    fn ranges_expand_in_order_with_padding() {
        assert_eq!(expanded("web@{1..3}.service").unwrap(), ["web@1.service", "web@2.service", "web@3.service"]);
        assert_eq!(expanded("web@{08..10}.service").unwrap(), ["web@08.service", "web@09.service", "web@10.service"]);
        assert_eq!(expanded("web@{0..0}").unwrap(), ["web@0"]);
        assert_eq!(expanded("plain.service").unwrap(), ["plain.service"]);
        assert_eq!(expanded("odd{x}.service").unwrap(), ["odd{x}.service"], "not a range: left as it is");
        assert_eq!(expanded("web@{1..100000}.service").unwrap().len(), 100_000);
    }

    #[test]
    fn bad_ranges_are_refused_with_the_reason() {
        assert_eq!(
            expanded("web@{5..1}.service").unwrap_err(),
            "invalid range {5..1} in web@{5..1}.service: the end is before the start"
        );
        assert!(expanded("web@{a..3}.service").unwrap_err().contains("non-negative whole numbers"));
        assert!(expanded("web@{-1..3}.service").unwrap_err().contains("non-negative whole numbers"));
        assert!(expanded("web@{0..99999999999}.service").unwrap_err().contains("more than 1000000 units"));
        assert!(expanded("web@{0..99999999999999999999999}.service").unwrap_err().contains("too large"));
        assert!(expanded("a{1..2}b{1..2}").unwrap_err().contains("only one range"));
    }

    #[test]
    fn a_list_skips_blank_lines_and_comments() {
        assert_eq!(list_lines("a.service\n\n  b@{1..2}.service  # two\n# none\n"), ["a.service", "b@{1..2}.service"]);
    }

    #[test]
    fn patterns_match_the_cluster_and_must_match_something() {
        let cluster: BTreeSet<String> = ["web@1.service", "web@2.service", "db.service"].map(String::from).into();
        let arguments = ["db.service".to_string(), "web@*.service".to_string()];
        assert_eq!(
            match_patterns(&arguments, &cluster).unwrap().names,
            ["db.service", "web@1.service", "web@2.service"]
        );
        // Regression (issue 68): one pattern matching nothing made the whole command do nothing.
        let some = ["web@*".to_string(), "c@*".to_string()];
        let matched = match_patterns(&some, &cluster).unwrap();
        assert_eq!((matched.names.len(), matched.unmatched), (2, vec!["c@*".to_string()]));
        assert_eq!(
            match_patterns(&["api@?.service".to_string()], &cluster).unwrap().unmatched,
            ["api@?.service".to_string()]
        );
        assert_eq!(match_patterns(&["web[".to_string()], &cluster).unwrap_err(), "invalid pattern web[");
    }
}
