//! The planner's working copy of the cluster: who runs where, and each machine's load (its
//! units and what they reserve), updated after every decision so later decisions see it.

use std::collections::{BTreeSet, HashMap};

use super::{ClusterSnapshot, PlacementStrategy, UnitSpec};
use crate::glob::Glob;
use crate::machine::MachineState;
use crate::resources::Resources;
use crate::state::DesiredState;
use crate::unit_name::UnitNameInfo;

/// A machine's position in ID order (which breaks load ties): how the planner refers to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Rank(pub usize);

/// A unit's position in the snapshot: how the planner refers to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct UnitIndex(pub usize);

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

/// What sits on one machine: how many units, and what they reserve in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Load {
    pub units: u32,
    pub reserved: Resources,
}

/// Room left on a machine, in thousandths of its capacity in its scarcest resource; a machine
/// that states no capacity is all room.
const ALL_ROOM: u32 = 1000;

/// Where a machine stands in the order the planner tries machines in (lower first).
type OrderKey = (u64, u64, u64);

pub(super) struct Working<'a> {
    machines: Vec<&'a MachineState>,
    units: &'a [UnitSpec],
    strategy: PlacementStrategy,
    load: Vec<Load>,
    by_load: BTreeSet<(OrderKey, Rank)>,
    /// The machines without a taint, in the same order: a unit that tolerates none looks only
    /// at these (the tainted ones, which few units may take, stay roomy and first in order).
    untainted_by_load: BTreeSet<(OrderKey, Rank)>,
    residents: Vec<Vec<UnitIndex>>,
    /// Per rank, the residents with `Conflicts=` or `Replaces=` rules: the only ones that can
    /// stand in the way of a unit without rules ([`Working::residents_related_to`]).
    ruled_residents: Vec<Vec<UnitIndex>>,
    placement: Vec<Option<Rank>>,
    /// Where each unit was scheduled when planning began, if that machine is live.
    initial: Vec<Option<Rank>>,
    conflict_globs: Vec<Vec<Glob>>,
    replace_globs: Vec<Vec<Glob>>,
    by_name: HashMap<&'a str, UnitIndex>,
    followers: HashMap<&'a str, Vec<UnitIndex>>,
    /// Per unit with `SpreadBy=`, its group (its `SpreadGroup=`, else its template, else its own
    /// name) and key.
    spread: Vec<Option<(String, &'a str)>>,
    /// Placed units of each spread group, by the value of the group's key on their machine.
    spread_counts: HashMap<String, HashMap<String, u32>>,
}

fn compile(patterns: &[String]) -> Vec<Glob> {
    patterns.iter().filter_map(|pattern| Glob::new(pattern)).collect()
}

impl<'a> Working<'a> {
    /// The working copy of `snapshot`, each machine starting with the load in `baseline`
    /// (by rank; units the planner is not given but that sit there), or empty.
    pub fn new(snapshot: &'a ClusterSnapshot, baseline: Option<&[Load]>) -> Self {
        let mut machines: Vec<&MachineState> = snapshot.machines.iter().collect();
        machines.sort_by(|a, b| a.id.cmp(&b.id));
        machines.dedup_by(|a, b| a.id == b.id);
        let units = snapshot.units.as_slice();
        let by_name = units.iter().enumerate().map(|(index, unit)| (unit.name.as_str(), UnitIndex(index))).collect();
        let mut followers: HashMap<&str, Vec<UnitIndex>> = HashMap::new();
        for (index, unit) in units.iter().enumerate() {
            for leader in &unit.requirements.machine_of {
                followers.entry(leader.as_str()).or_default().push(UnitIndex(index));
            }
        }
        let count = machines.len();
        let load: Vec<Load> =
            (0..count).map(|rank| baseline.and_then(|loads| loads.get(rank)).copied().unwrap_or_default()).collect();
        let mut working = Self {
            machines,
            units,
            strategy: snapshot.strategy,
            by_load: BTreeSet::new(),
            untainted_by_load: BTreeSet::new(),
            load,
            residents: vec![Vec::new(); count],
            ruled_residents: vec![Vec::new(); count],
            placement: vec![None; units.len()],
            initial: Vec::new(),
            conflict_globs: units.iter().map(|unit| compile(&unit.requirements.conflicts)).collect(),
            replace_globs: units.iter().map(|unit| compile(&unit.requirements.replaces)).collect(),
            by_name,
            followers,
            spread: units
                .iter()
                .map(|unit| {
                    let key = unit.requirements.spread_by.as_deref().filter(|_| !unit.requirements.global)?;
                    Some((unit.requirements.spread_group_of(&unit.name), key))
                })
                .collect(),
            spread_counts: HashMap::new(),
        };
        working.initial = units
            .iter()
            .map(|unit| unit.scheduled_on.as_deref().and_then(|machine| working.rank_of(machine)))
            .collect();
        working.by_load = working.ranks().map(|rank| (working.order_key(rank), rank)).collect();
        working.untainted_by_load =
            working.by_load.iter().filter(|(_, rank)| working.machine(*rank).taints.is_empty()).copied().collect();
        working
    }

    pub fn rank_of(&self, id: &str) -> Option<Rank> {
        self.machines.binary_search_by(|machine| machine.id.as_str().cmp(id)).ok().map(Rank)
    }

    /// The machines a `MachineID=` names: the one with that ID, or those whose ID starts with
    /// an 8-character short ID; found by search in the ID order, not by a walk.
    pub fn ranks_named(&self, wanted: &str) -> Vec<Rank> {
        let first = self.machines.partition_point(|machine| machine.id.as_str() < wanted);
        self.machines[first..]
            .iter()
            .take_while(|machine| machine.id.starts_with(wanted))
            .enumerate()
            .map(|(offset, _)| Rank(first + offset))
            .filter(|rank| self.machines[rank.0].matches_id(wanted))
            .collect()
    }

    pub fn unit_index(&self, name: &str) -> Option<UnitIndex> {
        self.by_name.get(name).copied()
    }

    pub fn has_machines(&self) -> bool {
        !self.machines.is_empty()
    }

    /// Every machine, in ID order.
    pub fn ranks(&self) -> impl Iterator<Item = Rank> + use<> {
        (0..self.machines.len()).map(Rank)
    }

    pub fn machine(&self, rank: Rank) -> &'a MachineState {
        self.machines[rank.0]
    }

    /// Whether the machine is drained: it takes no new units.
    pub fn draining(&self, rank: Rank) -> bool {
        self.machines[rank.0].drain.is_some()
    }

    /// Whether `unit` is on a drained machine whose drain has let it go.
    pub fn let_go(&self, unit: UnitIndex) -> Option<Rank> {
        let rank = self.placement(unit)?;
        let drain = self.machines[rank.0].drain.as_ref()?;
        drain.lets_go(&self.units[unit.0].name).then_some(rank)
    }

    /// Every unit of the snapshot, in snapshot order.
    pub fn unit_indices(&self) -> impl Iterator<Item = UnitIndex> + use<> {
        (0..self.units.len()).map(UnitIndex)
    }

    pub fn unit(&self, index: UnitIndex) -> &'a UnitSpec {
        &self.units[index.0]
    }

    pub fn placement(&self, unit: UnitIndex) -> Option<Rank> {
        self.placement[unit.0]
    }

    /// Puts `unit` on `rank`. Global units count as residents everywhere they run but are
    /// never given a placement of their own.
    pub fn place(&mut self, unit: UnitIndex, rank: Rank) {
        let Load { units, reserved } = self.load[rank.0];
        let reservation = self.unit(unit).requirements.reservation;
        self.set_load(rank, Load { units: units + 1, reserved: reserved.saturating_add(reservation) });
        self.count_spread(unit, rank, true);
        self.residents[rank.0].push(unit);
        if self.has_rules(unit) {
            self.ruled_residents[rank.0].push(unit);
        }
        if !self.unit(unit).requirements.global {
            self.placement[unit.0] = Some(rank);
        }
    }

    /// Takes `unit` off `rank`.
    pub fn remove(&mut self, unit: UnitIndex, rank: Rank) {
        if self.has_rules(unit) {
            self.ruled_residents[rank.0].retain(|resident| *resident != unit);
        }
        let residents = &mut self.residents[rank.0];
        let before = residents.len();
        residents.retain(|resident| *resident != unit);
        if residents.len() < before {
            let Load { units, reserved } = self.load[rank.0];
            let reservation = self.unit(unit).requirements.reservation;
            self.set_load(rank, Load { units: units - 1, reserved: reserved.saturating_sub(reservation) });
            self.count_spread(unit, rank, false);
        }
        if self.placement[unit.0] == Some(rank) {
            self.placement[unit.0] = None;
        }
    }

    /// Counts `unit` in (or out of) its spread group's value on `rank`.
    fn count_spread(&mut self, unit: UnitIndex, rank: Rank, placed: bool) {
        let Some((group, key)) = &self.spread[unit.0] else {
            return;
        };
        let value = self.machine(rank).metadata.get(*key).map_or("", String::as_str);
        let counts = self.spread_counts.entry(group.clone()).or_default();
        let count = counts.entry(value.to_string()).or_default();
        *count = if placed { *count + 1 } else { count.saturating_sub(1) };
    }

    /// The spread group and key of `unit`, if it spreads.
    pub fn spread_of(&self, unit: UnitIndex) -> Option<(&str, &'a str)> {
        self.spread[unit.0].as_ref().map(|(group, key)| (group.as_str(), *key))
    }

    /// How many of `group`'s units are placed on machines whose key has `value`.
    pub fn spread_count(&self, group: &str, value: &str) -> u32 {
        self.spread_counts.get(group).and_then(|counts| counts.get(value)).copied().unwrap_or(0)
    }

    fn set_load(&mut self, rank: Rank, load: Load) {
        let untainted = self.machine(rank).taints.is_empty();
        self.by_load.remove(&(self.order_key(rank), rank));
        if untainted {
            self.untainted_by_load.remove(&(self.order_key(rank), rank));
        }
        self.load[rank.0] = load;
        self.by_load.insert((self.order_key(rank), rank));
        if untainted {
            self.untainted_by_load.insert((self.order_key(rank), rank));
        }
    }

    /// Every machine's load, by rank.
    pub fn loads(&self) -> &[Load] {
        &self.load
    }

    /// What is left on `rank` for units to reserve; `None` when the machine states no
    /// capacity (it limits nothing).
    pub fn free(&self, rank: Rank) -> Option<Resources> {
        Some(self.machine(rank).capacity?.saturating_sub(self.load[rank.0].reserved))
    }

    /// What placing `unit` takes: its own reservation and those of the units that follow it
    /// (`MachineOf=`, chains included) and still wait to be placed, for they can only go where
    /// it goes.
    pub fn group_needs(&self, unit: UnitIndex) -> Resources {
        if self.followers(unit).is_empty() {
            return self.unit(unit).requirements.reservation;
        }
        let mut needs = Resources::ZERO;
        let mut seen = vec![unit];
        let mut next = vec![unit];
        while let Some(member) = next.pop() {
            needs = needs.saturating_add(self.unit(member).requirements.reservation);
            for &follower in self.followers(member) {
                let spec = self.unit(follower);
                let waits = self.placement(follower).is_none()
                    && spec.desired != DesiredState::Inactive
                    && !spec.requirements.global
                    && !UnitNameInfo::new(&spec.name).is_template();
                if waits && !seen.contains(&follower) {
                    seen.push(follower);
                    next.push(follower);
                }
            }
        }
        needs
    }

    /// Whether `needs` fits in what is left on `rank`.
    pub fn has_room(&self, needs: Resources, rank: Rank) -> bool {
        needs.is_zero() || self.free(rank).is_none_or(|free| needs.fits_in(free))
    }

    /// Room left on `rank`, in thousandths of its capacity in its scarcest resource.
    fn room(&self, rank: Rank) -> u32 {
        let Some(capacity) = self.machine(rank).capacity else {
            return ALL_ROOM;
        };
        let reserved = self.load[rank.0].reserved;
        let share = |capacity: u64, reserved: u64| {
            (capacity > 0).then(|| {
                let free = u128::from(capacity.saturating_sub(reserved));
                (free * u128::from(ALL_ROOM) / u128::from(capacity)) as u32
            })
        };
        [share(capacity.memory, reserved.memory), share(capacity.cpu_millis, reserved.cpu_millis)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(0)
    }

    /// Spreading tries the machine with the most room left first (in thousandths of its
    /// scarcest resource), then the one with the fewest units. Bin-packing is best fit: the
    /// machine with the least memory left, then the least CPU left, then the most units, so
    /// that whole machines stay free; a machine that states no capacity comes last.
    pub fn order_key(&self, rank: Rank) -> OrderKey {
        let units = u64::from(self.load[rank.0].units);
        match self.strategy {
            PlacementStrategy::Spread => (u64::from(ALL_ROOM - self.room(rank)), units, 0),
            PlacementStrategy::BinPack => {
                let free = self.free(rank).unwrap_or(Resources { memory: u64::MAX, cpu_millis: u64::MAX });
                (free.memory, free.cpu_millis, u64::from(u32::MAX) - units)
            }
        }
    }

    /// Machines in the order the strategy tries them, from the first that may have room for
    /// `needs`: bin-packing skips the machines with less memory left (in one step, not one by
    /// one). With `untainted_only`, the machines without a taint alone (for a unit that
    /// tolerates none, which no tainted machine takes).
    pub fn by_load_for(&self, needs: Resources, untainted_only: bool) -> impl Iterator<Item = Rank> + '_ {
        let from = match self.strategy {
            PlacementStrategy::Spread => (0, 0, 0),
            PlacementStrategy::BinPack => (needs.memory, 0, 0),
        };
        let set = if untainted_only { &self.untainted_by_load } else { &self.by_load };
        set.range((from, Rank(0))..).map(|(_, rank)| *rank)
    }

    pub fn residents(&self, rank: Rank) -> &[UnitIndex] {
        &self.residents[rank.0]
    }

    /// Whether `unit` may be pushed off `rank` by a unit that replaces it: a global unit
    /// anywhere, any other unit only while it still sits where it was when planning began
    /// (so a unit moves at most once per plan).
    pub fn may_evict(&self, unit: UnitIndex, rank: Rank) -> bool {
        self.unit(unit).requirements.global
            || (self.placement[unit.0] == Some(rank) && self.initial[unit.0] == Some(rank))
    }

    /// The units whose `MachineOf=` names `unit`.
    pub fn followers(&self, unit: UnitIndex) -> &[UnitIndex] {
        self.followers.get(self.unit(unit).name.as_str()).map_or(&[], Vec::as_slice)
    }

    /// Whether `unit` has `Conflicts=` or `Replaces=` rules: two units without are never
    /// related ([`Working::relation`]).
    fn has_rules(&self, unit: UnitIndex) -> bool {
        !self.conflict_globs[unit.0].is_empty() || !self.replace_globs[unit.0].is_empty()
    }

    /// The residents of `rank` that `unit` may have a [`Relation`] with: all of them for a
    /// unit with rules, else only those with rules. (Checking every resident made placing
    /// 100,000 units on one machine quadratic: 17 s of a 100,000-unit load.)
    pub fn residents_related_to(&self, unit: UnitIndex, rank: Rank) -> &[UnitIndex] {
        match self.has_rules(unit) {
            true => &self.residents[rank.0],
            false => &self.ruled_residents[rank.0],
        }
    }

    /// Why `unit` and `other` may not share a machine, if they may not.
    pub fn relation(&self, unit: UnitIndex, other: UnitIndex) -> Option<Relation> {
        if !self.has_rules(unit) && !self.has_rules(other) {
            return None;
        }
        let (name, other_name) = (self.unit(unit).name.as_str(), self.unit(other).name.as_str());
        if name == other_name {
            return None;
        }
        let matches = |globs: &[Glob], name: &str| globs.iter().any(|glob| glob.matches(name));
        if matches(&self.conflict_globs[unit.0], other_name) || matches(&self.conflict_globs[other.0], name) {
            return Some(Relation::Conflict);
        }
        match (matches(&self.replace_globs[unit.0], other_name), matches(&self.replace_globs[other.0], name)) {
            (true, true) => Some(Relation::Circular),
            (true, false) => Some(Relation::Replaces),
            (false, true) => Some(Relation::ReplacedBy),
            (false, false) => None,
        }
    }

    /// The units `unit`'s `Replaces=` patterns match: plain names are looked up, wildcard
    /// patterns are matched against every unit.
    pub fn replace_targets(&self, unit: UnitIndex) -> Vec<UnitIndex> {
        let mut targets = Vec::new();
        for glob in &self.replace_globs[unit.0] {
            match glob.literal() {
                Some(name) => targets.extend(self.unit_index(&name)),
                None => targets.extend(self.unit_indices().filter(|other| glob.matches(&self.unit(*other).name))),
            }
        }
        targets.sort_unstable();
        targets.dedup();
        targets.retain(|other| *other != unit);
        targets
    }
}
