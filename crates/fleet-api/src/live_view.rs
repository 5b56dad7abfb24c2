//! The web view's live feed: one task reads the cluster while someone watches, turns it into
//! rows ([`cluster_view`]), and sends every watcher only the rows that changed ([`patch`]).
//! Both are pure functions over plain data; the task and the channel are the only I/O.

use fleet_core::unpoisoned::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_core::access::Role;
use fleet_core::civil_time::rfc3339_of_micros;
use fleet_core::job::runs::{JobRecord, Outcome};
use fleet_core::requirements::reservation_of;
use fleet_core::reserved::{UnitReservation, reserved_by_machine};
use fleet_core::{MachineState, Resources, UnitState};
use fleet_registry::{ApiRegistry, StoredJob, UnitView};
use serde::Serialize;
use tokio::sync::broadcast;

/// How often the store is asked whether it moved while someone watches, for what it does not
/// signal (machines); a change of units, placements or states is read as soon as its
/// [`ReadPace`] allows.
pub const READ_EVERY: Duration = Duration::from_millis(250);

/// How often reads of the cluster may come while someone watches: a change is read at once
/// (at least [`ReadPace::SHORTEST_GAP`] after the read before), until the reads have taken a
/// fifth of the time over the last [`ReadPace::BURST`]; then each waits four times as long as
/// the read before took. A unit started shows at once; a large cluster that changes all the
/// time costs the feed at most a fifth of a core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadPace {
    /// The time the reads so far would have waited at a fifth of a core, not yet paid back.
    owed: Duration,
}

impl ReadPace {
    pub const SHORTEST_GAP: Duration = Duration::from_millis(50);
    pub const BURST: Duration = Duration::from_secs(1);

    /// After a read that took `took`, begun `since` after the read before ended: how long to
    /// wait before the next.
    pub fn after_read(&mut self, took: Duration, since: Duration) -> Duration {
        self.owed = self.owed.saturating_sub(since) + took * 4;
        self.owed.saturating_sub(Self::BURST).max(Self::SHORTEST_GAP)
    }
}

/// A machine as the web view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow {
    pub id: String,
    pub ip: String,
    pub metadata: BTreeMap<String, String>,
    /// Units on the machine (its load).
    pub units: usize,
    /// What units may reserve there (`None`: the machine limits nothing)...
    pub capacity: Option<Resources>,
    /// ...and what they do.
    pub reserved: Resources,
    /// While the machine is drained: where its drain stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainCell>,
    /// Its taints as written (`gpu=yes`, `db:evict`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// Since when it is out of touch (RFC 3339), while units wait for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_touch_since: Option<String>,
    /// The version of fleet its fleetd runs, as it registered.
    pub version: String,
}

/// A drained machine's drain, as the web view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrainCell {
    /// `draining` or `drained`.
    pub state: &'static str,
    /// Units let go that do not run elsewhere yet, and units still to go.
    pub moving: usize,
    pub left: usize,
    /// Whether a disruption budget holds its next unit (which one is shown to those who see
    /// the unit, in the drain's status).
    pub held: bool,
}

/// A unit as the web view shows it: desired and current state, where it runs and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitRow {
    pub name: String,
    pub desired: &'static str,
    pub current: Option<&'static str>,
    pub global: bool,
    pub machine: Option<String>,
    /// systemd's active and sub state where it runs (the first machine, for a global unit).
    pub active: Option<String>,
    pub sub: Option<String>,
    /// Machines reporting it (more than one for a global unit).
    pub machines: usize,
    /// Why it waits unplaced.
    pub reason: Option<String>,
    /// What its health check says where it runs (`healthy`, `unhealthy: HTTP 500`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// A unit on a calendar or a batch unit: how its last run ended and what comes next
    /// (`last: succeeded (run 12); next 2026-12-05T02:00:00Z`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<String>,
    /// `[X-Fleet] Priority=` (the default where it sets none).
    pub priority: u16,
    /// `[X-Fleet] DisruptionBudget=` of its group, as `1` or `25% per zone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// What it waits for (`Requires=`, `After=`), as `db.service after:cache.service`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<String>,
    /// Its current version and who made it (`3 by token:ci`); `fleetctl history` lists them all.
    pub version: String,
    /// What it reserves, tolerates, how long its machine may be out of touch, whether it runs
    /// at most once, what its instances spread by (`Requirements::terms`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub terms: Vec<String>,
    /// What in its file nothing knows, or is ignored (as `fleetctl status` warns).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The content the row was drawn from (not shown).
    #[serde(skip)]
    pub hash: fleet_core::UnitHash,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub machines: BTreeMap<String, MachineRow>,
    pub units: BTreeMap<String, UnitRow>,
}

/// What changed between two views: rows to show (new or changed) and rows gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// A full view: the watcher drops what it had.
    pub reset: bool,
    pub machines: Vec<MachineRow>,
    pub machines_gone: Vec<String>,
    pub units: Vec<UnitRow>,
    pub units_gone: Vec<String>,
}

impl Patch {
    pub fn is_empty(&self) -> bool {
        !self.reset
            && self.machines.is_empty()
            && self.machines_gone.is_empty()
            && self.units.is_empty()
            && self.units_gone.is_empty()
    }

    /// The part of the patch `role` may see (an operator limited to some units sees those).
    pub fn visible_to(&self, role: &Role) -> Patch {
        Patch {
            reset: self.reset,
            machines: self.machines.clone(),
            machines_gone: self.machines_gone.clone(),
            units: self.units.iter().filter(|unit| role.sees_unit(&unit.name)).cloned().collect(),
            units_gone: self.units_gone.iter().filter(|name| role.sees_unit(name)).cloned().collect(),
        }
    }
}

/// The rows of what the store holds, at `now` (microseconds since the epoch: when units on a
/// calendar run next). What a row takes from its unit's content alone is kept from `previous`
/// where the unit's content is the same.
pub fn cluster_view(
    previous: &ClusterView,
    units: &[UnitView],
    states: &[UnitState],
    machines: &[MachineState],
    jobs: &[StoredJob],
    now: i64,
) -> ClusterView {
    let records: BTreeMap<&str, &JobRecord> =
        jobs.iter().map(|stored| (stored.unit.as_str(), &stored.record)).collect();
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    let mut by_unit: BTreeMap<&str, Vec<&UnitState>> = BTreeMap::new();
    for state in states {
        *load.entry(state.machine_id.as_str()).or_default() += 1;
        by_unit.entry(state.name.as_str()).or_default().push(state);
    }
    let reservations = units.iter().map(|unit| UnitReservation {
        name: &unit.name,
        reservation: reservation_of(unit.file.options()).unwrap_or_default(),
        global: unit.global,
        machine: unit.machine_id.as_deref(),
    });
    let reserved = reserved_by_machine(reservations, states.iter().map(|s| (s.name.as_str(), s.machine_id.as_str())));
    let machines = machines
        .iter()
        .map(|machine| {
            let row = MachineRow {
                id: machine.id.to_string(),
                ip: machine.public_ip.clone(),
                metadata: machine.metadata.clone(),
                taints: fleet_core::taint::written(&machine.taints),
                units: load.get(machine.id.as_str()).copied().unwrap_or(0),
                capacity: machine.capacity,
                reserved: reserved.get(machine.id.as_str()).copied().unwrap_or_default(),
                drain: machine.drain.as_ref().map(|drain| {
                    let concerned = fleet_registry::drain_units(units, states, &machine.id, drain);
                    let standing = fleet_core::drain::progress(drain, &machine.id, &concerned);
                    DrainCell {
                        state: standing.word(),
                        moving: standing.moving.len(),
                        left: standing.left.len(),
                        held: drain.held.is_some(),
                    }
                }),
                out_of_touch_since: None,
                version: machine.version.clone(),
            };
            (row.id.clone(), row)
        })
        .collect();
    let units = units
        .iter()
        .map(|unit| {
            let reported = by_unit.get(unit.name.as_str()).map_or(&[][..], Vec::as_slice);
            let here = match &unit.machine_id {
                Some(machine) => reported.iter().find(|state| &state.machine_id == machine),
                None => reported.first(),
            };
            // What the previous view read from the same content, reused.
            let (terms, warnings) = match previous.units.get(&unit.name).filter(|row| row.hash == unit.hash) {
                Some(row) => (row.terms.clone(), row.warnings.clone()),
                None => {
                    let requirements = fleet_core::Requirements::from_unit(&unit.name, &unit.file);
                    (requirements.terms(), fleet_core::unknown_options::warnings_read(&unit.file, &requirements))
                }
            };
            let row = UnitRow {
                name: unit.name.clone(),
                desired: unit.desired.as_str(),
                current: unit.current.map(|current| current.as_str()),
                global: unit.global,
                machine: unit.machine_id.clone(),
                active: here.map(|state| state.systemd.active.clone()),
                sub: here.map(|state| state.systemd.sub.clone()),
                machines: reported.len(),
                reason: unit.reason.clone(),
                health: here.and_then(|state| state.health.as_ref()).map(|health| health.describe()),
                runs: runs_cell(unit, records.get(unit.name.as_str()).copied(), now),
                priority: fleet_core::requirements::priority_of(unit.file.options())
                    .unwrap_or(fleet_core::requirements::DEFAULT_PRIORITY),
                budget: fleet_core::disruption_budget::budget_of(&unit.name, unit.file.options())
                    .ok()
                    .flatten()
                    .map(|budget| budget.short()),
                requires: fleet_core::dependency::dependencies_of(&unit.name, unit.file.options())
                    .ok()
                    .filter(|dependencies| !dependencies.is_empty())
                    .map(|dependencies| dependencies.short()),
                version: version_cell(&unit.versions),
                terms,
                warnings,
                hash: unit.hash,
            };
            (row.name.clone(), row)
        })
        .collect();
    ClusterView { machines, units }
}

/// A unit's current version as the web view shows it: `3 by token:ci`, or `1` when who made it
/// is unknown.
fn version_cell(versions: &fleet_core::unit_history::Versions) -> String {
    match versions.current.as_ref().filter(|stamp| !stamp.by.is_unknown()) {
        Some(stamp) => format!("{} by {}", stamp.version, stamp.by.describe()),
        None => versions.number().to_string(),
    }
}

/// `view` with the machines out of touch that units wait for: each a row of its own (as it
/// was last seen), and each unit that waits for one shown `unknown`.
pub fn with_out_of_touch(mut view: ClusterView, machines: &[fleet_core::OutOfTouch]) -> ClusterView {
    for machine in machines {
        if view.machines.contains_key(&machine.id) {
            continue;
        }
        let since = rfc3339_of_micros(machine.since);
        let last = machine.last.clone().unwrap_or_default();
        for unit in &machine.units {
            if let Some(row) = view.units.get_mut(unit).filter(|row| row.machine.as_ref() == Some(&machine.id)) {
                row.active = Some(crate::out_of_touch::UNKNOWN.to_string());
                row.sub = Some(format!("machine out of touch since {since}"));
            }
        }
        let row = MachineRow {
            id: machine.id.clone(),
            ip: last.public_ip,
            metadata: last.metadata,
            units: machine.units.len(),
            capacity: last.capacity,
            reserved: Resources::default(),
            drain: None,
            taints: fleet_core::taint::written(&last.taints),
            out_of_touch_since: Some(since),
            version: last.version,
        };
        view.machines.insert(machine.id.clone(), row);
    }
    view
}

/// What the runs column says of `unit`: nothing for a unit whose runs fleet does not keep.
fn runs_cell(unit: &UnitView, record: Option<&JobRecord>, now: i64) -> Option<String> {
    let job = fleet_core::job::job_of(&unit.name, unit.file.options()).ok().flatten()?;
    let mut parts = Vec::new();
    match record.and_then(|record| record.runs.last()) {
        Some(run) if run.tally.is_some() => {
            let tally = run.tally.as_deref().cloned().unwrap_or_default();
            parts.push(format!(
                "last: {} succeeded, {} failed (run {})",
                tally.succeeded,
                tally.failed + tally.lost,
                run.id
            ));
        }
        Some(run) => {
            let state = match (&run.outcome, run.started) {
                (Some(outcome), _) => outcome.word(),
                (None, Some(_)) => "running",
                (None, None) => "waiting",
            };
            let status = match &run.outcome {
                Some(Outcome::Failed { status: Some(status), .. }) => format!(" (status {status})"),
                Some(Outcome::Failed { signal: Some(signal), .. }) => format!(" ({signal})"),
                _ => String::new(),
            };
            let attempt = if run.attempt > 1 { format!(", attempt {}", run.attempt) } else { String::new() };
            parts.push(format!("last: {state}{status}{attempt} (run {})", run.id));
        }
        None => parts.push("no runs yet".to_string()),
    }
    let launched = unit.desired == fleet_core::DesiredState::Launched;
    if let Some(retry) = record.filter(|_| launched).and_then(|record| record.retry_due(&job)) {
        parts.push(format!("retry {}", rfc3339_of_micros(retry.0)));
    } else if let Some(next) = job.schedule.as_ref().filter(|_| launched).and_then(|spec| spec.next_after(now)) {
        parts.push(format!("next {}", rfc3339_of_micros(next)));
    }
    Some(parts.join("; "))
}

fn changed<T: Clone + PartialEq>(old: &BTreeMap<String, T>, new: &BTreeMap<String, T>) -> (Vec<T>, Vec<String>) {
    let shown = new.iter().filter(|(key, row)| old.get(*key) != Some(row)).map(|(_, row)| row.clone()).collect();
    let gone = old.keys().filter(|key| !new.contains_key(*key)).cloned().collect();
    (shown, gone)
}

/// The rows that changed from `old` to `new`.
pub fn patch(old: &ClusterView, new: &ClusterView) -> Patch {
    let (machines, machines_gone) = changed(&old.machines, &new.machines);
    let (units, units_gone) = changed(&old.units, &new.units);
    Patch { reset: false, machines, machines_gone, units, units_gone }
}

/// All of `view`, as the first message a watcher gets.
pub fn reset(view: &ClusterView) -> Patch {
    Patch {
        reset: true,
        machines: view.machines.values().cloned().collect(),
        units: view.units.values().cloned().collect(),
        ..Patch::default()
    }
}

/// Reads the cluster into rows, reusing what `previous` drew from the same contents.
pub async fn read_view(
    registry: &dyn ApiRegistry,
    previous: &ClusterView,
) -> Result<ClusterView, fleet_registry::RegistryError> {
    let (units, states, machines, jobs, out_of_touch) = tokio::try_join!(
        registry.units(),
        registry.unit_states(),
        registry.machines(),
        registry.all_job_records(),
        registry.machines_out_of_touch()
    )?;
    let view = cluster_view(previous, &units, &states, &machines, &jobs, fleet_runtime::wall_clock::now_micros());
    Ok(with_out_of_touch(view, &out_of_touch))
}

/// The feed: one reader task for every watcher, running only while there are watchers.
pub struct LiveView {
    patches: broadcast::Sender<Arc<Patch>>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Default for LiveView {
    fn default() -> Self {
        Self { patches: broadcast::channel(64).0, reader: Mutex::new(None) }
    }
}

impl LiveView {
    /// Starts watching: the current view, then every patch. Starts the reader if it is not
    /// running.
    pub async fn watch(
        &self,
        registry: Arc<dyn ApiRegistry>,
    ) -> Result<(ClusterView, broadcast::Receiver<Arc<Patch>>), fleet_registry::RegistryError> {
        let receiver = self.patches.subscribe();
        let view = read_view(registry.as_ref(), &ClusterView::default()).await?;
        let mut reader = self.reader.locked();
        if reader.as_ref().is_none_or(|task| task.is_finished()) {
            *reader = Some(tokio::spawn(read_while_watched(registry, self.patches.clone(), view.clone())));
        }
        Ok((view, receiver))
    }
}

/// Reads the cluster again when its units change, or when the store moved at a look every
/// [`READ_EVERY`] (or cannot tell), as soon as its [`ReadPace`] allows, and
/// sends what changed, until nobody watches. A unit's row shows soon after its state lands:
/// on a fixed beat, a state that landed just past one waited for the next.
async fn read_while_watched(
    registry: Arc<dyn ApiRegistry>,
    patches: broadcast::Sender<Arc<Patch>>,
    mut last: ClusterView,
) {
    let mut seen: Option<u64> = None;
    let mut unit_changes = Some(registry.unit_changes());
    let mut pace = ReadPace::default();
    let mut last_end = tokio::time::Instant::now();
    let mut next_read = last_end;
    while patches.receiver_count() > 0 {
        let changed = async {
            match unit_changes.as_mut() {
                Some(changes) => changes.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let moved = tokio::select! {
            () = tokio::time::sleep(READ_EVERY) => false,
            followed = changed => {
                if !followed {
                    // The store stopped signalling: the beat alone.
                    unit_changes = None;
                    continue;
                }
                true
            }
        };
        tokio::time::sleep_until(next_read).await;
        if let Some(changes) = unit_changes.as_mut() {
            changes.borrow_and_update();
        }
        let revision = registry.revision().await.ok().flatten();
        if !moved && revision.is_some() && revision == seen {
            continue;
        }
        let started = tokio::time::Instant::now();
        match read_view(registry.as_ref(), &last).await {
            Ok(view) => {
                let changes = patch(&last, &view);
                if !changes.is_empty() {
                    let _ = patches.send(Arc::new(changes));
                }
                last = view;
                seen = revision;
            }
            Err(error) => tracing::debug!(%error, "the web view could not read the cluster"),
        }
        let now = tokio::time::Instant::now();
        next_read = now + pace.after_read(now - started, started - last_end);
        last_end = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::state::{DesiredState, SystemdState};
    use fleet_core::unit_file::UnitFile;

    fn unit(name: &str, machine: Option<&str>, reason: Option<&str>) -> UnitView {
        let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n").expect("valid unit");
        UnitView {
            name: name.into(),
            hash: file.hash(),
            file,
            desired: DesiredState::Launched,
            current: None,
            machine_id: machine.map(str::to_string),
            global: false,
            reason: reason.map(str::to_string),
            source: None,
            drift: Default::default(),
            secrets: Default::default(),
            versions: Default::default(),
        }
    }

    fn state(name: &str, machine: &str, active: &str) -> UnitState {
        UnitState {
            run: None,
            name: name.into(),
            machine_id: machine.into(),
            hash: unit(name, None, None).hash,
            systemd: SystemdState::new("loaded", active, "running"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
        }
    }

    fn machine(id: &str) -> MachineState {
        MachineState { id: id.into(), public_ip: "10.0.0.1".into(), ..MachineState::default() }
    }

    #[test]
    fn reads_come_at_once_until_they_took_a_fifth_of_the_time_then_four_times_apart() {
        let mut pace = ReadPace::default();
        let (took, ms) = (Duration::from_millis(40), Duration::from_millis);
        // Sporadic changes: each read as soon as may be.
        assert_eq!(pace.after_read(took, ms(2_000)), ReadPace::SHORTEST_GAP);
        assert_eq!(pace.after_read(took, ms(50)), ReadPace::SHORTEST_GAP);
        // A cluster changing all the time: once a second's worth is owed, four times the read.
        let mut gaps = Vec::new();
        for _ in 0..40 {
            let since = *gaps.last().unwrap_or(&ReadPace::SHORTEST_GAP);
            gaps.push(pace.after_read(took, since));
        }
        assert_eq!(gaps.last(), Some(&(took * 4)), "{gaps:?}");
        // Quiet for a while: at once again.
        assert_eq!(pace.after_read(took, ms(5_000)), ReadPace::SHORTEST_GAP);
    }

    #[test]
    fn rows_say_where_units_run_and_why_others_wait() {
        let view = cluster_view(
            &ClusterView::default(),
            &[unit("a.service", Some("m1"), None), unit("b.service", None, Some("no machine has region=x"))],
            &[state("a.service", "m1", "active")],
            &[machine("m1"), machine("m2")],
            &[],
            0,
        );
        assert_eq!(view.machines["m1"].units, 1);
        assert_eq!(view.machines["m2"].units, 0);
        assert_eq!(view.units["a.service"].active.as_deref(), Some("active"));
        assert_eq!(view.units["b.service"].reason.as_deref(), Some("no machine has region=x"));
        assert_eq!(view.units["b.service"].active, None);
    }

    #[test]
    fn a_machine_out_of_touch_has_a_row_and_its_waiting_units_show_unknown() {
        let units = [
            unit("db.service", Some("m2"), Some("machine m2 out of touch since …")),
            unit("a.service", Some("m1"), None),
        ];
        let view = cluster_view(
            &ClusterView::default(),
            &units,
            &[state("a.service", "m1", "active")],
            &[machine("m1")],
            &[],
            0,
        );
        let gone = fleet_core::OutOfTouch {
            id: "m2".into(),
            since: 1_764_936_184_000_000,
            last: Some(MachineState { public_ip: "10.0.0.2".into(), ..machine("m2") }),
            units: vec!["db.service".into()],
        };
        let back = fleet_core::OutOfTouch { id: "m1".into(), units: vec!["a.service".into()], ..gone.clone() };
        let view = with_out_of_touch(view, &[gone, back]);
        let row = &view.machines["m2"];
        assert_eq!((row.ip.as_str(), row.units), ("10.0.0.2", 1));
        assert_eq!(row.out_of_touch_since.as_deref(), Some("2025-12-05T12:03:04Z"));
        assert_eq!(view.units["db.service"].active.as_deref(), Some("unknown"));
        assert_eq!(view.units["db.service"].sub.as_deref(), Some("machine out of touch since 2025-12-05T12:03:04Z"));
        assert_eq!(view.machines["m1"].out_of_touch_since, None, "present again: its own row stands");
        assert_eq!(view.units["a.service"].active.as_deref(), Some("active"));
    }

    #[test]
    fn a_checked_unit_shows_its_health_where_it_runs() {
        let unhealthy = fleet_core::health::HealthReport {
            status: fleet_core::health::HealthStatus::Unhealthy,
            failure: "HTTP 500".into(),
            ..Default::default()
        };
        let checked = UnitState { health: Some(unhealthy), ..state("a.service", "m1", "active") };
        let view = cluster_view(
            &ClusterView::default(),
            &[unit("a.service", Some("m1"), None)],
            &[checked],
            &[machine("m1")],
            &[],
            0,
        );
        assert_eq!(view.units["a.service"].health.as_deref(), Some("unhealthy: HTTP 500"));
        let plain = cluster_view(
            &ClusterView::default(),
            &[unit("a.service", Some("m1"), None)],
            &[state("a.service", "m1", "active")],
            &[],
            &[],
            0,
        );
        assert_eq!(plain.units["a.service"].health, None, "no check, no health");
    }

    #[test]
    fn a_unit_shows_the_terms_no_other_column_shows() {
        let file = UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nAtMostOnce=true\nTolerate=gpu\n")
            .expect("valid unit");
        let picky = UnitView { hash: file.hash(), file, ..unit("picky.service", None, None) };
        let view = cluster_view(&ClusterView::default(), &[picky, unit("plain.service", None, None)], &[], &[], &[], 0);
        assert_eq!(view.units["picky.service"].terms, ["tolerates gpu", "at most once"]);
        assert!(view.units["plain.service"].terms.is_empty());
    }

    #[test]
    fn a_unit_whose_file_has_what_nothing_knows_carries_the_warnings() {
        let file = UnitFile::parse("[Service]\nExecStart=/bin/true\nRestrt=always\n").expect("valid unit");
        let typo = UnitView { hash: file.hash(), file, ..unit("typo.service", None, None) };
        let view = cluster_view(&ClusterView::default(), &[typo, unit("clean.service", None, None)], &[], &[], &[], 0);
        assert_eq!(
            view.units["typo.service"].warnings,
            ["unknown option Restrt= in [Service], which systemd ignores; did you mean Restart=?"]
        );
        assert!(view.units["clean.service"].warnings.is_empty());
        let row = serde_json::to_value(&view.units["clean.service"]).expect("a row");
        assert!(row.get("warnings").is_none(), "a row without warnings carries no field");
        // Read again, a row of the same content keeps what the previous view found in it;
        // new content is read again.
        let mut previous = view.clone();
        previous.units.get_mut("clean.service").expect("a row").warnings = vec!["kept".into()];
        let again = cluster_view(&previous, &[unit("clean.service", None, None)], &[], &[], &[], 0);
        assert_eq!(again.units["clean.service"].warnings, ["kept"]);
        let changed = UnitFile::parse("[Service]\nExecStart=/bin/false\n").expect("valid unit");
        let changed = UnitView { hash: changed.hash(), file: changed, ..unit("clean.service", None, None) };
        let again = cluster_view(&previous, &[changed], &[], &[], &[], 0);
        assert!(again.units["clean.service"].warnings.is_empty());
    }

    #[test]
    fn a_drained_machine_says_how_its_drain_stands() {
        let mut drained = machine("m1");
        drained.drain = Some(fleet_core::drain::Drain::new(fleet_core::rollout::MaxUnavailable::Count(1), 0));
        let units = [unit("a.service", Some("m1"), None), unit("b.service", Some("m2"), None)];
        let view = cluster_view(
            &ClusterView::default(),
            &units,
            &[state("a.service", "m1", "active")],
            &[drained.clone(), machine("m2")],
            &[],
            0,
        );
        assert_eq!(view.machines["m1"].drain, Some(DrainCell { state: "draining", moving: 0, left: 1, held: false }));
        assert_eq!(view.machines["m2"].drain, None);
        let moved = [unit("a.service", Some("m2"), None), unit("b.service", Some("m2"), None)];
        let view = cluster_view(&ClusterView::default(), &moved, &[], &[drained, machine("m2")], &[], 0);
        assert_eq!(view.machines["m1"].drain, Some(DrainCell { state: "drained", moving: 0, left: 0, held: false }));
    }

    #[test]
    fn a_patch_carries_only_what_changed_and_applies_to_the_new_view() {
        let machines = [machine("m1")];
        let before = cluster_view(
            &ClusterView::default(),
            &[unit("a.service", Some("m1"), None), unit("b.service", Some("m1"), None)],
            &[state("a.service", "m1", "activating"), state("b.service", "m1", "active")],
            &machines,
            &[],
            0,
        );
        let after = cluster_view(
            &ClusterView::default(),
            &[unit("a.service", Some("m1"), None), unit("c.service", None, None)],
            &[state("a.service", "m1", "active")],
            &machines,
            &[],
            0,
        );
        let changes = patch(&before, &after);
        let names: Vec<&str> = changes.units.iter().map(|unit| unit.name.as_str()).collect();
        assert_eq!(names, ["a.service", "c.service"]);
        assert_eq!(changes.units_gone, ["b.service"]);
        assert_eq!(changes.machines.len(), 1, "m1's load changed");
        assert!(patch(&after, &after).is_empty());
        let scoped = changes.visible_to(&Role::parse("operator", Some("a*")).expect("role"));
        assert_eq!(scoped.units.len(), 1);
        assert!(scoped.units_gone.is_empty());
    }

    #[test]
    fn a_unit_whose_runs_are_kept_shows_its_last_run_and_what_comes_next() {
        const SECOND: i64 = 1_000_000;
        const START: i64 = 1_796_342_400 * SECOND;
        let with = |text: &str| {
            let mut unit = unit("backup.service", None, None);
            unit.file = UnitFile::parse(text).expect("valid unit");
            unit
        };
        let calendar = with("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=*:0/15\n");
        let view = cluster_view(&ClusterView::default(), std::slice::from_ref(&calendar), &[], &[], &[], START);
        assert_eq!(view.units["backup.service"].runs.as_deref(), Some("no runs yet; next 2026-12-04T00:15:00Z"));
        let job = fleet_core::job::job_of("backup.service", calendar.file.options()).unwrap().unwrap();
        let mut record = fleet_core::job::runs::advance(&job, &JobRecord::new(START), START + 901 * SECOND, 20).record;
        let run = record.runs.last_mut().expect("a run");
        run.outcome = Some(Outcome::Failed { status: Some(3), signal: None });
        run.ended = Some(START + 950 * SECOND);
        run.released = true;
        let stored = StoredJob { unit: "backup.service".into(), record, version: 1 };
        let view = cluster_view(
            &ClusterView::default(),
            &[calendar],
            &[],
            &[],
            std::slice::from_ref(&stored),
            START + 960 * SECOND,
        );
        assert_eq!(
            view.units["backup.service"].runs.as_deref(),
            Some("last: failed (status 3) (run 1); next 2026-12-04T00:30:00Z")
        );
        let batch = with("[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nBatch=true\nRetries=1\n");
        let view = cluster_view(
            &ClusterView::default(),
            &[batch],
            &[],
            &[],
            std::slice::from_ref(&stored),
            START + 960 * SECOND,
        );
        assert_eq!(
            view.units["backup.service"].runs.as_deref(),
            Some("last: failed (status 3) (run 1); retry 2026-12-04T00:16:00Z")
        );
        // A service that moves when it fails shows its stays the same way.
        let moving = with("[Service]\nExecStart=/bin/web\n[X-Fleet]\nRetries=2\n");
        let view = cluster_view(&ClusterView::default(), &[moving], &[], &[], &[stored], START + 960 * SECOND);
        assert_eq!(
            view.units["backup.service"].runs.as_deref(),
            Some("last: failed (status 3) (run 1); retry 2026-12-04T00:16:00Z")
        );
        assert_eq!(
            cluster_view(&ClusterView::default(), &[unit("web.service", None, None)], &[], &[], &[], START).units["web.service"].runs,
            None
        );
    }
}
