//! Sending units to the cluster the way the original does before submit, load, start and
//! restart: from the registry if there, else from the local file (or, for an instance,
//! from its template in the registry or beside the file).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fleet_api_schema::{RolloutRequest, Unit, UnitOption};
use fleet_core::unit_name::{UnitNameInfo, mangle, validate_name, with_default_unit_type};
use fleet_core::{Requirements, UnitFile};

use crate::context::Context;
use crate::local_units::{local_template_path, read_unit_file, warn_ignored_options};
use crate::wait::fetch_units;

/// How many requests fleetctl keeps in flight at once.
pub const PARALLEL_REQUESTS: usize = 32;
/// How many batches of unit writes fleetctl keeps in flight at once: fleetd writes one at a
/// time to its store (more would only queue there), the other is read and checked meanwhile.
const PARALLEL_BATCHES: usize = 2;
/// The most units per batch (fleetd takes 1,000) and about the most bytes (fleetd reads 1 MiB).
const UNITS_PER_BATCH: usize = 1000;
const BATCH_BYTES: usize = 512 * 1024;

pub fn schema_options(file: &UnitFile) -> Vec<UnitOption> {
    file.options()
        .iter()
        .map(|option| UnitOption {
            name: option.name.clone(),
            section: option.section.clone(),
            value: option.value.clone(),
        })
        .collect()
}

pub fn unit_file(unit: &Unit) -> UnitFile {
    UnitFile::from_options(
        unit.options
            .iter()
            .map(|option| fleet_core::UnitOption::new(&option.section, &option.name, &option.value))
            .collect(),
    )
}

pub fn is_global(unit: &Unit) -> bool {
    Requirements::from_unit(&unit.name, &unit_file(unit)).global
}

/// Runs `work` on every item, keeping `PARALLEL_REQUESTS` in flight (a finished one makes
/// room for the next at once); results in item order.
pub async fn in_parallel<T, R, F, Fut>(items: Vec<T>, work: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    at_most_at_once(PARALLEL_REQUESTS, items, work).await
}

/// [`in_parallel`] with `limit` in flight.
async fn at_most_at_once<T, R, F, Fut>(limit: usize, items: Vec<T>, work: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let mut running = tokio::task::JoinSet::new();
    let mut items = items.into_iter().enumerate();
    loop {
        while running.len() < limit
            && let Some((index, item)) = items.next()
        {
            let request = work(item);
            running.spawn(async move { (index, request.await) });
        }
        match running.join_next().await {
            Some(Ok((index, result))) => results[index] = Some(result),
            Some(Err(error)) => std::panic::resume_unwind(error.into_panic()),
            None => break,
        }
    }
    results.into_iter().flatten().collect()
}

/// Writes `units`, each as its own `PUT` would (with options: created or replaced; without:
/// its desired state set): in batches when fleetd takes them, else one request per unit (the
/// original fleetd). Fails with the first unit refused.
pub async fn write_units(context: &Context, mut units: Vec<Unit>) -> Result<(), String> {
    // A batch names every desired state; a PUT of new content without one means inactive.
    for unit in units.iter_mut().filter(|unit| !unit.options.is_empty()) {
        unit.desired_state.get_or_insert_with(|| "inactive".to_string());
    }
    let mut batches = batches(units).into_iter();
    let Some(first) = batches.next() else { return Ok(()) };
    let client = context.client.clone();
    let Some(answers) = client.put_units(&first).await.map_err(|error| error.to_string())? else {
        let units: Vec<Unit> = first.into_iter().chain(batches.flatten()).collect();
        let results = in_parallel(units, move |unit| {
            let client = client.clone();
            async move { client.put_unit(&unit).await.map_err(|error| error.to_string()) }
        })
        .await;
        return results.into_iter().collect();
    };
    first_refusal(answers)?;
    let results = at_most_at_once(PARALLEL_BATCHES, batches.collect(), move |batch| {
        let client = client.clone();
        async move {
            match client.put_units(&batch).await {
                Ok(Some(answers)) => first_refusal(answers),
                Ok(None) => Err("fleetd stopped taking batches of units".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    results.into_iter().collect()
}

/// `units` cut into batches of at most [`UNITS_PER_BATCH`] units and about [`BATCH_BYTES`].
fn batches(units: Vec<Unit>) -> Vec<Vec<Unit>> {
    let mut batches: Vec<Vec<Unit>> = Vec::new();
    let mut bytes = 0;
    for unit in units {
        let size = serde_json::to_vec(&unit).map_or(0, |encoded| encoded.len());
        match batches.last_mut() {
            Some(batch) if batch.len() < UNITS_PER_BATCH && bytes + size <= BATCH_BYTES => {
                bytes += size;
                batch.push(unit);
            }
            _ => {
                bytes = size;
                batches.push(vec![unit]);
            }
        }
    }
    batches
}

/// The first unit of a batch that was not written, as a `PUT` of it alone would have failed.
fn first_refusal(answers: Vec<fleet_api_schema::UnitBatchResult>) -> Result<(), String> {
    match answers.into_iter().find(|answer| answer.code >= 400) {
        Some(refused) => {
            Err(fleet_client::ClientError::Api { code: refused.code, message: refused.message.unwrap_or_default() }
                .to_string())
        }
        None => Ok(()),
    }
}

/// The local content for `name`: its own file, else its template (registry first).
async fn local_content(
    argument: &str,
    name: &str,
    registry: &BTreeMap<String, Unit>,
    templates_on_disk: &mut HashMap<std::path::PathBuf, Option<UnitFile>>,
) -> Result<Option<UnitFile>, String> {
    if let Some(file) = read_unit_file(std::path::Path::new(argument))? {
        return Ok(Some(file));
    }
    let Some(template) = UnitNameInfo::new(name).template() else {
        return Ok(None);
    };
    if let Some(unit) = registry.get(&template) {
        return Ok(Some(unit_file(unit)));
    }
    let Some(path) = local_template_path(argument, name) else {
        return Ok(None);
    };
    if !templates_on_disk.contains_key(&path) {
        let file = read_unit_file(&path)?;
        templates_on_disk.insert(path.clone(), file);
    }
    Ok(templates_on_disk.get(&path).cloned().flatten())
}

/// What [`lazy_create`] does with a unit the registry holds in another version.
pub struct Replacing<'a> {
    /// Whether it replaces it (`--replace`).
    pub allowed: bool,
    /// The desired states in which it may.
    pub from: &'a [&'a str],
    /// The desired state the new version is written with: the command's own, so that a
    /// replacement is one write. The old version runs until the new one is asked for, and a
    /// command cut short leaves one of the two asked for, never a stopped unit.
    pub to: &'static str,
    /// Launched units get their new content in waves, as a rollout, instead of all at once.
    pub waves: Option<Waves>,
}

/// `start --replace --max-unavailable`: how a rollout of the replaced units moves.
#[derive(Clone, Debug)]
pub struct Waves {
    pub max_unavailable: String,
    pub min_ready_seconds: u64,
}

/// What [`lazy_create`] found and did.
pub struct Created {
    /// Every unit named, in argument order.
    pub names: Vec<String>,
    /// The units it wrote (created or replaced), as written: new units and replacements
    /// carry the command's desired state already, templates `inactive`.
    pub written: BTreeMap<String, Unit>,
    /// The rollout started for running units given new content in waves, if one was.
    pub rollout: Option<String>,
}

/// Makes sure every unit named by `arguments` exists in the cluster, replacing those that
/// differ when `replacing` allows. New units are written with the command's desired state
/// (`replacing.to`), so that creating and starting a unit is one write; each is announced
/// as the original announces a creation (`Unit X inactive`: what it is when written, before
/// any machine takes it).
pub async fn lazy_create(
    context: &Context,
    arguments: &[String],
    replacing: &Replacing<'_>,
) -> Result<Created, String> {
    let Creations { names, to_create, replaced, rolled, .. } = creations(context, arguments, replacing).await?;
    let written: BTreeMap<String, Unit> = to_create.iter().map(|unit| (unit.name.clone(), unit.clone())).collect();
    let announced: Vec<(String, bool)> = to_create
        .iter()
        .filter(|unit| !replaced.contains(&unit.name))
        .map(|unit| (unit.name.clone(), is_global(unit)))
        .collect();
    write_units(context, to_create).await?;
    let rollout = match replacing.waves.as_ref().filter(|_| !rolled.is_empty()) {
        Some(waves) => Some(roll_out(context, waves, rolled).await?),
        None => None,
    };
    // A global unit has no current state of its own: the original prints its name alone.
    for (name, global) in &announced {
        if *global {
            println!("Unit {name}");
        } else {
            println!("Unit {name} inactive");
        }
    }
    Ok(Created { names, written, rollout })
}

/// What [`lazy_create`] would write for `arguments`, worked out from the cluster and the local
/// files without writing anything (its warnings are printed as it goes).
pub struct Creations {
    /// Every unit named, in argument order.
    pub names: Vec<String>,
    /// The units to write (new, or replacements), with the command's desired state.
    pub to_create: Vec<Unit>,
    /// Those of `to_create` that replace a unit the cluster holds.
    pub replaced: BTreeSet<String>,
    /// Running units to be given new content in waves, by a rollout.
    pub rolled: BTreeMap<String, Vec<UnitOption>>,
    /// The named units (and their templates) as the cluster holds them.
    pub existing: BTreeMap<String, Unit>,
}

/// See [`Creations`].
pub async fn creations(
    context: &Context,
    arguments: &[String],
    replacing: &Replacing<'_>,
) -> Result<Creations, String> {
    let names: Vec<String> = arguments.iter().map(|argument| mangle(argument)).collect();
    for name in &names {
        validate_name(name).map_err(|error| error.to_string())?;
    }
    let mut wanted: BTreeSet<String> = names.iter().cloned().collect();
    wanted.extend(names.iter().filter_map(|name| UnitNameInfo::new(name).template()));
    let registry = fetch_units(context, &wanted).await?;
    let mut templates_on_disk = HashMap::new();
    let mut to_create: Vec<Unit> = Vec::new();
    let mut replaced = BTreeSet::new();
    let mut rolled: BTreeMap<String, Vec<UnitOption>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    // Each content is warned about once (the instances of one template share it).
    let mut warned = BTreeSet::new();
    for (argument, name) in arguments.iter().zip(&names) {
        if !seen.insert(name.clone()) {
            continue;
        }
        let path = with_default_unit_type(argument);
        let local = local_content(&path, name, &registry, &mut templates_on_disk).await?;
        if let Some(local) = &local
            && registry.get(name).is_none_or(|existing| unit_file(existing).hash() != local.hash())
            && warned.insert(local.hash())
        {
            warn_ignored_options(name, local);
        }
        if let Some(existing) = registry.get(name) {
            let Some(local) = local else { continue };
            let stored = unit_file(existing);
            if stored.hash() == local.hash() {
                if replacing.allowed {
                    println!("Found same Unit({name}) in Registry, nothing to do");
                }
                continue;
            }
            let desired = existing.desired_state.as_deref().unwrap_or("inactive");
            if !replacing.allowed {
                eprintln!(
                    "WARNING: Unit {name} in registry differs from local unit file {path}. Add --replace to override."
                );
            } else if replacing.waves.is_some() && desired == "launched" && !UnitNameInfo::new(name).is_template() {
                new_unit(name, &local)?;
                rolled.insert(name.clone(), schema_options(&local));
            } else if replacing.from.contains(&desired) {
                let unit = new_unit_as(name, &local, replacing.to)?;
                if unit.desired_state.as_deref() != Some("inactive") {
                    replaced.insert(name.clone());
                }
                to_create.push(unit);
            } else {
                eprintln!("Warning: can not replace Unit({name}) in state '{desired}', use the appropriate command");
            }
            continue;
        }
        let Some(local) = local else {
            return Err(format!("unable to find Unit({name}) in Registry or on filesystem"));
        };
        to_create.push(new_unit_as(name, &local, replacing.to)?);
    }
    Ok(Creations { names, to_create, replaced, rolled, existing: registry })
}

/// Starts a rollout that gives `files` (running units) their new content in `waves`; its name.
async fn roll_out(
    context: &Context,
    waves: &Waves,
    files: BTreeMap<String, Vec<UnitOption>>,
) -> Result<String, String> {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let name = format!("replace-{seconds}");
    let request = RolloutRequest {
        files,
        max_unavailable: waves.max_unavailable.clone(),
        min_ready_seconds: Some(waves.min_ready_seconds),
        ..RolloutRequest::default()
    };
    let rollout = context.client.start_rollout(&name, &request).await.map_err(|error| error.to_string())?;
    eprintln!(
        "Rollout {name} started: {} running units get their new content, at most {} down at once (see: fleetctl rollout status {name})",
        rollout.units.len(),
        rollout.max_unavailable
    );
    Ok(name)
}

/// A unit to write with `desired` as its desired state; a template is never asked to run, so
/// it is written `inactive`.
fn new_unit_as(name: &str, file: &UnitFile, desired: &str) -> Result<Unit, String> {
    let mut unit = new_unit(name, file)?;
    let desired = if UnitNameInfo::new(name).is_template() { "inactive" } else { desired };
    unit.desired_state = Some(desired.to_string());
    Ok(unit)
}

fn new_unit(name: &str, file: &UnitFile) -> Result<Unit, String> {
    let requirements = Requirements::from_unit(name, file);
    requirements.validate().map_err(|error| format!("unit {name}: {error}"))?;
    Ok(Unit { name: name.to_string(), options: schema_options(file), ..Unit::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, value_bytes: usize) -> Unit {
        let option = UnitOption { section: "Service".into(), name: "ExecStart".into(), value: "x".repeat(value_bytes) };
        Unit { name: name.into(), options: vec![option], ..Unit::default() }
    }

    #[test]
    fn batches_hold_at_most_a_thousand_units_and_about_half_a_mebibyte() {
        let small: Vec<Unit> = (0..2500).map(|index| unit(&format!("s{index}.service"), 10)).collect();
        let sizes: Vec<usize> = batches(small).iter().map(Vec::len).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        let large: Vec<Unit> = (0..10).map(|index| unit(&format!("l{index}.service"), 200 * 1024)).collect();
        let cut = batches(large);
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 2, 2, 2]);
        let names: Vec<String> = cut.into_iter().flatten().map(|unit| unit.name).collect();
        assert_eq!(names, (0..10).map(|index| format!("l{index}.service")).collect::<Vec<_>>(), "in order");
        assert!(batches(Vec::new()).is_empty());
    }
}
