//! What a source says the cluster should hold, read from its files at one commit: the unit
//! files under its paths, each with the desired state `fleet-desired.conf` gives it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::desired_file::{DESIRED_FILE, DesiredLine, parse_desired_file};
use crate::admission::admit_unit;
use crate::glob::Glob;
use crate::unit_name::{UnitNameInfo, validate_name};
use crate::{DesiredState, UnitFile};

/// A file of the source that did not read, by its path in the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProblem {
    pub path: String,
    pub line: Option<usize>,
    pub problem: String,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}: line {line}: {}", self.path, self.problem),
            None => write!(f, "{}: {}", self.path, self.problem),
        }
    }
}

/// One unit the source wants, with the file it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedUnit {
    pub file: UnitFile,
    pub desired: DesiredState,
    pub path: String,
}

/// The source at one commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceContent {
    pub units: BTreeMap<String, WantedUnit>,
    /// Units whose file did not read: they are left as the cluster holds them.
    pub broken: BTreeSet<String>,
    /// A desired-state file did not read: nothing of the source changes until it does.
    pub halted: bool,
    pub problems: Vec<FileProblem>,
}

/// The most units a source may hold unless configured otherwise (`source_max_units`).
pub const DEFAULT_MAX_UNITS: usize = 10_000;

/// Reads a source from its files, `(path in the repository, text)`, in any order: files named
/// like units become units, `fleet-desired.conf` files give desired states (in path order,
/// later lines winning), other files are ignored. A source that would hold more than
/// `max_units` units is halted, with the line that crossed the bound named.
pub fn read_source(files: &[(String, String)], max_units: usize) -> SourceContent {
    let mut content = SourceContent::default();
    let mut files: Vec<&(String, String)> = files.iter().collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut paths_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut desired_lines: Vec<(String, usize, DesiredLine)> = Vec::new();
    for (path, text) in files {
        let base = path.rsplit('/').next().unwrap_or(path);
        if base == DESIRED_FILE {
            match parse_desired_file(text) {
                Ok(lines) => desired_lines.extend(lines.into_iter().map(|(number, line)| (path.clone(), number, line))),
                Err(error) => {
                    content.halted = true;
                    content.problems.push(FileProblem {
                        path: path.clone(),
                        line: Some(error.line),
                        problem: error.problem,
                    });
                }
            }
            continue;
        }
        if validate_name(base).is_err() {
            continue;
        }
        paths_of.entry(base.to_string()).or_default().push(path.clone());
        match UnitFile::parse(text) {
            Ok(file) if let Err(problem) = admit_unit(base, &file) => {
                content.broken.insert(base.to_string());
                content.problems.push(FileProblem { path: path.clone(), line: None, problem });
            }
            Ok(file) => {
                // Kept as the original kept them, but named (issue 68): a typo is no longer silent.
                for unknown in crate::unknown_options::unknown_options(file.options()) {
                    content.problems.push(FileProblem { path: path.clone(), line: None, problem: unknown.to_string() });
                }
                let desired = DesiredState::Launched;
                content.units.insert(base.to_string(), WantedUnit { file, desired, path: path.clone() });
            }
            Err(error) => {
                content.broken.insert(base.to_string());
                content.problems.push(FileProblem {
                    path: path.clone(),
                    line: Some(error.line),
                    problem: error.reason.to_string(),
                });
            }
        }
    }
    for (name, paths) in paths_of.iter().filter(|(_, paths)| paths.len() > 1) {
        content.units.remove(name);
        content.broken.insert(name.clone());
        content.problems.push(FileProblem {
            path: paths.join(", "),
            line: None,
            problem: format!("{name} is defined more than once"),
        });
    }
    if content.units.len() > max_units {
        content.halted = true;
        content.problems.push(FileProblem { path: ".".into(), line: None, problem: too_many(max_units) });
    } else {
        apply_desired_lines(&mut content, &desired_lines, max_units);
    }
    // No unit file at all is taken for a mistake (a wrong path, an emptied branch) rather than
    // an order to destroy every unit the source made: a source meant to hold nothing is removed.
    if content.units.is_empty() && content.broken.is_empty() && !content.halted {
        content.halted = true;
        content.problems.push(FileProblem {
            path: ".".into(),
            line: None,
            problem: "no unit files under the source's paths: nothing was changed".into(),
        });
    }
    content
}

fn too_many(max_units: usize) -> String {
    format!("the source would hold more than {max_units} units (source_max_units): nothing was changed")
}

/// Gives each unit its desired state, adds the instances the lines name (up to `max_units`
/// units in all: beyond, the source halts); templates stay inactive (a template never runs).
fn apply_desired_lines(content: &mut SourceContent, lines: &[(String, usize, DesiredLine)], max_units: usize) {
    for (path, number, line) in lines {
        match line {
            DesiredLine::Pattern { glob, state } => {
                let Some(glob) = Glob::new(glob) else { continue };
                for (name, unit) in content.units.iter_mut() {
                    if glob.matches(name) {
                        unit.desired = *state;
                    }
                }
            }
            DesiredLine::Instances { names, state } => {
                for name in names.names() {
                    if content.units.len() >= max_units && !content.units.contains_key(&name) {
                        content.halted = true;
                        let problem = too_many(max_units);
                        content.problems.push(FileProblem { path: path.clone(), line: Some(*number), problem });
                        return;
                    }
                    let Some(template) = UnitNameInfo::new(&name).template() else { continue };
                    if content.broken.contains(&template) {
                        content.broken.insert(name.clone());
                        continue;
                    }
                    let Some(file) = content.units.get(&template).map(|unit| unit.file.clone()) else {
                        content.problems.push(FileProblem {
                            path: path.clone(),
                            line: Some(*number),
                            problem: format!("{name}: the source holds no template {template}"),
                        });
                        break;
                    };
                    let unit = WantedUnit { file, desired: *state, path: path.clone() };
                    content.units.insert(name, unit);
                }
            }
        }
    }
    for (name, unit) in content.units.iter_mut() {
        if UnitNameInfo::new(name).is_template() {
            unit.desired = DesiredState::Inactive;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(files: &[(String, String)]) -> SourceContent {
        read_source(files, DEFAULT_MAX_UNITS)
    }

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect()
    }

    #[test]
    fn units_templates_instances_and_states() {
        let content = read(&files(&[
            ("apps/a.service", "[Service]\nExecStart=/bin/true\n"),
            ("apps/batch.service", "[Service]\nExecStart=/bin/true\n"),
            ("apps/web@.service", "[Service]\nExecStart=/bin/web %i\n"),
            ("apps/README.md", "not a unit"),
            ("apps/fleet-desired.conf", "batch.service = loaded\nweb@{1..2}.service = launched\n"),
        ]));
        let states: Vec<(&str, DesiredState)> =
            content.units.iter().map(|(name, unit)| (name.as_str(), unit.desired)).collect();
        assert_eq!(
            states,
            vec![
                ("a.service", DesiredState::Launched),
                ("batch.service", DesiredState::Loaded),
                ("web@.service", DesiredState::Inactive),
                ("web@1.service", DesiredState::Launched),
                ("web@2.service", DesiredState::Launched),
            ]
        );
        assert!(content.problems.is_empty() && !content.halted);
        assert_eq!(content.units["web@1.service"].file, content.units["web@.service"].file);
    }

    #[test]
    fn a_bad_unit_file_is_named_and_left_alone() {
        let content = read(&files(&[
            ("a.service", "[Service]\nExecStart=/bin/true\n"),
            ("b.service", "[Service]\nthis is not an option\n"),
        ]));
        assert_eq!(content.units.keys().collect::<Vec<_>>(), vec!["a.service"]);
        assert!(content.broken.contains("b.service"));
        assert_eq!(
            content.problems[0].to_string(),
            "b.service: line 2: expected \"Name=Value\", found \"this is not an option\""
        );
    }

    #[test]
    fn a_bad_desired_file_halts_the_source_and_twins_are_refused() {
        let content = read(&files(&[
            ("a/x.service", "[Service]\nExecStart=/bin/true\n"),
            ("b/x.service", "[Service]\nExecStart=/bin/false\n"),
            ("fleet-desired.conf", "x.service = up\n"),
        ]));
        assert!(content.halted);
        assert!(content.broken.contains("x.service") && !content.units.contains_key("x.service"));
        let problems: Vec<String> = content.problems.iter().map(ToString::to_string).collect();
        assert!(
            problems.iter().any(|p| p.starts_with("fleet-desired.conf: line 1: unknown desired state")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p == "a/x.service, b/x.service: x.service is defined more than once"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_unit_the_cluster_would_refuse_is_a_problem() {
        let content =
            read(&files(&[("a.service", "[Service]\nExecStart=/bin/true\n[X-Fleet]\nMachineID=abc\nGlobal=true\n")]));
        assert!(content.units.is_empty() && content.broken.contains("a.service"));
        assert_eq!(content.problems[0].to_string(), "a.service: MachineID cannot be used with Global");
    }

    #[test]
    fn a_source_without_units_halts_instead_of_destroying_everything() {
        let content = read(&files(&[("README.md", "nothing here")]));
        assert!(content.halted);
        assert_eq!(content.problems[0].to_string(), ".: no unit files under the source's paths: nothing was changed");
    }

    #[test]
    fn instances_need_their_template() {
        let content = read(&files(&[("fleet-desired.conf", "# none\nweb@1.service = launched\n")]));
        assert_eq!(
            content.problems[0].to_string(),
            "fleet-desired.conf: line 2: web@1.service: the source holds no template web@.service"
        );
    }

    /// Regression: a desired file of 30 lines of 100,000 instances each took the engine
    /// leader to 2.6 GB and was still going. The source halts at its bound, naming the line.
    #[test]
    fn a_source_is_bounded_in_the_units_it_makes() {
        let desired = "web@{1..100000}.service = launched\n".repeat(30);
        let template = ("web@.service", "[Service]\nExecStart=/bin/web %i\n");
        let content = read(&files(&[template, ("fleet-desired.conf", &desired)]));
        assert!(content.halted);
        assert!(content.units.len() <= DEFAULT_MAX_UNITS);
        assert_eq!(
            content.problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "fleet-desired.conf: line 1: the source would hold more than 10000 units (source_max_units): nothing was changed"
            ]
        );
        let small = read_source(&files(&[template, ("fleet-desired.conf", "web@{1..3}.service = launched\n")]), 4);
        assert!(!small.halted && small.units.len() == 4, "the template and three instances: {small:?}");
        let over = read_source(&files(&[template, ("fleet-desired.conf", "web@{1..4}.service = launched\n")]), 4);
        assert!(over.halted);
        let files_over = read_source(&files(&[template, ("a.service", "[Service]\nExecStart=/bin/true\n")]), 1);
        assert!(files_over.halted && files_over.problems[0].to_string().contains("more than 1 units"));
    }

    /// Issue 68: a unit file with a typo from a source is still a unit, and its status names
    /// the typo with the option meant.
    #[test]
    fn a_typo_in_a_sources_unit_is_named_and_the_unit_kept() {
        let files = vec![("units/web.service".to_string(), "[Service]\nExecStrat=/bin/web\n".to_string())];
        let content = read_source(&files, DEFAULT_MAX_UNITS);
        assert!(content.units.contains_key("web.service") && !content.halted && content.broken.is_empty());
        let problems: Vec<String> = content.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            [
                "units/web.service: unknown option ExecStrat= in [Service], which systemd ignores; did you mean ExecStart=?"
            ]
        );
    }
}
