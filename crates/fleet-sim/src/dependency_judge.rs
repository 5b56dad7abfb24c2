//! The judge of units that wait for units ([`crate::SimConfig::dependent`]): `w<k>.service`
//! requires (`Requires=`, or `After=` for odd `k`) `r<k>.service`, a plain unit that machines'
//! faults move. A dependent must never be placed while its requirement does not run: judged at
//! the store, as each placement is written, against the reports the store holds (what the
//! engine could know). A requirement that stopped running less than a copy's lag and a pass
//! ago is excused (the engine may have planned from a report just before), and so is a
//! leader's first second (its copy may not show its predecessor's last writes yet); one that
//! never ran has no excuse.

use std::collections::BTreeMap;
use std::time::Duration;

// The simulation's clock (paused tokio time), as every judge's: by the machine's own clock a
// run starved of CPU judged its excuses differently (seed 796593883 failed once in CI that way).
use tokio::time::Instant;

/// The names of the dependents and of what they require.
pub const DEPENDENT_PREFIX: &str = "w";
pub const REQUIRED_PREFIX: &str = "r";

/// Longer than a copy lags its store (300 ms at most) with an engine's pass on top.
const SEEN_BY_ALL: Duration = Duration::from_secs(1);

/// How a required unit stands, by the store's reports.
#[derive(Debug, Clone, Copy)]
enum Stands {
    /// Reported running where it is placed, since.
    Up,
    /// Not, since.
    Down(Instant),
}

#[derive(Debug)]
pub struct DependencyJudge {
    began: Instant,
    required: BTreeMap<String, Stands>,
    /// The leading engine's machine, and since when it writes decisions.
    leader: Option<(String, Instant)>,
    /// Dependents placed while what they require ran.
    pub placed: usize,
    pub violations: Vec<String>,
}

impl Default for DependencyJudge {
    fn default() -> Self {
        Self { began: Instant::now(), required: BTreeMap::new(), leader: None, placed: 0, violations: Vec::new() }
    }
}

/// The unit `w<k>.service` requires: `r<k>.service`.
pub fn required_by(dependent: &str) -> Option<String> {
    let k = dependent.strip_prefix(DEPENDENT_PREFIX)?.strip_suffix(".service")?;
    k.parse::<usize>().ok().map(|k| format!("{REQUIRED_PREFIX}{k}.service"))
}

fn is_required(unit: &str) -> bool {
    unit.strip_prefix(REQUIRED_PREFIX)
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|k| k.parse::<usize>().is_ok())
}

impl DependencyJudge {
    /// The engine of `machine` writes decisions now.
    pub fn writes_as(&mut self, machine: &str) {
        if self.leader.as_ref().is_none_or(|(leader, _)| leader != machine) {
            self.leader = Some((machine.to_string(), Instant::now()));
        }
    }

    /// `unit` is placed by a write of the store just now.
    pub fn placed(&mut self, unit: &str) {
        if is_required(unit) {
            self.went_down(unit);
            return;
        }
        let Some(required) = required_by(unit) else { return };
        let settled_leader = self.leader.as_ref().is_some_and(|(_, since)| since.elapsed() > SEEN_BY_ALL);
        // One that never ran is seen by no leader running: no excuse.
        let (ran, excused) = match self.required.get(&required) {
            Some(Stands::Up) => (true, true),
            Some(Stands::Down(since)) => (since.elapsed() <= SEEN_BY_ALL, !settled_leader),
            None => (false, false),
        };
        if ran {
            self.placed += 1;
        } else if !excused {
            let elapsed = self.began.elapsed();
            self.violations.push(format!("at {elapsed:?}: {unit} was placed while {required} did not run"));
        }
    }

    /// `unit` was taken off its machine.
    pub fn unplaced(&mut self, unit: &str) {
        if is_required(unit) {
            self.went_down(unit);
        }
    }

    fn went_down(&mut self, unit: &str) {
        if matches!(self.required.get(unit), Some(Stands::Up)) {
            self.required.insert(unit.to_string(), Stands::Down(Instant::now()));
        }
    }

    /// A machine reported `unit` there, active or not; `placed_on`: where it is placed.
    pub fn reported(&mut self, unit: &str, machine: &str, active: bool, placed_on: Option<&String>) {
        if !is_required(unit) || placed_on.is_none_or(|on| on != machine) {
            return;
        }
        if active {
            self.required.insert(unit.to_string(), Stands::Up);
        } else {
            self.went_down(unit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependent_placed_while_what_it_requires_is_down_past_a_copys_lag_is_a_violation() {
        let mut judge =
            DependencyJudge { leader: Some(("m0".into(), Instant::now() - SEEN_BY_ALL * 2)), ..Default::default() };
        judge.placed("w0.service");
        assert_eq!(judge.violations.len(), 1, "never ran");
        judge.reported("r0.service", "m1", true, Some(&"m1".to_string()));
        judge.placed("w0.service");
        assert_eq!((judge.violations.len(), judge.placed), (1, 1), "it runs");
        judge.unplaced("r0.service");
        judge.placed("w0.service");
        assert_eq!(judge.violations.len(), 1, "down a moment ago: the engine may not have seen it");
        judge.required.insert("r0.service".into(), Stands::Down(Instant::now() - SEEN_BY_ALL * 2));
        judge.placed("w0.service");
        assert_eq!(judge.violations.len(), 2);
        assert_eq!(required_by("w12.service").as_deref(), Some("r12.service"));
    }
}
