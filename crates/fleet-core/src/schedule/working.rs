//! The planner's working copy of the cluster: who runs where, and each machine's load,
//! updated after every decision so later decisions see it.

use std::collections::{BTreeSet, HashMap};

use super::{ClusterSnapshot, UnitSpec};
use crate::glob::Glob;
use crate::machine::MachineState;

/// Machines are referred to by rank: their position in ID order, which breaks load ties.
pub(super) type Rank = usize;

/// Why two units may not share a machine, seen from the first one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Relation {
    /// A `Conflicts=` pattern of either one matches the other.
    Conflict,
    /// The first one's `Replaces=` matches the second: the second has to move.
    Replaces,
    /// The second one's `Replaces=` matches the first.
    ReplacedBy,
    /// Each one replaces the other: only one of them runs anywhere.
    Circular,
}

pub(super) struct Working<'a> {
    pub machines: Vec<&'a MachineState>,
    pub units: &'a [UnitSpec],
    load: Vec<u32>,
    by_load: BTreeSet<(u32, Rank)>,
    residents: Vec<Vec<usize>>,
    placement: Vec<Option<Rank>>,
    /// Where each unit was scheduled when planning began, if that machine is live.
    initial: Vec<Option<Rank>>,
    conflict_globs: Vec<Vec<Glob>>,
    replace_globs: Vec<Vec<Glob>>,
    by_name: HashMap<&'a str, usize>,
    followers: HashMap<&'a str, Vec<usize>>,
}

fn compile(patterns: &[String]) -> Vec<Glob> {
    patterns.iter().filter_map(|pattern| Glob::new(pattern)).collect()
}

impl<'a> Working<'a> {
    pub fn new(snapshot: &'a ClusterSnapshot) -> Self {
        let mut machines: Vec<&MachineState> = snapshot.machines.iter().collect();
        machines.sort_by(|a, b| a.id.cmp(&b.id));
        machines.dedup_by(|a, b| a.id == b.id);
        let units = snapshot.units.as_slice();
        let by_name = units.iter().enumerate().map(|(index, unit)| (unit.name.as_str(), index)).collect();
        let mut followers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (index, unit) in units.iter().enumerate() {
            for leader in &unit.requirements.machine_of {
                followers.entry(leader.as_str()).or_default().push(index);
            }
        }
        let count = machines.len();
        let mut working = Self {
            machines,
            units,
            load: vec![0; count],
            by_load: (0..count).map(|rank| (0, rank)).collect(),
            residents: vec![Vec::new(); count],
            placement: vec![None; units.len()],
            initial: Vec::new(),
            conflict_globs: units.iter().map(|unit| compile(&unit.requirements.conflicts)).collect(),
            replace_globs: units.iter().map(|unit| compile(&unit.requirements.replaces)).collect(),
            by_name,
            followers,
        };
        working.initial = units
            .iter()
            .map(|unit| unit.scheduled_on.as_deref().and_then(|machine| working.rank_of(machine)))
            .collect();
        working
    }

    pub fn rank_of(&self, id: &str) -> Option<Rank> {
        self.machines.binary_search_by(|machine| machine.id.as_str().cmp(id)).ok()
    }

    pub fn unit_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    pub fn placement(&self, unit: usize) -> Option<Rank> {
        self.placement[unit]
    }

    /// Puts `unit` on `rank`. Global units count as residents everywhere they run but are
    /// never given a placement of their own.
    pub fn place(&mut self, unit: usize, rank: Rank) {
        self.set_load(rank, self.load[rank] + 1);
        self.residents[rank].push(unit);
        if !self.units[unit].requirements.global {
            self.placement[unit] = Some(rank);
        }
    }

    /// Takes `unit` off `rank`.
    pub fn remove(&mut self, unit: usize, rank: Rank) {
        let before = self.residents[rank].len();
        self.residents[rank].retain(|resident| *resident != unit);
        if self.residents[rank].len() < before {
            self.set_load(rank, self.load[rank] - 1);
        }
        if self.placement[unit] == Some(rank) {
            self.placement[unit] = None;
        }
    }

    fn set_load(&mut self, rank: Rank, load: u32) {
        self.by_load.remove(&(self.load[rank], rank));
        self.load[rank] = load;
        self.by_load.insert((load, rank));
    }

    pub fn load(&self, rank: Rank) -> u32 {
        self.load[rank]
    }

    /// Machines from least to most loaded.
    pub fn by_load(&self) -> impl Iterator<Item = Rank> + '_ {
        self.by_load.iter().map(|(_, rank)| *rank)
    }

    pub fn residents(&self, rank: Rank) -> &[usize] {
        &self.residents[rank]
    }

    /// Whether `unit` may be pushed off `rank` by a unit that replaces it: a global unit
    /// anywhere, any other unit only while it still sits where it was when planning began
    /// (so a unit moves at most once per plan).
    pub fn may_evict(&self, unit: usize, rank: Rank) -> bool {
        self.units[unit].requirements.global || (self.placement[unit] == Some(rank) && self.initial[unit] == Some(rank))
    }

    /// The units whose `MachineOf=` names `unit`.
    pub fn followers(&self, unit: usize) -> &[usize] {
        self.followers.get(self.units[unit].name.as_str()).map_or(&[], Vec::as_slice)
    }

    /// Why `unit` and `other` may not share a machine, if they may not.
    pub fn relation(&self, unit: usize, other: usize) -> Option<Relation> {
        let without_rules =
            |index: usize| self.conflict_globs[index].is_empty() && self.replace_globs[index].is_empty();
        if without_rules(unit) && without_rules(other) {
            return None;
        }
        let (name, other_name) = (self.units[unit].name.as_str(), self.units[other].name.as_str());
        if name == other_name {
            return None;
        }
        let matches = |globs: &[Glob], name: &str| globs.iter().any(|glob| glob.matches(name));
        if matches(&self.conflict_globs[unit], other_name) || matches(&self.conflict_globs[other], name) {
            return Some(Relation::Conflict);
        }
        match (matches(&self.replace_globs[unit], other_name), matches(&self.replace_globs[other], name)) {
            (true, true) => Some(Relation::Circular),
            (true, false) => Some(Relation::Replaces),
            (false, true) => Some(Relation::ReplacedBy),
            (false, false) => None,
        }
    }

    /// The units `unit`'s `Replaces=` patterns match: plain names are looked up, wildcard
    /// patterns are matched against every unit.
    pub fn replace_targets(&self, unit: usize) -> Vec<usize> {
        let mut targets = Vec::new();
        for glob in &self.replace_globs[unit] {
            match glob.literal() {
                Some(name) => targets.extend(self.unit_index(&name)),
                None => targets.extend((0..self.units.len()).filter(|other| glob.matches(&self.units[*other].name))),
            }
        }
        targets.sort_unstable();
        targets.dedup();
        targets.retain(|other| *other != unit);
        targets
    }
}
