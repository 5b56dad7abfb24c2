//! The engine's reconcile, as a pure function.

use super::candidates::{MetadataIndex, able_to_run, choose, fits_machine};
use super::reason::{UnplacedReason, UnscheduleReason};
use super::working::Working;
use super::{ClusterSnapshot, Decision, Plan};
use crate::state::DesiredState;
use crate::unit_name::UnitNameInfo;

/// Decides the schedule changes for `snapshot`.
///
/// 1. Scheduled units whose desired state is inactive, or whose machine is gone, are
///    unscheduled; the others keep their machine while they can still run there.
/// 2. Every other unit that should run is placed on the least-loaded machine that satisfies
///    its requirements, `MachineOf=` followers after the units they follow; a unit that fits
///    nowhere is reported with the reason.
///
/// Global units are never placed (every matching machine runs them on its own), but they
/// count towards each machine's load and conflicts.
pub fn plan(snapshot: &ClusterSnapshot) -> Plan {
    let mut working = Working::new(snapshot);
    let mut plan = Plan::default();
    let units = &snapshot.units;
    let mut order: Vec<usize> =
        (0..units.len()).filter(|index| !UnitNameInfo::new(&units[*index].name).is_template()).collect();
    order.sort_by(|a, b| units[*a].name.cmp(&units[*b].name));

    for &index in &order {
        let unit = &units[index];
        if unit.requirements.global && unit.desired != DesiredState::Inactive {
            for rank in 0..working.machines.len() {
                if unit.requirements.metadata_matches(&working.machines[rank].metadata) {
                    working.place(index, rank);
                }
            }
        }
    }

    let placeable: Vec<usize> = order.iter().copied().filter(|index| !units[*index].requirements.global).collect();
    for &index in &placeable {
        let unit = &units[index];
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
    loop {
        let leaving: Vec<(usize, UnplacedReason)> = placeable
            .iter()
            .filter_map(|&index| {
                let rank = working.placement(index)?;
                fits_machine(&working, index, rank).err().map(|reason| (index, reason))
            })
            .collect();
        if leaving.is_empty() {
            break;
        }
        for (index, reason) in leaving {
            unschedule_misfit(&mut working, &mut plan, index, reason);
        }
    }
    for &index in &placeable {
        let Some(rank) = working.placement(index) else {
            continue;
        };
        if let Err(reason) = able_to_run(&working, index, rank) {
            unschedule_misfit(&mut working, &mut plan, index, reason);
        }
    }

    let mut pending: Vec<usize> = placeable
        .iter()
        .copied()
        .filter(|index| units[*index].desired != DesiredState::Inactive && working.placement(*index).is_none())
        .collect();
    // Leaders before followers; each round places the followers whose peers now have a place.
    pending.sort_by_key(|index| !units[*index].requirements.machine_of.is_empty());
    let mut index_cache = MetadataIndex::default();
    loop {
        let mut failed = Vec::new();
        let before = pending.len();
        for index in pending {
            match choose(&working, &mut index_cache, index) {
                Ok(rank) => {
                    working.place(index, rank);
                    plan.decisions.push(Decision::Schedule {
                        unit: units[index].name.clone(),
                        machine: working.machines[rank].id.clone(),
                    });
                }
                Err(reason) => failed.push((index, reason)),
            }
        }
        let progressed = failed.len() < before;
        let followers_left = failed.iter().any(|(index, _)| !units[*index].requirements.machine_of.is_empty());
        if !(progressed && followers_left) {
            plan.unplaced = failed.into_iter().map(|(index, reason)| (units[index].name.clone(), reason)).collect();
            break;
        }
        pending = failed.into_iter().map(|(index, _)| index).collect();
    }
    plan
}

fn unschedule_misfit(working: &mut Working<'_>, plan: &mut Plan, index: usize, reason: UnplacedReason) {
    if let Some(rank) = working.placement(index) {
        plan.decisions.push(Decision::Unschedule {
            unit: working.units[index].name.clone(),
            machine: working.machines[rank].id.clone(),
            reason: UnscheduleReason::CannotRunThere(reason),
        });
        working.remove(index);
    }
}
