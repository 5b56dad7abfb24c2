//! Why the engine unscheduled a unit, or could not place it.

use std::collections::BTreeMap;
use std::fmt;

use crate::resources::{Bytes, Cores, Resources};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnscheduleReason {
    TargetStateInactive,
    MachineWentAway,
    /// A unit that replaces it took its machine.
    ReplacedBy(String),
    CannotRunThere(Refusal),
    /// Its machine is drained, and the drain let it go.
    Drained,
    /// A unit of a higher priority that fit nowhere else took its room (`preemption = on`).
    PreemptedBy(Preemptor),
}

impl fmt::Display for UnscheduleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TargetStateInactive => f.write_str("target state inactive"),
            Self::MachineWentAway => f.write_str("target machine went away"),
            Self::ReplacedBy(other) => write!(f, "replaced by {other}"),
            Self::CannotRunThere(reason) => write!(f, "can no longer run there: {reason}"),
            Self::Drained => f.write_str("its machine is draining"),
            Self::PreemptedBy(preemptor) => write!(f, "{preemptor}"),
        }
    }
}

/// Who took a unit's room, as its reason names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemptor {
    pub unit: String,
    pub priority: u16,
}

impl std::fmt::Display for Preemptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "preempted by {} (priority {})", self.unit, self.priority)
    }
}

/// Why a unit cannot run on one particular machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    MachineIdMismatch {
        machine: String,
        wanted: String,
    },
    MetadataMismatch {
        machine: String,
    },
    PeerNotScheduled(String),
    PeersApart(Vec<String>),
    ConflictsWith(String),
    ReplacedBy(String),
    CircularReplace(String),
    ReplacesJustPlaced(String),
    /// The machine is drained: it takes no new units.
    Draining(String),
    /// The machine has a taint the unit does not tolerate (as written: `gpu=yes`).
    Tainted {
        machine: String,
        taint: String,
    },
}

impl Refusal {
    /// The reason a unit is unplaced when this was its refusal on every machine it could
    /// have gone to (the first machine's refusal names the others').
    pub fn everywhere(self) -> UnplacedReason {
        match self {
            Self::MachineIdMismatch { machine, wanted } => UnplacedReason::MachineIdMismatch { machine, wanted },
            Self::MetadataMismatch { machine } => UnplacedReason::MetadataMismatch { machine },
            Self::PeerNotScheduled(peer) => UnplacedReason::PeerNotScheduled(peer),
            Self::PeersApart(peers) => UnplacedReason::PeersApart(peers),
            Self::ConflictsWith(other) => UnplacedReason::ConflictsEverywhere(other),
            Self::ReplacedBy(other) => UnplacedReason::ReplacedEverywhere(other),
            Self::CircularReplace(other) => UnplacedReason::CircularReplace(other),
            Self::ReplacesJustPlaced(other) => UnplacedReason::ReplacesJustPlaced(other),
            Self::Draining(machine) => UnplacedReason::Draining(machine),
            Self::Tainted { machine, taint } => UnplacedReason::Tainted { machine, taint },
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConflictsWith(other) => write!(f, "conflicts with {other}"),
            Self::ReplacedBy(other) => write!(f, "replaced by {other}"),
            // The others read the same for one machine as for all of them.
            other => write!(f, "{}", other.clone().everywhere()),
        }
    }
}

/// Why a unit could not be placed anywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnplacedReason {
    NoMachines,
    NoMachineWithId(String),
    NoMachineWithMetadata(BTreeMap<String, Vec<String>>),
    PeerNotScheduled(String),
    PeersApart(Vec<String>),
    MachineIdMismatch {
        machine: String,
        wanted: String,
    },
    MetadataMismatch {
        machine: String,
    },
    ConflictsEverywhere(String),
    ReplacedEverywhere(String),
    CircularReplace(String),
    ReplacesJustPlaced(String),
    /// The machine its rules allow is drained (the first of them, when several are).
    Draining(String),
    /// The machine its rules allow has a taint it does not tolerate (the first of them).
    Tainted {
        machine: String,
        taint: String,
    },
    /// A unit a drain let go that follows (`MachineOf=`) one that stays on the machine.
    StaysWithLeader(String),
    /// A unit a drain let go whose rules allow no machine but its drained one.
    NowhereElse,
    /// Every machine its rules allow lacks room for its reservation.
    NoRoom {
        needs: Resources,
        closest: Closest,
    },
    /// Taken off a machine that is still present and may still run it: placed once that
    /// machine stopped it or is gone (stop before start).
    LeavingMachine(String),
    /// Preempted by a unit of a higher priority, and placed nowhere since, for the reason
    /// that follows.
    Preempted(Preemptor, Box<UnplacedReason>),
    /// It found no room, and taking the room of the lower-priority units named is held by
    /// their disruption budget (the text says which).
    PreemptionHeld {
        victims: Vec<String>,
        held: String,
        then: Box<UnplacedReason>,
    },
}

/// Among the machines a unit's rules allow, the one with the most of each resource free.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Closest {
    pub memory: (u64, String),
    pub cpu_millis: (u64, String),
}

impl Closest {
    /// Whether counting `free` could change it: more of some resource than it holds.
    pub fn improved_by(&self, free: Resources) -> bool {
        free.memory > self.memory.0 || free.cpu_millis > self.cpu_millis.0
    }

    /// Counts `free` on `machine`; of equal amounts the first counted is kept.
    pub fn count(&mut self, machine: &str, free: Resources) {
        if free.memory > self.memory.0 || self.memory.1.is_empty() {
            self.memory = (free.memory, machine.to_string());
        }
        if free.cpu_millis > self.cpu_millis.0 || self.cpu_millis.1.is_empty() {
            self.cpu_millis = (free.cpu_millis, machine.to_string());
        }
    }
}

/// "needs 8 GiB memory; the most free is 6.2 GiB on m1".
fn write_no_room(f: &mut fmt::Formatter<'_>, needs: Resources, closest: &Closest) -> fmt::Result {
    let (memory, memory_on) = &closest.memory;
    let (cpu, cpu_on) = &closest.cpu_millis;
    if needs.memory > *memory {
        write!(f, "needs {} memory; the most free is {} on {memory_on}", Bytes(needs.memory), Bytes(*memory))
    } else if needs.cpu_millis > *cpu {
        write!(f, "needs {} CPU; the most free is {} on {cpu_on}", Cores(needs.cpu_millis), Cores(*cpu))
    } else {
        write!(
            f,
            "needs {} memory and {} CPU on one machine; no machine has both free (the most memory free is {} on {memory_on}, the most CPU {} on {cpu_on})",
            Bytes(needs.memory),
            Cores(needs.cpu_millis),
            Bytes(*memory),
            Cores(*cpu)
        )
    }
}

impl fmt::Display for UnplacedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoMachines => f.write_str("no machines are available"),
            Self::NoMachineWithId(id) => write!(f, "no machine with ID {id} is available"),
            Self::NoMachineWithMetadata(wanted) => {
                f.write_str("no machine has metadata ")?;
                let alternatives: Vec<String> = wanted
                    .iter()
                    .map(|(key, values)| {
                        values.iter().map(|value| format!("{key}={value}")).collect::<Vec<_>>().join(" or ")
                    })
                    .collect();
                f.write_str(&alternatives.join(" and "))
            }
            Self::PeerNotScheduled(peer) => write!(f, "MachineOf {peer}, which is not scheduled"),
            Self::PeersApart(peers) => write!(f, "MachineOf {}, which are on different machines", peers.join(", ")),
            Self::MachineIdMismatch { machine, wanted } => {
                write!(f, "machine {machine} is not {wanted}")
            }
            Self::MetadataMismatch { machine } => {
                write!(f, "machine {machine} lacks the required metadata")
            }
            Self::ConflictsEverywhere(other) => {
                write!(f, "conflicts with {other} on every eligible machine")
            }
            Self::ReplacedEverywhere(other) => write!(f, "replaced by {other} on every eligible machine"),
            Self::CircularReplace(other) => {
                write!(f, "replaces {other}, which replaces it in turn: only one of them runs")
            }
            Self::ReplacesJustPlaced(other) => {
                write!(f, "replaces {other}, which has just been placed; retried on the next reconcile")
            }
            Self::Draining(machine) => write!(f, "machine {machine} is draining"),
            Self::Tainted { machine, taint } => {
                write!(f, "machine {machine} has taint {taint}, which the unit does not tolerate (Tolerate=)")
            }
            Self::StaysWithLeader(leader) => write!(f, "it follows {leader}, which stays"),
            Self::NowhereElse => f.write_str("its rules allow no other machine"),
            Self::NoRoom { needs, closest } => write_no_room(f, *needs, closest),
            Self::LeavingMachine(machine) => write!(f, "waits for machine {machine} to stop it"),
            Self::Preempted(preemptor, then) => write!(f, "{preemptor}: {then}"),
            Self::PreemptionHeld { victims, held, then } => {
                write!(f, "{then}; preempting {} is {held}", victims.join(", "))
            }
        }
    }
}
