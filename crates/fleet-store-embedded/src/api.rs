//! The API's facet of the embedded store.

use async_trait::async_trait;
use fleet_core::secrets::SecretPins;
use fleet_core::unpoisoned::Locked;
use std::collections::BTreeSet;

use fleet_core::{DesiredState, MachineId, MachineState, Requirements, UnitFile, UnitHash, UnitState};
use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::tables::{self, MetadataOverrides, UnitRecord, decode, encode, read_all};
use super::{EmbeddedRegistry, Touched, unavailable};
use fleet_core::drain::Drain;
use fleet_registry::codec::decode_listed;
use fleet_registry::codec::machine_from_records;
use fleet_registry::{
    ApiRegistry, ChangeSignal, Imported, ImportedUnit, MetadataChange, Page, PageRequest, RegistryError, Result,
    UnitChange, UnitChanged, UnitView, Writer,
};

/// A units or states table key as a page walks it: borrowed from the table, never copied;
/// it reads as the unit's name (a state key's part before the machine).
struct UnitKey<'a>(redb::AccessGuard<'a, &'static str>);

impl AsRef<str> for UnitKey<'_> {
    fn as_ref(&self) -> &str {
        let key = self.0.value();
        tables::split_state_key(key).map_or(key, |(unit, _)| unit)
    }
}

/// A table's rows in key order, after the key `after` when given.
fn resumed<'t>(
    table: &'t redb::ReadOnlyTable<&'static str, &'static [u8]>,
    after: Option<&str>,
) -> Result<redb::Range<'t, &'static str, &'static [u8]>> {
    let after = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
    table.range::<&str>((after, std::ops::Bound::Unbounded)).map_err(unavailable)
}

/// The tables a unit's view is read from, opened once for every unit a read lists (opening
/// them for each unit was a fifth of a 10,000-unit list's time).
struct UnitTables {
    bodies: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    schedule: redb::ReadOnlyTable<&'static str, &'static str>,
    reasons: redb::ReadOnlyTable<&'static str, &'static str>,
    states: redb::ReadOnlyTable<&'static str, &'static [u8]>,
}

impl UnitTables {
    fn open(txn: &ReadTransaction) -> Result<Self> {
        Ok(Self {
            bodies: txn.open_table(tables::BODIES).map_err(unavailable)?,
            schedule: txn.open_table(tables::SCHEDULE).map_err(unavailable)?,
            reasons: txn.open_table(tables::REASONS).map_err(unavailable)?,
            states: txn.open_table(tables::STATES).map_err(unavailable)?,
        })
    }

    /// Reads one unit with its body, schedule, reason and derived current state.
    fn unit_view(&self, name: &str, record: UnitRecord) -> Result<UnitView> {
        let hash_key = record.hash.to_string();
        let options = match self.bodies.get(hash_key.as_str()).map_err(unavailable)? {
            Some(body) => decode(&hash_key, body.value())?,
            None => {
                return Err(fleet_registry::RegistryError::Corrupt {
                    key: hash_key,
                    reason: "unit body missing".into(),
                });
            }
        };
        let machine_id = self.schedule.get(name).map_err(unavailable)?.map(|m| m.value().to_string());
        let reason = self.reasons.get(name).map_err(unavailable)?.map(|r| r.value().to_string());
        let reported = match (&machine_id, record.global) {
            (Some(machine), false) => {
                let key = tables::state_key(name, machine);
                let state = self.states.get(key.as_str()).map_err(unavailable)?;
                state.map(|s| decode::<UnitState>(&key, s.value())).transpose()?
            }
            _ => None,
        };
        let file = UnitFile::from_options(options);
        Ok(UnitView::from_records(name, record, file, machine_id, reason, reported.as_ref()))
    }
}

/// A unit of a listing: one whose body or state cannot be read is reported and left out.
fn listed(view: Result<UnitView>) -> Result<Option<UnitView>> {
    match view {
        Ok(view) => Ok(Some(view)),
        Err(error @ fleet_registry::RegistryError::Corrupt { .. }) => {
            tracing::error!(%error, "skipping a unit that cannot be read");
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// Who hears of a change to unit `name`: the engine, and the machines that may hold it.
fn touch_unit(txn: &WriteTransaction, name: &str, global: bool, touched: &mut Touched) -> Result<()> {
    touched.engine = true;
    if global {
        touched.all_machines = true;
    } else if let Some(machine) =
        txn.open_table(tables::SCHEDULE).map_err(unavailable)?.get(name).map_err(unavailable)?
    {
        touched.machines.push(machine.value().to_string());
    }
    Ok(())
}

/// Moves a unit's references from the contents `before` names to those `after` names
/// (`UnitRecord::contents`): a body is written with its first reference (`file` is the one
/// content a write may add) and deleted with its last.
fn move_references(
    txn: &WriteTransaction,
    before: &BTreeSet<UnitHash>,
    after: &BTreeSet<UnitHash>,
    file: Option<&UnitFile>,
) -> Result<()> {
    let mut refs = txn.open_table(tables::BODY_REFS).map_err(unavailable)?;
    let mut bodies = txn.open_table(tables::BODIES).map_err(unavailable)?;
    for hash in after.difference(before) {
        let key = hash.to_string();
        let count = refs.get(key.as_str()).map_err(unavailable)?.map_or(0, |c| c.value());
        refs.insert(key.as_str(), count + 1).map_err(unavailable)?;
        if count == 0 {
            let Some(file) = file.filter(|file| file.hash() == *hash) else {
                return Err(RegistryError::Corrupt { key, reason: "unit body missing".into() });
            };
            bodies.insert(key.as_str(), encode(&file.options()).as_slice()).map_err(unavailable)?;
        }
    }
    for hash in before.difference(after) {
        let key = hash.to_string();
        let count = refs.get(key.as_str()).map_err(unavailable)?.map_or(0, |c| c.value());
        if count <= 1 {
            refs.remove(key.as_str()).map_err(unavailable)?;
            bodies.remove(key.as_str()).map_err(unavailable)?;
        } else {
            refs.insert(key.as_str(), count - 1).map_err(unavailable)?;
        }
    }
    Ok(())
}

/// The contents `record` refers to, none for no record.
fn contents_of(record: Option<&UnitRecord>) -> BTreeSet<UnitHash> {
    record.map(UnitRecord::contents).unwrap_or_default()
}

fn unit_record(txn: &WriteTransaction, name: &str) -> Result<Option<UnitRecord>> {
    let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
    let record = units.get(name).map_err(unavailable)?;
    record.map(|r| decode(name, r.value())).transpose()
}

pub(super) fn read_machines(txn: &ReadTransaction) -> Result<Vec<MachineState>> {
    let machines = txn.open_table(tables::MACHINES).map_err(unavailable)?;
    let metadata = txn.open_table(tables::METADATA).map_err(unavailable)?;
    let drains = txn.open_table(tables::DRAINS).map_err(unavailable)?;
    let mut result = Vec::new();
    for row in machines.iter().map_err(unavailable)? {
        let (id, machine) = row.map_err(unavailable)?;
        let id = id.value().to_string();
        let overrides = metadata.get(id.as_str()).map_err(unavailable)?;
        let overrides = overrides.as_ref().map(|bytes| (id.as_str(), bytes.value()));
        let drain = drains.get(id.as_str()).map_err(unavailable)?;
        let drain = drain.as_ref().map(|bytes| (id.as_str(), bytes.value()));
        result.extend(machine_from_records(&id, machine.value(), overrides, drain));
    }
    Ok(result)
}

/// Whether the source `name` exists, as `txn` sees it.
pub(super) fn source_exists(txn: &WriteTransaction, name: &str) -> Result<bool> {
    Ok(txn.open_table(tables::SOURCES).map_err(unavailable)?.get(name).map_err(unavailable)?.is_some())
}

/// `SourceRemoved` when `writer` is a source that no longer exists (a sync under way when its
/// source was removed writes nothing after).
fn source_present(txn: &WriteTransaction, writer: &Writer) -> Result<()> {
    match writer {
        Writer::Source { name, .. } if !source_exists(txn, name)? => {
            Err(RegistryError::SourceRemoved { name: name.clone() })
        }
        _ => Ok(()),
    }
}

/// Stores `file` under `name` with `desired` in `txn`, if `writer` may.
fn put_in(
    txn: &WriteTransaction,
    touched: &mut Touched,
    name: &str,
    file: &UnitFile,
    desired: DesiredState,
    writer: &Writer,
    kept: usize,
) -> Result<()> {
    source_present(txn, writer)?;
    let hash = file.hash();
    let global = Requirements::from_unit(name, file).global;
    let previous = unit_record(txn, name)?;
    let source = owner_after(txn, writer, name, previous.as_ref())?;
    // A rotation's pins hold across new content: the unit is still on its way.
    let secrets = previous.as_ref().map(|old| old.secrets.clone()).unwrap_or_default();
    let versions = UnitRecord::versions_after(previous.as_ref(), hash, desired, writer, kept);
    let record = UnitRecord { hash, desired, global, source, drift: writer.drift_policy(), secrets, versions };
    move_references(txn, &contents_of(previous.as_ref()), &record.contents(), Some(file))?;
    txn.open_table(tables::UNITS)
        .map_err(unavailable)?
        .insert(name, encode(&record).as_slice())
        .map_err(unavailable)?;
    touch_unit(txn, name, global || previous.is_some_and(|old| old.global), touched)
}

/// Sets the desired state of the unit `name` in `txn`, if `writer` may; `false` when there
/// is no such unit.
fn set_desired_in(
    txn: &WriteTransaction,
    touched: &mut Touched,
    name: &str,
    desired: DesiredState,
    writer: &Writer,
    kept: usize,
) -> Result<bool> {
    source_present(txn, writer)?;
    let Some(mut record) = unit_record(txn, name)? else {
        return Ok(false);
    };
    let before = record.contents();
    record.source = owner_after(txn, writer, name, Some(&record))?;
    record.versions = UnitRecord::versions_after(Some(&record), record.hash, desired, writer, kept);
    record.desired = desired;
    move_references(txn, &before, &record.contents(), None)?;
    store_unit(txn, touched, name, &record)?;
    Ok(true)
}

/// Writes the record of the unit `name`, which stays global or not as it was, and tells the
/// agents it concerns.
fn store_unit(txn: &WriteTransaction, touched: &mut Touched, name: &str, record: &UnitRecord) -> Result<()> {
    txn.open_table(tables::UNITS).map_err(unavailable)?.insert(name, encode(record).as_slice()).map_err(unavailable)?;
    touch_unit(txn, name, record.global, touched)
}

/// Sets the secret pins of the unit `name` in `txn`; `false` when there is no such unit.
pub(super) fn set_pins_in(
    txn: &WriteTransaction,
    touched: &mut Touched,
    name: &str,
    pins: &SecretPins,
) -> Result<bool> {
    let Some(mut record) = unit_record(txn, name)? else {
        return Ok(false);
    };
    if record.secrets == *pins {
        return Ok(true);
    }
    record.secrets = pins.clone();
    store_unit(txn, touched, name, &record)?;
    Ok(true)
}

impl EmbeddedRegistry {
    /// How many past versions a unit keeps (`ApiRegistry::keep_versions`).
    fn versions_kept(&self) -> usize {
        self.versions_kept.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[async_trait]
impl ApiRegistry for EmbeddedRegistry {
    async fn job_record(&self, unit: &str) -> Result<Option<fleet_registry::StoredJob>> {
        let unit = unit.to_string();
        self.read(move |txn| {
            let jobs = txn.open_table(tables::JOBS).map_err(unavailable)?;
            let Some(value) = jobs.get(unit.as_str()).map_err(unavailable)? else { return Ok(None) };
            let stored = tables::decode::<tables::StoredJobValue>(&unit, value.value())?;
            Ok(Some(fleet_registry::StoredJob { unit: unit.clone(), record: stored.record, version: stored.version }))
        })
        .await
    }

    async fn all_job_records(&self) -> Result<Vec<fleet_registry::StoredJob>> {
        fleet_registry::EngineRegistry::job_records(self).await
    }

    async fn put_dispatched_run(
        &self,
        unit: &str,
        record: &fleet_core::job::runs::JobRecord,
        version: u64,
    ) -> Result<bool> {
        let (unit, record) = (unit.to_string(), record.clone());
        self.write(move |txn, touched| {
            let replaced = crate::job_records::replace(txn, &unit, Some(record), version)?;
            touched.engine = replaced;
            Ok(replaced)
        })
        .await
    }

    async fn revision(&self) -> Result<Option<u64>> {
        Ok(Some(self.writes()))
    }

    async fn units(&self) -> Result<Vec<UnitView>> {
        self.read(|txn| {
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let tables = UnitTables::open(txn)?;
            let records = read_all::<UnitRecord>(&units)?;
            let mut views = Vec::with_capacity(records.len());
            for (name, record) in records {
                views.extend(listed(tables.unit_view(&name, record))?);
            }
            Ok(views)
        })
        .await
    }

    async fn unit(&self, name: &str) -> Result<Option<UnitView>> {
        let name = name.to_string();
        self.read(move |txn| {
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let Some(record) = units.get(name.as_str()).map_err(unavailable)? else {
                return Ok(None);
            };
            let record = decode(&name, record.value())?;
            UnitTables::open(txn)?.unit_view(&name, record).map(Some)
        })
        .await
    }

    async fn put_unit_as(&self, name: &str, file: &UnitFile, desired: DesiredState, writer: &Writer) -> Result<()> {
        let (name, file, writer, kept) = (name.to_string(), file.clone(), writer.clone(), self.versions_kept());
        self.write(move |txn, touched| put_in(txn, touched, &name, &file, desired, &writer, kept)).await
    }

    async fn set_desired_state_as(&self, name: &str, desired: DesiredState, writer: &Writer) -> Result<bool> {
        let (name, writer, kept) = (name.to_string(), writer.clone(), self.versions_kept());
        self.write(move |txn, touched| set_desired_in(txn, touched, &name, desired, &writer, kept)).await
    }

    /// Every change in one transaction: a unit another writer owns is refused alone (its
    /// check comes before any write of it); any other failure writes nothing.
    async fn change_units_as(&self, changes: &[UnitChange], writer: &Writer) -> Result<Vec<Result<UnitChanged>>> {
        let (changes, writer, kept) = (changes.to_vec(), writer.clone(), self.versions_kept());
        self.write(move |txn, touched| {
            let mut answers = Vec::with_capacity(changes.len());
            for change in &changes {
                let answer = match &change.file {
                    Some(file) => put_in(txn, touched, &change.name, file, change.desired, &writer, kept)
                        .map(|()| UnitChanged::Written),
                    None => set_desired_in(txn, touched, &change.name, change.desired, &writer, kept)
                        .map(|found| if found { UnitChanged::Written } else { UnitChanged::NoSuchUnit }),
                };
                match answer {
                    Err(
                        refused @ (RegistryError::Owned { .. }
                        | RegistryError::ChangedSincePlan { .. }
                        | RegistryError::SourceRemoved { .. }),
                    ) => {
                        answers.push(Err(refused));
                    }
                    Err(error) => return Err(error),
                    Ok(changed) => answers.push(Ok(changed)),
                }
            }
            Ok(answers)
        })
        .await
    }

    async fn destroy_unit_as(&self, name: &str, writer: &Writer) -> Result<bool> {
        let (name, writer) = (name.to_string(), writer.clone());
        self.write(move |txn, touched| {
            source_present(txn, &writer)?;
            let record = match unit_record(txn, &name) {
                Ok(Some(record)) => record,
                Ok(None) => return Ok(false),
                Err(fleet_registry::RegistryError::Corrupt { key, reason }) => {
                    // Nobody can own what nobody can read: it goes with every row named after
                    // it (its body is left, as its hash cannot be read either).
                    tracing::error!(key, reason, "destroying a unit whose record cannot be read");
                    touch_unit(txn, &name, true, touched)?;
                    txn.open_table(tables::UNITS).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?;
                    for table in [tables::SCHEDULE, tables::REASONS] {
                        txn.open_table(table).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?;
                    }
                    return Ok(true);
                }
                Err(error) => return Err(error),
            };
            owner_after(txn, &writer, &name, Some(&record))?;
            touch_unit(txn, &name, record.global, touched)?;
            txn.open_table(tables::UNITS).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?;
            txn.open_table(tables::SCHEDULE).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?;
            txn.open_table(tables::REASONS).map_err(unavailable)?.remove(name.as_str()).map_err(unavailable)?;
            move_references(txn, &record.contents(), &BTreeSet::new(), None)?;
            Ok(true)
        })
        .await
    }

    /// One transaction: every unit and its placement, or nothing.
    async fn import_units(&self, units: &[ImportedUnit], writer: &Writer) -> Result<Imported> {
        let (units, writer) = (units.to_vec(), writer.clone());
        self.write(move |txn, touched| {
            let existing: Vec<String> = {
                let table = txn.open_table(tables::UNITS).map_err(unavailable)?;
                let mut existing = Vec::new();
                for unit in &units {
                    if table.get(unit.name.as_str()).map_err(unavailable)?.is_some() {
                        existing.push(unit.name.clone());
                    }
                }
                existing
            };
            if !existing.is_empty() {
                return Ok(Imported::Existing(existing));
            }
            for unit in &units {
                if let Some(machine) = &unit.machine {
                    txn.open_table(tables::SCHEDULE)
                        .map_err(unavailable)?
                        .insert(unit.name.as_str(), machine.as_str())
                        .map_err(unavailable)?;
                }
                put_in(txn, touched, &unit.name, &unit.file, unit.desired, &writer, 0)?;
            }
            Ok(Imported::Written)
        })
        .await
    }

    async fn kept_body(&self, hash: &fleet_core::UnitHash) -> Result<Option<UnitFile>> {
        fleet_registry::AgentRegistry::unit_body(self, hash).await
    }

    fn keep_versions(&self, kept: usize) {
        self.versions_kept.store(kept, std::sync::atomic::Ordering::Relaxed);
    }

    async fn units_page(&self, request: PageRequest) -> Result<Page<UnitView>> {
        self.read(move |txn| {
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let tables = UnitTables::open(txn)?;
            let rows = resumed(&units, request.after.as_deref())?.map(|row| {
                let (name, record) = row.map_err(unavailable)?;
                Ok((UnitKey(name), record))
            });
            Page::select(rows, &request, |name, record| match decode_listed::<UnitRecord>(name, record.value()) {
                Some(record) => listed(tables.unit_view(name, record)),
                None => Ok(None),
            })
        })
        .await
    }

    async fn unit_states_page(&self, request: PageRequest, machine: Option<&str>) -> Result<Page<UnitState>> {
        let machine = machine.map(str::to_string);
        self.read(move |txn| {
            let states = txn.open_table(tables::STATES).map_err(unavailable)?;
            // Keyed by unit, then machine: already in the list's order.
            let rows = resumed(&states, request.after.as_deref())?.filter_map(|row| {
                let (key, state) = match row {
                    Ok(row) => row,
                    Err(error) => return Some(Err(unavailable(error))),
                };
                let (_, on) = tables::split_state_key(key.value())?;
                if machine.as_deref().is_some_and(|machine| machine != on) {
                    return None;
                }
                Some(Ok((UnitKey(key), state)))
            });
            Page::select(rows, &request, |unit, state| Ok(decode_listed::<UnitState>(unit, state.value())))
        })
        .await
    }

    fn unit_changes(&self) -> ChangeSignal {
        self.signals.any_write.subscribe()
    }

    async fn unit_states(&self) -> Result<Vec<UnitState>> {
        self.read(|txn| {
            let states = txn.open_table(tables::STATES).map_err(unavailable)?;
            Ok(read_all::<UnitState>(&states)?.into_iter().map(|(_, state)| state).collect())
        })
        .await
    }

    async fn machines(&self) -> Result<Vec<MachineState>> {
        self.read(read_machines).await
    }

    async fn machines_out_of_touch(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        self.list_all(tables::OUT_OF_TOUCH).await
    }

    async fn required_places_of(&self, unit: &str, machine: &str) -> Result<Vec<fleet_registry::RequiredPlace>> {
        let (unit, machine) = (unit.to_string(), machine.to_string());
        self.read(move |txn| {
            let places = txn.open_table(tables::REQUIRED_PLACES).map_err(unavailable)?;
            let Some(value) = places.get(unit.as_str()).map_err(unavailable)? else { return Ok(Vec::new()) };
            let record = fleet_registry::codec::decode_listed::<fleet_registry::RequiredPlaces>(&unit, value.value());
            Ok(record.filter(|record| record.machine == machine).map(|record| record.places).unwrap_or_default())
        })
        .await
    }

    async fn engine_leader(&self) -> Result<Option<MachineId>> {
        Ok(self.leader.locked().clone())
    }

    async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<()> {
        let changes = changes.to_vec();
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::METADATA).map_err(unavailable)?;
            for change in &changes {
                let (machine_id, key, value) = match change {
                    MetadataChange::Set { machine_id, key, value } => (machine_id, key, value.as_str()),
                    MetadataChange::Remove { machine_id, key } => (machine_id, key, ""),
                };
                let mut overrides: MetadataOverrides = match table.get(machine_id.as_str()).map_err(unavailable)? {
                    Some(bytes) => decode(machine_id, bytes.value())?,
                    None => MetadataOverrides::new(),
                };
                overrides.insert(key.clone(), value.to_string());
                table.insert(machine_id.as_str(), encode(&overrides).as_slice()).map_err(unavailable)?;
                touched.machines.push(machine_id.clone());
            }
            touched.engine = true;
            Ok(())
        })
        .await
    }
    async fn set_drain(&self, machine_id: &str, drain: Option<&Drain>) -> Result<()> {
        let (machine_id, drain) = (machine_id.to_string(), drain.map(encode));
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::DRAINS).map_err(unavailable)?;
            match &drain {
                Some(bytes) => table.insert(machine_id.as_str(), bytes.as_slice()).map(drop),
                None => table.remove(machine_id.as_str()).map(drop),
            }
            .map_err(unavailable)?;
            touched.engine = true;
            Ok(())
        })
        .await
    }

    async fn drains(&self) -> Result<Vec<(MachineId, Drain)>> {
        self.read(|txn| {
            let machines = txn.open_table(tables::MACHINES).map_err(unavailable)?;
            let drains = txn.open_table(tables::DRAINS).map_err(unavailable)?;
            let mut present = Vec::new();
            for row in drains.iter().map_err(unavailable)? {
                let (id, drain) = row.map_err(unavailable)?;
                let id = id.value().to_string();
                if machines.get(id.as_str()).map_err(unavailable)?.is_some() {
                    present.push((id.clone(), decode(&id, drain.value())?));
                }
            }
            Ok(present)
        })
        .await
    }

    async fn step_drain(&self, machine_id: &str, drain: &Drain) -> Result<bool> {
        let (machine_id, drain) = (machine_id.to_string(), drain.clone());
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::DRAINS).map_err(unavailable)?;
            let standing: Option<Drain> = table
                .get(machine_id.as_str())
                .map_err(unavailable)?
                .map(|bytes| decode(&machine_id, bytes.value()))
                .transpose()?;
            if standing.is_none_or(|standing| standing.started != drain.started) {
                return Ok(false);
            }
            table.insert(machine_id.as_str(), encode(&drain).as_slice()).map_err(unavailable)?;
            touched.engine = true;
            Ok(true)
        })
        .await
    }
}

/// Who owns `name` after `writer` writes it (its record now is `current`), or why it is kept
/// out: another owner, or a change since the plan guarding the write (checked here, inside the
/// write's transaction, against the machine the unit is placed on in it).
fn owner_after(
    txn: &WriteTransaction,
    writer: &Writer,
    name: &str,
    current: Option<&UnitRecord>,
) -> Result<Option<String>> {
    let machine = match writer.guard() {
        Some(_) => txn
            .open_table(tables::SCHEDULE)
            .map_err(unavailable)?
            .get(name)
            .map_err(unavailable)?
            .map(|machine| machine.value().to_string()),
        None => None,
    };
    writer.admits(name, current, machine.as_deref()).map_err(|refused| refused.into_error(name))
}
