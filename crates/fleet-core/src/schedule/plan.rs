//! The engine's reconcile, as a pure function.

use std::collections::{HashMap, HashSet, VecDeque};

use super::candidates::{MetadataIndex, able_to_run, choose, circular_partner_placed, fits_machine, spread_notes};
use super::preemption::{
    LOOKS_PER_PLAN, PREEMPTED_PER_PLAN, Preemptor, choose_victims, lowest_placed, may_preempt, replace_bound,
};
use super::reason::{Refusal, UnplacedReason, UnscheduleReason};
use super::working::{Load, Rank, Relation, UnitIndex, Working};
use super::{ClusterSnapshot, Decision, MachineLoad, Plan};
use crate::agent_plan::global_unit_runs;
use crate::disruption_budget::Budgets;
use crate::state::DesiredState;
use crate::unit_name::UnitNameInfo;

/// Decides the schedule changes for `snapshot`.
///
/// 1. Scheduled units whose desired state is inactive, or whose machine is gone, are
///    unscheduled; the others keep their machine while they can still run there.
/// 2. Global units count on every machine whose metadata matches, except where they would
///    share the machine with a unit they conflict with or replace (the agent's rule).
/// 3. Units drains let go move off their drained machines where they fit (those that fit
///    nowhere stay, with the reason); a drained machine takes no unit.
/// 4. Every other unit that should run is placed: units that replace others first, on the
///    machine of a unit they replace (which then moves elsewhere, its `MachineOf=` followers
///    with it); then units restricted to some machines, then the rest, each on the first
///    machine in the strategy's order that satisfies its requirements and has room for its
///    reservation (and its waiting followers'), followers right after the units they follow.
///    A unit that fits nowhere is reported with the reason.
/// 5. With preemption on, a unit that found no room may take that of units of a lower
///    priority ([`super::preemption`]); they are placed elsewhere if they fit, else wait saying
///    who took their room.
pub fn plan(snapshot: &ClusterSnapshot) -> Plan {
    plan_with(snapshot, None).0
}

/// Where a plan leaves each snapshot unit: its machine's rank (by the unit's position in the
/// snapshot; global units have none). Each machine's load is the plan's own `loads`.
pub(super) struct Outcome {
    pub placement: Vec<Option<usize>>,
}

/// [`plan`], with each machine starting at the load in `baseline` (by rank) rather than
/// empty: what units outside `snapshot` put there. Also returns where the plan leaves things.
pub(super) fn plan_with(snapshot: &ClusterSnapshot, baseline: Option<&[Load]>) -> (Plan, Outcome) {
    let mut working = Working::new(snapshot, baseline);
    let mut plan = Plan::default();
    let mut placed = PlacedInThisPlan { at: vec![None; snapshot.units.len()], retracted: HashSet::new() };
    let unit = |index: UnitIndex| &snapshot.units[index.0];
    let mut order: Vec<UnitIndex> =
        working.unit_indices().filter(|index| !UnitNameInfo::new(&unit(*index).name).is_template()).collect();
    order.sort_by(|a, b| unit(*a).name.cmp(&unit(*b).name));
    let (globals, placeable): (Vec<UnitIndex>, Vec<UnitIndex>) =
        order.iter().partition(|index| unit(**index).requirements.global);

    let mut budgets = snapshot.budgets.clone();
    keep_scheduled_units(&mut working, &mut plan, &mut placed, &placeable, &mut budgets);
    count_global_units(&mut working, &globals);
    let mut index_cache = MetadataIndex::default();
    move_drained_units(&mut working, &mut plan, &mut placed, &placeable, &mut index_cache);

    let waiting: Vec<UnitIndex> = placeable
        .iter()
        .copied()
        .filter(|index| unit(*index).desired != DesiredState::Inactive && working.placement(*index).is_none())
        .collect();
    let mut pending = placement_order(&working, waiting);
    let mut budget = PreemptionBudget::default();
    loop {
        let mut failed = Vec::new();
        let (mut placed_any, mut evicted_any) = (false, false);
        while let Some(index) = pending.pop_front() {
            match choose(&working, &mut index_cache, index) {
                Ok(rank) => {
                    working.place(index, rank);
                    placed.at[index.0] = Some(plan.decisions.len());
                    plan.decisions.push(Decision::Schedule {
                        unit: unit(index).name.clone(),
                        machine: working.machine(rank).id.clone(),
                    });
                    evicted_any |= make_room(&mut working, &mut plan, &mut placed, index, rank, &mut pending);
                    placed_any = true;
                }
                Err(reason) => failed.push((index, reason)),
            }
        }
        let followers_left = failed.iter().any(|(index, _)| !unit(*index).requirements.machine_of.is_empty());
        if !(placed_any && (followers_left || evicted_any)) {
            let mut preempted = VecDeque::new();
            if snapshot.preemption {
                preempt(&mut working, &mut plan, &mut placed, &mut failed, &mut budget, &mut preempted, &mut budgets);
            }
            if preempted.is_empty() {
                plan.unplaced = failed
                    .into_iter()
                    .map(|(index, reason)| {
                        let name = &unit(index).name;
                        let reason = match budget.preemptors.get(&index).or(snapshot.preempted.get(name)) {
                            Some(preemptor) if snapshot.preemption => {
                                UnplacedReason::Preempted(preemptor.clone(), Box::new(reason))
                            }
                            _ => reason,
                        };
                        let reason = match budget.held.remove(&index) {
                            Some((victims, held)) => {
                                UnplacedReason::PreemptionHeld { victims, held, then: Box::new(reason) }
                            }
                            None => reason,
                        };
                        (name.clone(), reason)
                    })
                    .collect();
                break;
            }
            // The units that took room go on; those that left theirs look for other room.
            pending = failed.into_iter().map(|(index, _)| index).chain(preempted).collect();
            continue;
        }
        pending = failed.into_iter().map(|(index, _)| index).collect();
    }
    plan.spread_notes = spread_notes(&working, &mut index_cache);
    if !placed.retracted.is_empty() {
        let mut position = 0;
        plan.decisions.retain(|_| {
            position += 1;
            !placed.retracted.contains(&(position - 1))
        });
    }
    plan.loads = working
        .ranks()
        .zip(working.loads())
        .map(|(rank, load)| MachineLoad {
            machine: working.machine(rank).id.clone(),
            units: load.units,
            reserved: load.reserved,
        })
        .collect();
    let outcome = Outcome {
        placement: working.unit_indices().map(|index| working.placement(index).map(|rank| rank.0)).collect(),
    };
    (plan, outcome)
}

/// The order waiting units (given in name order) are placed in: by `Priority=`, highest
/// first, and within one priority those that replace others first, then those restricted to
/// some machines (`MachineID=`, then `MachineMetadata=`: placed before units that could go
/// anywhere take their room), then the rest, and last the followers whose leaders are not
/// waiting; each leader's waiting followers (`MachineOf=`, chains
/// included) right after it, so that nothing takes the room they need in between.
fn placement_order(working: &Working<'_>, waiting: Vec<UnitIndex>) -> VecDeque<UnitIndex> {
    let is_waiting: HashSet<UnitIndex> = waiting.iter().copied().collect();
    let waiting_leaders = |index: UnitIndex| {
        working
            .unit(index)
            .requirements
            .machine_of
            .iter()
            .filter_map(|leader| working.unit_index(leader))
            .filter(|leader| is_waiting.contains(leader))
            .count()
    };
    let mut roots: Vec<UnitIndex> = waiting.iter().copied().filter(|index| waiting_leaders(*index) == 0).collect();
    roots.sort_by_key(|index| {
        let requirements = &working.unit(*index).requirements;
        let latitude = match (&requirements.machine_id, requirements.metadata.is_empty()) {
            (Some(_), _) => 0,
            (None, false) => 1,
            (None, true) => 2,
        };
        (
            std::cmp::Reverse(requirements.priority),
            !requirements.machine_of.is_empty(),
            requirements.replaces.is_empty(),
            latitude,
        )
    });
    let mut order = VecDeque::with_capacity(waiting.len());
    let mut placed_leaders: HashMap<UnitIndex, usize> = HashMap::new();
    let mut emitted: HashSet<UnitIndex> = HashSet::with_capacity(waiting.len());
    for root in roots {
        let mut next = vec![root];
        while let Some(index) = next.pop() {
            if !emitted.insert(index) {
                continue;
            }
            order.push_back(index);
            // A follower comes once the last of its waiting leaders has.
            for &follower in working.followers(index).iter().rev() {
                if !is_waiting.contains(&follower) || emitted.contains(&follower) {
                    continue;
                }
                let seen = placed_leaders.entry(follower).or_default();
                *seen += 1;
                if *seen >= waiting_leaders(follower) {
                    next.push(follower);
                }
            }
        }
    }
    // Followers caught in a circle of MachineOf= come last, in name order.
    order.extend(waiting.into_iter().filter(|index| !emitted.contains(index)));
    order
}

/// Where this plan scheduled each unit (its decision's position). A unit this plan placed
/// and then has to move again (its leader was replaced, say) has that Schedule taken back
/// rather than an Unschedule from a machine it never reached: a plan moves a unit at most
/// once.
struct PlacedInThisPlan {
    at: Vec<Option<usize>>,
    retracted: HashSet<usize>,
}

/// Step 1: scheduled units stay on their machine unless their desired state is inactive, the
/// machine is gone, or they can no longer run there.
fn keep_scheduled_units(
    working: &mut Working<'_>,
    plan: &mut Plan,
    placed: &mut PlacedInThisPlan,
    placeable: &[UnitIndex],
    budgets: &mut Budgets,
) {
    for &index in placeable {
        let unit = working.unit(index);
        let Some(machine) = &unit.scheduled_on else {
            continue;
        };
        let reason = if unit.desired == DesiredState::Inactive {
            UnscheduleReason::TargetStateInactive
        } else if let Some(rank) = working.rank_of(machine) {
            working.place(index, rank);
            continue;
        } else {
            UnscheduleReason::MachineWentAway
        };
        plan.decisions.push(Decision::Unschedule { unit: unit.name.clone(), machine: machine.clone(), reason });
    }
    // Units that no longer fit their machine leave first, followers after their leaders
    // (hence the repeat); only then are conflicts between the units that stay resolved, so
    // nothing is evicted for a unit that is itself about to leave.
    // Evicted units are placed again with every other unplaced unit, so this queue is unused.
    let mut requeue = VecDeque::new();
    // Units a taint's `:evict` would move that their disruption budget keeps where they are.
    let mut kept: HashSet<UnitIndex> = HashSet::new();
    loop {
        let leaving: Vec<(UnitIndex, Refusal)> = placeable
            .iter()
            .filter(|index| !kept.contains(index))
            .filter_map(|&index| {
                let rank = working.placement(index)?;
                fits_machine(working, index, rank).err().map(|reason| (index, reason))
            })
            .collect();
        if leaving.is_empty() {
            break;
        }
        for (index, reason) in leaving {
            if let Refusal::Tainted { machine, taint } = &reason {
                let going = leaving_together(working, index);
                if let Err(held) = budgets.take(going.iter().map(String::as_str)) {
                    let text = format!("stays on machine {machine} despite its taint {taint}: {held}");
                    plan.held.push((working.unit(index).name.clone(), text));
                    kept.insert(index);
                    continue;
                }
                plan.disrupted.extend(going.into_iter().map(|unit| (unit, machine.clone())));
            }
            evict(working, plan, placed, index, UnscheduleReason::CannotRunThere(reason), &mut requeue);
        }
    }
    for &index in placeable {
        let Some(rank) = working.placement(index) else {
            continue;
        };
        let targets = working.replace_targets(index);
        let refusal =
            circular_partner_placed(working, index, &targets).and_then(|()| able_to_run(working, index, rank));
        let reason = match refusal {
            Ok(()) => continue,
            // Its budget keeps it beside the taint (above).
            Err(Refusal::Tainted { .. }) if kept.contains(&index) => continue,
            Err(Refusal::ReplacedBy(other)) => UnscheduleReason::ReplacedBy(other),
            Err(reason) => UnscheduleReason::CannotRunThere(reason),
        };
        evict(working, plan, placed, index, reason, &mut requeue);
    }
}

/// Step 3: each unit a drain let go (in name order; `MachineOf=` followers with their leader)
/// moves off its drained machine to where it would be placed, before any waiting unit takes
/// the room. One with nowhere to go stays where it is, with the reason, as if never moved.
fn move_drained_units<'a>(
    working: &mut Working<'a>,
    plan: &mut Plan,
    placed: &mut PlacedInThisPlan,
    placeable: &[UnitIndex],
    index_cache: &mut MetadataIndex<'a>,
) {
    // Units pushed off by one that replaces them wait with the rest (they are unplaced now).
    let mut pushed_off = VecDeque::new();
    for &index in placeable {
        let Some(from) = working.let_go(index) else {
            continue;
        };
        if resident_leader(working, index, from).is_some() {
            // It moves with its leader, or stays with it (below).
            continue;
        }
        let first = plan.decisions.len();
        let mut group = VecDeque::new();
        evict(working, plan, placed, index, UnscheduleReason::Drained, &mut group);
        match choose(working, index_cache, index) {
            Ok(_) => {
                // The leader first, then its followers (the order they were unscheduled in); a
                // follower that fits nowhere waits with the rest.
                for member in group {
                    if let Ok(rank) = choose(working, index_cache, member) {
                        working.place(member, rank);
                        placed.at[member.0] = Some(plan.decisions.len());
                        let machine = working.machine(rank).id.clone();
                        plan.decisions.push(Decision::Schedule { unit: working.unit(member).name.clone(), machine });
                        make_room(working, plan, placed, member, rank, &mut pushed_off);
                    }
                }
            }
            Err(reason) => {
                for (offset, member) in group.into_iter().enumerate() {
                    placed.retracted.insert(first + offset);
                    working.place(member, from);
                }
                let reason = match reason {
                    UnplacedReason::Draining(machine) if machine == working.machine(from).id => {
                        UnplacedReason::NowhereElse
                    }
                    reason => reason,
                };
                plan.stuck.push((working.unit(index).name.clone(), reason));
            }
        }
    }
    for &index in placeable {
        if let Some(from) = working.let_go(index)
            && let Some(leader) = resident_leader(working, index, from)
        {
            plan.stuck.push((working.unit(index).name.clone(), UnplacedReason::StaysWithLeader(leader)));
        }
    }
}

/// The first of `unit`'s `MachineOf=` leaders that is on `rank` too.
fn resident_leader(working: &Working<'_>, unit: UnitIndex, rank: Rank) -> Option<String> {
    working
        .unit(unit)
        .requirements
        .machine_of
        .iter()
        .find(|leader| working.unit_index(leader).and_then(|leader| working.placement(leader)) == Some(rank))
        .cloned()
}

/// Step 2: each global unit, in name order, counts on the machines where it will run.
fn count_global_units(working: &mut Working<'_>, globals: &[UnitIndex]) {
    for &index in globals {
        let unit = working.unit(index);
        if unit.desired == DesiredState::Inactive {
            continue;
        }
        for rank in working.ranks() {
            let excludes_a_resident = || {
                working.residents_related_to(index, rank).iter().any(|other| working.relation(index, *other).is_some())
            };
            if global_unit_runs(unit.desired, &unit.requirements, working.machine(rank), excludes_a_resident) {
                working.place(index, rank);
            }
        }
    }
}

/// The names of `unit` and of its `MachineOf=` followers on its machine (chains included):
/// what [`evict`] takes off that machine with it.
fn leaving_together(working: &Working<'_>, unit: UnitIndex) -> Vec<String> {
    let rank = working.placement(unit);
    let mut names = vec![working.unit(unit).name.clone()];
    let mut next = vec![unit];
    while let Some(leader) = next.pop() {
        for &follower in working.followers(leader) {
            let name = &working.unit(follower).name;
            if working.placement(follower) == rank && !names.contains(name) {
                names.push(name.clone());
                next.push(follower);
            }
        }
    }
    names
}

/// What preemption may still do in this plan, who took each unit's room, and the units whose
/// preemption a disruption budget held (the victims it would have taken, and the hold).
struct PreemptionBudget {
    victims: usize,
    looks: usize,
    preemptors: HashMap<UnitIndex, Preemptor>,
    held: HashMap<UnitIndex, (Vec<String>, String)>,
}

impl Default for PreemptionBudget {
    fn default() -> Self {
        Self { victims: PREEMPTED_PER_PLAN, looks: LOOKS_PER_PLAN, preemptors: HashMap::new(), held: HashMap::new() }
    }
}

/// Step 5, with `preemption = on`: each unit that found no room (highest priority first)
/// takes the room of units of a lower priority where [`choose_victims`] finds it, within the
/// plan's budget. The units it took off their machines are queued in `preempted`, to be
/// placed elsewhere; the units placed so leave `failed`.
fn preempt(
    working: &mut Working<'_>,
    plan: &mut Plan,
    placed: &mut PlacedInThisPlan,
    failed: &mut Vec<(UnitIndex, UnplacedReason)>,
    budget: &mut PreemptionBudget,
    preempted: &mut VecDeque<UnitIndex>,
    budgets: &mut Budgets,
) {
    let Some(lowest) = lowest_placed(working) else {
        return;
    };
    let mut candidates: Vec<UnitIndex> = failed
        .iter()
        .filter(|(index, reason)| {
            matches!(reason, UnplacedReason::NoRoom { .. }) && working.unit(*index).requirements.priority > lowest
        })
        .map(|(index, _)| *index)
        .collect();
    if candidates.is_empty() {
        return;
    }
    let replaced = replace_bound(working);
    candidates.retain(|index| may_preempt(working, *index, &replaced));
    candidates.sort_by_key(|index| std::cmp::Reverse(working.unit(*index).requirements.priority));
    for index in candidates {
        if budget.looks == 0 || budget.victims == 0 {
            break;
        }
        budget.looks -= 1;
        let Some((rank, victims)) = choose_victims(working, index, budget.victims) else {
            continue;
        };
        let going: Vec<String> = victims.iter().flat_map(|victim| leaving_together(working, *victim)).collect();
        if let Err(held) = budgets.take(going.iter().map(String::as_str)) {
            let names = victims.iter().map(|victim| working.unit(*victim).name.clone()).collect();
            budget.held.insert(index, (names, held.to_string()));
            continue;
        }
        let machine = working.machine(rank).id.clone();
        plan.disrupted.extend(going.into_iter().map(|unit| (unit, machine.clone())));
        budget.held.remove(&index);
        let spec = working.unit(index);
        let preemptor = Preemptor { unit: spec.name.clone(), priority: spec.requirements.priority };
        budget.victims -= victims.len();
        for victim in victims {
            budget.preemptors.insert(victim, preemptor.clone());
            evict(working, plan, placed, victim, UnscheduleReason::PreemptedBy(preemptor.clone()), preempted);
        }
        working.place(index, rank);
        placed.at[index.0] = Some(plan.decisions.len());
        plan.decisions
            .push(Decision::Schedule { unit: preemptor.unit.clone(), machine: working.machine(rank).id.clone() });
        make_room(working, plan, placed, index, rank, preempted);
        failed.retain(|(other, _)| *other != index);
    }
}

/// Moves the units `unit` replaces off `rank`, where it has just landed. Returns whether any
/// scheduled unit had to leave.
fn make_room(
    working: &mut Working<'_>,
    plan: &mut Plan,
    placed: &mut PlacedInThisPlan,
    unit: UnitIndex,
    rank: Rank,
    pending: &mut VecDeque<UnitIndex>,
) -> bool {
    let replaced: Vec<UnitIndex> = working
        .residents_related_to(unit, rank)
        .iter()
        .copied()
        .filter(|other| working.relation(unit, *other) == Some(Relation::Replaces))
        .collect();
    let mut evicted = false;
    for other in replaced {
        if working.unit(other).requirements.global {
            working.remove(other, rank);
        } else {
            let reason = UnscheduleReason::ReplacedBy(working.unit(unit).name.clone());
            evict(working, plan, placed, other, reason, pending);
            evicted = true;
        }
    }
    evicted
}

/// Unschedules `unit` and queues it to be placed again, then does the same for its
/// `MachineOf=` followers on that machine, chains included.
fn evict(
    working: &mut Working<'_>,
    plan: &mut Plan,
    placed: &mut PlacedInThisPlan,
    unit: UnitIndex,
    reason: UnscheduleReason,
    pending: &mut VecDeque<UnitIndex>,
) {
    let Some(rank) = working.placement(unit) else {
        return;
    };
    let name = working.unit(unit).name.clone();
    match placed.at[unit.0].take() {
        Some(position) => {
            placed.retracted.insert(position);
        }
        None => plan.decisions.push(Decision::Unschedule {
            unit: name.clone(),
            machine: working.machine(rank).id.clone(),
            reason,
        }),
    }
    working.remove(unit, rank);
    pending.push_back(unit);
    for follower in working.followers(unit).to_vec() {
        if working.placement(follower) == Some(rank) {
            let reason = UnscheduleReason::CannotRunThere(Refusal::PeerNotScheduled(name.clone()));
            evict(working, plan, placed, follower, reason, pending);
        }
    }
}
