//! The Registry seam: the cluster's shared state, in three facets, one per role.
//!
//! - [`ApiRegistry`]: what the HTTP API reads and writes (units, desired states, machines,
//!   unit states).
//! - [`EngineRegistry`]: the engine's snapshot and its fenced schedule writes.
//! - [`AgentRegistry`]: one machine's presence, its own work, unit bodies and its states.
//!
//! The stores live in crates of their own: `fleet-store-embedded` (a redb file; the
//! single-machine default) and `fleet-store-etcd` (etcd v3; clusters). This crate has the
//! traits, the records, their codec and apply rule, and the [`contract`] every store passes.

#![forbid(unsafe_code)]

pub mod apply_rule;
mod budget_members;
pub mod codec;
mod disruption_ledger;
mod drain_units;
mod event_sink;
mod import;
pub mod machine_identity;
mod model;
mod ownership;
mod plan_guard;
mod source_reading;
mod source_record;
mod unit_change;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use fleet_core::drain::Drain;
use fleet_core::events::{EventPage, NewEvent};
use fleet_core::schedule::Decision;
use fleet_core::{DesiredState, MachineId, MachineState, OutOfTouch, UnitFile, UnitHash, UnitState};
use tokio::sync::watch;

pub use budget_members::{BudgetedUnit, budget_members, budgeted_units};
pub use disruption_ledger::{BudgetView, Decision as DisruptionDecision, DisruptionLedger, Shown};
pub use drain_units::{budgeted_requirers, drain_unit_names, drain_units, note_required_by};
pub use event_sink::{EventSink, micros_now};
pub use fleet_core::required_places::{RequiredPlace, RequiredPlaces};
pub use fleet_core::schedule::SnapshotUnit;
pub use fleet_core::schedule::departures::SilentDeparture;
pub use import::{Imported, ImportedUnit};
pub use machine_identity::{JoinRefused, MachineIdentity};
pub use model::{
    AssignedUnit, EngineSnapshot, MachineWork, MetadataChange, RegistrationRecord, RegistrationRefused, RevokedMachine,
    SecretRecord, StateReport, TokenRecord, UnitRecord, UnitView,
};
pub use ownership::{Refused, Writer};
pub use plan_guard::PlanGuard;
pub use source_reading::{ReadSource, SourceReading, held_units};
pub use source_record::{DEFAULT_DEADLINE_SECONDS, OutOfSync, RolledSecret, RolloutRecord, SourceRecord, SourceStatus};
pub use unit_change::{UnitChange, UnitChanged};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The store could not be reached or failed; the caller may retry.
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    /// The watch-fed copy a reader uses has not made its first listing yet (a fleetd starting
    /// up): the reader is woken when it has, so this is no failure to report.
    #[error("registry unavailable: the store's copy is not listed yet")]
    NotListedYet,
    /// This machine's presence lapsed (its lease expired), and no copy of its work read since
    /// it registered again shows which of its units are still its own: the engine may have
    /// placed any of them elsewhere meanwhile. An agent stops what it runs until it can read
    /// its work again.
    #[error("this machine's presence lapsed and its work since registering again is not read yet")]
    PresenceLapsed,
    /// The store holds something this version cannot read.
    #[error("registry holds unreadable data under {key}: {reason}")]
    Corrupt { key: String, reason: String },
    /// The engine's leadership was lost before a fenced write.
    #[error("engine leadership lost")]
    LeadershipLost,
    /// Another live fleetd already holds this machine ID.
    #[error(
        "machine ID {machine_id} is already in use by another live fleetd; give each machine its own machine_id \
         (if that fleetd has died, its presence expires after agent_ttl)"
    )]
    MachineInUse { machine_id: String },
    /// The unit belongs to another owner (a source, or hand writes when a source writes).
    #[error("{}", owned_message(unit, owner))]
    Owned { unit: String, owner: Option<String> },
    /// A write guarded by a plan's index (`?ifUnchanged=`) found the unit changed since
    /// that plan: nothing of the unit was written.
    #[error("unit {unit} changed since plan index {index}: plan again")]
    ChangedSincePlan { unit: String, index: u64 },
    /// A source's write after the source was removed (a sync that was under way): the
    /// source's units are no longer its to write.
    #[error("source {name} was removed; its units are no longer its to write")]
    SourceRemoved { name: String },
    /// The machine holds no presence through this store (a pull agent that moved to another
    /// manager): it must announce itself here first.
    #[error("machine {machine_id} is not announced here; announce it again")]
    NotAnnounced { machine_id: String },
}

fn owned_message(unit: &str, owner: &Option<String>) -> String {
    match owner {
        Some(source) => format!(
            "unit {unit} is managed by source {source}: change it in the source, or take it over explicitly (--take-over)"
        ),
        None => format!("unit {unit} was made by hand, not by this source: take it over explicitly (--take-over)"),
    }
}

impl RegistryError {
    /// The one way a store says it failed: which store, and its own error.
    pub fn unavailable(store: &str, error: impl std::fmt::Display) -> Self {
        Self::Unavailable(format!("{store}: {error}"))
    }
}

pub type Result<T> = std::result::Result<T, RegistryError>;

/// A counter that moves on every change a reader cares about; readers wait on it and then
/// re-read. Changes may be coalesced, never lost.
pub type ChangeSignal = watch::Receiver<u64>;

/// The cluster's events ([`fleet_core::events`]): one stream for every member, in the order
/// the store gives their batches.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Stores `events` (at most [`fleet_core::events::PER_BATCH`]) as one batch, after every
    /// batch stored before it.
    async fn append_events(&self, events: &[NewEvent]) -> Result<()>;
    /// Up to `limit` events after index `after`, in index order, with what was trimmed.
    async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage>;
    /// Up to `limit` of the events kept before index `before` (`u64::MAX`: the newest),
    /// newest first: what a reader that shows the latest events starts from.
    async fn events_before(&self, before: u64, limit: usize) -> Result<Vec<fleet_core::events::Event>>;
    /// Moves when events may have been appended, by any member.
    fn event_changes(&self) -> ChangeSignal;
    /// Trims the events beyond the newest `most` and those made before `oldest_at`
    /// (microseconds since the epoch); returns how many went.
    async fn trim_events(&self, most: usize, oldest_at: i64) -> Result<usize>;
}

/// Credentials every fleetd of a cluster accepts: bearer tokens, kept by their hash.
#[async_trait]
pub trait CredentialRegistry: Send + Sync {
    /// Stores a new token; `false` (and nothing written) when one of that name exists.
    async fn create_token(&self, record: &TokenRecord) -> Result<bool>;
    /// Every token, in name order.
    async fn tokens(&self) -> Result<Vec<TokenRecord>>;
    /// Removes a token; `false` when there was none.
    async fn revoke_token(&self, name: &str) -> Result<bool>;
    /// Stores a new registration token; `false` (and nothing written) when one of that name
    /// exists. The etcd store attaches a lease that ends with `expires`, so etcd itself drops
    /// an expired token.
    async fn create_registration(&self, record: &RegistrationRecord) -> Result<bool>;
    /// Every registration token, in name order.
    async fn registrations(&self) -> Result<Vec<RegistrationRecord>>;
    /// Removes a registration token; `false` when there was none.
    async fn revoke_registration(&self, name: &str) -> Result<bool>;
    /// Refuses the machine's certificate from now on, and removes the machine and its unit
    /// states (so the engine moves its units), in one write.
    async fn revoke_machine(&self, revoked: &RevokedMachine) -> Result<()>;
    /// Every revoked machine, in ID order.
    async fn revoked_machines(&self) -> Result<Vec<RevokedMachine>>;
    /// Joins `machine_id`, over the key whose hash is `key_sha256`, with the registration
    /// token whose hash is `sha256`, at `now` (seconds since the Unix epoch): in one write,
    /// checked by [`machine_identity::admit_join`] against who holds the ID and its
    /// revocation, counts the token's use and binds the ID to the key. Returns the token as
    /// it now stands and the machine's identity.
    async fn join_machine(
        &self,
        sha256: &str,
        now: u64,
        machine_id: &str,
        key_sha256: &str,
    ) -> Result<std::result::Result<(RegistrationRecord, MachineIdentity), JoinRefused>>;
    /// The identity of a pull agent's machine, if one joined with that ID.
    async fn machine_identity(&self, machine_id: &str) -> Result<Option<MachineIdentity>>;
    /// Stores a machine's identity (its renewed key, its bound public IP).
    async fn put_machine_identity(&self, identity: &MachineIdentity) -> Result<()>;
    /// Frees a revoked machine's ID for another key: its identity goes, its revocation is
    /// marked forgotten (its old key stays refused). `false` when the machine is not revoked.
    async fn forget_machine(&self, machine_id: &str) -> Result<bool>;
    /// Stores `record` if the stored secret of its name is still at version `previous`
    /// (`None`: there is none); `false`, and nothing written, when it moved meanwhile.
    async fn put_secret(&self, record: &SecretRecord, previous: Option<u64>) -> Result<bool>;
    /// Every secret, in name order (values sealed).
    async fn secrets(&self) -> Result<Vec<SecretRecord>>;
    /// One secret (its value sealed), if it exists.
    async fn secret(&self, name: &str) -> Result<Option<SecretRecord>>;
    /// Removes a secret; `false` when there was none.
    async fn remove_secret(&self, name: &str) -> Result<bool>;
    /// Sets the versions of its secrets the unit `name` is to run with (its record and the
    /// machines' copies), all else of it left as it is; `false` when there is no such unit.
    async fn set_secret_pins(&self, name: &str, pins: &fleet_core::secrets::SecretPins) -> Result<bool>;
}

/// Git sources (their records, and what their last syncs did) and rollouts.
#[async_trait]
pub trait SourceRegistry: Send + Sync {
    /// Stores a source, replacing any of that name.
    async fn put_source(&self, record: &SourceRecord) -> Result<()>;
    /// Every source, in name order.
    async fn sources(&self) -> Result<Vec<SourceRecord>>;
    /// Removes a source and its status; `false` when there was none. Its units stay.
    async fn remove_source(&self, name: &str) -> Result<bool>;
    /// Every source's status, by name.
    async fn source_statuses(&self) -> Result<Vec<(String, SourceStatus)>>;
    async fn set_source_status(&self, name: &str, status: &SourceStatus) -> Result<()>;
    /// Stores a rollout, replacing any of that name.
    async fn put_rollout(&self, record: &RolloutRecord) -> Result<()>;
    /// Writes `record` only if the stored rollout is still `before` (as read): `false`, and
    /// nothing written, when it was changed meanwhile (paused, undone, promoted by hand) or
    /// removed. The rollout driver's step, so that it never overwrites such a change.
    async fn put_rollout_over(&self, record: &RolloutRecord, before: &RolloutRecord) -> Result<bool>;
    /// Every rollout, in name order, shared: a rollout of 10,000 units is read on every pass
    /// of its driver and every `GET`, and a reader that changes it works on its own copy.
    async fn rollouts(&self) -> Result<Vec<Arc<RolloutRecord>>>;
    /// Removes a rollout; `false` when there was none.
    async fn remove_rollout(&self, name: &str) -> Result<bool>;
    /// Moves when a source, a source's status or a rollout changes: what the engine leader's
    /// source syncer and rollout driver wake on instead of reading the store on a timer.
    fn source_changes(&self) -> ChangeSignal;
}

/// Which part of a list a page holds: of the items whose unit name `admits` lets through,
/// the `start`-th on, at most `limit` of them; or, when `after` names the item the page
/// before ended with (its list key: a unit's name; a unit state's name, `\0`, machine), the
/// items after it, which a store finds without walking the ones before.
#[derive(Clone)]
pub struct PageRequest {
    pub start: usize,
    pub limit: usize,
    pub admits: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    pub after: Option<String>,
}

impl PageRequest {
    /// Every item, in one page.
    pub fn everything() -> Self {
        Self { start: 0, limit: usize::MAX, admits: Arc::new(|_: &str| true), after: None }
    }

    /// The items of these names, in one page.
    pub fn named(names: &std::collections::BTreeSet<String>) -> Self {
        let names = Arc::new(names.clone());
        Self { start: 0, limit: usize::MAX, admits: Arc::new(move |name: &str| names.contains(name)), after: None }
    }

    /// How many admitted items to pass over before the page: none when it resumes `after`.
    pub fn skip(&self) -> usize {
        if self.after.is_some() { 0 } else { self.start }
    }
}

/// One page of a list, and whether more items follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub more: bool,
}

impl<T> Page<T> {
    /// The page `request` names among `items` (in list order), each given with its unit
    /// name; `view` is called only for the items the page holds (`None`: left out).
    pub fn select<K: AsRef<str>, I>(
        items: impl Iterator<Item = Result<(K, I)>>,
        request: &PageRequest,
        mut view: impl FnMut(&str, I) -> Result<Option<T>>,
    ) -> Result<Self> {
        let mut page = Self { items: Vec::new(), more: false };
        let mut skipped = 0;
        for item in items {
            let (name, item) = item?;
            let name = name.as_ref();
            if !(request.admits)(name) {
                continue;
            }
            if skipped < request.skip() {
                skipped += 1;
                continue;
            }
            if page.items.len() == request.limit {
                page.more = true;
                break;
            }
            page.items.extend(view(name, item)?);
        }
        Ok(page)
    }
}

#[async_trait]
pub trait ApiRegistry: CredentialRegistry + SourceRegistry + EventLog + Send + Sync {
    /// Every unit, in name order, with its schedule and derived current state.
    async fn units(&self) -> Result<Vec<UnitView>>;
    /// One page of [`ApiRegistry::units`], built without reading every unit: what a request
    /// for a page costs grows with the page, not with the cluster (a store may still walk
    /// the names before the page).
    async fn units_page(&self, request: PageRequest) -> Result<Page<UnitView>> {
        let request = PageRequest { after: None, ..request };
        let units = self.units().await?;
        Page::select(units.into_iter().map(|unit| Ok((unit.name.clone(), unit))), &request, |_, unit| Ok(Some(unit)))
    }
    /// One page of [`ApiRegistry::unit_states`] (in unit, then machine order), of one
    /// machine's units when `machine` is given.
    async fn unit_states_page(&self, request: PageRequest, machine: Option<&str>) -> Result<Page<UnitState>> {
        let request = PageRequest { after: None, ..request };
        let states = self.unit_states().await?;
        let states = states.into_iter().filter(|state| machine.is_none_or(|machine| state.machine_id == machine));
        Page::select(states.map(|state| Ok((state.name.clone(), state))), &request, |_, state| Ok(Some(state)))
    }
    /// The states every machine reported of the units `names`, in no particular order: what a
    /// rollout follows on every pass (a store may find them without ordering every state, and
    /// share the states it holds parsed instead of copying them).
    async fn states_of_units(&self, names: &std::collections::BTreeSet<String>) -> Result<Vec<Arc<UnitState>>> {
        Ok(self.unit_states_page(PageRequest::named(names), None).await?.items.into_iter().map(Arc::new).collect())
    }
    async fn unit(&self, name: &str) -> Result<Option<UnitView>>;
    /// Stores `file` under `name` with `desired`, replacing any unit of that name that
    /// `writer` may write ([`RegistryError::Owned`] otherwise).
    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()>;
    /// Sets a unit's desired state; `false` when there is no such unit.
    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool>;
    /// Makes every change of `changes`, each on its own: one refused or lost holds back no
    /// other. Answers per change, in order; `Err` as a whole only when nothing could be tried.
    /// A store may write many changes per request to its backend.
    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>> {
        let mut answers = Vec::with_capacity(changes.len());
        for change in changes {
            answers.push(self.change_unit_as(change, writer).await);
        }
        Ok(answers)
    }
    /// One change of [`ApiRegistry::change_units_as`], made alone.
    async fn change_unit_as(&self, change: &UnitChange, writer: &Writer) -> Result<UnitChanged> {
        match &change.file {
            Some(file) => {
                self.put_unit_as(&change.name, file, change.desired, writer).await?;
                Ok(UnitChanged::Written)
            }
            None => Ok(match self.set_desired_state_as(&change.name, change.desired, writer).await? {
                true => UnitChanged::Written,
                false => UnitChanged::NoSuchUnit,
            }),
        }
    }
    /// Removes a unit; `false` when there was none.
    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool>;
    /// Stores every unit of `units` by hand, each placed on the machine it names, or none of
    /// them: [`Imported::Existing`] when a unit of one of their names exists. A placement
    /// written here is the engine's from then on (it keeps it while the unit can run there).
    /// `writer` is who the units' first versions are by.
    async fn import_units(&self, units: &[ImportedUnit], writer: &Writer) -> Result<Imported>;
    /// How many past versions each unit keeps from now on ([`fleet_core::unit_history`]): a
    /// write trims what is beyond it.
    fn keep_versions(&self, kept: usize);
    /// The unit file of a content a unit or a kept version names, by its hash.
    async fn kept_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>>;
    /// [`ApiRegistry::put_unit_as`] by hand, taking nothing over.
    async fn put_unit(&self, name: &str, file: &UnitFile, desired: DesiredState) -> Result<()> {
        self.put_unit_as(name, file, desired, &Writer::BY_HAND).await
    }
    /// [`ApiRegistry::set_desired_state_as`] by hand, taking nothing over.
    async fn set_desired_state(&self, name: &str, desired: DesiredState) -> Result<bool> {
        self.set_desired_state_as(name, desired, &Writer::BY_HAND).await
    }
    /// [`ApiRegistry::destroy_unit_as`] by hand, taking nothing over.
    async fn destroy_unit(&self, name: &str) -> Result<bool> {
        self.destroy_unit_as(name, &Writer::BY_HAND).await
    }
    /// Every unit state every machine reported, in (unit, machine) order.
    async fn unit_states(&self) -> Result<Vec<UnitState>>;
    /// The job record of `unit` (its runs, when it runs on a calendar or is a batch unit), with
    /// its version, if it has one.
    async fn job_record(&self, unit: &str) -> Result<Option<StoredJob>>;
    /// Every stored job record (the web view's runs of each unit).
    async fn all_job_records(&self) -> Result<Vec<StoredJob>>;
    /// Replaces `unit`'s job record by `record`, which has a run started by hand (`fleetctl
    /// run`), if the stored one is still at `version` (0: none is stored); `false` when another
    /// write came first. The one write of a job record not fenced by the engine's lease (the
    /// version alone orders it against the leader's), and it wakes the engine.
    async fn put_dispatched_run(
        &self,
        unit: &str,
        record: &fleet_core::job::runs::JobRecord,
        version: u64,
    ) -> Result<bool>;
    /// Moves when a unit, its placement or a unit state may have changed (a store may move it
    /// more often), for a reader of [`ApiRegistry::units_page`] and
    /// [`ApiRegistry::unit_states_page`] to read again. On etcd it moves while those pages are
    /// being read or the engine leads (either holds the cluster's cache; an API read lets it
    /// go when idle).
    fn unit_changes(&self) -> ChangeSignal;
    /// Live machines with their effective metadata, in ID order.
    async fn machines(&self) -> Result<Vec<MachineState>>;
    /// One page of [`ApiRegistry::machines`] (`admits` and `after` take machine IDs); a store
    /// may serve it from a copy with the consistency of its list pages.
    async fn machines_page(&self, request: PageRequest) -> Result<Page<MachineState>> {
        let machines = self.machines().await?;
        let after = request.after.as_deref();
        let rest = machines.into_iter().filter(|machine| after.is_none_or(|after| machine.id.as_str() > after));
        Page::select(rest.map(|machine| Ok((machine.id.clone(), machine))), &request, |_, machine| Ok(Some(machine)))
    }
    /// The machines gone that units still wait for (`LostAfter=`, `AtMostOnce=`), as the
    /// leading engine recorded them, in ID order (one back may be there until the engine's
    /// next pass: a reader leaves out those [`ApiRegistry::machines`] lists).
    async fn machines_out_of_touch(&self) -> Result<Vec<OutOfTouch>>;
    /// Where what `unit`, placed on `machine`, requires runs, as the leading engine recorded
    /// it (none: it names nothing up yet, or the engine has not recorded it there yet).
    async fn required_places_of(&self, unit: &str, machine: &str) -> Result<Vec<RequiredPlace>>;
    /// The machine whose engine leads the cluster now, if one does.
    async fn engine_leader(&self) -> Result<Option<MachineId>>;
    /// Applies runtime metadata changes all at once.
    async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<()>;
    /// The drains of the machines present, by machine ID, in ID order: what
    /// [`ApiRegistry::machines`] shows of them, without reading every machine (the drain
    /// driver asks on every change of the cluster). A store may serve it from its copy.
    async fn drains(&self) -> Result<Vec<(MachineId, Drain)>>;
    /// Starts or replaces a machine's drain, or with `None` ends it (the machine takes units
    /// again). The machine reads with it from then on ([`MachineState::drain`]).
    async fn set_drain(&self, machine_id: &str, drain: Option<&Drain>) -> Result<()>;
    /// Stores a step of a machine's drain, only while the drain it steps (the one begun at
    /// `drain.started`) still stands: `false`, and nothing written, when it was ended or
    /// started again meanwhile.
    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool>;
    /// A number that changes whenever anything the API shows may have changed, cheap to ask:
    /// a reader that polls (the web view) reads everything again only when it moved. `None`
    /// when the store cannot tell.
    async fn revision(&self) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// A unit's job record (the runs of a scheduled or run-to-completion unit) as a store holds
/// it, with the version a compare-and-swap names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredJob {
    pub unit: String,
    pub record: fleet_core::job::runs::JobRecord,
    /// Moves on every write of the record; never 0 for a stored one.
    pub version: u64,
}

/// Proof of engine leadership, checked by every schedule write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineLease {
    pub machine_id: String,
    pub token: u64,
}

#[async_trait]
pub trait EngineRegistry: Send + Sync {
    /// Takes or renews the engine leadership for `machine_id`; `None` when another holds it.
    async fn acquire_leadership(&self, machine_id: &str) -> Result<Option<EngineLease>>;
    async fn release_leadership(&self, lease: &EngineLease) -> Result<()>;
    async fn snapshot(&self) -> Result<EngineSnapshot>;
    /// The revision [`EngineRegistry::snapshot`] would carry now, without building it: an
    /// engine that planned that revision skips the listing. `None` when the store cannot
    /// tell cheaply.
    async fn snapshot_revision(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// The bodies of the given units, for the ones the engine has not cached yet.
    async fn unit_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>>;
    /// Writes the decisions and the reasons for unplaced units, fenced by `lease`. A decision
    /// that no longer applies (the unit was destroyed or moved meanwhile) is skipped.
    async fn apply(&self, lease: &EngineLease, decisions: &[Decision], unplaced: &[(String, String)]) -> Result<()>;
    /// What the machines report of `units`: the engine follows the runs of scheduled units by
    /// it, and places a unit it took off a present machine only once that machine stopped it
    /// ([`fleet_core::schedule::departures::Reports`]).
    async fn reported_states(&self, units: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>>;
    /// Every stored job record.
    async fn job_records(&self) -> Result<Vec<StoredJob>>;
    /// Replaces `unit`'s job record by `record` (`None`: removes it) if the stored one is
    /// still at `version` (0: none is stored), fenced by `lease`; `false` when another write
    /// came first. The one way a run is claimed: two leaders never both claim one elapse.
    async fn put_job_record(
        &self,
        lease: &EngineLease,
        unit: &str,
        record: Option<&fleet_core::job::runs::JobRecord>,
        version: u64,
    ) -> Result<bool>;
    /// The ticket of each global unit on a calendar: the run its machines are to run now.
    async fn run_tickets(&self) -> Result<BTreeMap<String, fleet_core::job::global_runs::RunTicket>>;
    /// Sets `unit`'s ticket (`None`: removes it), fenced by `lease`; every machine's work
    /// carries it with the unit.
    async fn put_run_ticket(
        &self,
        lease: &EngineLease,
        unit: &str,
        ticket: Option<&fleet_core::job::global_runs::RunTicket>,
    ) -> Result<()>;
    /// The machines out of touch that units wait for, as the engine leading last recorded
    /// them ([`EngineRegistry::record_out_of_touch`]), in ID order.
    async fn recorded_out_of_touch(&self) -> Result<Vec<OutOfTouch>>;
    /// Replaces the record of machines out of touch by `machines` (what differs is written),
    /// fenced by `lease`.
    async fn record_out_of_touch(&self, lease: &EngineLease, machines: &[OutOfTouch]) -> Result<()>;
    /// The silent departures the engine leading last recorded
    /// ([`EngineRegistry::record_silent_departures`]), in unit order.
    async fn recorded_silent_departures(&self) -> Result<Vec<SilentDeparture>>;
    /// Replaces the record of silent departures by `departures` (what differs is written),
    /// fenced by `lease`: the units taken off a present machine that had not reported them,
    /// which a leader taking over holds too.
    async fn record_silent_departures(&self, lease: &EngineLease, departures: &[SilentDeparture]) -> Result<()>;
    /// Where what each placed unit with `Requires=` or `After=` requires runs, as the engine
    /// leading last recorded it ([`EngineRegistry::record_required_places`]).
    async fn recorded_required_places(&self) -> Result<Vec<RequiredPlaces>>;
    /// Replaces the record of where what units require runs by `places` (what differs is
    /// written), fenced by `lease`: each machine's work carries those of its units
    /// ([`AssignedUnit::required_at`]).
    async fn record_required_places(&self, lease: &EngineLease, places: &[RequiredPlaces]) -> Result<()>;
    /// Moves when units, desired states or machines change.
    fn engine_changes(&self) -> ChangeSignal;
    /// Moves when a machine's report of a unit may have changed (a store may move it more
    /// often): the engine wakes on it only while a unit waits for the machine it left to stop
    /// it. On etcd it moves while the cluster's cache runs, which the leading engine holds.
    fn state_changes(&self) -> ChangeSignal;
}

/// Upkeep some stores need, done on the engine leader's fleetd beside the engine (etcd: its
/// history older than it keeps is dropped, and the bodies no unit refers to any more are
/// deleted). A store that needs none (the embedded one drops a body with its last unit and
/// keeps no history) does not implement it.
#[async_trait]
pub trait StoreChores: Send + Sync {
    /// Does the chores that are due, and costs no request when none is. Answers when the next
    /// one is due at the latest; a move of [`StoreChores::chore_changes`] may bring it sooner.
    async fn do_chores(&self) -> Result<std::time::Duration>;
    /// Moves when a chore may have become due (the engine's snapshot found a content that
    /// lost its last unit).
    fn chore_changes(&self) -> ChangeSignal;
}

/// A consistent copy of the whole store while it serves (`fleetctl backup`): the embedded
/// store's; etcd has `etcdctl snapshot save`.
#[async_trait]
pub trait StoreBackup: Send + Sync {
    /// Writes a snapshot of the store, as of one moment, into the new file `to`; its size.
    async fn back_up(&self, to: &std::path::Path) -> Result<u64>;
}

/// The store's recorded format (`fleet_core::store_format`), read and written by fleetd before
/// anything else touches the store.
#[async_trait]
pub trait FormatRecord: Send + Sync {
    /// The format the store records; `None` when it records none (written by fleet 0.1).
    async fn stored_format(&self) -> Result<Option<fleet_core::store_format::StoredFormat>>;
    /// Records `new` if the store still records `expected`; `false` when another fleetd
    /// recorded something else first (read it again and decide again).
    async fn record_format(
        &self,
        expected: Option<fleet_core::store_format::StoredFormat>,
        new: fleet_core::store_format::StoredFormat,
    ) -> Result<bool>;
    /// Applies one migration (`fleet_core::store_format::MIGRATIONS`) to the store's keys or
    /// tables; safe to apply again after a crash half way, and safe while fleetds of the
    /// previous format run on the store.
    async fn migrate(&self, step: &fleet_core::store_format::Migration) -> Result<()>;
}

/// The questions put to one machine about its units' journals, as the machine answers them:
/// through the store on an etcd member, through its manager on a pull agent. Every kind of
/// machine answers through this facet, by one reconciler.
#[async_trait]
pub trait JournalInbox: Send + Sync {
    /// The questions put to `machine` and not answered yet, by id.
    async fn journal_questions(&self, machine: &str) -> Result<Vec<(String, JournalQuestion)>>;
    /// Moves when a question may have been put to `machine`.
    fn journal_question_changes(&self, machine: &str) -> ChangeSignal;
    /// Answers question `id` put to `machine` (`answer` is a `RelayedJournal` in JSON), and
    /// takes the question away.
    async fn answer_journal(&self, machine: &str, id: &str, answer: &[u8]) -> Result<()>;
}

/// A unit's journal asked of the machine that runs it through another fleetd of the cluster
/// (etcd: a question under the machine's own prefix, answered beside it, both under the
/// asker's short lease). A store whose one machine answers for itself (the embedded store)
/// does not implement it.
#[async_trait]
pub trait JournalQuestions: JournalInbox {
    /// Puts `question` to `machine`; its answer, or `None` when none came within `wait`.
    async fn ask_journal(
        &self,
        machine: &str,
        question: &JournalQuestion,
        wait: std::time::Duration,
    ) -> Result<Option<Vec<u8>>>;
    /// The questions put to any machine and not answered yet: what a manager answers for
    /// the pull agents it holds, which cannot reach the store.
    async fn every_journal_question(&self) -> Result<Vec<PutQuestion>>;
    /// Moves when a question may have been put to any machine.
    fn every_journal_question_changes(&self) -> ChangeSignal;
}

/// A journal question, the machine it was put to and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutQuestion {
    pub machine: String,
    pub id: String,
    pub question: JournalQuestion,
}

/// What a journal question asks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JournalQuestion {
    pub unit: String,
    pub lines: usize,
    /// The unit manager's status report too.
    pub status: bool,
}

#[async_trait]
pub trait AgentRegistry: Send + Sync {
    /// Announces this machine; it stays until [`AgentRegistry::unregister_machine`].
    async fn register_machine(&self, machine: &MachineState) -> Result<()>;
    /// Removes the machine and the unit states it reported.
    async fn unregister_machine(&self, machine_id: &str) -> Result<()>;
    /// Announces a pull agent's machine on its behalf (its certificate proved who it is): it
    /// takes over a presence another manager may still hold for it, unit states included.
    async fn announce_for_agent(&self, machine: &MachineState) -> Result<()> {
        self.register_machine(machine).await
    }
    /// What this machine should hold: its own schedule and the global units.
    async fn machine_work(&self, machine_id: &str) -> Result<MachineWork>;
    async fn unit_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>>;
    /// The bodies of `hashes` that exist, for `machine_id`'s units. A store that can reads
    /// them in one request (an agent asks for all the content new to it in a pass at once),
    /// or has them already from the machine's work (etcd: see `CarryingAssignment`).
    async fn unit_bodies(&self, _machine_id: &str, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        let mut found = HashMap::new();
        for hash in hashes {
            if let Some(file) = self.unit_body(hash).await? {
                found.insert(*hash, file);
            }
        }
        Ok(found)
    }
    /// Records state changes of this machine's units in one write.
    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> Result<()>;
    /// Moves when this machine's work may have changed.
    fn machine_changes(&self, machine_id: &str) -> ChangeSignal;
    /// Moves when the store says this machine's presence lapsed (its lease expired), for an
    /// agent to act on at once, even in the middle of a pass. `None`: it never lapses.
    fn presence_lapses(&self, _machine_id: &str) -> Option<ChangeSignal> {
        None
    }
    /// The agent stopped what ran on the machine after its presence lapsed. A store that
    /// signals lapses registers a machine again only after this (when an agent follows its
    /// lapses): present again in the store's view with units the engine may have moved
    /// still running, the machine would run them twice.
    fn presence_lapse_handled(&self, _machine_id: &str) {}
    /// When this machine's presence was last known renewed: its lease, if it has not been
    /// renewed since, expires no sooner than then plus `agent_ttl`.
    fn presence_renewed(&self, _machine_id: &str) -> Renewal {
        Renewal::NotLeased
    }
    /// Whether something this machine runs needs its presence proven by its own clock (an
    /// `AtMostOnce=` unit, `stop_units_when_cut_off`): a store whose renewals cost something
    /// while idle (a pull agent's heartbeats) renews often only while one does, and counts
    /// [`AgentRegistry::presence_renewed`] from then.
    fn presence_wanted(&self, _machine_id: &str, _wanted: bool) {}
}

/// What a store knows of the renewals of a machine's presence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The store keeps no lease (the embedded store), or counts none now (a pull agent that
    /// nothing asks to prove its presence): the presence does not lapse by this machine's clock.
    NotLeased,
    /// The machine holds no presence through this store now (it has not registered yet).
    NotHeld,
    /// The last renewal that succeeded was sent then.
    SentAt(tokio::time::Instant),
}

/// A store that serves every role, as fleetd needs.
/// The values of the secrets a unit names, for the machine that runs it: an etcd member opens
/// them with the cluster's secrets key, a pull agent asks its manager over its own mTLS
/// channel (which checks the unit is this machine's work).
#[async_trait]
pub trait UnitSecrets: Send + Sync {
    /// The values of the secrets `unit` names (`names`), for `machine_id`, which runs it, at
    /// the versions the unit is pinned to (else the newest): `pins`, as the machine's work
    /// says, for a member, which opens them itself; a manager answering a pull agent goes by
    /// its own copy of that work instead. An error says why not (never with a value).
    async fn unit_secrets(
        &self,
        machine_id: &str,
        unit: &str,
        names: &[String],
        pins: &fleet_core::secrets::SecretPins,
    ) -> std::result::Result<Vec<DeliveredSecret>, String>;
}

/// One secret's value as a machine receives it for a unit.
pub struct DeliveredSecret {
    pub name: String,
    pub version: u64,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for DeliveredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeliveredSecret({} v{})", self.name, self.version)
    }
}

impl Drop for DeliveredSecret {
    fn drop(&mut self) {
        self.value.fill(0);
    }
}

pub trait Registry: ApiRegistry + EngineRegistry + AgentRegistry {}

impl<T: ApiRegistry + EngineRegistry + AgentRegistry> Registry for T {}

#[cfg(feature = "contract")]
pub mod contract;
