//! Units whose machine is gone, and how long each stays placed there before the plan may
//! move it. A machine is out of touch from its last renewal of its presence; the store lets
//! the presence expire no sooner than `agent_ttl` after it, and the engine sees the machine
//! gone then. A unit stays for what its `LostAfter=` leaves of that (nothing by default,
//! for ever with `never`), and an `AtMostOnce=` unit at least for [`at_most_once_hold`]: its
//! machine stops it once its presence may have lapsed, counted on its own clock, so the
//! engine leaves it where it is until that has certainly happened. An engine that takes
//! over counts from its own first sight, later than the truth, never earlier; it shows the
//! time its predecessor recorded ([`MachineAbsences::adopt`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::ClusterSnapshot;
use crate::civil_time::rfc3339_of_micros;
use crate::machine::{MachineState, OutOfTouch};
use crate::requirements::Requirements;

/// How long an at-most-once unit stays on a machine seen gone before it may start
/// elsewhere: `agent_ttl` again (the stop, and the machine's clock running up to a tenth
/// slow), and a second for the machine to notice.
pub fn at_most_once_hold(agent_ttl: Duration) -> Duration {
    agent_ttl + agent_ttl / 10 + Duration::from_secs(1)
}

/// How long after the engine first sees its machine gone a unit with `requirements` stays
/// there; `None`: until the machine comes back.
pub fn stay_of(requirements: &Requirements, agent_ttl: Duration) -> Option<Duration> {
    let stay = requirements.lost_after.stay_after_seen_gone(agent_ttl)?;
    Some(if requirements.at_most_once { stay.max(at_most_once_hold(agent_ttl)) } else { stay })
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Absence {
    /// When this engine first saw the machine gone.
    seen: Instant,
    /// The same, or what an earlier leader recorded, by the wall clock (µs since the epoch).
    since: i64,
    last: Option<MachineState>,
}

/// When the engine first saw each machine gone that units are still placed on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineAbsences {
    absent: BTreeMap<String, Absence>,
}

/// A unit the plan must leave where it is: its machine is gone, and its stay is not over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldUnit {
    pub machine: String,
    /// When the stay ends; `None`: when the machine is back.
    pub until: Option<Instant>,
    /// Why it stays, as lists show it.
    pub reason: String,
}

/// The units held, and when the first stay ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub units: BTreeMap<String, HeldUnit>,
    pub next_end: Option<Instant>,
}

impl MachineAbsences {
    /// Notes, as of `now` (`wall_now` by the wall clock, µs), the machines units are placed
    /// on that are not in the cluster, with their record from `before` (the machines of the
    /// last look); forgets those back, and those no unit is placed on any more.
    pub fn observe(&mut self, cluster: &ClusterSnapshot, before: &[MachineState], now: Instant, wall_now: i64) {
        let present: BTreeSet<&str> = cluster.machines.iter().map(|machine| machine.id.as_str()).collect();
        let placed_on: BTreeSet<&str> = cluster.units.iter().filter_map(|unit| unit.scheduled_on.as_deref()).collect();
        self.absent.retain(|machine, _| placed_on.contains(machine.as_str()) && !present.contains(machine.as_str()));
        for machine in placed_on.difference(&present) {
            self.absent.entry((*machine).to_string()).or_insert_with(|| Absence {
                seen: now,
                since: wall_now,
                last: before.iter().find(|known| known.id == *machine).cloned(),
            });
        }
    }

    /// Takes the times and records an earlier leader wrote for machines this engine sees gone
    /// too: they are shown as before. Its own count of each stay still runs from its own sight.
    pub fn adopt(&mut self, recorded: &[OutOfTouch]) {
        for record in recorded {
            if let Some(absence) = self.absent.get_mut(&record.id) {
                absence.since = absence.since.min(record.since);
                if absence.last.is_none() {
                    absence.last = record.last.clone();
                }
            }
        }
    }

    /// Counts every absence again from `now` (the times shown stay): after the store did not
    /// answer this engine, a machine may have come back and gone again unseen.
    pub fn count_again_from(&mut self, now: Instant) {
        for absence in self.absent.values_mut() {
            absence.seen = absence.seen.max(now);
        }
    }

    /// The units whose machine is gone and whose stay ([`stay_of`]) is not over at `now`. A
    /// unit unloaded meanwhile is not held: it runs nowhere else, and the plan takes it off.
    pub fn held(&self, cluster: &ClusterSnapshot, now: Instant, agent_ttl: Duration) -> Held {
        let mut held = Held::default();
        for unit in cluster.units.iter().filter(|unit| unit.desired != crate::state::DesiredState::Inactive) {
            let Some((machine, absence)) =
                unit.scheduled_on.as_ref().and_then(|machine| Some((machine, self.absent.get(machine)?)))
            else {
                continue;
            };
            let stay = stay_of(&unit.requirements, agent_ttl);
            let until = match stay {
                Some(stay) if absence.seen + stay <= now => continue,
                Some(stay) => Some(absence.seen + stay),
                None => None,
            };
            if let Some(until) = until {
                held.next_end = Some(held.next_end.map_or(until, |next| next.min(until)));
            }
            let reason = held_reason(machine, absence.since, stay, &unit.requirements, agent_ttl);
            held.units.insert(unit.name.clone(), HeldUnit { machine: machine.clone(), until, reason });
        }
        held
    }

    /// What lists show of the machines `held` units wait for, by machine ID.
    pub fn records(&self, held: &Held) -> Vec<OutOfTouch> {
        let mut waiting: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (unit, held) in &held.units {
            waiting.entry(held.machine.as_str()).or_default().push(unit.clone());
        }
        waiting
            .into_iter()
            .filter_map(|(machine, units)| {
                let absence = self.absent.get(machine)?;
                Some(OutOfTouch { id: machine.to_string(), since: absence.since, last: absence.last.clone(), units })
            })
            .collect()
    }
}

/// Why a unit stays on its machine seen gone at `since` (µs), for `stay` after that: its
/// `LostAfter=`, unless its `AtMostOnce=` hold is the longer.
fn held_reason(
    machine: &str,
    since: i64,
    stay: Option<Duration>,
    requirements: &Requirements,
    agent_ttl: Duration,
) -> String {
    let gone = format!("machine {machine} out of touch since {}", rfc3339_of_micros(since));
    let Some(stay) = stay else {
        return format!("{gone}: waits for it to come back (LostAfter=never)");
    };
    let from = rfc3339_of_micros(since.saturating_add(i64::try_from(stay.as_micros()).unwrap_or(i64::MAX)));
    let by_lost_after = requirements.lost_after.stay_after_seen_gone(agent_ttl) == Some(stay);
    match requirements.lost_after.written() {
        Some(written) if by_lost_after => {
            format!("{gone}: placed elsewhere from {from} unless it is back (LostAfter={written})")
        }
        _ => {
            format!("{gone}: placed elsewhere from {from}, once the machine has certainly stopped it (AtMostOnce=true)")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lost_after::LostAfter;
    use crate::schedule::{UnitSpec, plan};
    use crate::state::DesiredState;

    const WALL: i64 = 1_764_936_184_000_000; // 2025-12-05T12:03:04Z

    fn unit(name: &str, on: &str, requirements: Requirements) -> UnitSpec {
        UnitSpec {
            name: name.into(),
            desired: DesiredState::Launched,
            requirements: Arc::new(requirements),
            scheduled_on: Some(on.into()),
        }
    }

    fn once() -> Requirements {
        Requirements { at_most_once: true, ..Requirements::default() }
    }

    fn lost_after(lost_after: LostAfter) -> Requirements {
        Requirements { lost_after, ..Requirements::default() }
    }

    fn machine(id: &str) -> MachineState {
        MachineState { id: id.into(), public_ip: format!("10.0.0.{}", id.len()), ..MachineState::default() }
    }

    #[test]
    fn an_at_most_once_unit_of_a_machine_gone_stays_put_for_the_hold_and_moves_after() {
        let ttl = Duration::from_secs(4);
        let hold = at_most_once_hold(ttl);
        let cluster = ClusterSnapshot {
            machines: vec![machine("b")],
            units: vec![unit("once.service", "a", once()), unit("plain.service", "a", Requirements::default())],
            ..ClusterSnapshot::default()
        };
        let mut absences = MachineAbsences::default();
        let seen = Instant::now();
        absences.observe(&cluster, &[machine("a"), machine("b")], seen, WALL);
        let held = absences.held(&cluster, seen, ttl);
        assert_eq!(held.units.keys().collect::<Vec<_>>(), ["once.service"], "the plain unit moves at once");
        assert_eq!(held.next_end, Some(seen + hold));
        assert_eq!(
            held.units["once.service"].reason,
            "machine a out of touch since 2025-12-05T12:03:04Z: placed elsewhere from 2025-12-05T12:03:09Z, once the machine has certainly stopped it (AtMostOnce=true)"
        );
        assert_eq!(
            absences.records(&held),
            [OutOfTouch { id: "a".into(), since: WALL, last: Some(machine("a")), units: vec!["once.service".into()] }]
        );
        // A later look does not restart the count.
        absences.observe(&cluster, &[machine("b")], seen + Duration::from_secs(3), WALL + 3_000_000);
        assert_eq!(absences.held(&cluster, seen + hold - Duration::from_millis(1), ttl).units.len(), 1);
        let held = absences.held(&cluster, seen + hold, ttl);
        assert!(held.units.is_empty() && held.next_end.is_none(), "the hold is over");
        assert!(absences.records(&held).is_empty(), "no unit waits for it: not listed");

        // What the plan does with the rest: the plain unit moves, the held one is not there.
        let planned = ClusterSnapshot {
            machines: cluster.machines.clone(),
            units: cluster.units.iter().filter(|unit| unit.name == "plain.service").cloned().collect(),
            ..ClusterSnapshot::default()
        };
        assert_eq!(plan(&planned).decisions.len(), 2, "unscheduled from a, scheduled on b");
    }

    #[test]
    fn a_unit_stays_for_its_lost_after_less_agent_ttl_and_for_ever_with_never() {
        let ttl = Duration::from_secs(30);
        let cluster = ClusterSnapshot {
            machines: vec![],
            units: vec![
                unit("db.service", "a", lost_after(LostAfter::After(Duration::from_secs(600)))),
                unit("vault.service", "a", lost_after(LostAfter::Never)),
                unit("both.service", "a", Requirements { at_most_once: true, ..lost_after(LostAfter::After(ttl)) }),
            ],
            ..ClusterSnapshot::default()
        };
        let mut absences = MachineAbsences::default();
        let seen = Instant::now();
        absences.observe(&cluster, &[], seen, WALL);
        let held = absences.held(&cluster, seen, ttl);
        assert_eq!(held.units["db.service"].until, Some(seen + Duration::from_secs(570)));
        assert_eq!(
            held.units["db.service"].reason,
            "machine a out of touch since 2025-12-05T12:03:04Z: placed elsewhere from 2025-12-05T12:12:34Z unless it is back (LostAfter=10m)"
        );
        assert_eq!(held.units["vault.service"].until, None);
        assert_eq!(
            held.units["vault.service"].reason,
            "machine a out of touch since 2025-12-05T12:03:04Z: waits for it to come back (LostAfter=never)"
        );
        assert_eq!(held.units["both.service"].until, Some(seen + at_most_once_hold(ttl)), "the longer of the two");
        assert_eq!(held.next_end, Some(seen + at_most_once_hold(ttl)));
        let unloaded = ClusterSnapshot {
            units: cluster
                .units
                .iter()
                .map(|unit| UnitSpec { desired: DesiredState::Inactive, ..unit.clone() })
                .collect(),
            ..ClusterSnapshot::default()
        };
        assert!(absences.held(&unloaded, seen, ttl).units.is_empty(), "unloaded: taken off, not held");
        let much_later = seen + Duration::from_secs(365 * 24 * 3600);
        assert_eq!(absences.held(&cluster, much_later, ttl).units.keys().collect::<Vec<_>>(), ["vault.service"]);
        assert_eq!(absences.held(&cluster, much_later, ttl).next_end, None, "nothing ends by the clock");
    }

    #[test]
    fn a_new_leader_shows_the_time_recorded_before_it_and_counts_from_its_own_sight() {
        let ttl = Duration::from_secs(30);
        let cluster = ClusterSnapshot {
            machines: vec![],
            units: vec![unit("db.service", "a", lost_after(LostAfter::After(Duration::from_secs(600))))],
            ..ClusterSnapshot::default()
        };
        let mut absences = MachineAbsences::default();
        let seen = Instant::now();
        absences.observe(&cluster, &[], seen, WALL);
        let recorded = OutOfTouch { id: "a".into(), since: WALL - 60_000_000, last: Some(machine("a")), units: vec![] };
        absences.adopt(&[recorded, OutOfTouch { id: "elsewhere".into(), ..OutOfTouch::default() }]);
        let held = absences.held(&cluster, seen, ttl);
        assert_eq!(held.units["db.service"].until, Some(seen + Duration::from_secs(570)), "its own count");
        let records = absences.records(&held);
        assert_eq!(records.len(), 1, "only machines it sees gone");
        assert_eq!((records[0].since, records[0].last.clone()), (WALL - 60_000_000, Some(machine("a"))));
    }

    /// Seed 796436904 (`--lost-after 6` with the rest): the leader's store did not answer
    /// while a machine came back and went again; its absence was counted from the first.
    #[test]
    fn an_absence_counts_again_after_the_store_did_not_answer() {
        let ttl = Duration::from_secs(4);
        let cluster = ClusterSnapshot {
            units: vec![unit("db.service", "a", lost_after(LostAfter::After(Duration::from_secs(12))))],
            ..ClusterSnapshot::default()
        };
        let mut absences = MachineAbsences::default();
        let seen = Instant::now();
        absences.observe(&cluster, &[], seen, WALL);
        absences.count_again_from(seen + Duration::from_secs(10));
        let held = absences.held(&cluster, seen + Duration::from_secs(9), ttl);
        assert_eq!(held.units["db.service"].until, Some(seen + Duration::from_secs(18)));
        assert!(held.units["db.service"].reason.contains("since 2025-12-05T12:03:04Z"), "the time shown stays");
    }

    #[test]
    fn a_machine_back_or_no_longer_used_is_forgotten() {
        let mut absences = MachineAbsences::default();
        let now = Instant::now();
        let gone = ClusterSnapshot {
            machines: vec![],
            units: vec![unit("once.service", "a", once())],
            ..ClusterSnapshot::default()
        };
        absences.observe(&gone, &[], now, WALL);
        let back =
            ClusterSnapshot { machines: vec![machine("a")], units: gone.units.clone(), ..ClusterSnapshot::default() };
        absences.observe(&back, &[], now + Duration::from_secs(1), WALL);
        assert_eq!(absences, MachineAbsences::default());
        absences.observe(&gone, &[], now + Duration::from_secs(2), WALL);
        absences.observe(&ClusterSnapshot::default(), &[], now + Duration::from_secs(3), WALL);
        assert_eq!(absences, MachineAbsences::default(), "no unit is placed on it any more");
    }

    #[test]
    fn the_hold_covers_the_lease_again_and_a_tenth_for_clocks() {
        assert_eq!(at_most_once_hold(Duration::from_secs(10)), Duration::from_secs(12));
    }
}
