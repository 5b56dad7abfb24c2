//! What the simulation checks of units on a calendar (`[X-Fleet] Schedule=`), from the job
//! records it samples and the starts the machines' unit managers saw:
//!
//! - **At most once.** No elapse is claimed for two first attempts (two run numbers), and a
//!   unit is started by the machines no more often than runs of it were claimed: no run
//!   started twice, whatever leader changes, lost answers, restarts and cuts came.
//! - **At least once, or accounted for.** Every elapse from the first record seen to the last
//!   record's cursor was claimed, waits (queued), or lies in a range skipped with its reason.

use std::collections::{BTreeMap, BTreeSet};

use fleet_core::calendar::CalendarSpec;
use fleet_core::job::runs::{JobRecord, Skipped};

#[derive(Debug, Default)]
struct Seen {
    /// Run number → (elapse, attempt), as first seen.
    runs: BTreeMap<u64, (Option<i64>, u32)>,
    skips: BTreeSet<(i64, i64)>,
    first_cursor: Option<i64>,
    last: Option<JobRecord>,
}

#[derive(Debug, Default)]
pub struct RunsJudge {
    seen: BTreeMap<String, Seen>,
    pub violations: Vec<String>,
}

impl RunsJudge {
    /// Takes in the job records stored now of the units on a calendar, `units`.
    pub fn look(&mut self, jobs: &BTreeMap<String, (JobRecord, u64)>, units: &BTreeSet<String>) {
        for (unit, (record, _)) in jobs.iter().filter(|(unit, _)| units.contains(*unit)) {
            let seen = self.seen.entry(unit.clone()).or_default();
            seen.first_cursor.get_or_insert(record.cursor);
            for run in &record.runs {
                let now = (run.elapse, run.attempt);
                if let Some(before) = seen.runs.insert(run.id, now)
                    && before != now
                {
                    self.violations.push(format!("{unit}: run {} was {before:?} and is now {now:?}", run.id));
                }
            }
            seen.skips.extend(record.skips.iter().map(|Skipped { first, last, .. }| (*first, *last)));
            seen.last = Some(record.clone());
        }
    }

    /// The verdict, with each unit's schedule and how often the machines started it.
    pub fn judge(&mut self, schedules: &BTreeMap<String, CalendarSpec>, starts: &BTreeMap<String, u64>) {
        for (unit, seen) in &self.seen {
            let mut first_attempts: BTreeMap<i64, u64> = BTreeMap::new();
            for (id, (elapse, attempt)) in &seen.runs {
                let Some(elapse) = elapse.filter(|_| *attempt == 1) else { continue };
                if let Some(other) = first_attempts.insert(elapse, *id) {
                    self.violations.push(format!("{unit}: elapse {elapse} was claimed by runs {other} and {id}"));
                }
            }
            let started = starts.get(unit).copied().unwrap_or(0);
            let claimed = seen.runs.len() as u64;
            if started > claimed {
                self.violations.push(format!("{unit}: started {started} times for {claimed} runs claimed"));
            }
            let (Some(spec), Some(last), Some(from)) = (schedules.get(unit), &seen.last, seen.first_cursor) else {
                continue;
            };
            let mut elapse = spec.next_after(from);
            while let Some(at) = elapse.filter(|at| *at <= last.cursor) {
                let accounted = first_attempts.contains_key(&at)
                    || last.queued == Some(at)
                    || seen.skips.iter().any(|(first, last)| *first <= at && at <= *last);
                if !accounted {
                    self.violations.push(format!("{unit}: elapse {at} was neither run, waiting nor skipped"));
                }
                elapse = spec.next_after(at);
            }
        }
    }

    /// How many runs were claimed in all.
    pub fn runs_claimed(&self) -> usize {
        self.seen.values().map(|seen| seen.runs.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::job::runs::{Run, SkipReason};

    const SECOND: i64 = 1_000_000;
    const START: i64 = 1_796_342_400 * SECOND;

    fn run(id: u64, elapse: i64, attempt: u32) -> Run {
        Run {
            id,
            elapse: Some(elapse),
            attempt,
            avoid: Vec::new(),
            claimed: elapse,
            machine: None,
            started: None,
            ended: None,
            outcome: None,
            released: true,
            log: None,
            tally: None,
        }
    }

    fn stored(cursor: i64, runs: Vec<Run>, skips: Vec<Skipped>) -> BTreeMap<String, (JobRecord, u64)> {
        let record = JobRecord { cursor, runs, skips, ..JobRecord::new(START) };
        BTreeMap::from([("s.service".to_string(), (record, 1))])
    }

    fn verdict(looks: &[BTreeMap<String, (JobRecord, u64)>], starts: u64) -> Vec<String> {
        let mut judge = RunsJudge::default();
        for look in looks {
            judge.look(look, &BTreeSet::from(["s.service".to_string()]));
        }
        let spec = CalendarSpec::parse("*:*:0/2").expect("a schedule");
        judge.judge(
            &BTreeMap::from([("s.service".to_string(), spec)]),
            &BTreeMap::from([("s.service".to_string(), starts)]),
        );
        judge.violations
    }

    #[test]
    fn every_elapse_run_once_or_skipped_passes_and_each_breach_is_named() {
        let first = stored(START, vec![], vec![]);
        let skipped = Skipped { first: START + 4 * SECOND, last: START + 6 * SECOND, why: SkipReason::Missed };
        let fine = stored(
            START + 8 * SECOND,
            vec![run(1, START + 2 * SECOND, 1), run(2, START + 8 * SECOND, 1)],
            vec![skipped.clone()],
        );
        assert_eq!(verdict(&[first.clone(), fine.clone()], 2), Vec::<String>::new());
        // A retry is a second attempt at an elapse, not a second claim of it.
        let retried =
            stored(START + 2 * SECOND, vec![run(1, START + 2 * SECOND, 1), run(2, START + 2 * SECOND, 2)], vec![]);
        assert_eq!(verdict(&[first.clone(), retried], 2), Vec::<String>::new());
        assert_eq!(verdict(&[first.clone(), fine.clone()], 3), vec!["s.service: started 3 times for 2 runs claimed"]);
        let twice =
            stored(START + 2 * SECOND, vec![run(1, START + 2 * SECOND, 1), run(2, START + 2 * SECOND, 1)], vec![]);
        assert_eq!(
            verdict(&[first.clone(), twice], 2),
            vec![format!("s.service: elapse {} was claimed by runs 1 and 2", START + 2 * SECOND)]
        );
        let gap =
            stored(START + 8 * SECOND, vec![run(1, START + 2 * SECOND, 1), run(2, START + 8 * SECOND, 1)], vec![]);
        assert_eq!(
            verdict(&[first, gap], 2),
            vec![
                format!("s.service: elapse {} was neither run, waiting nor skipped", START + 4 * SECOND),
                format!("s.service: elapse {} was neither run, waiting nor skipped", START + 6 * SECOND),
            ]
        );
    }
}
