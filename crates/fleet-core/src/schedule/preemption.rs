//! Preemption: with `preemption = on`, a unit that fits nowhere may take the room of units of a
//! lower `Priority=` on one machine. Of the machines its rules allow (every rule but room), the
//! one where it needs the fewest units to leave, then the one whose highest priority among
//! them is lowest, then the strategy's order; on that machine the units leave lowest priority
//! first (the largest reservation first among equals, so that fewer leave). Never a global
//! unit, a unit on a calendar or a batch unit (its run is kept by the engine), nor one that
//! leads `MachineOf=` followers on that machine; never a unit of equal or higher priority; and
//! never more than [`PREEMPTED_PER_PLAN`] units in one plan. A unit that could be pushed off
//! again in the same plan by a `Replaces=` (its own, or another's naming it or its leader)
//! preempts nothing: the room it took would go to another unit.

use super::candidates::{able_to_run, untainted};
pub use super::reason::Preemptor;
use super::working::{Rank, UnitIndex, Working};
use crate::resources::Resources;

/// The most units one plan takes off their machines to make room (an engine pass is one plan):
/// a cluster that changes its mind about priorities moves a bounded number at a time.
pub const PREEMPTED_PER_PLAN: usize = 16;

/// The most waiting units one plan looks for victims for: each look walks every machine.
pub const LOOKS_PER_PLAN: usize = 32;

/// Whether `victim` may leave `rank` for a unit of `priority`.
fn may_leave(working: &Working<'_>, victim: UnitIndex, rank: Rank, priority: u16) -> bool {
    let requirements = &working.unit(victim).requirements;
    requirements.priority < priority
        && !requirements.global
        && requirements.job.is_none()
        && !requirements.reservation.is_zero()
        && working.followers(victim).iter().all(|follower| working.placement(*follower) != Some(rank))
}

/// The units that would leave `rank` for `unit` to fit there, in the order they leave, or
/// `None` when `unit` may not run there, or would not fit even with every unit it may
/// preempt gone, or needs more than `allowed` to leave.
fn victims_on(working: &Working<'_>, unit: UnitIndex, rank: Rank, allowed: usize) -> Option<Vec<UnitIndex>> {
    let capacity = working.machine(rank).capacity?;
    if working.draining(rank)
        || untainted(working, unit, rank, false).is_err()
        || able_to_run(working, unit, rank).is_err()
    {
        return None;
    }
    let needs = working.group_needs(unit);
    let priority = working.unit(unit).requirements.priority;
    let mut candidates: Vec<UnitIndex> =
        working.residents(rank).iter().copied().filter(|other| may_leave(working, *other, rank, priority)).collect();
    candidates.sort_by(|a, b| {
        let (a_spec, b_spec) = (working.unit(*a), working.unit(*b));
        let reserved = |spec: &super::UnitSpec| {
            let Resources { memory, cpu_millis } = spec.requirements.reservation;
            (memory, cpu_millis)
        };
        (a_spec.requirements.priority, std::cmp::Reverse(reserved(a_spec)), &a_spec.name).cmp(&(
            b_spec.requirements.priority,
            std::cmp::Reverse(reserved(b_spec)),
            &b_spec.name,
        ))
    });
    // What stays reserved there as units leave (on a machine over capacity, units may have
    // to leave before any room shows: counting down from what is reserved tells).
    let mut reserved = working.loads()[rank.0].reserved;
    // Room as the planner counts it: in each resource, what is left once all that stays is
    // counted, nothing where that is more than the capacity.
    let fits = |reserved: Resources| needs.fits_in(capacity.saturating_sub(reserved));
    let mut leaving = Vec::new();
    for victim in candidates {
        if fits(reserved) || leaving.len() >= allowed {
            break;
        }
        reserved = reserved.saturating_sub(working.unit(victim).requirements.reservation);
        leaving.push(victim);
    }
    if !fits(reserved) || leaving.is_empty() {
        return None;
    }
    // The last to leave was needed; one before it may not be (a larger one came after it):
    // it stays, so that no unit leaves that need not.
    let mut position = 0;
    while position + 1 < leaving.len() {
        let with_it = reserved.saturating_add(working.unit(leaving[position]).requirements.reservation);
        if fits(with_it) {
            reserved = with_it;
            leaving.remove(position);
        } else {
            position += 1;
        }
    }
    Some(leaving)
}

/// The machine `unit` would preempt units on, and those units in the order they leave; `None`
/// when no machine would take it with at most `allowed` units gone.
pub(super) fn choose_victims(working: &Working<'_>, unit: UnitIndex, allowed: usize) -> Option<(Rank, Vec<UnitIndex>)> {
    if allowed == 0 {
        return None;
    }
    working
        .ranks()
        .filter_map(|rank| victims_on(working, unit, rank, allowed).map(|victims| (rank, victims)))
        .min_by_key(|(rank, victims)| {
            let highest = victims.iter().map(|victim| working.unit(*victim).requirements.priority).max();
            (victims.len(), highest, working.order_key(*rank), *rank)
        })
}

/// The units some unit's `Replaces=` names: they, the units that follow them, and the units
/// that replace others do not preempt.
pub(super) fn replace_bound(working: &Working<'_>) -> std::collections::HashSet<UnitIndex> {
    working
        .unit_indices()
        .filter(|index| !working.unit(*index).requirements.replaces.is_empty())
        .flat_map(|index| working.replace_targets(index))
        .collect()
}

/// Whether `unit` may preempt: see [`replace_bound`].
pub(super) fn may_preempt(
    working: &Working<'_>,
    unit: UnitIndex,
    replaced: &std::collections::HashSet<UnitIndex>,
) -> bool {
    let requirements = &working.unit(unit).requirements;
    requirements.replaces.is_empty()
        && !replaced.contains(&unit)
        && requirements
            .machine_of
            .iter()
            .filter_map(|leader| working.unit_index(leader))
            .all(|leader| !replaced.contains(&leader))
}

/// The lowest priority among the units placed on a machine (global units aside): a waiting
/// unit of that priority or lower preempts nothing, and is not looked for.
pub(super) fn lowest_placed(working: &Working<'_>) -> Option<u16> {
    working
        .unit_indices()
        .filter(|index| working.placement(*index).is_some())
        .map(|index| working.unit(index).requirements.priority)
        .min()
}

#[cfg(test)]
mod tests;
