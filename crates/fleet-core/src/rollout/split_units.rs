//! A rollout's units cut in two for a store that writes its running rollouts often and
//! bounds what one write may carry (etcd): what stays as it is while the rollout runs (the
//! units' names and both contents, written once) and what its driver changes on every pass
//! (their steps, as runs over the same order: units move in waves, so the runs are few).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{RolloutUnit, Step};
use crate::UnitHash;

/// The units' names and contents, in the rollout's order: the names, each distinct content
/// once, and runs of consecutive units sharing both contents (`count`, `from`, `to`, indexes
/// into `contents`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedUnits {
    names: Vec<String>,
    contents: Vec<UnitHash>,
    runs: Vec<(usize, usize, usize)>,
}

/// The units' steps, in the order of their [`FixedUnits`]: runs of consecutive units at one
/// step (`count`, step).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRuns(Vec<(usize, Step)>);

/// `units` as the part that stays and the part that moves.
pub fn split_units(units: &[RolloutUnit]) -> (FixedUnits, StepRuns) {
    let mut contents: Vec<UnitHash> = Vec::new();
    let mut indexes: HashMap<UnitHash, usize> = HashMap::new();
    let mut index_of = |hash: UnitHash| {
        *indexes.entry(hash).or_insert_with(|| {
            contents.push(hash);
            contents.len() - 1
        })
    };
    let mut content_runs: Vec<(usize, usize, usize)> = Vec::new();
    let mut step_runs: Vec<(usize, Step)> = Vec::new();
    for unit in units {
        let (from, to) = (index_of(unit.from), index_of(unit.to));
        match content_runs.last_mut() {
            Some((count, kept_from, kept_to)) if (*kept_from, *kept_to) == (from, to) => *count += 1,
            _ => content_runs.push((1, from, to)),
        }
        match step_runs.last_mut() {
            Some((count, step)) if *step == unit.step => *count += 1,
            _ => step_runs.push((1, unit.step.clone())),
        }
    }
    let names = units.iter().map(|unit| unit.name.clone()).collect();
    (FixedUnits { names, contents, runs: content_runs }, StepRuns(step_runs))
}

/// The units `fixed` names at the steps `steps` gives them; an error when the two do not
/// describe the same units.
pub fn join_units(fixed: &FixedUnits, steps: &StepRuns) -> Result<Vec<RolloutUnit>, String> {
    let total = fixed.names.len();
    if counted(fixed.runs.iter().map(|run| run.0)) != Some(total) {
        return Err(format!("the content runs do not hold the {total} units named"));
    }
    if counted(steps.0.iter().map(|run| run.0)) != Some(total) {
        return Err(format!("the step runs do not hold the {total} units named"));
    }
    let content = |index: usize| fixed.contents.get(index).copied().ok_or_else(|| format!("no content {index}"));
    let mut contents = Vec::with_capacity(total);
    for &(count, from, to) in &fixed.runs {
        let pair = (content(from)?, content(to)?);
        contents.extend(std::iter::repeat_n(pair, count));
    }
    let steps = steps.0.iter().flat_map(|(count, step)| std::iter::repeat_n(step, *count));
    Ok(fixed
        .names
        .iter()
        .zip(contents)
        .zip(steps)
        .map(|((name, (from, to)), step)| RolloutUnit { name: name.clone(), from, to, step: step.clone() })
        .collect())
}

/// The sum of `counts`, unless it overflows.
fn counted(mut counts: impl Iterator<Item = usize>) -> Option<usize> {
    counts.try_fold(0_usize, |sum, count| sum.checked_add(count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(text: &str) -> UnitHash {
        crate::UnitFile::parse(&format!("[Service]\nExecStart={text}\n")).expect("a unit").hash()
    }

    fn units(count: usize) -> Vec<RolloutUnit> {
        (0..count)
            .map(|n| RolloutUnit {
                name: format!("web@{n}.service"),
                from: if n % 7 == 0 { hash("/bin/c") } else { hash("/bin/a") },
                to: hash(&format!("/bin/b {}", n / 3)),
                step: match n % 5 {
                    0 | 1 => Step::Done,
                    2 => Step::Replacing { since: 100 + (n as u64 % 3) },
                    3 => Step::Failed { why: format!("unit {n} failed") },
                    _ => Step::Waiting,
                },
            })
            .collect()
    }

    #[test]
    fn the_two_parts_join_into_the_units_they_were_cut_from() {
        for count in [0, 1, 2, 100] {
            let units = units(count);
            let (fixed, steps) = split_units(&units);
            assert_eq!(join_units(&fixed, &steps), Ok(units.clone()));
            let (fixed, steps) = (
                serde_json::from_str(&serde_json::to_string(&fixed).expect("encoded")).expect("decoded"),
                serde_json::from_str(&serde_json::to_string(&steps).expect("encoded")).expect("decoded"),
            );
            assert_eq!(join_units(&fixed, &steps), Ok(units));
        }
    }

    #[test]
    fn a_pass_changes_only_the_steps_part() {
        let mut units = units(50);
        let (fixed, _) = split_units(&units);
        for unit in &mut units {
            unit.step = Step::Done;
        }
        let (fixed_after, steps) = split_units(&units);
        assert_eq!(fixed_after, fixed);
        assert_eq!(steps, StepRuns(vec![(50, Step::Done)]), "one run for units at one step");
    }

    #[test]
    fn parts_that_do_not_describe_the_same_units_are_refused() {
        let (fixed, steps) = split_units(&units(10));
        let (other, other_steps) = split_units(&units(11));
        assert!(join_units(&fixed, &other_steps).is_err());
        assert!(join_units(&other, &steps).is_err());
        let overflowing = StepRuns(vec![(usize::MAX, Step::Done), (11, Step::Done)]);
        assert!(join_units(&fixed, &overflowing).is_err());
        let mut broken = fixed.clone();
        broken.runs[0].1 = 99;
        assert!(join_units(&broken, &steps).is_err(), "a content index out of the table");
    }
}
