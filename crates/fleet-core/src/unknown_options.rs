//! Options and sections of a unit file that neither systemd nor fleet knows: the original
//! stored them silently and systemd ignores them, so `ExecStrat=` made a unit that failed
//! without saying why. They are still accepted; this names them, with the known one nearest
//! (`did you mean ExecStart?`), for fleetctl to warn at submission and in `status`.
//!
//! What systemd knows is the table its parser is built from (`unknown_options/systemd.txt`,
//! written by `scripts/systemd-options.sh`); `[X-Fleet]` holds the original's keys and
//! fleet's own. Sections and options whose names begin with `X-` are the user's own, as
//! systemd has them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;

use crate::UnitFile;
use crate::closest::closest;
use crate::requirements::Requirements;
use crate::requirements::{KNOWN_KEYS, added_keys};
use crate::unit_file::{UnitOption, X_FLEET};

/// `Section.Name` a line, the first line saying which systemd.
const SYSTEMD_OPTIONS: &str = include_str!("unknown_options/systemd.txt");

/// Every section systemd knows, with its options; `[X-Fleet]` with fleet's.
static KNOWN: LazyLock<BTreeMap<&'static str, BTreeSet<&'static str>>> = LazyLock::new(|| {
    let mut known: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for line in SYSTEMD_OPTIONS.lines().filter(|line| !line.starts_with('#')) {
        if let Some((section, name)) = line.split_once('.') {
            known.entry(section).or_default().insert(name);
        }
    }
    known.entry(X_FLEET).or_default().extend(KNOWN_KEYS.iter().copied().chain(added_keys()));
    known
});

/// A section, or an option of a known section, that nothing knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unknown {
    Section { section: String, nearest: Option<&'static str> },
    Option { section: String, name: String, nearest: Option<&'static str> },
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unknown::Section { section, nearest } => {
                write!(f, "unknown section [{section}], which systemd ignores")?;
                match nearest {
                    Some(nearest) => write!(f, "; did you mean [{nearest}]?"),
                    None => Ok(()),
                }
            }
            Unknown::Option { section, name, nearest } => {
                write!(f, "unknown option {name}= in [{section}], which ")?;
                f.write_str(if section == X_FLEET { "fleet ignores" } else { "systemd ignores" })?;
                match nearest {
                    Some(nearest) => write!(f, "; did you mean {nearest}=?"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The unknown sections and options of a unit file, each once, in file order.
pub fn unknown_options(options: &[UnitOption]) -> Vec<Unknown> {
    let mut found: Vec<Unknown> = Vec::new();
    for option in options {
        let unknown = if is_users_own(&option.section) {
            continue;
        } else if let Some(names) = KNOWN.get(option.section.as_str()) {
            if is_users_own(&option.name) || names.contains(option.name.as_str()) {
                continue;
            }
            let nearest = closest(&option.name, names.iter().copied());
            Unknown::Option { section: option.section.clone(), name: option.name.clone(), nearest }
        } else {
            let nearest = closest(&option.section, KNOWN.keys().copied());
            Unknown::Section { section: option.section.clone(), nearest }
        };
        if !found.contains(&unknown) {
            found.push(unknown);
        }
    }
    found
}

/// What `name`'s author is warned of in its file, each a sentence: the sections and options
/// nothing knows (see [`unknown_options`]), then the metadata requirements ignored for not
/// being one `key=value`. fleetctl says them at submission and in `status`; the web view marks
/// the unit with them.
pub fn unit_warnings(name: &str, file: &UnitFile) -> Vec<String> {
    warnings_read(file, &Requirements::from_unit(name, file))
}

/// [`unit_warnings`] of a file whose requirements are read already (`requirements`, read from
/// `file` under the unit's name), for a caller that needs them too.
pub fn warnings_read(file: &UnitFile, requirements: &Requirements) -> Vec<String> {
    let unknown = unknown_options(file.options()).iter().map(ToString::to_string).collect::<Vec<_>>();
    unknown.into_iter().chain(metadata_notes(&requirements.ignored_metadata)).collect()
}

/// What `name`'s file asks of machines' metadata that is not one `key=value`, each said as
/// ignored: the original ignores it too, so the unit is not held to what its author meant.
pub fn ignored_metadata_notes(name: &str, file: &UnitFile) -> Vec<String> {
    metadata_notes(&Requirements::from_unit(name, file).ignored_metadata)
}

fn metadata_notes(ignored: &[String]) -> Vec<String> {
    ignored
        .iter()
        .map(|item| {
            format!(
                "metadata requirement {item:?} is not one key=value, and is ignored (as the original does): it does not restrict where the unit runs"
            )
        })
        .collect()
}

/// `X-…`: a name systemd leaves to the user (fleet's own section aside).
fn is_users_own(name: &str) -> bool {
    name.starts_with("X-") && name != X_FLEET
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(text: &str) -> Vec<String> {
        let file = crate::UnitFile::parse(text).expect("a unit file");
        unknown_options(file.options()).iter().map(ToString::to_string).collect()
    }

    /// Regression (issue 68): typos were stored silently and the unit failed without a word.
    #[test]
    fn typos_are_named_with_the_option_meant() {
        let found = unknown(
            "[Unit]\nDescription=web\n[Service]\nExecStrat=/bin/web\nExecStrat=/bin/web2\nRestart=always\n\
             [Servce]\nUser=web\n[X-Fleet]\nMachineMetdata=zone=a\nSpreadBy=zone\n",
        );
        assert_eq!(
            found,
            [
                "unknown option ExecStrat= in [Service], which systemd ignores; did you mean ExecStart=?",
                "unknown section [Servce], which systemd ignores; did you mean [Service]?",
                "unknown option MachineMetdata= in [X-Fleet], which fleet ignores; did you mean MachineMetadata=?",
            ]
        );
    }

    #[test]
    fn what_systemd_and_fleet_know_passes_and_the_users_own_names_too() {
        let text = "[Unit]\nDescription=d\nAfter=a.service\nStartLimitIntervalSec=5\n\
                    [Service]\nType=simple\nExecStartPre=/bin/true\nExecStart=/bin/true\nMemoryLimit=1G\n\
                    CPUShares=10\nPermissionsStartOnly=true\nStartLimitInterval=5\nX-Mine=1\n\
                    [Socket]\nListenStream=80\n[Timer]\nOnCalendar=daily\n[Install]\nWantedBy=multi-user.target\n\
                    [X-Fleet]\nMachineID=abc\nX-ConditionMachineMetadata=a=b\nGlobal=true\nAtMostOnce=true\n\
                    HealthCheck=http://127.0.0.1/\n[X-Own]\nAnything=goes\n";
        assert_eq!(unknown(text), Vec::<String>::new());
    }

    /// Regression: `Secret=` (a key fleet reads) was warned of as unknown, at submission, in
    /// `status` and in the web view: the known keys were a list of their own.
    #[test]
    fn every_key_fleet_adds_is_known() {
        for key in crate::requirements::added_keys() {
            assert_eq!(unknown(&format!("[X-Fleet]\n{key}=x\n")), Vec::<String>::new(), "{key}");
        }
        assert_eq!(unknown("[X-Fleet]\nSecret=db-password:db\n"), Vec::<String>::new());
    }

    #[test]
    fn a_units_warnings_name_unknown_options_then_ignored_metadata() {
        let file = crate::UnitFile::parse("[Service]\nExecStrat=/bin/x\n[X-Fleet]\nMachineMetadata=role\n")
            .expect("a unit file");
        assert_eq!(
            unit_warnings("x.service", &file),
            [
                "unknown option ExecStrat= in [Service], which systemd ignores; did you mean ExecStart=?",
                "metadata requirement \"role\" is not one key=value, and is ignored (as the original does): it does not restrict where the unit runs",
            ]
        );
        let clean = crate::UnitFile::parse("[Service]\nExecStart=/bin/x\n").expect("a unit file");
        assert_eq!(unit_warnings("x.service", &clean), Vec::<String>::new());
    }

    #[test]
    fn a_name_nothing_is_near_is_named_without_a_guess() {
        assert_eq!(
            unknown("[Service]\nFrobnicate=1\n"),
            ["unknown option Frobnicate= in [Service], which systemd ignores"]
        );
    }
}
