//! What the engine leader's source syncer and rollout driver use of the store, and no more:
//! their reads, their writes, and the change signal they wake on.

use std::sync::Arc;

use async_trait::async_trait;
use fleet_core::{DesiredState, UnitFile, UnitState};
use fleet_registry::{
    ApiRegistry, ChangeSignal, RolloutRecord, SourceRecord, SourceRegistry, SourceStatus, UnitView, Writer,
};

type Result<T> = std::result::Result<T, fleet_registry::RegistryError>;

#[async_trait]
pub trait LeaderStore: Send + Sync {
    async fn sources(&self) -> Result<Vec<SourceRecord>>;
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>>;
    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()>;
    async fn rollouts(&self) -> Result<Vec<RolloutRecord>>;
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()>;
    async fn units(&self) -> Result<Vec<UnitView>>;
    async fn unit_states(&self) -> Result<Vec<UnitState>>;
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()>;
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool>;
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool>;
    /// Moves when a source, a source's status or a rollout changes.
    fn source_changes(&self) -> ChangeSignal;
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
    async fn rollouts(&self) -> Result<Vec<RolloutRecord>> {
        SourceRegistry::rollouts(&**self).await
    }
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()> {
        SourceRegistry::put_rollout(&**self, record).await
    }
    async fn units(&self) -> Result<Vec<UnitView>> {
        ApiRegistry::units(&**self).await
    }
    async fn unit_states(&self) -> Result<Vec<UnitState>> {
        ApiRegistry::unit_states(&**self).await
    }
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        ApiRegistry::put_unit_as(&**self, name, file, desired, writer).await
    }
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        ApiRegistry::set_desired_state_as(&**self, name, desired, writer).await
    }
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        ApiRegistry::destroy_unit_as(&**self, name, writer).await
    }
    fn source_changes(&self) -> ChangeSignal {
        SourceRegistry::source_changes(&**self)
    }
}
