//! Blocking until units reach a state, as the original's fleetctl does: one attempt is up
//! to 2 s of polling every 250 ms.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fleet_api_schema::Unit;

use crate::BlockFlags;
use crate::context::Context;
use crate::progress::{Progress, describe};
use crate::table::MachineLegends;

pub const POLL: Duration = Duration::from_millis(250);
pub const ATTEMPT: Duration = Duration::from_secs(2);
/// Past this many units, one listing is cheaper than a request per unit.
const LIST_THRESHOLD: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempts {
    NoBlock,
    Limited(u32),
    Forever,
}

impl Attempts {
    pub fn from_flags(block: &BlockFlags) -> Self {
        match (block.no_block, block.block_attempts) {
            (true, _) => Self::NoBlock,
            (false, 0) => Self::Forever,
            (false, n) => Self::Limited(n),
        }
    }

    pub fn from_count(count: u32) -> Self {
        if count == 0 { Self::Forever } else { Self::Limited(count) }
    }

    pub fn deadline(self) -> Option<Instant> {
        match self {
            Self::Limited(n) => Some(Instant::now() + ATTEMPT * n),
            Self::NoBlock => Some(Instant::now()),
            Self::Forever => None,
        }
    }
}

/// Reads the units named `names`, in one listing when there are many.
pub async fn fetch_units(context: &Context, names: &BTreeSet<String>) -> Result<BTreeMap<String, Unit>, String> {
    if names.len() > LIST_THRESHOLD {
        let units = context.client.units().await.map_err(|error| error.to_string())?;
        return Ok(units
            .into_iter()
            .filter(|unit| names.contains(&unit.name))
            .map(|unit| (unit.name.clone(), unit))
            .collect());
    }
    let mut found = BTreeMap::new();
    for name in names {
        if let Some(unit) = context.client.unit(name).await.map_err(|error| error.to_string())? {
            found.insert(name.clone(), unit);
        }
    }
    Ok(found)
}

/// Waits for each unit in `names` to report current state `target`, printing
/// `Unit X <state> on <machine>` as each does. On timeout, says which unit and why it could
/// not be placed, if the engine knows.
pub async fn wait_for_state(
    context: &Context,
    names: &[String],
    target: &str,
    attempts: Attempts,
) -> Result<(), String> {
    let deadline = attempts.deadline();
    let mut pending: Vec<String> = names.to_vec();
    let mut legends: Option<MachineLegends> = None;
    let progress = (attempts != Attempts::NoBlock).then(|| Progress::new(names.len(), target));
    // The reasons already shown above the progress line, by unit.
    let mut noted: BTreeMap<String, String> = BTreeMap::new();
    let say = |line: String| match &progress {
        Some(progress) => progress.println(&line),
        None => println!("{line}"),
    };
    loop {
        let wanted: BTreeSet<String> = pending.iter().cloned().collect();
        let units = fetch_units(context, &wanted).await?;
        let mut still = Vec::new();
        for name in pending {
            match units.get(&name) {
                Some(unit) if unit.current_state.as_deref() == Some(target) => {
                    let on = match &unit.machine_id {
                        Some(id) => {
                            // Read and sorted once: a wait for 100,000 units names a machine each.
                            if legends.is_none() {
                                legends = Some(MachineLegends::of(&context.machines().await));
                            }
                            let on = legends.as_ref().map(|legends| legends.full_legend(id, false)).unwrap_or_default();
                            format!(" on {on}")
                        }
                        None => String::new(),
                    };
                    say(format!("Unit {name} {target}{on}"));
                }
                _ => still.push(name),
            }
        }
        pending = still;
        if pending.is_empty() {
            return Ok(());
        }
        // Why a unit waits is said as soon as the engine says it, on a terminal or not (issue
        // 68: piped, a start of a unit that fits nowhere waited forever in silence).
        let unplaced: Vec<(&String, &str)> =
            pending.iter().filter_map(|name| Some((name, units.get(name)?.reason.as_deref()?))).collect();
        for (name, reason) in &unplaced {
            if noted.get(*name).map(String::as_str) != Some(*reason) {
                let line = format!("Unit {name} cannot be scheduled: {reason}");
                match &progress {
                    Some(progress) => progress.note(&line),
                    None => eprintln!("{line}"),
                }
                noted.insert((*name).clone(), reason.to_string());
            }
        }
        if let Some(progress) = &progress {
            let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
            for name in &pending {
                let state = units.get(name).and_then(|unit| unit.current_state.clone());
                *by_state.entry(state.unwrap_or_else(|| "not submitted".to_string())).or_default() += 1;
            }
            progress.update(names.len() - pending.len(), describe(target, &by_state, unplaced.len()));
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            let name = &pending[0];
            let mut message = format!("timed out waiting for unit {name} to report state {target}");
            // Why each unit still waiting cannot be placed, where the engine said and it was
            // not said already.
            for name in pending.iter().filter(|name| !noted.contains_key(*name)) {
                if let Some(reason) = units.get(name).and_then(|unit| unit.reason.as_deref()) {
                    message.push_str(&format!("\nUnit {name} cannot be scheduled: {reason}"));
                }
            }
            return Err(message);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until none of `names` exists any more.
pub async fn wait_for_gone(context: &Context, names: &[String], attempts: Attempts) -> Result<(), String> {
    let deadline = attempts.deadline();
    let wanted: BTreeSet<String> = names.iter().cloned().collect();
    let progress = (attempts != Attempts::NoBlock).then(|| Progress::new(names.len(), "destroyed"));
    loop {
        let left = fetch_units(context, &wanted).await?;
        if left.is_empty() {
            return Ok(());
        }
        if let Some(progress) = &progress {
            progress.update(names.len() - left.len(), format!("waiting for {} to go", left.len()));
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            let name = left.keys().next().cloned().unwrap_or_default();
            return Err(format!("timed out waiting for unit {name} to be destroyed"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// After `start`, checks for one attempt that systemd (or the native manager) reports each
/// unit loaded and active.
pub async fn wait_for_active(context: &Context, names: &[String]) -> Result<(), String> {
    let mut deadline = Instant::now() + ATTEMPT;
    let mut pending: BTreeSet<String> = names.iter().cloned().collect();
    loop {
        let states = context.client.unit_states(None).await.map_err(|error| error.to_string())?;
        let mut last_seen = BTreeMap::new();
        let mut active = Vec::new();
        for state in states.iter().filter(|state| pending.contains(&state.name)) {
            last_seen.insert(state.name.clone(), format!("{}/{}", state.systemd_active_state, state.systemd_sub_state));
            if state.systemd_load_state == "loaded" && state.systemd_active_state == "active" {
                active.push(state.name.clone());
            }
        }
        // The original gives all units one 2 s window; a machine starting a thousand units
        // at once takes longer than that for the last ones, so the window starts again while
        // units keep becoming active (for one unit, it is the original's window).
        if !active.is_empty() {
            deadline = Instant::now() + ATTEMPT;
        }
        for name in active {
            pending.remove(&name);
        }
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let name = pending.iter().next().cloned().unwrap_or_default();
            let seen = last_seen.get(&name).cloned().unwrap_or_else(|| "no state reported".to_string());
            return Err(format!(
                "Failed to find an active unit {name} within {}s, err: unit is {seen}",
                ATTEMPT.as_secs()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
