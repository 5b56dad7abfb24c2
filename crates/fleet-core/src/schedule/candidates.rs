//! Where one unit may go: the first machine in the strategy's order that satisfies all its
//! requirements and has room for its reservation.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use super::reason::{Closest, Refusal, UnplacedReason};
use super::working::{Rank, Relation, UnitIndex, Working};
use crate::resources::Resources;

/// Machines whose metadata satisfies one `MachineMetadata=` requirement.
pub(super) struct Eligible {
    ranks: Vec<Rank>,
    mask: Vec<bool>,
}

/// Below this many eligible machines the planner scans them all rather than walking every
/// machine in load order and skipping the ineligible ones.
const SMALL_ELIGIBLE_SET: usize = 64;

/// The values one metadata key takes over the machines (a machine without it: `""`), and
/// which each machine has.
pub(super) struct Domains {
    values: Vec<String>,
    of_rank: Vec<usize>,
}

#[derive(Default)]
pub(super) struct MetadataIndex<'a> {
    cache: HashMap<&'a BTreeMap<String, Vec<String>>, Rc<Eligible>>,
    domains: HashMap<&'a str, Rc<Domains>>,
}

impl<'a> MetadataIndex<'a> {
    fn eligible(&mut self, working: &Working<'a>, wanted: &'a BTreeMap<String, Vec<String>>) -> Rc<Eligible> {
        self.cache
            .entry(wanted)
            .or_insert_with(|| {
                let mask: Vec<bool> = working
                    .ranks()
                    .map(|rank| {
                        let metadata = &working.machine(rank).metadata;
                        wanted.iter().all(|(key, allowed)| metadata.get(key).is_some_and(|v| allowed.contains(v)))
                    })
                    .collect();
                let ranks = working.ranks().filter(|rank| mask[rank.0]).collect();
                Rc::new(Eligible { ranks, mask })
            })
            .clone()
    }

    fn domains(&mut self, working: &Working<'a>, key: &'a str) -> Rc<Domains> {
        self.domains
            .entry(key)
            .or_insert_with(|| {
                let mut values: Vec<String> = Vec::new();
                let of_rank = working
                    .ranks()
                    .map(|rank| {
                        let value = working.machine(rank).metadata.get(key).map_or("", String::as_str);
                        match values.iter().position(|known| known == value) {
                            Some(at) => at,
                            None => {
                                values.push(value.to_string());
                                values.len() - 1
                            }
                        }
                    })
                    .collect();
                Rc::new(Domains { values, of_rank })
            })
            .clone()
    }
}

/// Checks that `unit` may run on `rank`, given everything placed so far. Units it replaces
/// do not stand in its way while they can still be moved off.
pub(super) fn able_to_run(working: &Working<'_>, unit: UnitIndex, rank: Rank) -> Result<(), Refusal> {
    fits_machine(working, unit, rank)?;
    for &other in working.residents_related_to(unit, rank) {
        let name = || working.unit(other).name.clone();
        match working.relation(unit, other) {
            None => {}
            Some(Relation::Replaces) if working.may_evict(other, rank) => {}
            Some(Relation::Replaces) => return Err(Refusal::ReplacesJustPlaced(name())),
            Some(Relation::Conflict) => return Err(Refusal::ConflictsWith(name())),
            Some(Relation::ReplacedBy) => return Err(Refusal::ReplacedBy(name())),
            Some(Relation::Circular) => return Err(Refusal::CircularReplace(name())),
        }
    }
    Ok(())
}

/// Fails when a unit among `targets` (the units `unit` replaces) is placed and replaces
/// `unit` in turn: of two such units only one runs anywhere.
pub(super) fn circular_partner_placed(
    working: &Working<'_>,
    unit: UnitIndex,
    targets: &[UnitIndex],
) -> Result<(), Refusal> {
    match targets
        .iter()
        .copied()
        .find(|other| working.placement(*other).is_some() && working.relation(unit, *other) == Some(Relation::Circular))
    {
        Some(other) => Err(Refusal::CircularReplace(working.unit(other).name.clone())),
        None => Ok(()),
    }
}

/// Checks `MachineID=`, `MachineMetadata=` and `MachineOf=` against `rank`: the rules that
/// do not depend on which other units share the machine.
pub(super) fn fits_machine(working: &Working<'_>, unit: UnitIndex, rank: Rank) -> Result<(), Refusal> {
    let spec = working.unit(unit);
    let machine = working.machine(rank);
    if let Some(wanted) = &spec.requirements.machine_id
        && !machine.matches_id(wanted)
    {
        return Err(Refusal::MachineIdMismatch { machine: machine.id.clone(), wanted: wanted.clone() });
    }
    if !spec.requirements.metadata_matches(&machine.metadata) {
        return Err(Refusal::MetadataMismatch { machine: machine.id.clone() });
    }
    // A taint that evicts holds the units already there as it holds new ones.
    untainted(working, unit, rank, true)?;
    if let Some(peer_rank) = peers_rank(working, unit)?
        && peer_rank != rank
    {
        return Err(Refusal::PeersApart(spec.requirements.machine_of.clone()));
    }
    Ok(())
}

/// Fails when `rank` has a taint `unit` does not tolerate; with `evicting`, only a taint that
/// moves off the units already there (`:evict`).
pub(super) fn untainted(working: &Working<'_>, unit: UnitIndex, rank: Rank, evicting: bool) -> Result<(), Refusal> {
    let machine = working.machine(rank);
    let tolerate = &working.unit(unit).requirements.tolerate;
    match crate::taint::first_untolerated(&machine.taints, tolerate, evicting) {
        None => Ok(()),
        Some((key, taint)) => {
            Err(Refusal::Tainted { machine: machine.id.clone(), taint: crate::taint::Written(key, taint).to_string() })
        }
    }
}

/// The one machine all of a unit's `MachineOf=` peers are on, if it has peers.
fn peers_rank(working: &Working<'_>, unit: UnitIndex) -> Result<Option<Rank>, Refusal> {
    let peers = &working.unit(unit).requirements.machine_of;
    let mut found: Option<Rank> = None;
    for peer in peers {
        let rank = working
            .unit_index(peer)
            .and_then(|index| working.placement(index))
            .ok_or_else(|| Refusal::PeerNotScheduled(peer.clone()))?;
        match found {
            Some(other) if other != rank => return Err(Refusal::PeersApart(peers.clone())),
            _ => found = Some(rank),
        }
    }
    Ok(found)
}

/// The machine `unit` goes to, or why there is none: the first eligible machine in the
/// strategy's order that holds a unit it replaces (it takes that unit's place), else the first
/// eligible machine in that order. A machine is eligible when the unit's rules allow it there
/// and its reservation fits in what is left; a unit refused only for room on every machine its
/// rules allow is told how close the roomiest came.
pub(super) fn choose<'a>(
    working: &Working<'a>,
    index: &mut MetadataIndex<'a>,
    unit: UnitIndex,
) -> Result<Rank, UnplacedReason> {
    if !working.has_machines() {
        return Err(UnplacedReason::NoMachines);
    }
    let requirements = &working.unit(unit).requirements;
    let targets = working.replace_targets(unit);
    circular_partner_placed(working, unit, &targets).map_err(Refusal::everywhere)?;
    let fixed: Option<Vec<Rank>> = if let Some(rank) = peers_rank(working, unit).map_err(Refusal::everywhere)? {
        Some(vec![rank])
    } else if let Some(wanted) = &requirements.machine_id {
        let ranks = working.ranks_named(wanted);
        if ranks.is_empty() {
            return Err(UnplacedReason::NoMachineWithId(wanted.clone()));
        }
        Some(ranks)
    } else {
        None
    };
    let eligible = (!requirements.metadata.is_empty()).then(|| index.eligible(working, &requirements.metadata));
    if let Some(eligible) = &eligible
        && eligible.ranks.is_empty()
    {
        return Err(UnplacedReason::NoMachineWithMetadata(requirements.metadata.clone()));
    }
    // Room is checked first (it is cheap) and the rules only where there is room; why a unit
    // fits nowhere is worked out only once it does.
    let needs = working.group_needs(unit);
    // A unit that tolerates no taint looks at untainted machines alone.
    let untainted_only = requirements.tolerate.is_empty();
    let mut consider = |rank: Rank| {
        !working.draining(rank)
            && working.has_room(needs, rank)
            && untainted(working, unit, rank, false).is_ok()
            && able_to_run(working, unit, rank).is_ok()
    };
    let first_in_order = |ranks: &[Rank], consider: &mut dyn FnMut(Rank) -> bool| {
        ranks.iter().copied().filter(|rank| consider(*rank)).min_by_key(|rank| (working.order_key(*rank), *rank))
    };
    if !targets.is_empty() {
        let mut held: Vec<Rank> = targets
            .into_iter()
            .filter(|other| working.relation(unit, *other) == Some(Relation::Replaces))
            .filter_map(|other| working.placement(other))
            .filter(|rank| fixed.as_ref().is_none_or(|ranks| ranks.contains(rank)))
            .collect();
        held.sort_unstable();
        held.dedup();
        if let Some(rank) = first_in_order(&held, &mut consider) {
            return Ok(rank);
        }
    }
    // The first machine in the strategy's order among those `keep` admits.
    let mut first_where = |keep: &dyn Fn(Rank) -> bool| match (&fixed, &eligible) {
        (Some(ranks), _) => {
            let ranks: Vec<Rank> = ranks.iter().copied().filter(|rank| keep(*rank)).collect();
            first_in_order(&ranks, &mut consider)
        }
        (None, Some(eligible)) if eligible.ranks.len() <= SMALL_ELIGIBLE_SET => {
            let ranks: Vec<Rank> = eligible.ranks.iter().copied().filter(|rank| keep(*rank)).collect();
            first_in_order(&ranks, &mut consider)
        }
        (None, Some(eligible)) => working
            .by_load_for(needs, untainted_only)
            .filter(|rank| eligible.mask[rank.0] && keep(*rank))
            .find(|rank| consider(*rank)),
        (None, None) => {
            working.by_load_for(needs, untainted_only).filter(|rank| keep(*rank)).find(|rank| consider(*rank))
        }
    };
    // A retried run goes back to a machine it failed on only when no other takes it.
    let avoided: Vec<Rank> = requirements.avoid.iter().flat_map(|id| working.ranks_named(id)).collect();
    let mut first_preferred = |keep: &dyn Fn(Rank) -> bool| {
        if avoided.is_empty() {
            return first_where(keep);
        }
        first_where(&|rank: Rank| keep(rank) && !avoided.contains(&rank)).or_else(|| first_where(keep))
    };
    // A unit that spreads tries the values of its key from the one with the fewest of its
    // group, then the strategy's order within each.
    let chosen = match working.spread_of(unit) {
        Some((group, key)) => {
            let domains = index.domains(working, key);
            let mut order: Vec<usize> = (0..domains.values.len()).collect();
            order.sort_by_key(|domain| (working.spread_count(group, &domains.values[*domain]), *domain));
            order.into_iter().find_map(|domain| first_preferred(&|rank: Rank| domains.of_rank[rank.0] == domain))
        }
        None => first_preferred(&|_| true),
    };
    chosen.ok_or_else(|| why_nowhere(working, unit, needs, fixed.as_deref(), eligible.as_deref()))
}

/// A spread group's key and its placed members, each with its machine.
type SpreadGroup<'a> = (&'a str, Vec<(UnitIndex, Rank)>);

/// For each group of units that spread (`SpreadBy=`) whose key's values end more than one apart,
/// a note on each of its units in a value more than one over the fewest (of the values with a
/// machine that is not drained): which value has fewer,
/// and why it takes none of them ("zone=a has 2 fewer of web@: needs 2 GiB memory; ..."), or
/// that placed units are not moved to even it out. Unit name, note.
pub(super) fn spread_notes<'a>(working: &Working<'a>, index: &mut MetadataIndex<'a>) -> Vec<(String, String)> {
    let mut groups: BTreeMap<&str, SpreadGroup<'a>> = BTreeMap::new();
    for unit in working.unit_indices() {
        if let (Some((group, key)), Some(rank)) = (working.spread_of(unit), working.placement(unit)) {
            groups.entry(group).or_insert_with(|| (key, Vec::new())).1.push((unit, rank));
        }
    }
    let mut notes = Vec::new();
    for (group, (key, members)) in groups {
        let domains = index.domains(working, key);
        let count = |domain: usize| working.spread_count(group, &domains.values[domain]);
        // A value whose every machine is drained takes no unit: it does not count as fewer.
        let open =
            |domain: usize| working.ranks().any(|rank| domains.of_rank[rank.0] == domain && !working.draining(rank));
        let Some(fewest) =
            (0..domains.values.len()).filter(|domain| open(*domain)).min_by_key(|domain| (count(*domain), *domain))
        else {
            continue;
        };
        let over: Vec<UnitIndex> = members
            .iter()
            .filter(|(_, rank)| count(domains.of_rank[rank.0]) > count(fewest) + 1)
            .map(|(unit, _)| *unit)
            .collect();
        let Some(&example) = over.iter().min_by_key(|unit| &working.unit(**unit).name) else { continue };
        let ranks: Vec<Rank> = working.ranks().filter(|rank| domains.of_rank[rank.0] == fewest).collect();
        let needs = working.group_needs(example);
        let takes = |rank: &Rank| working.has_room(needs, *rank) && able_to_run(working, example, *rank).is_ok();
        let why = if ranks.iter().any(takes) {
            "placed units are not moved to even it out".to_string()
        } else {
            why_nowhere(working, example, needs, Some(&ranks), None).to_string()
        };
        let value = match domains.values[fewest].as_str() {
            "" => format!("no {key}"),
            value => format!("{key}={value}"),
        };
        for unit in over {
            let most = count(domains.of_rank[working.placement(unit).map_or(0, |rank| rank.0)]);
            let text = format!("spread unevenly: {value} has {} fewer of {group}: {why}", most - count(fewest));
            notes.push((working.unit(unit).name.clone(), text));
        }
    }
    notes
}

/// Why `unit` fits on none of `fixed` (or the `eligible` machines, or all): short of room for
/// what it `needs` (with the units that follow it) on every machine its rules allow and that is
/// not drained, naming the closest, else the first machine's refusal.
fn why_nowhere(
    working: &Working<'_>,
    unit: UnitIndex,
    needs: Resources,
    fixed: Option<&[Rank]>,
    eligible: Option<&Eligible>,
) -> UnplacedReason {
    let mut first_refusal: Option<Refusal> = None;
    let mut closest: Option<Closest> = None;
    let ranks: Box<dyn Iterator<Item = Rank>> = match (fixed, eligible) {
        (Some(ranks), _) => Box::new(ranks.iter().copied()),
        (None, Some(eligible)) => Box::new(eligible.ranks.iter().copied()),
        (None, None) => Box::new(working.ranks()),
    };
    let mut first_drained: Option<Refusal> = None;
    for rank in ranks {
        if working.draining(rank) {
            first_drained.get_or_insert(Refusal::Draining(working.machine(rank).id.clone()));
            continue;
        }
        if let Err(tainted) = untainted(working, unit, rank, false) {
            first_drained.get_or_insert(tainted);
            continue;
        }
        // Once a machine the rules allow is known, only one with more of something free can
        // change the answer: the rules (the costly part) are checked on those alone.
        let free = working.free(rank).unwrap_or_default();
        if closest.as_ref().is_some_and(|closest| !closest.improved_by(free)) {
            continue;
        }
        match able_to_run(working, unit, rank) {
            Ok(()) => {
                closest.get_or_insert_with(Closest::default).count(&working.machine(rank).id, free);
            }
            Err(reason) => {
                first_refusal.get_or_insert(reason);
            }
        }
    }
    match closest {
        Some(closest) => UnplacedReason::NoRoom { needs, closest },
        // A drain or a taint is named only when nothing else stands in the way.
        None => first_refusal.or(first_drained).map_or(UnplacedReason::NoMachines, Refusal::everywhere),
    }
}
