//! The engine's facet of the embedded store. One fleetd owns the file, so leadership is
//! always its own; the lease is still checked so the seam behaves as on etcd.

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use fleet_core::schedule::Decision;
use fleet_core::{UnitFile, UnitHash};
use redb::ReadableTable;

use super::api::read_machines;
use super::tables::{self, Options, UnitRecord, read_all};
use super::{EmbeddedRegistry, unavailable};
use fleet_core::job::global_runs::RunTicket;
use fleet_core::job::runs::JobRecord;
use fleet_registry::apply_rule::{Condition, ReasonWrite, unit_writes};
use fleet_registry::{
    ApiRegistry, ChangeSignal, EngineLease, EngineRegistry, EngineSnapshot, RegistryError, Result, SilentDeparture,
    SnapshotUnit, StoredJob,
};

const EMBEDDED_LEASE_TOKEN: u64 = 1;

impl EmbeddedRegistry {
    /// Replaces every row of `table` by `rows` (key → value), under `lease`: what the engine
    /// records of its own memory.
    async fn replace_rows(
        &self,
        lease: &EngineLease,
        table: super::credentials::NamedTable,
        rows: Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        if lease.token != EMBEDDED_LEASE_TOKEN {
            return Err(RegistryError::LeadershipLost);
        }
        self.write(move |txn, _touched| {
            let mut table = txn.open_table(table).map_err(unavailable)?;
            table.retain(|key, _| rows.iter().any(|(wanted, _)| wanted == key)).map_err(unavailable)?;
            for (key, value) in &rows {
                table.insert(key.as_str(), value.as_slice()).map_err(unavailable)?;
            }
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl EngineRegistry for EmbeddedRegistry {
    async fn acquire_leadership(&self, machine_id: &str) -> Result<Option<EngineLease>> {
        *self.leader.locked() = Some(machine_id.to_string());
        Ok(Some(EngineLease { machine_id: machine_id.to_string(), token: EMBEDDED_LEASE_TOKEN }))
    }

    async fn release_leadership(&self, lease: &EngineLease) -> Result<()> {
        let mut leader = self.leader.locked();
        if leader.as_deref() == Some(lease.machine_id.as_str()) {
            *leader = None;
        }
        Ok(())
    }

    async fn snapshot(&self) -> Result<EngineSnapshot> {
        // Read before the data: a write in between only makes the engine plan once more.
        let revision = *self.signals.engine.borrow();
        self.read(move |txn| {
            let machines = read_machines(txn)?;
            let schedule = txn.open_table(tables::SCHEDULE).map_err(unavailable)?;
            let mut placed = HashMap::new();
            for row in schedule.iter().map_err(unavailable)? {
                let (unit, machine) = row.map_err(unavailable)?;
                placed.insert(unit.value().to_string(), machine.value().to_string());
            }
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let units = read_all::<UnitRecord>(&units)?
                .into_iter()
                .map(|(name, record)| SnapshotUnit {
                    machine_id: placed.remove(&name),
                    name,
                    hash: record.hash,
                    desired: record.desired,
                })
                .collect();
            Ok(EngineSnapshot { revision, machines, units })
        })
        .await
    }

    async fn snapshot_revision(&self) -> Result<Option<u64>> {
        Ok(Some(*self.signals.engine.borrow()))
    }

    async fn unit_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        self.read_bodies(hashes).await
    }

    async fn apply(&self, lease: &EngineLease, decisions: &[Decision], unplaced: &[(String, String)]) -> Result<()> {
        if lease.token != EMBEDDED_LEASE_TOKEN {
            return Err(RegistryError::LeadershipLost);
        }
        let (decisions, unplaced) = (decisions.to_vec(), unplaced.to_vec());
        self.write(move |txn, touched| {
            // The engine hears of its own writes, so its next snapshot has a new revision.
            touched.engine = true;
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let machines = txn.open_table(tables::MACHINES).map_err(unavailable)?;
            let mut schedule = txn.open_table(tables::SCHEDULE).map_err(unavailable)?;
            let mut reasons = txn.open_table(tables::REASONS).map_err(unavailable)?;
            let mut stored = Vec::new();
            for row in reasons.iter().map_err(unavailable)? {
                let (unit, reason) = row.map_err(unavailable)?;
                stored.push((unit.value().to_string(), reason.value().to_string()));
            }
            let stored = stored.iter().map(|(unit, reason)| (unit.as_str(), reason.as_str()));
            for write in unit_writes(&decisions, &unplaced, stored) {
                let unit = write.unit.as_str();
                let placed = schedule.get(unit).map_err(unavailable)?.map(|machine| machine.value().to_string());
                let exists = units.get(unit).map_err(unavailable)?.is_some();
                let mut holds = true;
                for condition in write.conditions() {
                    holds &= match condition {
                        // The engine reads this store directly: the record it planned from is
                        // the one there now, if the unit still exists.
                        Condition::UnitUnchanged | Condition::UnitExists => exists,
                        Condition::PlacedOn(machine) => placed.as_deref() == Some(machine.as_str()),
                        Condition::Unplaced => placed.is_none(),
                        Condition::MachineAbsent(machine) => {
                            machines.get(machine.as_str()).map_err(unavailable)?.is_none()
                        }
                    };
                }
                if !holds {
                    continue;
                }
                if let Some(leaving) = &write.leaves {
                    schedule.remove(unit).map_err(unavailable)?;
                    touched.machines.push(leaving.machine.clone());
                }
                if let Some(machine) = &write.lands_on {
                    schedule.insert(unit, machine.as_str()).map_err(unavailable)?;
                    touched.machines.push(machine.clone());
                }
                match &write.reason {
                    ReasonWrite::Set(reason) => {
                        reasons.insert(unit, reason.as_str()).map_err(unavailable)?;
                    }
                    ReasonWrite::Clear => {
                        reasons.remove(unit).map_err(unavailable)?;
                    }
                    ReasonWrite::Keep => {}
                }
            }
            Ok(())
        })
        .await
    }

    async fn recorded_out_of_touch(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        ApiRegistry::machines_out_of_touch(self).await
    }

    async fn record_out_of_touch(&self, lease: &EngineLease, machines: &[fleet_core::OutOfTouch]) -> Result<()> {
        let rows = machines.iter().map(|machine| (machine.id.clone(), tables::encode(machine))).collect();
        self.replace_rows(lease, tables::OUT_OF_TOUCH, rows).await
    }

    async fn recorded_silent_departures(&self) -> Result<Vec<SilentDeparture>> {
        self.list_all(tables::SILENT_DEPARTURES).await
    }

    async fn record_silent_departures(&self, lease: &EngineLease, departures: &[SilentDeparture]) -> Result<()> {
        let rows = departures.iter().map(|departure| (departure.unit.clone(), tables::encode(departure))).collect();
        self.replace_rows(lease, tables::SILENT_DEPARTURES, rows).await
    }

    async fn recorded_required_places(&self) -> Result<Vec<fleet_registry::RequiredPlaces>> {
        self.list_all(tables::REQUIRED_PLACES).await
    }

    async fn record_required_places(
        &self,
        lease: &EngineLease,
        places: &[fleet_registry::RequiredPlaces],
    ) -> Result<()> {
        if lease.token != EMBEDDED_LEASE_TOKEN {
            return Err(RegistryError::LeadershipLost);
        }
        let rows: Vec<(String, String, Vec<u8>)> =
            places.iter().map(|record| (record.unit.clone(), record.machine.clone(), tables::encode(record))).collect();
        // Only the rows that differ are written, and only their machines' agents woken.
        self.write(move |txn, touched| {
            let mut table = txn.open_table(tables::REQUIRED_PLACES).map_err(unavailable)?;
            let mut stale = Vec::new();
            for row in table.iter().map_err(unavailable)? {
                let (unit, value) = row.map_err(unavailable)?;
                let unit = unit.value().to_string();
                let wanted = rows.iter().find(|(name, _, _)| *name == unit);
                if wanted.is_none_or(|(_, _, wanted)| wanted.as_slice() != value.value()) {
                    let record =
                        fleet_registry::codec::decode_listed::<fleet_registry::RequiredPlaces>(&unit, value.value());
                    stale.push((unit, record.map(|record| record.machine)));
                }
            }
            for (unit, machine) in stale {
                table.remove(unit.as_str()).map_err(unavailable)?;
                touched.machines.extend(machine);
            }
            for (unit, machine, value) in &rows {
                if table.get(unit.as_str()).map_err(unavailable)?.is_none() {
                    table.insert(unit.as_str(), value.as_slice()).map_err(unavailable)?;
                    touched.machines.push(machine.clone());
                }
            }
            Ok(())
        })
        .await
    }

    async fn reported_states(&self, units: &BTreeSet<String>) -> Result<Vec<std::sync::Arc<fleet_core::UnitState>>> {
        if units.is_empty() {
            return Ok(Vec::new());
        }
        ApiRegistry::states_of_units(self, units).await
    }

    async fn job_records(&self) -> Result<Vec<StoredJob>> {
        self.read(move |txn| {
            let jobs = txn.open_table(tables::JOBS).map_err(unavailable)?;
            Ok(read_all::<tables::StoredJobValue>(&jobs)?
                .into_iter()
                .map(|(unit, stored)| StoredJob { unit, record: stored.record, version: stored.version })
                .collect())
        })
        .await
    }

    async fn put_job_record(
        &self,
        lease: &EngineLease,
        unit: &str,
        record: Option<&JobRecord>,
        version: u64,
    ) -> Result<bool> {
        if lease.token != EMBEDDED_LEASE_TOKEN {
            return Err(RegistryError::LeadershipLost);
        }
        let (unit, record) = (unit.to_string(), record.cloned());
        self.write(move |txn, _touched| super::job_records::replace(txn, &unit, record, version)).await
    }

    async fn run_tickets(&self) -> Result<BTreeMap<String, RunTicket>> {
        self.read(|txn| {
            let tickets = txn.open_table(tables::RUN_TICKETS).map_err(unavailable)?;
            Ok(tables::read_all::<RunTicket>(&tickets)?.into_iter().collect())
        })
        .await
    }

    async fn put_run_ticket(&self, lease: &EngineLease, unit: &str, ticket: Option<&RunTicket>) -> Result<()> {
        if lease.token != EMBEDDED_LEASE_TOKEN {
            return Err(RegistryError::LeadershipLost);
        }
        let (unit, ticket) = (unit.to_string(), ticket.copied());
        self.write(move |txn, touched| {
            let mut tickets = txn.open_table(tables::RUN_TICKETS).map_err(unavailable)?;
            match ticket {
                Some(ticket) => tickets.insert(unit.as_str(), tables::encode(&ticket).as_slice()).map(|_| ()),
                None => tickets.remove(unit.as_str()).map(|_| ()),
            }
            .map_err(unavailable)?;
            // Every machine's work carries it.
            touched.all_machines = true;
            Ok(())
        })
        .await
    }

    fn engine_changes(&self) -> ChangeSignal {
        self.signals.engine.subscribe()
    }

    fn state_changes(&self) -> ChangeSignal {
        self.signals.any_write.subscribe()
    }
}

impl EmbeddedRegistry {
    /// The bodies of `hashes` that exist, in one read transaction.
    pub(super) async fn read_bodies(&self, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        let hashes = hashes.to_vec();
        self.read(move |txn| {
            let bodies = txn.open_table(tables::BODIES).map_err(unavailable)?;
            let mut found = HashMap::new();
            for hash in hashes {
                let key = hash.to_string();
                if let Some(body) = bodies.get(key.as_str()).map_err(unavailable)?
                    && let Some(options) = fleet_registry::codec::decode_listed::<Options>(&key, body.value())
                {
                    found.insert(hash, UnitFile::from_options(options));
                }
            }
            Ok(found)
        })
        .await
    }
}
