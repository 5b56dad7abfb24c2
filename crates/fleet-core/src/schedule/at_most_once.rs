//! Units that asked to run at most once (`[X-Fleet] AtMostOnce=true`) wait before they
//! move. Their machine stops them once its presence may have lapsed, counted on its own
//! clock from the last renewal it sent; the store lets the presence expire no sooner than
//! `agent_ttl` after that renewal. So once the engine sees the machine gone, the machine has
//! stopped them, or will within what its clock may run slow by plus the time a stop takes:
//! the engine leaves them where they are for [`hold`] after it first sees their machine gone,
//! and only then lets the plan move them. An engine that takes over counts from its own first
//! sight, later than the truth, never earlier.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::ClusterSnapshot;

/// How long an at-most-once unit stays on a machine seen gone before it may start
/// elsewhere: `agent_ttl` again (the stop, and the machine's clock running up to a tenth
/// slow), and a second for the machine to notice.
pub fn hold(agent_ttl: Duration) -> Duration {
    agent_ttl + agent_ttl / 10 + Duration::from_secs(1)
}

/// When the engine first saw each machine gone that units are still placed on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineAbsences {
    since: BTreeMap<String, Instant>,
}

impl MachineAbsences {
    /// Notes, as of `now`, the machines units are placed on that are not in the cluster;
    /// forgets those back, and those no unit is placed on any more.
    pub fn observe(&mut self, cluster: &ClusterSnapshot, now: Instant) {
        let present: BTreeSet<&str> = cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
        let placed_on: BTreeSet<&str> = cluster.units.iter().filter_map(|unit| unit.scheduled_on.as_deref()).collect();
        self.since.retain(|machine, _| placed_on.contains(machine.as_str()) && !present.contains(machine.as_str()));
        for machine in placed_on.difference(&present) {
            self.since.entry((*machine).to_string()).or_insert(now);
        }
    }

    /// The at-most-once units whose machine has been seen gone for less than `hold`, which
    /// the plan must not touch yet, and when the first of those holds ends.
    pub fn held(&self, cluster: &ClusterSnapshot, now: Instant, hold: Duration) -> (BTreeSet<String>, Option<Instant>) {
        let mut held = BTreeSet::new();
        let mut next_end: Option<Instant> = None;
        for unit in cluster.units.iter().filter(|unit| unit.requirements.at_most_once) {
            let Some(since) = unit.scheduled_on.as_ref().and_then(|machine| self.since.get(machine)) else {
                continue;
            };
            let ends = *since + hold;
            if ends > now {
                held.insert(unit.name.clone());
                next_end = Some(next_end.map_or(ends, |next| next.min(ends)));
            }
        }
        (held, next_end)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::machine::MachineState;
    use crate::requirements::Requirements;
    use crate::schedule::{UnitSpec, plan};
    use crate::state::DesiredState;

    fn unit(name: &str, on: &str, at_most_once: bool) -> UnitSpec {
        UnitSpec {
            name: name.into(),
            desired: DesiredState::Launched,
            requirements: Arc::new(Requirements { at_most_once, ..Requirements::default() }),
            scheduled_on: Some(on.into()),
        }
    }

    fn machine(id: &str) -> MachineState {
        MachineState { id: id.into(), ..MachineState::default() }
    }

    #[test]
    fn an_at_most_once_unit_of_a_machine_gone_stays_put_for_the_hold_and_moves_after() {
        let ttl = Duration::from_secs(4);
        let cluster = ClusterSnapshot {
            machines: vec![machine("b")],
            units: vec![unit("once.service", "a", true), unit("plain.service", "a", false)],
            ..ClusterSnapshot::default()
        };
        let mut absences = MachineAbsences::default();
        let seen = Instant::now();
        absences.observe(&cluster, seen);
        let (held, ends) = absences.held(&cluster, seen, hold(ttl));
        assert_eq!(held, BTreeSet::from(["once.service".to_string()]), "the plain unit moves at once");
        assert_eq!(ends, Some(seen + hold(ttl)));
        // A later look does not restart the count.
        absences.observe(&cluster, seen + Duration::from_secs(3));
        let (held, _) = absences.held(&cluster, seen + hold(ttl) - Duration::from_millis(1), hold(ttl));
        assert_eq!(held.len(), 1);
        let (held, ends) = absences.held(&cluster, seen + hold(ttl), hold(ttl));
        assert!(held.is_empty() && ends.is_none(), "the hold is over");

        // What the plan does with the rest: the plain unit moves, the held one is not there.
        let planned = ClusterSnapshot {
            machines: cluster.machines.clone(),
            units: cluster.units.iter().filter(|unit| unit.name == "plain.service").cloned().collect(),
            ..ClusterSnapshot::default()
        };
        assert_eq!(plan(&planned).decisions.len(), 2, "unscheduled from a, scheduled on b");
    }

    #[test]
    fn a_machine_back_or_no_longer_used_is_forgotten() {
        let mut absences = MachineAbsences::default();
        let now = Instant::now();
        let gone = ClusterSnapshot {
            machines: vec![],
            units: vec![unit("once.service", "a", true)],
            ..ClusterSnapshot::default()
        };
        absences.observe(&gone, now);
        let back =
            ClusterSnapshot { machines: vec![machine("a")], units: gone.units.clone(), ..ClusterSnapshot::default() };
        absences.observe(&back, now + Duration::from_secs(1));
        assert_eq!(absences, MachineAbsences::default());
        absences.observe(&gone, now + Duration::from_secs(2));
        absences.observe(&ClusterSnapshot::default(), now + Duration::from_secs(3));
        assert_eq!(absences, MachineAbsences::default(), "no unit is placed on it any more");
    }

    #[test]
    fn the_hold_covers_the_lease_again_and_a_tenth_for_clocks() {
        assert_eq!(hold(Duration::from_secs(10)), Duration::from_secs(12));
    }
}
