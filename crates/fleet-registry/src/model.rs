//! The plain records the registry hands out.

use std::collections::BTreeMap;

use fleet_core::drift::DriftPolicy;
use fleet_core::schedule::SnapshotUnit;
use fleet_core::secrets::SecretPins;
use fleet_core::state::TargetReport;
use fleet_core::unit_history::{Before, Versions, Write};
use fleet_core::{CurrentState, DesiredState, MachineState, UnitFile, UnitHash, UnitState};
use serde::{Deserialize, Serialize};

/// A unit as the stores keep it: its body's hash, its desired state and whether it is global
/// (so that agents can find the global units without reading every body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitRecord {
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub global: bool,
    /// The source that made the unit and owns it; absent for a unit made by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// What machines do when the unit drifts there (its writer's policy).
    #[serde(default, skip_serializing_if = "DriftPolicy::is_default")]
    pub drift: DriftPolicy,
    /// The versions of its secrets it runs with, where not the newest (a rotation under way).
    #[serde(default, skip_serializing_if = "SecretPins::is_empty")]
    pub secrets: SecretPins,
    /// Its versions: when and by whom the current one was made, and the ones kept before it.
    #[serde(default, skip_serializing_if = "Versions::is_empty")]
    pub versions: Versions,
}

impl UnitRecord {
    /// The record of a unit made by hand with content `hash`, wanted `desired`: not global,
    /// no secret pins, no versions kept yet.
    pub fn by_hand(hash: UnitHash, desired: DesiredState) -> Self {
        Self {
            hash,
            desired,
            global: false,
            source: None,
            drift: DriftPolicy::default(),
            secrets: SecretPins::default(),
            versions: Versions::default(),
        }
    }

    /// The versions of a unit after `writer` writes `hash` with `desired` over `before` (`None`:
    /// it creates the unit) now, keeping `kept` past versions.
    pub fn versions_after(
        before: Option<&UnitRecord>,
        hash: UnitHash,
        desired: DesiredState,
        writer: &crate::Writer,
        kept: usize,
    ) -> Versions {
        let before =
            before.map(|record| Before { hash: record.hash, desired: record.desired, versions: &record.versions });
        let write = Write { hash, desired, at: now_in_seconds(), by: writer.changed_by() };
        Versions::after(before, write, kept)
    }

    /// Every content the unit refers to: what it runs and what its kept versions name.
    pub fn contents(&self) -> std::collections::BTreeSet<UnitHash> {
        self.versions.contents_with(self.hash)
    }
}

/// Seconds since the Unix epoch by this machine's clock (0 for a clock set before it).
pub fn now_in_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
}

/// A unit as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitView {
    pub name: String,
    pub file: UnitFile,
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// `None` for global units, which have no single current state.
    pub current: Option<CurrentState>,
    pub machine_id: Option<String>,
    pub global: bool,
    /// Why the engine could not place the unit, when it could not.
    pub reason: Option<String>,
    /// The source that owns the unit; `None`: made by hand.
    pub source: Option<String>,
    pub drift: DriftPolicy,
    pub secrets: SecretPins,
    pub versions: Versions,
}

impl UnitView {
    /// A unit as the API shows it, from what a store keeps: the current state is derived
    /// from the schedule and the state the target machine reported for this version of the
    /// unit (none for global units). A report of an older version does not count: while a
    /// replacement is under way the old version may still run, and a client waiting for the
    /// new one to be launched must not be told it is.
    pub fn from_records(
        name: &str,
        record: UnitRecord,
        file: UnitFile,
        machine_id: Option<String>,
        reason: Option<String>,
        reported: Option<&UnitState>,
    ) -> Self {
        let current = (!record.global).then(|| {
            let reported = reported.filter(|state| state.hash == record.hash);
            DesiredState::derive_current(TargetReport::of(machine_id.is_some(), reported.map(|state| state.launched)))
        });
        Self {
            name: name.to_string(),
            file,
            hash: record.hash,
            desired: record.desired,
            current,
            machine_id: if record.global { None } else { machine_id },
            global: record.global,
            reason,
            source: record.source,
            drift: record.drift,
            secrets: record.secrets,
            versions: record.versions,
        }
    }
}

/// A change made through `PATCH /machines`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataChange {
    Set { machine_id: String, key: String, value: String },
    Remove { machine_id: String, key: String },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    /// Moves whenever anything in the snapshot may have changed; equal revisions mean equal
    /// snapshots, so the engine can skip planning.
    pub revision: u64,
    pub machines: Vec<MachineState>,
    pub units: Vec<SnapshotUnit>,
}

/// A unit some machine should hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedUnit {
    pub name: String,
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub drift: DriftPolicy,
    pub secrets: SecretPins,
    /// For a global unit on a calendar: the run every machine is to run now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<fleet_core::job::global_runs::RunTicket>,
    /// For a unit with `Requires=` or `After=`: where the instances it names that are up run,
    /// as the leading engine recorded it ([`fleet_core::required_places`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_at: Vec<fleet_core::required_places::RequiredPlace>,
}

/// One machine's work: itself as the cluster sees it, its schedule and the global units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineWork {
    pub machine: Option<MachineState>,
    pub scheduled: Vec<AssignedUnit>,
    pub globals: Vec<AssignedUnit>,
}

pub use fleet_core::StateReport;

/// A bearer token as a store keeps it: never the token, only its SHA-256 (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub name: String,
    /// `admin`, `operator` or `viewer`.
    pub role: String,
    /// The unit pattern an operator token is limited to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units: Option<String>,
    /// The secrets an operator token may set and name in its units (none without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
    pub sha256: String,
    /// When it was made, in seconds since the Unix epoch.
    pub created: u64,
    /// When it stops being accepted, in seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
}

/// A cluster secret as a store keeps it: its value sealed under the cluster's secrets key
/// (`fleet-secrets`), which no store holds, with who set which version when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    pub name: String,
    /// 1 for the first value, one more for each value set since.
    pub version: u64,
    /// The value's length in bytes (what a reader of the store may know of it).
    pub size: usize,
    /// The identity that set it, as the audit trail names it.
    pub set_by: String,
    /// When, in seconds since the Unix epoch.
    pub set_at: u64,
    /// The value, sealed and bound to this name and version.
    pub sealed: String,
    /// Older versions some unit is still pinned to (a rotation under way, or undone), by
    /// version: their values, sealed likewise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kept: BTreeMap<u64, String>,
}

impl SecretRecord {
    /// The sealed value of `version`, while this record has it.
    pub fn sealed_version(&self, version: u64) -> Option<&str> {
        if version == self.version { Some(&self.sealed) } else { self.kept.get(&version).map(String::as_str) }
    }
}

/// A registration token as a store keeps it (only its SHA-256): what a pull agent presents
/// once to join, for a machine certificate of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationRecord {
    pub name: String,
    pub sha256: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// When it stops being accepted (the etcd store also drops it then, by a lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    #[serde(default)]
    pub uses: u32,
    /// Metadata given to the machines that join with it (binding: they cannot widen it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The machine IDs it may create, as a pattern (`edge-*`); any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ids: Option<String>,
}

/// Why a registration token cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationRefused {
    #[error("unknown or revoked registration token")]
    Unknown,
    #[error("expired registration token")]
    Expired,
    #[error("registration token used up")]
    Exhausted,
}

impl RegistrationRecord {
    /// Whether the token may be used once more at `now` (seconds since the Unix epoch).
    pub fn usable_at(&self, now: u64) -> Result<(), RegistrationRefused> {
        if self.expires.is_some_and(|expires| expires <= now) {
            return Err(RegistrationRefused::Expired);
        }
        if self.max_uses.is_some_and(|max| self.uses >= max) {
            return Err(RegistrationRefused::Exhausted);
        }
        Ok(())
    }
}

/// A machine whose certificate is refused from now on (`fleetctl machine revoke`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedMachine {
    pub id: String,
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The key the machine held then (a pull agent's); its certificates stay refused even
    /// once the machine is forgotten. `None`: every certificate of the ID is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sha256: Option<String>,
    /// An administrator freed the ID for another key (`fleetctl machine forget`).
    #[serde(default)]
    pub forgotten: bool,
}

#[cfg(test)]
mod tests {
    use fleet_core::{CurrentState, DesiredState, SystemdState, UnitFile, UnitState};

    use super::{UnitRecord, UnitView};

    #[test]
    fn only_a_report_of_this_version_makes_a_unit_launched() {
        let old = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1\n").expect("a unit file");
        let new = UnitFile::parse("[Service]\nExecStart=/bin/sleep 2\n").expect("a unit file");
        let record = UnitRecord::by_hand(new.hash(), DesiredState::Launched);
        let report = |file: &UnitFile| UnitState {
            run: None,
            name: "a.service".into(),
            machine_id: "m1".into(),
            hash: file.hash(),
            systemd: SystemdState::new("loaded", "active", "running"),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
        };
        let view = |reported: &UnitState| {
            UnitView::from_records("a.service", record.clone(), new.clone(), Some("m1".into()), None, Some(reported))
                .current
        };
        assert_eq!(view(&report(&old)), Some(CurrentState::Inactive));
        assert_eq!(view(&report(&new)), Some(CurrentState::Launched));
    }
}
