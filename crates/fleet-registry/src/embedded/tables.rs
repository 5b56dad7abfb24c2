//! The embedded store's tables and how records are encoded in them.

use std::collections::BTreeMap;

use fleet_core::{DesiredState, UnitHash, UnitOption};
use redb::{ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::RegistryError;

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
/// `unit\0machine` → [`fleet_core::UnitState`].
pub const STATES: TableDefinition<&str, &[u8]> = TableDefinition::new("states");

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UnitRecord {
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub global: bool,
}

pub type Options = Vec<UnitOption>;
pub type MetadataOverrides = BTreeMap<String, String>;

pub fn state_key(unit: &str, machine: &str) -> String {
    format!("{unit}\0{machine}")
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("registry records always serialise")
}

pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, RegistryError> {
    serde_json::from_slice(bytes)
        .map_err(|error| RegistryError::Corrupt { key: key.to_string(), reason: error.to_string() })
}

/// Reads and decodes every row of a table whose values are JSON.
pub fn read_all<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<(String, T)>, RegistryError> {
    let mut rows = Vec::new();
    for row in table.iter().map_err(super::unavailable)? {
        let (key, value) = row.map_err(super::unavailable)?;
        let key = key.value().to_string();
        let decoded = decode(&key, value.value())?;
        rows.push((key, decoded));
    }
    Ok(rows)
}
