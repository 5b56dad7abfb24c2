//! The API's reads of the cluster's cache and the states' (`cluster_cache.rs`: units,
//! placements, reasons, bodies, machines and their metadata; unit states), from which lists
//! are served: a page costs a walk over names in memory and the views of its own items, never a
//! read of whole prefixes from etcd.
//!
//! Consistency, as the API states it: a list through a fleetd shows every unit write that
//! fleetd's API acknowledged before the list began (it waits for its copy to have it), and
//! every other write once the watch delivered it (milliseconds). A copy whose watch is down
//! answers nothing: the list fails as a read from etcd would.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{TxnOpResponse, TxnResponse};
use fleet_core::{MachineState, UnitFile, UnitState};

use super::EtcdRegistry;
use super::caches::{CATCH_UP, Cache, Held};
use super::keys::KeyRange;
use super::mirror::MirrorData;
use fleet_registry::codec::{Options, decode_listed};
use fleet_registry::{Page, PageRequest, RegistryError, Result, UnitRecord, UnitView};

/// How long the cluster's cache stays after an API read used it: a fleetd that an operator
/// listed through once gives it back, and holds only its own work again.
pub(super) const IDLE: Duration = Duration::from_secs(600);

/// (unit, machine) pairs, sorted.
type UnitMachinePairs = Vec<(String, String)>;

/// The unit states of `data` (the states' cache) in (unit, machine) order: etcd keeps them by
/// machine first, so the order is sorted once per change of the cache, not once per page.
fn state_order(registry: &EtcdRegistry, data: &MirrorData) -> UnitMachinePairs {
    let prefix = registry.keys().all_states();
    let mut order: UnitMachinePairs = data
        .range(&KeyRange::prefix(prefix.clone()))
        .filter_map(|(key, _)| {
            let (machine, unit) = machine_and_unit(&prefix, key)?;
            Some((unit.to_string(), machine.to_string()))
        })
        .collect();
    order.sort_unstable();
    order
}

/// The machine and unit a state key (`<prefix><machine>/<unit>`, `prefix` the states') names.
fn machine_and_unit<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let (machine, unit) = key.strip_prefix(prefix)?.split_once('/')?;
    (!machine.is_empty() && !unit.is_empty() && !unit.contains('/')).then_some((machine, unit))
}

/// The entries of `range` in key order, after the key `after` when given.
fn resumed<'a>(
    data: &'a MirrorData,
    range: &'a KeyRange,
    after: Option<String>,
) -> Box<dyn Iterator<Item = (&'a String, &'a super::mirror::Entry)> + 'a> {
    match after {
        Some(after) => Box::new(
            data.entries
                .range::<String, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                .take_while(move |(key, _)| range.contains(key)),
        ),
        None => Box::new(data.range(range)),
    }
}

impl EtcdRegistry {
    /// Notes a write this API made (`keys` in the order of the transaction's operations):
    /// lists wait until their caches have every change it made ([`EtcdRegistry::wrote_at`]).
    pub(super) fn api_wrote(&self, reply: &TxnResponse, keys: &[String]) {
        if let Some(header) = reply.header() {
            self.api_wrote_at(header.revision(), keys, &reply.op_responses());
        }
    }

    /// [`EtcdRegistry::api_wrote`] for operations answered by `responses` at `revision` (the
    /// operations of a nested transaction, say).
    pub(super) fn api_wrote_at(&self, revision: i64, keys: &[String], responses: &[TxnOpResponse]) {
        let changed = keys.iter().zip(responses).filter(|(_, response)| match response {
            TxnOpResponse::Put(_) => true,
            TxnOpResponse::Delete(deleted) => deleted.deleted() > 0,
            // A write on a condition ([`crate::api::put_if_absent`]): it wrote if it held.
            TxnOpResponse::Txn(inner) => inner.succeeded(),
            TxnOpResponse::Get(_) => false,
        });
        self.wrote_at(revision, changed.map(|(key, _)| key.as_str()));
    }

    /// Notes that this fleetd changed `changed` at `revision` (only keys whose change makes an
    /// event), in every cache the API reads that runs: its reads then wait until they hold it.
    /// A cache started later lists after the write, so it needs no note.
    pub(super) fn wrote_at<'k>(&self, revision: i64, changed: impl Iterator<Item = &'k str>) {
        let caches = [self.cluster_cache_running(), self.states_cache_running()];
        let caches: Vec<_> = caches.into_iter().flatten().collect();
        for key in changed {
            caches.iter().for_each(|cache| cache.expect(key, revision));
        }
    }

    /// `held` once it holds this API's writes and its watch is up.
    pub(super) async fn up_to_date(held: Held) -> Result<Held> {
        if held.caught_up(CATCH_UP).await {
            return Ok(held);
        }
        Err(RegistryError::Unavailable(
            "etcd: the API's copy of the cluster is not up to date (its watch is behind or down)".into(),
        ))
    }

    pub(super) async fn units_page_from_copy(&self, request: PageRequest) -> Result<Page<UnitView>> {
        let mirror = Self::up_to_date(self.api_mirror()).await?;
        let states = Self::up_to_date(self.api_states()).await?;
        let (data, states) = (mirror.synced()?, states.synced()?);
        let keys = self.keys();
        let prefix = keys.units();
        let range = KeyRange::prefix(prefix.clone());
        let after = request.after.as_deref().map(|unit| keys.unit(unit));
        let units = resumed(&data, &range, after)
            .filter_map(|(key, entry)| keys.name_in(&prefix, key).map(|name| Ok((name, (key.as_str(), entry)))));
        let mut bodies: HashMap<String, UnitFile> = HashMap::new();
        Page::select(units, &request, |name, (key, entry)| {
            // Decoded once per version, and shared with the engine's snapshots of the cache.
            let Some(record) = entry.decoded_listed::<UnitRecord>(key) else { return Ok(None) };
            self.view_in_copy(&data, &states, name, Arc::unwrap_or_clone(record), &mut bodies)
        })
    }

    /// Unit `name` from the cluster's cache, when it runs and holds this API's writes (a
    /// read of one unit then costs etcd nothing); `None` when the cache cannot answer.
    pub(super) async fn unit_from_copy(&self, name: &str) -> Option<Result<Option<UnitView>>> {
        let (cache, states) = (self.api_copy_if_up(&Cache::Cluster)?, self.api_copy_if_up(&Cache::States)?);
        if !cache.caught_up(CATCH_UP).await || !states.caught_up(CATCH_UP).await {
            return None;
        }
        let (data, states) = (cache.synced().ok()?, states.synced().ok()?);
        let key = self.keys().unit(name);
        let Some(entry) = data.entries.get(&key) else { return Some(Ok(None)) };
        let record = match entry.decoded::<UnitRecord>(&key) {
            Ok(record) => Arc::unwrap_or_clone(record),
            Err(error) => return Some(Err(error)),
        };
        // Ranges are watched apart: another fleetd's unit may show before its body does.
        if !data.entries.contains_key(&self.keys().body(&record.hash.to_string())) {
            return None;
        }
        Some(self.view_in_copy(&data, &states, name, record, &mut HashMap::new()))
    }

    /// `record`'s view with what the caches hold of it: body (parsed once per page in
    /// `bodies`), placement, reason and state. `None` when its body is missing.
    fn view_in_copy(
        &self,
        data: &MirrorData,
        states: &MirrorData,
        name: &str,
        record: UnitRecord,
        bodies: &mut HashMap<String, UnitFile>,
    ) -> Result<Option<UnitView>> {
        let keys = self.keys();
        let body_key = keys.body(&record.hash.to_string());
        let file = match bodies.get(&body_key) {
            Some(file) => file.clone(),
            None => {
                let Some(body) = data.entries.get(&body_key) else {
                    tracing::error!(key = body_key, "skipping a unit whose body is missing");
                    return Ok(None);
                };
                // Parsed once per revision of the body, shared with the engine's reads of it.
                let file = UnitFile::from_options(body.decoded::<Options>(&body_key)?.as_ref().clone());
                bodies.insert(body_key, file.clone());
                file
            }
        };
        let text = |key: String| data.entries.get(&key).map(|entry| String::from_utf8_lossy(&entry.value).into_owned());
        let machine = text(keys.placement(name));
        let reason = text(keys.reason(name));
        let state: Option<UnitState> = machine.as_ref().and_then(|machine| {
            let key = keys.state(machine, name);
            states.entries.get(&key).and_then(|entry| decode_listed(&key, &entry.value))
        });
        Ok(Some(UnitView::from_records(name, record, file, machine, reason, state.as_ref())))
    }

    /// One page of the live machines with their effective metadata, in ID order (`admits`
    /// and `after` take machine IDs). Only the page's machines are decoded: a client that
    /// pages through 10,000 machines a hundred at a time decodes each once, not a hundred times.
    pub(super) async fn machines_page_from_copy(&self, request: PageRequest) -> Result<Page<MachineState>> {
        let mirror = Self::up_to_date(self.api_mirror()).await?;
        let data = mirror.synced()?;
        let keys = self.keys();
        let prefix = keys.machines();
        let range = KeyRange::prefix(prefix.clone());
        let after = request.after.as_deref().map(|id| keys.machine(id));
        let machines = resumed(&data, &range, after)
            .filter_map(|(key, entry)| Some(Ok((keys.name_in(&prefix, key)?, (key, entry)))));
        Page::select(machines, &request, |id, (key, entry)| Ok(super::engine::machine_in(self, &data, id, key, entry)))
    }

    /// The drains of the machines present, from the copy: a walk over its drains alone.
    pub(super) async fn drains_from_copy(&self) -> Result<Vec<(String, fleet_core::drain::Drain)>> {
        let mirror = Self::up_to_date(self.api_mirror()).await?;
        let data = mirror.synced()?;
        let keys = self.keys();
        let prefix = keys.all_drains();
        let mut drains = Vec::new();
        for (key, entry) in data.range(&KeyRange::prefix(prefix.clone())) {
            let Some(id) = keys.name_in(&prefix, key) else { continue };
            if !data.entries.contains_key(&keys.machine(id)) {
                continue;
            }
            if let Some(drain) = decode_listed::<fleet_core::drain::Drain>(key, &entry.value) {
                drains.push((id.to_string(), drain));
            }
        }
        Ok(drains)
    }

    /// The machines out of touch the engine recorded, from the copy.
    pub(super) async fn out_of_touch_from_copy(&self) -> Result<Vec<fleet_core::OutOfTouch>> {
        let mirror = Self::up_to_date(self.api_mirror()).await?;
        let data = mirror.synced()?;
        Ok(super::leader_records::records_in(&data, &self.keys().all_out_of_touch()))
    }

    /// Where what `unit` on `machine` requires runs, as the engine recorded it, from the copy.
    pub(super) async fn required_places_from_copy(
        &self,
        unit: &str,
        machine: &str,
    ) -> Result<Vec<fleet_registry::RequiredPlace>> {
        let mirror = Self::up_to_date(self.api_mirror()).await?;
        let data = mirror.synced()?;
        let key = self.keys().required_place(machine, unit);
        let record = data.entries.get(&key).and_then(|entry| {
            fleet_registry::codec::decode_listed::<fleet_registry::RequiredPlaces>(&key, &entry.value)
        });
        Ok(record.map(|record| record.places).unwrap_or_default())
    }

    /// The states of `names`, in key (machine, unit) order: one walk over the copy's states,
    /// each looked up by its unit's name, with no (unit, machine) order to sort. Each is parsed
    /// once per revision and shared: a rollout reads the states of its units on every pass.
    pub(super) async fn states_of_units_from_copy(&self, names: &BTreeSet<String>) -> Result<Vec<Arc<UnitState>>> {
        let mirror = Self::up_to_date(self.api_states()).await?;
        let data = mirror.synced()?;
        let keys = self.keys();
        let prefix = keys.all_states();
        let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
        Ok(data
            .range(&KeyRange::prefix(prefix.clone()))
            .filter(|(key, _)| machine_and_unit(&prefix, key).is_some_and(|(_, unit)| wanted.contains(unit)))
            .filter_map(|(key, entry)| entry.decoded_listed::<UnitState>(key))
            .collect())
    }

    pub(super) async fn unit_states_page_from_copy(
        &self,
        request: PageRequest,
        machine: Option<&str>,
    ) -> Result<Page<UnitState>> {
        let mirror = Self::up_to_date(self.api_states()).await?;
        let data = mirror.synced()?;
        let keys = self.keys();
        let decoded = |unit: &str, machine: &str| {
            let key = keys.state(machine, unit);
            // Parsed afresh: a list is read now and then, and the copy keeps no parsed state
            // for it (100,000 of them would be tens of MiB beside the raw ones).
            Ok(data.entries.get(&key).and_then(|entry| decode_listed::<UnitState>(&key, &entry.value)))
        };
        if let Some(machine) = machine {
            // One machine's states are one range, in unit order.
            let prefix = keys.state(machine, "");
            let range = KeyRange::prefix(prefix.clone());
            let after = request.after.as_deref().and_then(|after| after.split_once('\0'));
            let after = after.map(|(unit, _)| keys.state(machine, unit));
            let units = resumed(&data, &range, after)
                .filter_map(|(key, _)| keys.name_in(&prefix, key).map(|unit| Ok((unit, ()))));
            return Page::select(units, &request, |unit, ()| decoded(unit, machine));
        }
        // Kept with the cache for its generation, and gone with it.
        let order = mirror.derived(&data, |data| state_order(self, data));
        let from = match request.after.as_deref().and_then(|after| after.split_once('\0')) {
            Some(after) => order.partition_point(|(unit, machine)| (unit.as_str(), machine.as_str()) <= after),
            None => 0,
        };
        let states = order[from..].iter().map(|(unit, machine)| Ok((unit.as_str(), machine.as_str())));
        Page::select(states, &request, |unit, machine| decoded(unit, machine))
    }
}
