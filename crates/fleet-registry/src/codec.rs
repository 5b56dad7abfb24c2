//! How every store encodes its records: JSON, with a decode error that names the key.

use std::collections::BTreeMap;

use fleet_core::UnitOption;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::RegistryError;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("registry records always serialise")
}

pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, RegistryError> {
    serde_json::from_slice(bytes)
        .map_err(|error| RegistryError::Corrupt { key: key.to_string(), reason: error.to_string() })
}

/// Decodes one record of a listing. A record that cannot be read is reported (with its key)
/// and left out, so one bad record hides itself, not the whole listing or the engine.
pub fn decode_listed<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Option<T> {
    match decode(key, bytes) {
        Ok(value) => Some(value),
        Err(error) => {
            tracing::error!(%error, "skipping a record that cannot be read");
            None
        }
    }
}

/// A machine record with its runtime metadata overrides applied and its drain, if it has one:
/// the one reading of a machine, for every store and facet (each record given with its key).
/// A machine record that cannot be read is skipped, overrides or a drain that cannot be read
/// are ignored, each reported with its key.
pub fn machine_from_records(
    machine_key: &str,
    machine: &[u8],
    overrides: Option<(&str, &[u8])>,
    drain: Option<(&str, &[u8])>,
) -> Option<fleet_core::MachineState> {
    let machine: fleet_core::MachineState = decode_listed(machine_key, machine)?;
    let overrides: MetadataOverrides = overrides.and_then(|(key, bytes)| decode_listed(key, bytes)).unwrap_or_default();
    let mut machine = machine.with_overrides(&overrides);
    machine.drain = drain.and_then(|(key, bytes)| decode_listed(key, bytes));
    Some(machine)
}

/// A unit body as stored: its options, in order.
pub type Options = Vec<UnitOption>;
/// A machine's runtime metadata changes: key → value, an empty value removing the key.
pub type MetadataOverrides = BTreeMap<String, String>;

/// The registration token among `records` whose hash is `sha256`, compared in constant time
/// against every one (no early exit).
pub fn find_registration<K>(
    records: Vec<(K, crate::RegistrationRecord)>,
    sha256: &str,
) -> Option<(K, crate::RegistrationRecord)> {
    fleet_core::secret::find_by_hash(records, sha256, |(_, record)| record.sha256.as_str())
}
