//! Where the units a unit waits for run, as that unit learns it without asking the API.
//!
//! The leading engine records, for each unit with `[X-Fleet] Requires=` or `After=` placed on
//! a machine, the instances it names that are up: their unit name, machine ID and public IP
//! ([`RequiredPlaces`]). The machine running the unit writes them as the file
//! [`FILE_NAME`] in the unit's credentials directory (`$CREDENTIALS_DIRECTORY`), one line per
//! instance (`db.service 3f2a… 10.0.0.2`), and writes it again when they move; then it does
//! what `[X-Fleet] RequiresChange=` says ([`OnChange`]): restart the unit (the default), reload
//! it, or nothing.
//!
//! Places only grow stale, never empty: while none of what a unit names is up, its record
//! keeps the places it had ([`next_places`]), so a unit running on is not restarted into an
//! empty file by a requirement going down for a moment.

use serde::{Deserialize, Serialize};

/// The option saying what a unit wants when what it requires moves.
pub const CHANGE_KEY: &str = "RequiresChange";
/// The file's name in the unit's credentials directory.
pub const FILE_NAME: &str = "fleet-requires";

/// What a running unit wants when the places of what it requires change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnChange {
    /// Stopped and started again, reading the new file from the start.
    #[default]
    Restart,
    /// Its `ExecReload=` run, the unit left running.
    Reload,
    /// The file written again, nothing else.
    None,
}

impl OnChange {
    pub fn word(self) -> &'static str {
        match self {
            OnChange::Restart => "restart",
            OnChange::Reload => "reload",
            OnChange::None => "none",
        }
    }
}

/// One running instance of what a unit requires.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequiredPlace {
    pub unit: String,
    #[serde(rename = "machineID")]
    pub machine_id: String,
    #[serde(rename = "primaryIP")]
    pub public_ip: String,
}

/// The places recorded for `unit`, placed on `machine`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequiredPlaces {
    pub unit: String,
    pub machine: String,
    pub places: Vec<RequiredPlace>,
}

/// The places to record for a unit whose requirements are up at `up` (sorted), having been
/// recorded at `before`: `up`, unless nothing is up, when what was recorded stays.
pub fn next_places(up: Vec<RequiredPlace>, before: Option<&[RequiredPlace]>) -> Vec<RequiredPlace> {
    match before {
        Some(before) if up.is_empty() => before.to_vec(),
        _ => up,
    }
}

/// The file's content: one line per place, `unit machine-id public-ip`.
pub fn file_content(places: &[RequiredPlace]) -> Vec<u8> {
    let mut text = String::new();
    for place in places {
        let ip = if place.public_ip.is_empty() { "-" } else { place.public_ip.as_str() };
        text.push_str(&format!("{} {} {ip}\n", place.unit, place.machine_id));
    }
    text.into_bytes()
}

/// The places a `fleet-requires` file written by [`file_content`] names; lines that are not
/// three words are left out.
pub fn parse_file(content: &[u8]) -> Vec<RequiredPlace> {
    String::from_utf8_lossy(content)
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let (unit, machine, ip) = (words.next()?, words.next()?, words.next()?);
            if words.next().is_some() || unit.is_empty() || machine.is_empty() {
                return None;
            }
            let public_ip = if ip == "-" { String::new() } else { ip.to_string() };
            Some(RequiredPlace { unit: unit.to_string(), machine_id: machine.to_string(), public_ip })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_back_as_the_places_it_was_written_from() {
        let places = vec![
            RequiredPlace { unit: "db@1.service".into(), machine_id: "m1".into(), public_ip: "10.0.0.1".into() },
            RequiredPlace { unit: "db@2.service".into(), machine_id: "m2".into(), public_ip: String::new() },
        ];
        assert_eq!(parse_file(&file_content(&places)), places);
        assert_eq!(parse_file(b"one two\nthree four five six\n\n"), Vec::new());
    }

    #[test]
    fn places_never_go_empty_once_known_and_the_file_has_a_line_each() {
        let db = |machine: &str| RequiredPlace {
            unit: "db.service".into(),
            machine_id: machine.into(),
            public_ip: format!("10.0.0.{}", machine.len()),
        };
        assert_eq!(next_places(vec![], None), vec![]);
        assert_eq!(next_places(vec![], Some(&[db("m1")])), vec![db("m1")]);
        assert_eq!(next_places(vec![db("m22")], Some(&[db("m1")])), vec![db("m22")]);
        let mut no_ip = db("m1");
        no_ip.public_ip.clear();
        let text = String::from_utf8(file_content(&[db("m22"), no_ip])).expect("text");
        assert_eq!(text, "db.service m22 10.0.0.3\ndb.service m1 -\n");
    }
}
