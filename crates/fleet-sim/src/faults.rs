//! The faults of one simulated run, from its seed alone: what, on which machine, when and for
//! how long. Machine faults may overlap on different machines; one election at a time.

use std::time::Duration;

use fleet_testkit::Seeded;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// The machine cannot reach the store (its requests get no answer, its watch breaks).
    Cut,
    /// Its fleetd is stopped (SIGSTOP): it sends and hears nothing, its units run on.
    Freeze,
    /// Its fleetd is killed and started again after the fault's length; its units run on.
    Restart,
    /// The store elects a new leader: no one gets an answer; leases' clocks restart after.
    Election,
    /// Its watch is stuck (on a member that lost its leader) while its requests are answered.
    WatchStall,
}

impl FaultKind {
    const ALL: [FaultKind; 5] =
        [FaultKind::Cut, FaultKind::Freeze, FaultKind::Restart, FaultKind::Election, FaultKind::WatchStall];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Cut => "cut",
            FaultKind::Freeze => "freeze",
            FaultKind::Restart => "restart",
            FaultKind::Election => "election",
            FaultKind::WatchStall => "watch stall",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub at: Duration,
    pub kind: FaultKind,
    /// The machine (ignored for an election).
    pub target: usize,
    pub lasts: Duration,
}

/// The longest a fault lasts.
pub const LONGEST_FAULT: Duration = Duration::from_secs(10);
/// The longest a watch stays stuck: the copy tries the store again within this.
pub const LONGEST_STALL: Duration = Duration::from_secs(2);

pub fn plan(random: &mut Seeded, length: Duration, machines: usize) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut free_at = vec![Duration::ZERO; machines];
    let mut store_free_at = Duration::ZERO;
    let mut at = Duration::from_secs(2);
    while at < length {
        let kind = FaultKind::ALL[random.below(FaultKind::ALL.len())];
        let target = random.below(machines);
        let longest = if kind == FaultKind::WatchStall { LONGEST_STALL } else { LONGEST_FAULT };
        let lasts = random.duration(Duration::from_millis(200), longest);
        let free = if kind == FaultKind::Election { &mut store_free_at } else { &mut free_at[target] };
        if *free <= at {
            *free = at + lasts;
            faults.push(Fault { at, kind, target, lasts });
        }
        at += random.duration(Duration::from_millis(200), Duration::from_secs(3));
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_plan_with_one_fault_at_a_time_per_target() {
        let first = plan(&mut Seeded::new(9), Duration::from_secs(60), 4);
        assert_eq!(first, plan(&mut Seeded::new(9), Duration::from_secs(60), 4));
        assert_ne!(first, plan(&mut Seeded::new(10), Duration::from_secs(60), 4));
        for (index, fault) in first.iter().enumerate() {
            let same_target = |other: &&Fault| {
                (other.kind == FaultKind::Election) == (fault.kind == FaultKind::Election)
                    && (fault.kind == FaultKind::Election || other.target == fault.target)
            };
            for earlier in first[..index].iter().filter(same_target) {
                assert!(earlier.at + earlier.lasts <= fault.at, "{earlier:?} overlaps {fault:?}");
            }
        }
    }
}
