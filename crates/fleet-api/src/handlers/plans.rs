//! `POST /plans` (our addition): what a command's unit writes would do, before they are made.
//! The request is admitted as the writes themselves would be (a malformed unit, or one naming
//! a secret the caller may not name, gets the error the command would get), but the caller
//! needs only to see the units it plans. The engine's planner then runs over the cluster as
//! the store holds it, with and without the change ([`fleet_core::schedule::preview`]), and
//! nothing is written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use axum::response::Response;
use fleet_core::access::Role;
use fleet_core::requirements::Requirements;
use fleet_core::schedule::preview::{PreviewChange, PreviewedUnit, preview};
use fleet_core::schedule::{ClusterSnapshot, UnitSpec};
use fleet_core::unit_name::validate_name;
use fleet_core::{DesiredState, UnitFile};
use fleet_registry::{UnitChange, UnitView, Writer};

use super::unit_batch::{Permission, admitted, may};
use super::units::json_object;
use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::schema::{Plan, PlanRequest, PlanUnit, PlannedUnit, Unit, UnitOption};
use requirements_memo::RequirementsMemo;

/// The most units one plan may name: ten thousand instances of a template fit the request
/// body's bound when they carry its content once.
pub const MOST_UNITS_PER_PLAN: usize = 10_000;

/// The most machines one plan may drain.
pub const MOST_DRAINS_PER_PLAN: usize = 100;

/// The most plans a fleetd works out at once: each may take a core for a second on a large
/// cluster, and viewers may ask. More are refused (429) until one ends.
pub const MOST_PLANS_AT_ONCE: usize = 2;

/// One of the [`MOST_PLANS_AT_ONCE`] plans a fleetd works out (`under_way` counts them),
/// given back when dropped.
struct PlanSlot<'a> {
    under_way: &'a AtomicUsize,
}

impl<'a> PlanSlot<'a> {
    fn take(under_way: &'a AtomicUsize) -> Result<Self, ApiError> {
        if under_way.fetch_add(1, Ordering::SeqCst) >= MOST_PLANS_AT_ONCE {
            under_way.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{MOST_PLANS_AT_ONCE} plans are being worked out already; try again"),
            ));
        }
        Ok(PlanSlot { under_way })
    }
}

impl Drop for PlanSlot<'_> {
    fn drop(&mut self) {
        self.under_way.fetch_sub(1, Ordering::SeqCst);
    }
}

pub async fn post(state: &ApiState, role: &Role, body: &[u8]) -> Result<Response, ApiError> {
    let request: PlanRequest = json_object(body)?;
    if let Some(source) = &request.source_sync {
        if !(request.units.is_empty() && request.destroy.is_empty() && request.drain.is_empty()) {
            return Err(ApiError::bad_request("sourceSync is planned alone: no units, destroy or drain with it"));
        }
        return plan_source_sync(state, role, source, request.source_sync_force).await;
    }
    if request.source_sync_force {
        return Err(ApiError::bad_request("sourceSyncForce is given only with sourceSync"));
    }
    if request.units.is_empty() && request.destroy.is_empty() && request.drain.is_empty() {
        return Err(ApiError::bad_request("no units given"));
    }
    if request.drain.len() > MOST_DRAINS_PER_PLAN {
        return Err(ApiError::bad_request(format!(
            "{} machines given; at most {MOST_DRAINS_PER_PLAN} per plan",
            request.drain.len()
        )));
    }
    if request.units.len() + request.destroy.len() > MOST_UNITS_PER_PLAN {
        return Err(ApiError::bad_request(format!(
            "{} units given; at most {MOST_UNITS_PER_PLAN} per plan",
            request.units.len() + request.destroy.len()
        )));
    }
    let units = with_contents(request.units, &request.contents)?;
    let changes = admitted(units, role, Permission::Plan, MOST_UNITS_PER_PLAN, state.agent_ttl)?;
    let mut named: HashSet<&str> = changes.iter().map(|change| change.name.as_str()).collect();
    for name in &request.destroy {
        validate_name(name).map_err(|error| ApiError::bad_request(format!("unit {name}: {error}")))?;
        may(role, name, Permission::Plan)?;
        if !named.insert(name) {
            return Err(ApiError::bad_request(format!("unit {name} is given twice")));
        }
    }
    let _slot = PlanSlot::take(&state.plans_under_way)?;
    let files = changes.iter().filter_map(|change| Some((change.name.as_str(), change.file.as_ref()?)));
    super::secrets::check_named(state, role, files.clone()).await?;
    super::dependency_cycles::refuse_cycles(state, files).await?;
    let (units, machines) = (state.registry.units().await?, state.registry.machines().await?);
    let mut drained = Vec::with_capacity(request.drain.len());
    for requested in &request.drain {
        let machine =
            super::drains::find_in(&machines, requested)?.ok_or_else(|| super::drains::not_found(requested))?;
        drained.push(machine.id.clone());
    }
    let plan = plan_over(state, (units, machines), changes, request.destroy, drained).await?;
    Ok(json_response(StatusCode::OK, &Plan { units: seen_by(plan.units, role), ..plan }))
}

/// The plan of a sync of source `name` now (forced when `force`): its branch fetched and read
/// through this fleetd's source reader, the writes the syncer would make worked out and
/// planned. Only for identities that may read sources.
async fn plan_source_sync(state: &ApiState, role: &Role, name: &str, force: bool) -> Result<Response, ApiError> {
    // What a source holds is for those who may read sources (not an operator scoped to some
    // units): the plan shows its commit, problems and owners.
    if fleet_core::access::decide(role, fleet_core::access::Action::ReadSources) != fleet_core::access::Access::Allowed
    {
        return Err(ApiError::new(StatusCode::FORBIDDEN, format!("{role} may not plan a sync of a source")));
    }
    let reader = state.source_reader.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this fleetd reads no git sources: plan the sync through another",
        )
    })?;
    let sources = state.registry.sources().await?;
    let kept = sources.iter().map(|source| source.name.clone()).collect::<std::collections::BTreeSet<_>>();
    let source = super::sources::named(sources, name)?;
    let _slot = PlanSlot::take(&state.plans_under_way)?;
    // A fleetd that is not the engine leader runs no syncer to let go of removed sources'
    // clones and content: its plans do.
    reader.forget_others(&kept).await;
    let read = reader
        .read_source(&source)
        .await
        .map_err(|error| ApiError::new(StatusCode::BAD_GATEWAY, format!("source {name}: {error}")))?;
    let (units, machines) = (state.registry.units().await?, state.registry.machines().await?);
    let rollouts = state.registry.rollouts().await?;
    let writes = source_sync::sync_writes(&source, &read, force, &units, &rollouts);
    let plan = plan_over(state, (units, machines), writes.changes, writes.destroy, Vec::new()).await?;
    let mut sync = writes.sync;
    sync.contents.retain(|unit, _| may(role, unit, Permission::Plan).is_ok());
    sync.rolled.retain(|unit| may(role, unit, Permission::Plan).is_ok());
    Ok(json_response(StatusCode::OK, &Plan { units: seen_by(plan.units, role), source: Some(sync), ..plan }))
}

/// The plan of `changes`, `destroy` and the drains of `drained` over the cluster of `units`
/// on `machines`, as its engine would place them, with the index it stands at.
async fn plan_over(
    state: &ApiState,
    (units, machines): (Vec<UnitView>, Vec<fleet_core::MachineState>),
    changes: Vec<UnitChange>,
    destroy: Vec<String>,
    drained: Vec<String>,
) -> Result<Plan, ApiError> {
    let index = standing_index(&units, &machines);
    let policy = (state.placement_strategy, state.preemption);
    let budgets = budget_view(state, &units, &machines).await?.budgets();
    let waits = dependency_waits::dependency_waits(state, &units, &changes, &destroy).await?;
    let asked = Asked { changes, destroy, drained, waits };
    let memo = state.plan_requirements.clone();
    let (mut planned, units) = tokio::task::spawn_blocking(move || {
        let planned = planned(&units, machines, policy, budgets, &asked, &memo);
        (planned, units)
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the plan could not be made"))?;
    affected_dependents::note_affected_dependents(state, &units, &mut planned).await?;
    Ok(Plan { index, units: planned, source: None })
}

/// The planned units `role` may see: a change (a drain, a unit that replaces another) may move
/// units outside a scoped operator's pattern, which stay hidden from it.
fn seen_by(planned: Vec<PlannedUnit>, role: &Role) -> Vec<PlannedUnit> {
    planned.into_iter().filter(|unit| may(role, &unit.name, Permission::Plan).is_ok()).collect()
}

/// The request's units as a batch writes them: each with its options, given or named.
fn with_contents(units: Vec<PlanUnit>, contents: &BTreeMap<String, Vec<UnitOption>>) -> Result<Vec<Unit>, ApiError> {
    units
        .into_iter()
        .map(|unit| {
            let options = match (unit.options.is_empty(), &unit.content) {
                (true, Some(key)) => contents.get(key).cloned().ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "unit {}: content {key:?} is not in the request's contents",
                        unit.name
                    ))
                })?,
                (false, Some(_)) => {
                    return Err(ApiError::bad_request(format!("unit {}: options and content both given", unit.name)));
                }
                (_, None) => unit.options,
            };
            Ok(Unit { name: unit.name, desired_state: unit.desired_state, options, ..Unit::default() })
        })
        .collect()
}

/// The writer of a unit write by `identity`, guarded by the plan whose index `?ifUnchanged=`
/// gives, if any ([`guarded`]: refused at once when the cluster changed since).
pub async fn guarded_writer(
    state: &ApiState,
    identity: &crate::auth::Identity,
    query: &[(String, String)],
) -> Result<Writer, ApiError> {
    guarded(state, super::units::writer(identity, query)?, query).await
}

/// `?ifUnchanged=INDEX` on a unit write: the write is refused (409) unless the cluster is
/// still as the plan that printed INDEX saw it, and `writer` is returned guarded by that plan.
/// The whole cluster is checked here, just before the write, against this member's copy; each
/// unit the write then writes is checked again by the store inside its write
/// ([`fleet_registry::PlanGuard`]), so a unit the command writes is never written over a
/// change made since the plan.
pub async fn guarded(state: &ApiState, writer: Writer, query: &[(String, String)]) -> Result<Writer, ApiError> {
    let Some(text) = crate::query::first_value(query, "ifUnchanged") else { return Ok(writer) };
    let asked: u64 = text.parse().map_err(|_| {
        ApiError::bad_request(format!("invalid ifUnchanged {text:?}: a plan index, as fleetctl plan prints it"))
    })?;
    let (units, machines) = (state.registry.units().await?, state.registry.machines().await?);
    let now = standing_index(&units, &machines);
    if now != asked {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the cluster changed since plan index {asked} (it is at {now} now): plan again"),
        ));
    }
    Ok(writer.guarded_by(Arc::new(fleet_registry::PlanGuard::of(asked, &units))))
}

/// What a plan depends on, as one number: every unit's name, content, desired state and
/// machine, and every machine as the planner sees it (metadata, capacity, drain, taints). Unit
/// states, which change all the time, are not in it. The same on every member and every
/// store (SHA-256 of a fixed encoding), so a plan made through one member guards a write
/// through another.
pub fn standing_index(units: &[UnitView], machines: &[fleet_core::MachineState]) -> u64 {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut units: Vec<&UnitView> = units.iter().collect();
    units.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    for unit in units {
        let line = format!(
            "unit\0{}\0{}\0{}\0{}\n",
            unit.name,
            unit.hash,
            unit.desired,
            unit.machine_id.as_deref().unwrap_or("")
        );
        digest.update(line.as_bytes());
    }
    let mut machines: Vec<&fleet_core::MachineState> = machines.iter().collect();
    machines.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    for machine in machines {
        let planned = (&machine.id, &machine.metadata, &machine.capacity, &machine.drain);
        digest.update(b"machine\0");
        digest.update(serde_json::to_string(&planned).unwrap_or_default().as_bytes());
        digest.update(b"\n");
        // Only where there are any, so that an untainted cluster's index is what it was
        // before taints (a plan made through an older member still guards a write here).
        if !machine.taints.is_empty() {
            digest.update(b"taints\0");
            digest.update(fleet_core::taint::written(&machine.taints).join(",").as_bytes());
            digest.update(b"\n");
        }
    }
    let sum = digest.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&sum.as_ref()[..8]);
    // Shown as a decimal number: kept below 2^53 so that any JSON reader holds it exactly.
    u64::from_be_bytes(first) >> 11
}

/// What the disruption budgets are counted from, as the cluster stands: the budgeted units,
/// their states, the drains and the rollouts (nothing is read when no unit has a budget).
async fn budget_view(
    state: &ApiState,
    units: &[UnitView],
    machines: &[fleet_core::MachineState],
) -> Result<fleet_registry::BudgetView, ApiError> {
    let budgeted = fleet_registry::budgeted_units(units);
    if budgeted.is_empty() {
        return Ok(fleet_registry::BudgetView::default());
    }
    let names: std::collections::BTreeSet<String> = budgeted.iter().map(|unit| unit.name.clone()).collect();
    let states = state.registry.unit_states_page(fleet_registry::PageRequest::named(&names), None).await?.items;
    Ok(fleet_registry::BudgetView {
        units: budgeted,
        states: states.into_iter().map(Arc::new).collect(),
        drains: fleet_registry::BudgetView::drains_of(machines),
        rollouts: state.registry.rollouts().await?,
        machines: machines.to_vec(),
    })
}

/// What a plan was asked to preview.
struct Asked {
    changes: Vec<UnitChange>,
    destroy: Vec<String>,
    /// Machines drained, by full ID.
    drained: Vec<String>,
    /// Units that would wait for units, with why: kept unplaced, as the engine keeps them.
    waits: HashMap<String, String>,
}

/// The plan of `asked` over the cluster of `units` on `machines`.
fn planned(
    units: &[UnitView],
    machines: Vec<fleet_core::MachineState>,
    (strategy, preemption): (fleet_core::schedule::PlacementStrategy, bool),
    budgets: fleet_core::disruption_budget::Budgets,
    asked: &Asked,
    memo: &RequirementsMemo,
) -> Vec<PlannedUnit> {
    let Asked { changes, destroy, drained, waits } = asked;
    let kept_off =
        |name: &str, desired: DesiredState| if waits.contains_key(name) { DesiredState::Inactive } else { desired };
    let specs = units
        .iter()
        .zip(memo.of(units))
        .map(|(unit, requirements)| UnitSpec {
            name: unit.name.clone(),
            desired: kept_off(&unit.name, as_planned(unit.desired, &requirements, unit.machine_id.is_some())),
            requirements,
            scheduled_on: unit.machine_id.clone(),
        })
        .collect();
    let cluster = ClusterSnapshot { machines, units: specs, strategy, preemption, budgets, ..Default::default() };
    let standing: HashMap<&str, &UnitView> = units.iter().map(|unit| (unit.name.as_str(), unit)).collect();
    let previewed: Vec<PreviewChange> = changes
        .iter()
        .map(|change| {
            let requirements = change.file.as_ref().map(|file| Arc::new(Requirements::from_unit(&change.name, file)));
            let now = standing.get(change.name.as_str());
            let kept = requirements
                .clone()
                .or_else(|| now.map(|unit| Arc::new(Requirements::from_unit(&unit.name, &unit.file))));
            let placed = now.is_some_and(|unit| unit.machine_id.is_some());
            let desired = kept.map_or(change.desired, |kept| as_planned(change.desired, &kept, placed));
            let desired = kept_off(&change.name, desired);
            PreviewChange::Set { name: change.name.clone(), desired, requirements }
        })
        .chain(destroy.iter().map(|name| PreviewChange::Destroy { name: name.clone() }))
        .chain(drained.iter().map(|machine| PreviewChange::Drain { machine: machine.clone() }))
        .collect();
    let preview = preview(&cluster, &previewed);
    let changed: HashMap<&str, &UnitChange> = changes.iter().map(|change| (change.name.as_str(), change)).collect();
    let destroyed: HashSet<&str> = destroy.iter().map(String::as_str).collect();
    let mut planned: Vec<PlannedUnit> =
        preview.units.into_iter().map(|unit| planned_unit(unit, &standing, &changed, &destroyed)).collect();
    for unit in &mut planned {
        if let Some(why) = waits.get(&unit.name) {
            unit.waiting = Some(why.clone());
        }
    }
    planned
}

/// A unit whose runs fleet keeps (on a calendar, or a batch unit) is placed only for a run, as
/// the engine does: one that is not placed now stays unplaced in the plan.
fn as_planned(desired: DesiredState, requirements: &Requirements, placed: bool) -> DesiredState {
    if requirements.job.as_ref().is_some_and(fleet_core::job::Job::keeps_runs) && !placed {
        DesiredState::Inactive
    } else {
        desired
    }
}

/// What the plan says of a unit whose runs fleet keeps.
fn runs_note(name: &str, file: &UnitFile) -> Option<String> {
    let job = fleet_core::job::job_of(name, file.options()).ok().flatten()?;
    if job.moves_on_failure() {
        let delay = fleet_core::duration::short_span(job.retry_delay);
        return Some(format!("moves when it fails: up to {} times in a row, {delay} apart and doubling", job.retries));
    }
    let global = fleet_core::Requirements::from_unit(name, file).global;
    let on = if global { "on every machine it may run on, " } else { "" };
    Some(match (&job.schedule, global) {
        (Some(spec), _) => match spec.next_after(fleet_runtime::wall_clock::now_micros()) {
            Some(next) => format!("runs {on}on {spec}, next at {}", fleet_core::civil_time::rfc3339_of_micros(next)),
            None => format!("runs {on}on {spec}, never again"),
        },
        (None, true) => "a global batch unit: every machine it may run on runs it once each start".to_string(),
        (None, false) => "a batch unit: one run each start, placed when started".to_string(),
    })
}

/// One previewed unit as the answer shows it.
fn planned_unit(
    unit: PreviewedUnit,
    standing: &HashMap<&str, &UnitView>,
    changed: &HashMap<&str, &UnitChange>,
    destroy: &HashSet<&str>,
) -> PlannedUnit {
    let now = standing.get(unit.name.as_str());
    let change = changed.get(unit.name.as_str());
    let destroyed = destroy.contains(unit.name.as_str());
    let hash_before = now.map(|view| view.hash.to_string());
    let new_hash = change.and_then(|change| change.file.as_ref()).map(|file| file.hash().to_string());
    let file_after = change.and_then(|change| change.file.as_ref()).or_else(|| now.map(|view| &view.file));
    let runs = file_after.filter(|_| !destroyed).and_then(|file| runs_note(&unit.name, file));
    let action = match (now, change) {
        (None, None) if destroyed => "missing",
        (_, None) if destroyed => "destroy",
        // On a drained machine: it leaves, or stays with why.
        (_, None) if unit.changed && unit.before == unit.after => "stays",
        (_, None) => "moved",
        (None, Some(change)) if change.file.is_some() => "create",
        (None, Some(_)) => "missing",
        (Some(_), Some(_)) if new_hash.is_some() && new_hash != hash_before => "change",
        (Some(view), Some(change)) if view.desired != change.desired => "set",
        (Some(_), Some(_)) => "unchanged",
    };
    let desired_after = match (action, change) {
        ("destroy" | "missing", _) => None,
        (_, Some(change)) => Some(change.desired.to_string()),
        (_, None) => now.map(|view| view.desired.to_string()),
    };
    let version_before = now.map(|view| view.versions.number());
    let version = match action {
        "destroy" | "missing" => None,
        "create" => Some(1),
        "change" | "set" => version_before.map(|number| number + 1),
        _ => version_before,
    };
    PlannedUnit {
        version_before,
        version,
        action: action.to_string(),
        hash: match action {
            "destroy" | "missing" => None,
            _ => new_hash.or_else(|| hash_before.clone()),
        },
        hash_before,
        desired_state_before: now.map(|view| view.desired.to_string()),
        desired_state: desired_after,
        machine_before: unit.before,
        machine: unit.after,
        waiting: unit.waiting,
        runs,
        on_required: None,
        name: unit.name,
    }
}

mod affected_dependents;
mod dependency_waits;
pub mod requirements_memo;
mod source_sync;

#[cfg(test)]
mod tests;
