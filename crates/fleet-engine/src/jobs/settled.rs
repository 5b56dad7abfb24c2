//! Whether the engine's job step would change nothing this pass: the same records at the same
//! versions, the same reports of the units whose runs it follows, and no time it waits for come.
//! Then, with the cluster's snapshot unchanged too, the pass has nothing to plan: without this
//! every pass (one each `engine_reconcile_interval`) planned every unit while one unit on a
//! calendar existed.

use std::collections::BTreeSet;
use std::sync::Arc;

use fleet_core::UnitState;
use fleet_registry::{EngineRegistry, RegistryError, StoredJob};

/// What a job step read: each record's unit and version, and the reports it took in (sorted).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct StepInputs {
    records: Vec<(String, u64)>,
    reports: Vec<Arc<UnitState>>,
}

impl StepInputs {
    pub(super) fn of<'a>(stored: impl IntoIterator<Item = &'a StoredJob>, mut reports: Vec<Arc<UnitState>>) -> Self {
        let mut records: Vec<(String, u64)> = stored.into_iter().map(|job| (job.unit.clone(), job.version)).collect();
        records.sort_unstable();
        reports.sort_unstable_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
        Self { records, reports }
    }
}

/// The last step that wrote nothing: what it read, and whose reports it read.
#[derive(Debug, Default)]
pub(super) struct Settled {
    inputs: Option<StepInputs>,
    followed: BTreeSet<String>,
}

impl Settled {
    /// Notes a step that wrote nothing and found nothing contested: it is the step's fixed
    /// point while `inputs` stay as they are.
    pub(super) fn note(&mut self, inputs: StepInputs, followed: BTreeSet<String>) {
        self.inputs = Some(inputs);
        self.followed = followed;
    }

    /// Forgets the last step: the next one runs whatever it reads.
    pub(super) fn forget(&mut self) {
        self.inputs = None;
        self.followed.clear();
    }

    /// Whether a step now would read what the last one noted (and so write and decide what it
    /// did). Reads the records and the followed units' reports; nothing when none is noted.
    pub(super) async fn holds(&self, registry: &dyn EngineRegistry) -> Result<bool, RegistryError> {
        let Some(noted) = &self.inputs else { return Ok(false) };
        let stored = registry.job_records().await?;
        let reports = registry.reported_states(&self.followed).await?;
        Ok(StepInputs::of(&stored, reports) == *noted)
    }
}
