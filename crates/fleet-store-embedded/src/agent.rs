//! The agents' facet of the embedded store.

use std::collections::HashMap;

use async_trait::async_trait;
use fleet_core::{MachineState, UnitFile, UnitHash};
use redb::ReadableTable;

use super::api::read_machines;
use super::tables::{self, Options, UnitRecord, decode, encode, state_key};
use super::{EmbeddedRegistry, Touched, unavailable};
use fleet_registry::{
    AgentRegistry, AssignedUnit, ChangeSignal, MachineIdentity, MachineWork, RequiredPlaces, Result, StateReport,
};

/// What a machine's work asks first of every unit record: whether the unit is global.
#[derive(serde::Deserialize)]
struct GlobalOnly {
    global: bool,
}

#[async_trait]
impl AgentRegistry for EmbeddedRegistry {
    /// A fleetd starting: what an earlier fleetd of this machine reported goes (a unit it
    /// reported running may have stopped while no fleetd ran, and the engine waits for a
    /// machine to stop what it took off it); the agent reports what it holds on its first
    /// pass.
    async fn register_machine(&self, machine: &MachineState) -> Result<()> {
        self.write_machine(machine, true).await
    }

    /// A pull agent coming to this manager again keeps its reports: it reports only changes.
    async fn announce_for_agent(&self, machine: &MachineState) -> Result<()> {
        self.write_machine(machine, false).await
    }

    async fn unregister_machine(&self, machine_id: &str) -> Result<()> {
        let machine_id = machine_id.to_string();
        self.write(move |txn, touched| {
            txn.open_table(tables::MACHINES).map_err(unavailable)?.remove(machine_id.as_str()).map_err(unavailable)?;
            let suffix = format!("\0{machine_id}");
            let mut states = txn.open_table(tables::STATES).map_err(unavailable)?;
            states.retain(|key, _| !key.ends_with(&suffix)).map_err(unavailable)?;
            *touched = Touched::engine();
            Ok(())
        })
        .await
    }

    async fn machine_work(&self, machine_id: &str) -> Result<MachineWork> {
        let machine_id = machine_id.to_string();
        self.read(move |txn| {
            let machine = read_machines(txn)?.into_iter().find(|machine| machine.id == machine_id);
            let units = txn.open_table(tables::UNITS).map_err(unavailable)?;
            let schedule = txn.open_table(tables::SCHEDULE).map_err(unavailable)?;
            let places = txn.open_table(tables::REQUIRED_PLACES).map_err(unavailable)?;
            let mut work = MachineWork { machine, ..MachineWork::default() };
            for row in schedule.iter().map_err(unavailable)? {
                let (unit, machine) = row.map_err(unavailable)?;
                if machine.value() != machine_id {
                    continue;
                }
                let name = unit.value().to_string();
                if let Some(record) = units.get(name.as_str()).map_err(unavailable)?
                    && let Some(record) = fleet_registry::codec::decode_listed::<UnitRecord>(&name, record.value())
                {
                    let required_at = match places.get(name.as_str()).map_err(unavailable)? {
                        Some(value) => fleet_registry::codec::decode_listed::<RequiredPlaces>(&name, value.value())
                            .filter(|record| record.machine == machine_id)
                            .map(|record| record.places)
                            .unwrap_or_default(),
                        None => Vec::new(),
                    };
                    work.scheduled.push(AssignedUnit {
                        name,
                        hash: record.hash,
                        desired: record.desired,
                        drift: record.drift,
                        secrets: record.secrets,
                        run: None,
                        required_at,
                    });
                }
            }
            let tickets = txn.open_table(tables::RUN_TICKETS).map_err(unavailable)?;
            for row in units.iter().map_err(unavailable)? {
                let (key, value) = row.map_err(unavailable)?;
                // Every unit of the cluster at every wake: whether it is global is read first,
                // without decoding the rest (most are not).
                let global = fleet_registry::codec::decode::<GlobalOnly>(key.value(), value.value());
                if !global.is_ok_and(|unit| unit.global) {
                    continue;
                }
                let name = key.value().to_string();
                if let Some(record) = fleet_registry::codec::decode_listed::<UnitRecord>(&name, value.value()) {
                    let run = match tickets.get(name.as_str()).map_err(unavailable)? {
                        Some(ticket) => fleet_registry::codec::decode_listed(&name, ticket.value()),
                        None => None,
                    };
                    work.globals.push(AssignedUnit {
                        name,
                        hash: record.hash,
                        desired: record.desired,
                        drift: record.drift,
                        secrets: record.secrets,
                        run,
                        required_at: Vec::new(),
                    });
                }
            }
            Ok(work)
        })
        .await
    }

    async fn unit_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        let key = hash.to_string();
        self.read(move |txn| {
            let bodies = txn.open_table(tables::BODIES).map_err(unavailable)?;
            let body = bodies.get(key.as_str()).map_err(unavailable)?;
            body.map(|body| decode::<Options>(&key, body.value()).map(UnitFile::from_options)).transpose()
        })
        .await
    }

    async fn unit_bodies(&self, _machine_id: &str, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        self.read_bodies(hashes).await
    }

    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> Result<()> {
        if reports.is_empty() {
            return Ok(());
        }
        let (machine_id, reports) = (machine_id.to_string(), reports.to_vec());
        self.write(move |txn, _| {
            let mut states = txn.open_table(tables::STATES).map_err(unavailable)?;
            for report in &reports {
                match report {
                    StateReport::Set(state) => {
                        let key = state_key(&state.name, &machine_id);
                        states.insert(key.as_str(), encode(state).as_slice()).map_err(unavailable)?;
                    }
                    StateReport::Remove(name) => {
                        states.remove(state_key(name, &machine_id).as_str()).map_err(unavailable)?;
                    }
                }
            }
            Ok(())
        })
        .await
    }

    fn machine_changes(&self, machine_id: &str) -> ChangeSignal {
        self.machine_signal(machine_id)
    }
}

impl EmbeddedRegistry {
    /// Writes `machine`'s record; with `fresh_reports`, drops the unit states it reported.
    /// Writes a machine's presence; `fresh_reports` for a fleetd of this store registering
    /// (its earlier reports go, and its ID is bound to it as a member: no join takes it).
    async fn write_machine(&self, machine: &MachineState, fresh_reports: bool) -> Result<()> {
        let machine = machine.clone();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
        self.write(move |txn, touched| {
            let mut machines = txn.open_table(tables::MACHINES).map_err(unavailable)?;
            machines.insert(machine.id.as_str(), encode(&machine).as_slice()).map_err(unavailable)?;
            if fresh_reports {
                let mut identities = txn.open_table(tables::IDENTITIES).map_err(unavailable)?;
                if identities.get(machine.id.as_str()).map_err(unavailable)?.is_none() {
                    let member = encode(&MachineIdentity::member(&machine.id, now));
                    identities.insert(machine.id.as_str(), member.as_slice()).map_err(unavailable)?;
                }
                let suffix = format!("\0{}", machine.id);
                let mut states = txn.open_table(tables::STATES).map_err(unavailable)?;
                states.retain(|key, _| !key.ends_with(&suffix)).map_err(unavailable)?;
            }
            *touched = Touched::engine();
            touched.machines.push(machine.id.clone());
            Ok(())
        })
        .await
    }
}
