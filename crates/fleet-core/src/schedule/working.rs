//! The planner's working copy of the cluster: who runs where, and each machine's load,
//! updated after every decision so later decisions see it.

use std::collections::{BTreeSet, HashMap};

use super::{ClusterSnapshot, UnitSpec};
use crate::glob::Glob;
use crate::machine::MachineState;

/// Machines are referred to by rank: their position in ID order, which breaks load ties.
pub(super) type Rank = usize;

pub(super) struct Working<'a> {
    pub machines: Vec<&'a MachineState>,
    pub units: &'a [UnitSpec],
    load: Vec<u32>,
    by_load: BTreeSet<(u32, Rank)>,
    residents: Vec<Vec<usize>>,
    placement: Vec<Option<Rank>>,
    conflict_globs: Vec<Vec<Glob>>,
    by_name: HashMap<&'a str, usize>,
}

impl<'a> Working<'a> {
    pub fn new(snapshot: &'a ClusterSnapshot) -> Self {
        let mut machines: Vec<&MachineState> = snapshot.machines.iter().collect();
        machines.sort_by(|a, b| a.id.cmp(&b.id));
        machines.dedup_by(|a, b| a.id == b.id);
        let units = snapshot.units.as_slice();
        let conflict_globs = units
            .iter()
            .map(|unit| unit.requirements.conflicts.iter().filter_map(|pattern| Glob::new(pattern)).collect())
            .collect();
        let by_name = units.iter().enumerate().map(|(index, unit)| (unit.name.as_str(), index)).collect();
        let count = machines.len();
        Self {
            machines,
            units,
            load: vec![0; count],
            by_load: (0..count).map(|rank| (0, rank)).collect(),
            residents: vec![Vec::new(); count],
            placement: vec![None; units.len()],
            conflict_globs,
            by_name,
        }
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
        self.by_load.remove(&(self.load[rank], rank));
        self.load[rank] += 1;
        self.by_load.insert((self.load[rank], rank));
        self.residents[rank].push(unit);
        if !self.units[unit].requirements.global {
            self.placement[unit] = Some(rank);
        }
    }

    pub fn remove(&mut self, unit: usize) {
        if let Some(rank) = self.placement[unit].take() {
            self.by_load.remove(&(self.load[rank], rank));
            self.load[rank] -= 1;
            self.by_load.insert((self.load[rank], rank));
            self.residents[rank].retain(|resident| *resident != unit);
        }
    }

    pub fn load(&self, rank: Rank) -> u32 {
        self.load[rank]
    }

    /// Machines from least to most loaded.
    pub fn by_load(&self) -> impl Iterator<Item = Rank> + '_ {
        self.by_load.iter().map(|(_, rank)| *rank)
    }

    /// A unit on `rank` that `unit` may not share a machine with, checked both ways.
    pub fn conflicting_resident(&self, unit: usize, rank: Rank) -> Option<usize> {
        let name = self.units[unit].name.as_str();
        let own = &self.conflict_globs[unit];
        self.residents[rank].iter().copied().find(|&other| {
            let other_name = self.units[other].name.as_str();
            other_name != name
                && (own.iter().any(|glob| glob.matches(other_name))
                    || self.conflict_globs[other].iter().any(|glob| glob.matches(name)))
        })
    }
}
