//! The embedded store's tables and how records are encoded in them.

use redb::{ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;

use fleet_registry::RegistryError;

/// Unit name → [`UnitRecord`].
pub const UNITS: TableDefinition<&str, &[u8]> = TableDefinition::new("units");
/// Unit hash (hex) → the unit's options; written once, dropped when no unit refers to it.
pub const BODIES: TableDefinition<&str, &[u8]> = TableDefinition::new("bodies");
/// Unit hash (hex) → how many units refer to that body.
pub const BODY_REFS: TableDefinition<&str, u64> = TableDefinition::new("body_refs");
/// Unit name → machine ID it is scheduled on.
pub const SCHEDULE: TableDefinition<&str, &str> = TableDefinition::new("schedule");
/// Unit name → why the engine could not place it.
pub const REASONS: TableDefinition<&str, &str> = TableDefinition::new("reasons");
/// Machine ID → configured [`fleet_core::MachineState`].
pub const MACHINES: TableDefinition<&str, &[u8]> = TableDefinition::new("machines");
/// Machine ID → runtime metadata changes (empty value = removed key).
pub const METADATA: TableDefinition<&str, &[u8]> = TableDefinition::new("metadata");
/// Machine ID → its [`fleet_core::drain::Drain`], while it is drained.
pub const DRAINS: TableDefinition<&str, &[u8]> = TableDefinition::new("drains");
/// Registration token name → [`fleet_registry::RegistrationRecord`].
pub const REGISTRATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("registrations");
/// Machine ID → [`fleet_registry::RevokedMachine`].
pub const REVOKED: TableDefinition<&str, &[u8]> = TableDefinition::new("revoked_machines");
/// Machine ID → [`fleet_registry::MachineIdentity`] (a pull agent's key and grants).
pub const IDENTITIES: TableDefinition<&str, &[u8]> = TableDefinition::new("machine_identities");
/// Token name → [`fleet_registry::TokenRecord`].
pub const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
/// Source name → [`fleet_registry::SourceRecord`].
pub const SOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("sources");
/// Rollout name → [`fleet_registry::RolloutRecord`].
pub const ROLLOUTS: TableDefinition<&str, &[u8]> = TableDefinition::new("rollouts");
/// Secret name → [`fleet_registry::SecretRecord`] (its value sealed).
pub const SECRETS: TableDefinition<&str, &[u8]> = TableDefinition::new("secrets");
/// Source name → [`fleet_registry::SourceStatus`].
pub const SOURCE_STATUSES: TableDefinition<&str, &[u8]> = TableDefinition::new("source_statuses");

/// Whether `table` holds sources, their statuses or rollouts: what `source_changes` signals.
pub fn holds_sources(table: TableDefinition<&str, &[u8]>) -> bool {
    use redb::TableHandle;
    [SOURCES, SOURCE_STATUSES, ROLLOUTS].iter().any(|held| held.name() == table.name())
}
/// `unit\0machine` → [`fleet_core::UnitState`].
pub const STATES: TableDefinition<&str, &[u8]> = TableDefinition::new("states");

pub use fleet_registry::UnitRecord;

pub fn state_key(unit: &str, machine: &str) -> String {
    format!("{unit}\0{machine}")
}

/// The unit and machine of a [`state_key`].
pub fn split_state_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('\0')
}

pub use fleet_registry::codec::{MetadataOverrides, Options, decode, encode};

/// Reads and decodes every row of a table whose values are JSON. A row that cannot be read
/// is reported and left out: it hides itself, not the table.
pub fn read_all<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<(String, T)>, RegistryError> {
    let mut rows = Vec::new();
    for row in table.iter().map_err(super::unavailable)? {
        let (key, value) = row.map_err(super::unavailable)?;
        let key = key.value().to_string();
        if let Some(decoded) = fleet_registry::codec::decode_listed(&key, value.value()) {
            rows.push((key, decoded));
        }
    }
    Ok(rows)
}

/// `format` → [`fleet_core::store_format::StoredFormat`]: the store's layout (none in a store
/// written by fleet 0.1).
pub const STORE_FORMAT: TableDefinition<&str, &[u8]> = TableDefinition::new("store_format");

/// Every table of JSON records a store opens with (the format's table aside, which only a
/// fleetd that checked the format writes).
pub const RECORDS: [TableDefinition<&str, &[u8]>; 13] = [
    UNITS,
    BODIES,
    MACHINES,
    METADATA,
    DRAINS,
    STATES,
    TOKENS,
    REGISTRATIONS,
    REVOKED,
    IDENTITIES,
    SOURCES,
    SOURCE_STATUSES,
    ROLLOUTS,
];

/// Tables of JSON records added to format 1 since 0.2.0 began it: a store opens with them too
/// (a store without one is given it), a backup holds them, and a snapshot taken before they
/// were added restores without them.
pub const ADDED_RECORDS: [TableDefinition<&str, &[u8]>; 6] =
    [SECRETS, JOBS, RUN_TICKETS, OUT_OF_TOUCH, SILENT_DEPARTURES, REQUIRED_PLACES];

/// Unit name → [`fleet_registry::RequiredPlaces`]: where what each placed unit with
/// `Requires=` or `After=` requires runs, as the engine recorded it.
pub const REQUIRED_PLACES: TableDefinition<&str, &[u8]> = TableDefinition::new("required_places");

/// Unit name → [`fleet_registry::SilentDeparture`]: the units taken off a present machine that
/// had not reported them, as the engine recorded them.
pub const SILENT_DEPARTURES: TableDefinition<&str, &[u8]> = TableDefinition::new("silent_departures");

/// Machine ID → [`fleet_core::OutOfTouch`]: the machines gone that units wait for, as the
/// engine recorded them.
pub const OUT_OF_TOUCH: TableDefinition<&str, &[u8]> = TableDefinition::new("out_of_touch");

/// Unit name → [`fleet_core::job::global_runs::RunTicket`]: the run every machine of a global
/// unit on a calendar is to run now.
pub const RUN_TICKETS: TableDefinition<&str, &[u8]> = TableDefinition::new("run_tickets");

/// Unit name → [`StoredJobValue`]: the runs of a scheduled or run-to-completion unit.
pub const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");

/// A job record with the version its compare-and-swap names.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct StoredJobValue {
    pub version: u64,
    pub record: fleet_core::job::runs::JobRecord,
}

/// Every table of text values.
pub const TEXTS: [TableDefinition<&str, &str>; 2] = [SCHEDULE, REASONS];

/// The names of the tables every store of format 1 has ([`RECORDS`], [`TEXTS`], [`BODY_REFS`]):
/// what a snapshot must hold.
pub fn required_names() -> impl Iterator<Item = &'static str> {
    use redb::TableHandle;
    RECORDS.iter().map(|table| table.name()).chain(TEXTS.iter().map(|table| table.name())).chain([BODY_REFS.name()])
}

/// The names of every table a store opens with: [`required_names`] and [`ADDED_RECORDS`].
pub fn opened_names() -> impl Iterator<Item = &'static str> {
    use redb::TableHandle;
    required_names().chain(ADDED_RECORDS.iter().map(|table| table.name()))
}
