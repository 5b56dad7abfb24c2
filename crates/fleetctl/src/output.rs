//! `-o json` and `-o wide`: what the list and status commands print for programs, in one
//! stable schema (documented in docs/json-output.md). Every object is built here from the
//! API's types, so that a field keeps its name whatever the API adds.

use std::collections::BTreeMap;

use serde::Serialize;

/// How a command prints what it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// The original's table (columns from --fields)
    #[default]
    Table,
    /// The table with every column the command knows
    Wide,
    /// One JSON array of objects (--fields does not apply)
    Json,
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputFlag {
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// A row of `list-machines -o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow<'a> {
    pub machine: &'a str,
    pub ip: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
    /// Units the cluster has on the machine.
    pub units: usize,
    /// `etcd`, `embedded` or `pull`; `None` from a fleetd that does not say.
    pub connection: Option<&'a str>,
    /// Whether the machine's engine leads the cluster.
    pub leader: bool,
    /// What units may reserve there in all; `None` from a machine that does not say.
    pub capacity: Option<fleet_api_schema::Capacity>,
    /// What the units there reserve.
    pub reserved: fleet_api_schema::Capacity,
    /// `draining` or `drained` while the machine is drained, else `null`.
    pub drain: Option<&'a str>,
    /// Its taints as written (`gpu=yes`, `db:evict`); empty when it has none.
    pub taints: &'a [String],
    /// Since when it is out of touch (RFC 3339), while units wait for it; `null` while present.
    pub out_of_touch_since: Option<&'a str>,
    /// The version of fleet its fleetd runs; `null` from a fleetd that does not say.
    pub version: Option<&'a str>,
}

/// A row of `list-unit-files -o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitFileRow<'a> {
    pub unit: &'a str,
    pub hash: String,
    pub description: Option<&'a str>,
    pub desired_state: Option<&'a str>,
    /// `null` for global units, which have no single state.
    pub current_state: Option<&'a str>,
    pub global: bool,
    /// The machine the unit is scheduled to (`null` when none, or global).
    pub machine: Option<&'a str>,
    pub machine_ip: Option<&'a str>,
    /// Why the unit waits unplaced, when it does.
    pub reason: Option<&'a str>,
    /// The git source that owns it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a str>,
    /// For a unit a source owns: why the cluster holds it otherwise than the source says, or
    /// `in sync`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<&'a str>,
    /// For a unit on a calendar: its `Schedule=`, normalized.
    pub schedule: Option<String>,
    /// For a unit on a calendar: when it next runs (`2026-12-05 01:00:00 UTC`, or `never`).
    pub next_elapse: Option<String>,
    /// `[X-Fleet] Priority=` (50 when it sets none).
    pub priority: u16,
    /// `[X-Fleet] DisruptionBudget=` (`1`, `25%`) and `DisruptionBudgetBy=`; `null` for none.
    pub disruption_budget: Option<BudgetJson>,
    /// `[X-Fleet] Requires=`, `After=`, `RequiresGrace=`, `RequiresChange=`; `null` for none.
    pub requires: Option<RequiresJson>,
    /// What it reserves, tolerates, how long its machine may be out of touch, whether it runs
    /// at most once, what its instances spread by (`Requirements::terms`); `[]` for none.
    pub terms: Vec<String>,
    /// Its current version (`fleetctl history`): 1 for a unit never changed.
    pub version: u64,
}

/// What a unit waits for, in `-o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequiresJson {
    pub requires: Vec<String>,
    pub after: Vec<String>,
    /// `RequiresGrace=` (`30s`); `null`: never stopped for what it requires.
    pub grace: Option<String>,
    /// `RequiresChange=`: `restart`, `reload` or `none`.
    pub on_change: &'static str,
}

impl RequiresJson {
    pub fn of(dependencies: &fleet_core::dependency::Dependencies) -> Option<Self> {
        use fleet_core::dependency::Kind;
        (!dependencies.is_empty()).then(|| Self {
            requires: dependencies.written(Kind::Requires),
            after: dependencies.written(Kind::After),
            grace: dependencies.grace.map(fleet_core::duration::short_span),
            on_change: dependencies.on_change.word(),
        })
    }
}

/// A unit's disruption budget in `-o json`.
#[derive(Debug, Serialize)]
pub struct BudgetJson {
    pub size: String,
    pub by: Option<String>,
}

impl BudgetJson {
    pub fn of(budget: &fleet_core::disruption_budget::DisruptionBudget) -> Self {
        Self { size: budget.size.to_string(), by: budget.by.clone() }
    }
}

/// A row of `list-units -o json`: one unit on one machine.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitRow<'a> {
    pub unit: &'a str,
    pub machine: &'a str,
    pub machine_ip: Option<&'a str>,
    pub hash: &'a str,
    pub load_state: &'a str,
    pub active_state: &'a str,
    pub sub_state: &'a str,
    /// How the unit drifted on its machine, when it did.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub drift: &'a str,
    /// What its health check says while it runs: `healthy`, `unhealthy` or `unknown`.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub health: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub health_failure: &'a str,
    /// Since when its machine is out of touch (RFC 3339): the unit waits for it, its state
    /// unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_touch_since: Option<&'a str>,
}

/// An element of `status -o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatus<'a> {
    pub unit: &'a str,
    pub description: Option<&'a str>,
    pub desired_state: Option<&'a str>,
    pub current_state: Option<&'a str>,
    pub global: bool,
    pub hash: String,
    /// Where the unit is, one element per machine that reported it.
    pub states: Vec<UnitRow<'a>>,
    /// The unit's recent log lines, from the machine serving the API, when it runs there.
    pub log: Vec<&'a str>,
    /// What in the unit file neither systemd nor fleet knows (`fleet_core::unknown_options`),
    /// and the metadata requirements it ignores for not being one `key=value`.
    pub unknown_options: Vec<String>,
}

/// Prints `rows` as one pretty JSON array and a newline.
pub fn print_json(rows: &impl Serialize) {
    match serde_json::to_string_pretty(rows) {
        Ok(text) => println!("{text}"),
        Err(error) => eprintln!("cannot write JSON: {error}"),
    }
}

/// Each unit of a rollout's plan and where the rollout would replace it: its place (from 1)
/// and whether it is the canary's.
pub type ReplacementOrder = std::collections::BTreeMap<String, (usize, bool)>;

/// `plan -o json`: the plan's index and its units, every field present (`null` for none).
#[derive(Debug, Serialize)]
pub struct PlanOutput<'a> {
    pub index: u64,
    pub units: Vec<PlanUnitRow<'a>>,
    /// `plan source sync`: the commit read, and what the sync would leave alone; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a fleet_api_schema::PlannedSync>,
}

/// A unit of `plan -o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanUnitRow<'a> {
    pub name: &'a str,
    pub action: &'a str,
    pub hash_before: Option<&'a str>,
    pub hash: Option<&'a str>,
    pub desired_state_before: Option<&'a str>,
    pub desired_state: Option<&'a str>,
    pub machine_before: Option<&'a str>,
    pub machine: Option<&'a str>,
    pub waiting: Option<&'a str>,
    /// A unit on a calendar or a batch unit: when it runs (placed only for a run).
    pub runs: Option<&'a str>,
    /// A running unit that waits for units the command takes down or moves: what it does.
    pub on_required: Option<&'a str>,
    /// `plan rollout`: where the rollout would replace it (from 1); null otherwise.
    pub order: Option<usize>,
    /// `plan rollout`: whether it is among the canary's units.
    pub canary: bool,
    /// Its version now and after (`fleetctl history`).
    pub version_before: Option<u64>,
    pub version: Option<u64>,
}

impl<'a> PlanOutput<'a> {
    pub fn of(plan: &'a fleet_api_schema::Plan, order: Option<&ReplacementOrder>) -> Self {
        let units = plan
            .units
            .iter()
            .map(|unit| PlanUnitRow {
                name: &unit.name,
                action: &unit.action,
                hash_before: unit.hash_before.as_deref(),
                hash: unit.hash.as_deref(),
                desired_state_before: unit.desired_state_before.as_deref(),
                desired_state: unit.desired_state.as_deref(),
                machine_before: unit.machine_before.as_deref(),
                machine: unit.machine.as_deref(),
                waiting: unit.waiting.as_deref(),
                runs: unit.runs.as_deref(),
                on_required: unit.on_required.as_deref(),
                order: order.and_then(|order| order.get(&unit.name)).map(|(place, _)| *place),
                canary: order.and_then(|order| order.get(&unit.name)).is_some_and(|(_, canary)| *canary),
                version_before: unit.version_before,
                version: unit.version,
            })
            .collect();
        Self { index: plan.index, units, source: plan.source.as_ref() }
    }
}

/// `import-original -o json`: whether it was written and every unit, every field present
/// (`null` for none).
#[derive(Debug, Serialize)]
pub struct ImportOutput<'a> {
    pub written: bool,
    pub units: Vec<ImportUnitRow<'a>>,
}

/// A unit of `import-original -o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportUnitRow<'a> {
    pub name: &'a str,
    pub action: &'a str,
    pub desired_state: &'a str,
    #[serde(rename = "machineID")]
    pub machine_id: Option<&'a str>,
    pub hash: Option<&'a str>,
    pub reason: Option<&'a str>,
}

impl<'a> ImportOutput<'a> {
    pub fn of(report: &'a fleet_api_schema::ImportReport) -> Self {
        let units = report
            .units
            .iter()
            .map(|unit| ImportUnitRow {
                name: &unit.name,
                action: &unit.action,
                desired_state: &unit.desired_state,
                machine_id: unit.machine_id.as_deref(),
                hash: unit.hash.as_deref(),
                reason: unit.reason.as_deref(),
            })
            .collect();
        Self { written: report.written, units }
    }
}
