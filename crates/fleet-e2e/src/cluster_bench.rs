//! What the cluster benchmarks share: the unit templates every unit comes from, submitting
//! many units straight to etcd, and waiting until they all report launched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_core::{DesiredState, UnitFile};
use fleet_registry::{ApiRegistry, PageRequest, RegistryError, UnitView};
use fleet_store_etcd::EtcdRegistry;
use tokio::sync::Semaphore;

use crate::launched_units::LaunchedUnits;

/// How many templates the units are instances of.
pub const TEMPLATES: usize = 10;
/// How many submissions run at once.
const SUBMITTERS: usize = 64;
/// How long the count of launched units may stand still before a run is given up.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Simulated machine `index`: `role=worker`, no engine, offering [`SIMULATED_CAPACITY`] when
/// `reserving`.
pub fn simulated_machine(index: usize, reserving: bool) -> fleet_core::MachineState {
    fleet_core::MachineState {
        id: format!("{:08x}5151515151515151515151515151", 0x5100_0000 + index),
        public_ip: format!("10.{}.{}.{}", index / 65536, (index / 256) % 256, index % 256),
        metadata: [("role".to_string(), "worker".to_string())].into(),
        version: "bench".into(),
        disable_engine: true,
        connection: fleet_core::Connection::Etcd,
        capacity: reserving.then_some(SIMULATED_CAPACITY),
        drain: None,
        taints: Default::default(),
    }
}

/// Template `index`: a service for machines with `role=worker`.
pub fn template(index: usize) -> UnitFile {
    template_reserving(index, false)
}

/// What each bench unit reserves when the bench runs with reservations: ten of them on one
/// simulated machine take 640 MiB and half a core of its [`SIMULATED_CAPACITY`].
pub const BENCH_RESERVATION: &str = "Memory=64M\nCPU=0.05\n";
/// What each simulated machine offers when the bench runs with reservations.
pub const SIMULATED_CAPACITY: fleet_core::Resources = fleet_core::Resources { memory: 8 << 30, cpu_millis: 4000 };

/// Template `index`, reserving [`BENCH_RESERVATION`] when `reserving`.
pub fn template_reserving(index: usize, reserving: bool) -> UnitFile {
    template_with(index, reserving, false)
}

/// Template `index` as [`template_reserving`] makes it; with `dependent`, the instances of
/// template 1 `Requires=` and those of template 2 come `After=` the instance of template 0 of
/// their number (`bench1@7.service` waits for `bench0@7.service`): one unit in five waits for
/// another ([`unit_name`] numbers the instances so that each has its counterpart).
pub fn template_with(index: usize, reserving: bool, dependent: bool) -> UnitFile {
    let reservation = if reserving { BENCH_RESERVATION } else { "" };
    let waits = match index {
        1 if dependent => "Requires=bench0@%i.service\n",
        2 if dependent => "After=bench0@%i.service\n",
        _ => "",
    };
    let text = format!(
        "[Unit]\nDescription=bench template {index}\n\n[Service]\nExecStart=/bin/sleep 100000\n\n[X-Fleet]\nMachineMetadata=role=worker\n{reservation}{waits}"
    );
    UnitFile::parse(&text).expect("the bench template parses")
}

/// The name of unit `index` of the bench: an instance of template `index % TEMPLATES`,
/// numbered `index`, or with `dependent` numbered `index / TEMPLATES` (every template then
/// has an instance of each number).
pub fn unit_name(index: usize, dependent: bool) -> String {
    let number = if dependent { index / TEMPLATES } else { index };
    format!("bench{}@{number}.service", index % TEMPLATES)
}

/// Submits `count` units (instances of the templates), 64 at a time; returns how long it took.
pub async fn submit_units(api: &EtcdRegistry, count: usize) -> Duration {
    let templates: Vec<UnitFile> = (0..TEMPLATES).map(template).collect();
    let units = (0..count)
        .map(|index| (format!("bench{}@{index}.service", index % TEMPLATES), templates[index % TEMPLATES].clone()));
    submit(api, units).await
}

/// Submits `units` (name, file) launched, 64 at a time; returns how long it took.
pub async fn submit(api: &EtcdRegistry, units: impl IntoIterator<Item = (String, UnitFile)>) -> Duration {
    let submitting = Instant::now();
    let permits = Arc::new(Semaphore::new(SUBMITTERS));
    let mut submissions = tokio::task::JoinSet::new();
    for (name, file) in units {
        let (api, permits) = (api.clone(), permits.clone());
        submissions.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore");
            // A store that does not answer in time under the load is asked again, as a client would.
            let mut tries = 0;
            while let Err(error) = api.put_unit(&name, &file, DesiredState::Launched).await {
                tries += 1;
                assert!(matches!(error, RegistryError::Unavailable(_)) && tries < 10, "submit {name}: {error:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
    while submissions.join_next().await.is_some() {}
    submitting.elapsed()
}

/// How many machines are registered under the key prefix `prefix` (`/_coreos.com/fleet/`):
/// counted, not listed (a listing of every machine ten times a second was itself a load on
/// etcd in the very rush the benches measure).
pub async fn registered_machines(client: &mut etcd_client::Client, prefix: &str) -> usize {
    let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
    let reply = client.get(format!("{prefix}machines/"), Some(options)).await;
    reply.map_or(0, |reply| usize::try_from(reply.count()).unwrap_or(0))
}

/// The longest the bench's copy of the units may go without answering before the bench gives up.
const COPY_PATIENCE: Duration = Duration::from_secs(120);

/// Every unit, page by page from the store's copy as the API reads them (as far as they
/// read).
pub async fn every_unit(api: &EtcdRegistry) -> Vec<UnitView> {
    let mut all: Vec<UnitView> = Vec::new();
    let mut unanswered_since: Option<Instant> = None;
    loop {
        let after = all.last().map(|unit| unit.name.clone());
        let request = PageRequest { start: all.len(), limit: 10_000, admits: Arc::new(|_: &str| true), after };
        // A copy that cannot answer now (etcd overloaded, its watch behind) is asked again:
        // counted as no units, it would read as nothing launched.
        let page = match api.units_page(request).await {
            Ok(page) => page,
            Err(error) => {
                let since = *unanswered_since.get_or_insert_with(Instant::now);
                assert!(since.elapsed() < COPY_PATIENCE, "the bench's copy of the units did not answer: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        unanswered_since = None;
        let more = page.more;
        all.extend(page.items);
        if !more {
            return all;
        }
    }
}

/// Writes the templates and a list of `count` instance names into `dir`, for
/// `fleetctl start --from-file`: the names the other submissions use.
pub fn unit_list(dir: &std::path::Path, count: usize, reserving: bool, dependent: bool) -> std::path::PathBuf {
    for index in 0..TEMPLATES {
        let path = dir.join(format!("bench{index}@.service"));
        std::fs::write(&path, template_with(index, reserving, dependent).serialize()).expect("write a bench template");
    }
    let names: Vec<String> = (0..count).map(|index| unit_name(index, dependent)).collect();
    let list = dir.join("units.list");
    std::fs::write(&list, names.join("\n")).expect("write the unit list");
    list
}

/// Waits until `count` units report launched, printing progress every 5 s; `stuck` tells why
/// when nothing moves for two minutes. Returns how long it took.
pub async fn wait_all_launched(launched: &LaunchedUnits, count: usize, stuck: impl Fn() -> String) -> Duration {
    let started = Instant::now();
    let (mut last_done, mut last_progress, mut last_report) = (0, Instant::now(), Instant::now());
    let mut changes = launched.changes();
    loop {
        let done = *changes.borrow_and_update();
        if done >= count {
            return started.elapsed();
        }
        if done != last_done {
            (last_done, last_progress) = (done, Instant::now());
        }
        assert!(last_progress.elapsed() < STALL_LIMIT, "stuck at {done}/{count} launched; {}", stuck());
        if last_report.elapsed() > Duration::from_secs(5) {
            println!("    … {done}/{count} launched after {:.1} s", started.elapsed().as_secs_f64());
            last_report = Instant::now();
        }
        // Woken by the count's change; at least once a second to report and to notice a stall.
        if let Ok(ended) = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await {
            ended.expect("the count of launched units is followed for as long as the bench waits");
        }
    }
}
