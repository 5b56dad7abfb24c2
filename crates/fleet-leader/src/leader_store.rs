//! What the engine leader's source syncer, rollout driver and drain driver use of the store, and no more:
//! their reads, their writes, and the change signals they wake on.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use fleet_core::drain::Drain;
use fleet_core::secrets::SecretPins;
use fleet_core::{DesiredState, MachineState, UnitFile, UnitState};
use fleet_registry::{
    ApiRegistry, ChangeSignal, PageRequest, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus, UnitChange,
    UnitChanged, UnitView, Writer,
};

type Result<T> = std::result::Result<T, fleet_registry::RegistryError>;

#[async_trait]
pub trait LeaderStore: Send + Sync {
    async fn sources(&self) -> Result<Vec<SourceRecord>>;
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>>;
    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()>;
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>>;
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()>;
    /// `SourceRegistry::put_rollout_over`: the driver's step, never over a change by hand.
    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool>;
    /// The units of these names that exist, from the store's watch-fed copy where it has one.
    async fn units_named(&self, names: &BTreeSet<String>) -> Result<Vec<UnitView>>;
    /// Every unit, from the store's watch-fed copy where it has one (a sync compares the
    /// whole cluster with its source).
    async fn units_copied(&self) -> Result<Vec<UnitView>>;
    /// The drains of the live machines, by machine ID, from the watch-fed copy likewise.
    async fn drains(&self) -> Result<Vec<(String, Drain)>>;
    /// The live machines (a disruption budget grouped by a key reads their metadata).
    async fn machines(&self) -> Result<Vec<MachineState>>;
    /// Stores a step of a machine's drain while that drain stands (`false` when it does not).
    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool>;
    /// The states the machines report of these units, from the watch-fed copy likewise.
    async fn states_of(&self, names: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>>;
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()>;
    /// Many unit writes as one writer, each on its own (`ApiRegistry::change_units_as`: a store
    /// may write many per request).
    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>>;
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool>;
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool>;
    /// The versions of its secrets a unit is to run with (a secret's rollout moves them).
    async fn set_secret_pins(&self, name: &str, pins: &SecretPins) -> Result<bool>;
    /// Moves when a source, a source's status or a rollout changes.
    fn source_changes(&self) -> ChangeSignal;
    /// Moves when a unit, a unit state, a machine or a drain may have changed, while
    /// [`LeaderStore::units_named`], [`LeaderStore::units_copied`] and
    /// [`LeaderStore::states_of`] are being read.
    fn unit_changes(&self) -> ChangeSignal;
}

/// Any store the API serves from holds what the leader's loops use.
#[async_trait]
impl<T: ApiRegistry + ?Sized> LeaderStore for Arc<T> {
    async fn sources(&self) -> Result<Vec<SourceRecord>> {
        SourceRegistry::sources(&**self).await
    }
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>> {
        SourceRegistry::source_statuses(&**self).await
    }
    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()> {
        SourceRegistry::set_source_status(&**self, name, status).await
    }
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>> {
        SourceRegistry::rollouts(&**self).await
    }
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        SourceRegistry::put_rollout(&**self, record).await
    }
    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool> {
        SourceRegistry::put_rollout_over(&**self, record, before).await
    }
    async fn units_named(&self, names: &BTreeSet<String>) -> Result<Vec<UnitView>> {
        Ok(ApiRegistry::units_page(&**self, PageRequest::named(names)).await?.items)
    }
    async fn units_copied(&self) -> Result<Vec<UnitView>> {
        Ok(ApiRegistry::units_page(&**self, PageRequest::everything()).await?.items)
    }
    async fn drains(&self) -> Result<Vec<(String, Drain)>> {
        ApiRegistry::drains(&**self).await
    }
    async fn machines(&self) -> Result<Vec<MachineState>> {
        ApiRegistry::machines(&**self).await
    }
    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool> {
        ApiRegistry::step_drain(&**self, machine_id, drain).await
    }
    async fn states_of(&self, names: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>> {
        ApiRegistry::states_of_units(&**self, names).await
    }
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        ApiRegistry::put_unit_as(&**self, name, file, desired, writer).await
    }
    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>> {
        ApiRegistry::change_units_as(&**self, changes, writer).await
    }
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        ApiRegistry::set_desired_state_as(&**self, name, desired, writer).await
    }
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        ApiRegistry::destroy_unit_as(&**self, name, writer).await
    }
    async fn set_secret_pins(&self, name: &str, pins: &SecretPins) -> Result<bool> {
        fleet_registry::CredentialRegistry::set_secret_pins(&**self, name, pins).await
    }
    fn source_changes(&self) -> ChangeSignal {
        SourceRegistry::source_changes(&**self)
    }
    fn unit_changes(&self) -> ChangeSignal {
        ApiRegistry::unit_changes(&**self)
    }
}
