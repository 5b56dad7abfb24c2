//! How a rollout's units are stored: as a table, not one object per unit. A running rollout
//! is stored again on every step of its driver, and a rollout of 10,000 units written as
//! objects (name, both hashes in hex, step) is about 1.3 MB each time; as a table it is the
//! names, each distinct content once, and runs of units that share their contents and step
//! (units move through a rollout in waves, so the runs are few). Records written as a list of
//! objects, before the table, are still read.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{RolloutUnit, Step};
use crate::UnitHash;

/// `count` consecutive units with the contents at `from` and `to` in the table, at `step`.
#[derive(Serialize, Deserialize)]
struct Run(usize, usize, usize, Step);

#[derive(Serialize, Deserialize)]
struct Table {
    names: Vec<String>,
    contents: Vec<UnitHash>,
    runs: Vec<Run>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stored {
    Table(Table),
    Objects(Vec<RolloutUnit>),
}

pub fn serialize<S: Serializer>(units: &[RolloutUnit], serializer: S) -> Result<S::Ok, S::Error> {
    // A rollout of files may give every unit its own content: each found by hash, not by a
    // walk over those before it.
    let mut contents: Vec<UnitHash> = Vec::new();
    let mut indexes: HashMap<UnitHash, usize> = HashMap::new();
    let mut index_of = |hash: UnitHash| {
        *indexes.entry(hash).or_insert_with(|| {
            contents.push(hash);
            contents.len() - 1
        })
    };
    let mut runs: Vec<Run> = Vec::new();
    for unit in units {
        let (from, to) = (index_of(unit.from), index_of(unit.to));
        match runs.last_mut() {
            Some(Run(count, kept_from, kept_to, step))
                if (*kept_from, *kept_to) == (from, to) && *step == unit.step =>
            {
                *count += 1;
            }
            _ => runs.push(Run(1, from, to, unit.step.clone())),
        }
    }
    let names = units.iter().map(|unit| unit.name.clone()).collect();
    Table { names, contents, runs }.serialize(serializer)
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<RolloutUnit>, D::Error> {
    let table = match Stored::deserialize(deserializer)? {
        Stored::Objects(units) => return Ok(units),
        Stored::Table(table) => table,
    };
    let counted = table.runs.iter().try_fold(0_usize, |sum, Run(count, ..)| sum.checked_add(*count));
    let Some(counted) = counted.filter(|counted| *counted == table.names.len()) else {
        return Err(serde::de::Error::custom(format!("the runs do not hold the {} units named", table.names.len())));
    };
    let content = |index: usize| {
        table.contents.get(index).copied().ok_or_else(|| serde::de::Error::custom(format!("no content {index}")))
    };
    let mut names = table.names.into_iter();
    let mut units = Vec::with_capacity(counted);
    for Run(count, from, to, step) in table.runs {
        let (from, to) = (content(from)?, content(to)?);
        for name in names.by_ref().take(count) {
            units.push(RolloutUnit { name, from, to, step: step.clone() });
        }
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{MaxUnavailable, Rollout};

    fn hash(text: &str) -> UnitHash {
        crate::UnitFile::parse(&format!("[Service]\nExecStart={text}\n")).expect("a unit").hash()
    }

    fn rollout(units: Vec<RolloutUnit>) -> Rollout {
        Rollout { units, ..super::super::tests::rollout(0, MaxUnavailable::Count(1)) }
    }

    fn units(count: usize) -> Vec<RolloutUnit> {
        let (old, new, other) = (hash("/bin/a"), hash("/bin/b"), hash("/bin/c"));
        (0..count)
            .map(|n| RolloutUnit {
                name: format!("web@{n}.service"),
                from: if n % 7 == 0 { other } else { old },
                to: new,
                step: match n % 5 {
                    0 | 1 => Step::Done,
                    2 => Step::Replacing { since: 100 + (n as u64 % 3) },
                    3 => Step::Failed { why: format!("unit {n} \"failed\"") },
                    _ => Step::Waiting,
                },
            })
            .collect()
    }

    #[test]
    fn a_rollout_reads_back_as_it_was_written() {
        for count in [0, 1, 2, 100] {
            let written = rollout(units(count));
            let text = serde_json::to_string(&written).expect("encoded");
            assert_eq!(serde_json::from_str::<Rollout>(&text).expect("decoded"), written);
        }
    }

    #[test]
    fn units_that_share_contents_and_step_take_one_run() {
        let (old, new) = (hash("/bin/a"), hash("/bin/b"));
        let wave = |step: Step, from: usize, to: usize| {
            (from..to).map(move |n| RolloutUnit {
                name: format!("web@{n}.service"),
                from: old,
                to: new,
                step: step.clone(),
            })
        };
        let units: Vec<RolloutUnit> = wave(Step::Done, 0, 5000)
            .chain(wave(Step::Replacing { since: 7 }, 5000, 6000))
            .chain(wave(Step::Waiting, 6000, 10_000))
            .collect();
        let table = serde_json::to_value(rollout(units.clone())).expect("encoded");
        assert_eq!(table["units"]["runs"].as_array().map(Vec::len), Some(3));
        assert_eq!(table["units"]["contents"].as_array().map(Vec::len), Some(2));
        let objects = serde_json::to_string(&units).expect("encoded").len();
        let stored = table["units"].to_string().len();
        assert!(stored * 4 < objects, "{stored} bytes as a table, {objects} as objects");
    }

    #[test]
    fn a_record_written_as_objects_is_still_read() {
        let written = rollout(units(12));
        let mut text = serde_json::to_value(&written).expect("encoded");
        text["units"] = serde_json::to_value(&written.units).expect("objects");
        assert_eq!(serde_json::from_value::<Rollout>(text).expect("decoded"), written);
    }

    #[test]
    fn a_table_that_does_not_add_up_is_refused() {
        let mut text = serde_json::to_value(rollout(units(3))).expect("encoded");
        text["units"]["names"] = serde_json::json!(["a.service"]);
        assert!(serde_json::from_value::<Rollout>(text.clone()).is_err());
        text["units"]["names"] = serde_json::json!(["a.service", "b.service", "c.service"]);
        let runs = text["units"]["runs"].clone();
        text["units"]["runs"] = serde_json::json!([[usize::MAX, 0, 0, "Done"], [4, 0, 0, "Done"]]);
        assert!(serde_json::from_value::<Rollout>(text.clone()).is_err(), "counts that overflow");
        text["units"]["runs"] = runs;
        text["units"]["runs"][0][1] = serde_json::json!(9);
        assert!(serde_json::from_value::<Rollout>(text).is_err());
    }
}
