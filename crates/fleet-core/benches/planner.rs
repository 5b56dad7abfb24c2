//! Benchmark: the pure engine planner placing 100,000 units onto 10,000 machines with the
//! full constraint mix: per 100 units, 40 unconstrained, 20 `MachineMetadata=`, 10
//! `Conflicts=` globs over their service's instances, 21 in `MachineOf=` chains
//! (leader ← middle ← tail, seven chains), 5 `MachineID=`, 3 `Replaces=`, and 1 in 1,000
//! units `Global=` (100 global units). Both the first placement and a replacement wave over
//! a settled cluster are timed, and a burst of new units planned in full and incrementally.
//! Then the same units each reserving memory and CPU, onto machines of four sizes, spread and
//! bin-packed: the time, and how many machines each strategy leaves empty. Last the same units
//! with priorities (900 for one in ten, 10 for three in ten), one machine in twenty tainted
//! (one unit in fifty tolerating it) and preemption on, onto machines too small for them all
//! (5 GiB and 5 cores each), with the units of each priority placed as a settled cluster would
//! hold them and the 900s waiting: the plan that preempts; and that plan again with every unit
//! in a disruption budget of 10% per region and one machine in 200 tainted `:evict`. Prints
//! its numbers.
//!
//! Last, units that wait for units (issue 75): 100,000 units placed, 20% of them requiring one
//! of 1,000 dbs (19,000 by name, 1,000 by a pattern over all of them with a count): the
//! engine's index of them built, and one db's state changing, as a pass woken by that report
//! looks at it.
//!
//! Run: `cargo bench -p fleet-core --bench planner`

use std::time::Instant;

use fleet_core::machine::MachineState;
use fleet_core::schedule::preview::{PreviewChange, preview};
use fleet_core::schedule::{
    ClusterSnapshot, Decision, IncrementalPlanner, PlacementStrategy, PlanScope, UnitSpec, plan,
};
use fleet_core::{DesiredState, Requirements, Resources, UnitFile};

const MACHINES: usize = 10_000;
const UNITS: usize = 100_000;
const REGIONS: [&str; 4] = ["us-east", "us-west", "eu", "asia"];

/// Machine sizes of the reservations run, in GiB and cores, one in four of each.
const SIZES: [(u64, u64); 4] = [(8, 4), (16, 8), (32, 16), (64, 32)];
/// What unit `n` reserves in the reservations run, memory and CPU.
const RESERVATIONS: [&str; 4] =
    ["Memory=128M\nCPU=0.1", "Memory=256M\nCPU=0.25", "Memory=512M\nCPU=0.5", "Memory=1G\nCPU=1"];

fn cluster(reserving: bool) -> ClusterSnapshot {
    let machines = (0..MACHINES)
        .map(|n| MachineState {
            capacity: reserving.then(|| {
                let (gib, cores) = SIZES[n % SIZES.len()];
                Resources { memory: gib << 30, cpu_millis: cores * 1000 }
            }),
            id: format!("{n:032x}"),
            metadata: [
                ("region".to_string(), REGIONS[n % REGIONS.len()].to_string()),
                ("disk".to_string(), if n % 3 == 0 { "ssd" } else { "hdd" }.to_string()),
            ]
            .into(),
            ..Default::default()
        })
        .collect();
    let units = (0..UNITS)
        .map(|n| {
            let (name, x_fleet) = unit_kind(n);
            // Global units (agents, one per machine of a region) reserve nothing.
            let reservation =
                if reserving && !x_fleet.contains("Global") { RESERVATIONS[n % RESERVATIONS.len()] } else { "" };
            let file =
                UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n\n[X-Fleet]\n{x_fleet}{reservation}\n"))
                    .expect("benchmark units parse");
            UnitSpec {
                requirements: std::sync::Arc::new(Requirements::from_unit(&name, &file)),
                name,
                desired: DesiredState::Launched,
                scheduled_on: None,
            }
        })
        .collect();
    ClusterSnapshot { machines, units, ..ClusterSnapshot::default() }
}

/// The name and `[X-Fleet]` section of unit `n`.
fn unit_kind(n: usize) -> (String, String) {
    if n % 1000 == 999 {
        let region = REGIONS[n % REGIONS.len()];
        return (format!("agent-{n}.service"), format!("Global=true\nMachineMetadata=region={region}\n"));
    }
    match n % 100 {
        0..=19 => (
            format!("db-{n}.service"),
            format!("MachineMetadata=region={}\nMachineMetadata=disk=ssd\n", REGIONS[n % REGIONS.len()]),
        ),
        // Instances of one service, ten to a group, kept on distinct machines.
        20..=29 => (format!("web-{}@{n}.service", n / 100), format!("Conflicts=web-{}@*.service\n", n / 100)),
        // Chains: a leader, a middle unit following it, a tail following the middle.
        30..=50 => {
            let chain = n - (n % 100 - 30) % 3;
            match (n % 100 - 30) % 3 {
                0 => (format!("chain-{chain}-leader.service"), String::new()),
                1 => (format!("chain-{chain}-middle.service"), format!("MachineOf=chain-{chain}-leader.service\n")),
                _ => (format!("chain-{chain}-tail.service"), format!("MachineOf=chain-{chain}-middle.service\n")),
            }
        }
        51..=55 => (format!("pinned-{n}.service"), format!("MachineID={:032x}\n", n % MACHINES)),
        // Each replaces an unconstrained unit of the same hundred.
        56..=58 => (format!("kick-{n}.service"), format!("Replaces=app-{}.service\n", n + 10)),
        _ => (format!("app-{n}.service"), String::new()),
    }
}

fn main() {
    let snapshot = cluster(false);
    println!(
        "planner: {UNITS} units onto {MACHINES} machines (40% free, 20% MachineMetadata, 10% Conflicts, \
         21% MachineOf chains, 5% MachineID, 3% Replaces, 0.1% Global)"
    );
    for run in 1..=3 {
        let started = Instant::now();
        let result = plan(&snapshot);
        let elapsed = started.elapsed();
        let placed = result.decisions.iter().filter(|d| matches!(d, Decision::Schedule { .. })).count();
        println!("run {run}: placed {placed}, unplaced {}, {:.3} s", result.unplaced.len(), elapsed.as_secs_f64());
    }
    // The steady state: every unit already placed, nothing to change.
    let mut settled = snapshot.clone();
    place_as_planned(&mut settled, &snapshot);
    measure("steady state (all placed)", &settled);

    // A replacement wave: the cluster settled without the replacing units, which then arrive
    // together; each takes the machine of the unit it replaces, which moves elsewhere.
    let mut wave = settled.clone();
    for spec in wave.units.iter_mut().filter(|spec| !spec.requirements.replaces.is_empty()) {
        spec.scheduled_on = None;
    }
    measure("replacement wave (3,000 units replacing placed ones)", &wave);

    // Machine loss: 100 machines (1%) go away; their units, followers included, move.
    let mut loss = settled.clone();
    loss.machines.retain(|machine| !machine.id.ends_with("00"));
    measure("machine loss (100 machines gone)", &loss);

    // A burst on the settled cluster: 1,000 new units without rules, as `fleetctl start` of a
    // template's instances gives the engine between two reconciles; the planner that remembers
    // where it left the cluster plans only them.
    let mut planner = IncrementalPlanner::default();
    let (_, scope) = planner.plan(&settled);
    assert_eq!(scope, PlanScope::Full);
    let mut burst = settled.clone();
    burst.units.extend(
        settled.units.iter().filter(|spec| spec.name.starts_with("app-")).take(1000).map(|spec| UnitSpec {
            name: format!("burst-{}", spec.name),
            scheduled_on: None,
            ..spec.clone()
        }),
    );
    measure("burst of 1,000 free units, full plan", &burst);
    let started = Instant::now();
    let (result, scope) = planner.plan(&burst);
    let elapsed = started.elapsed();
    assert_eq!(result, plan(&burst), "the incremental plan is the full plan");
    println!(
        "burst of 1,000 free units, incremental plan ({scope:?}): {} scheduled, {:.3} s",
        result.decisions.len(),
        elapsed.as_secs_f64()
    );

    // A plan of 10,000 new units over the settled cluster, as `fleetctl plan start` asks it
    // (`preview`: the cluster settled, then with the change).
    let changes: Vec<PreviewChange> = settled
        .units
        .iter()
        .filter(|spec| spec.name.starts_with("app-"))
        .take(10_000)
        .map(|spec| PreviewChange::Set {
            name: format!("planned-{}", spec.name),
            desired: DesiredState::Launched,
            requirements: Some(spec.requirements.clone()),
        })
        .collect();
    for run in 1..=3 {
        let started = Instant::now();
        let previewed = preview(&settled, &changes);
        let elapsed = started.elapsed();
        let placed = previewed.units.iter().filter(|unit| unit.after.is_some()).count();
        println!("preview of 10,000 new units, run {run}: {placed} placed, {:.3} s", elapsed.as_secs_f64());
    }

    // Every unit reserving memory and CPU (128M/0.1 to 1G/1), machines of 8 to 64 GiB.
    let reserving = cluster(true);
    println!("with reservations: every unit reserves, machines of 8/16/32/64 GiB and 4/8/16/32 cores");
    for strategy in [PlacementStrategy::Spread, PlacementStrategy::BinPack] {
        let snapshot = ClusterSnapshot { strategy, ..reserving.clone() };
        for run in 1..=2 {
            let started = Instant::now();
            let result = plan(&snapshot);
            let elapsed = started.elapsed();
            let used: std::collections::HashSet<&str> = result
                .decisions
                .iter()
                .filter_map(|decision| match decision {
                    Decision::Schedule { machine, .. } => Some(machine.as_str()),
                    Decision::Unschedule { .. } => None,
                })
                .collect();
            println!(
                "{strategy:?} run {run}: placed {}, unplaced {}, {:.3} s; {} machines left without a placed unit",
                result.decisions.len(),
                result.unplaced.len(),
                elapsed.as_secs_f64(),
                MACHINES - used.len()
            );
            if run == 1 && !result.unplaced.is_empty() {
                let mut kinds: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
                for (unit, _) in &result.unplaced {
                    *kinds.entry(unit.split(['-', '@']).next().unwrap_or(unit)).or_default() += 1;
                }
                println!("  unplaced by kind: {kinds:?}; first reason: {}", result.unplaced[0].1);
            }
        }
    }

    let decorated = with_priorities_and_taints(cluster(true));
    println!("the reservations run with priorities, 1 machine in 20 tainted and preemption on (spread)");
    for run in 1..=2 {
        let started = Instant::now();
        let result = plan(&decorated);
        println!(
            "run {run}: placed {}, unplaced {}, {:.3} s",
            result.decisions.len(),
            result.unplaced.len(),
            started.elapsed().as_secs_f64()
        );
    }

    let decorated = with_budgets(decorated);
    println!("the same with disruption budgets (10% per region) and 1 machine in 200 tainted :evict");
    for run in 1..=2 {
        let started = Instant::now();
        let result = plan(&decorated);
        println!(
            "run {run}: placed {}, {} evictions held, unplaced {}, {:.3} s",
            result.decisions.len(),
            result.held.len(),
            result.unplaced.len(),
            started.elapsed().as_secs_f64()
        );
    }

    let contended = contended();
    let waiting = contended.units.iter().filter(|unit| unit.scheduled_on.is_none()).count();
    println!(
        "with priorities, taints and preemption: machines of 5 GiB and 5 cores, 1 in 20 tainted, {waiting} units waiting"
    );
    for run in 1..=2 {
        let started = Instant::now();
        let result = plan(&contended);
        let elapsed = started.elapsed();
        let preempted = result
            .decisions
            .iter()
            .filter(|d| {
                matches!(d, Decision::Unschedule { reason: fleet_core::schedule::UnscheduleReason::PreemptedBy(_), .. })
            })
            .count();
        println!(
            "run {run}: {} decisions, {preempted} units preempted, {} unplaced, {:.3} s",
            result.decisions.len(),
            result.unplaced.len(),
            elapsed.as_secs_f64()
        );
    }
    let mut planner = IncrementalPlanner::default();
    planner.plan(&contended);
    let started = Instant::now();
    let (_, scope) = planner.plan(&contended);
    println!("  the next pass with units waiting: {scope:?}, {:.3} s", started.elapsed().as_secs_f64());
    let budgeted = with_budgets(contended);
    println!(
        "and with disruption budgets (10% per region, of each service's instances) and 1 machine in 200 tainted :evict"
    );
    for run in 1..=2 {
        let started = Instant::now();
        let result = plan(&budgeted);
        let elapsed = started.elapsed();
        let held = result.unplaced.iter().filter(|(_, reason)| reason.to_string().contains("held by")).count();
        println!(
            "run {run}: {} decisions, {} units disrupted, {} evictions and {held} preemptions held, {} unplaced, {:.3} s",
            result.decisions.len(),
            result.disrupted.len(),
            result.held.len(),
            result.unplaced.len(),
            elapsed.as_secs_f64()
        );
    }
    dependencies();
}

/// `snapshot` with every unit in a disruption budget of 10% per region of its service's
/// instances (all up), counted as the engine counts them, and one machine in two hundred
/// tainted `maintenance:evict`.
fn with_budgets(mut snapshot: ClusterSnapshot) -> ClusterSnapshot {
    use fleet_core::disruption_budget::{Budgets, DisruptionBudget, Member};
    use fleet_core::rollout::MaxUnavailable;
    for (n, machine) in snapshot.machines.iter_mut().enumerate() {
        if n % 200 == 7 {
            machine.taints = fleet_core::taint::parse_taints("maintenance:evict").expect("a taint");
        }
    }
    let budget = DisruptionBudget { size: MaxUnavailable::Percent(10), by: Some("region".to_string()) };
    let region: std::collections::HashMap<&str, String> = snapshot
        .machines
        .iter()
        .map(|machine| (machine.id.as_str(), machine.metadata.get("region").cloned().unwrap_or_default()))
        .collect();
    let members = snapshot.units.iter().map(|unit| Member {
        name: unit.name.clone(),
        group: unit.requirements.spread_group_of(&unit.name),
        budget: budget.clone(),
        value: unit.scheduled_on.as_deref().and_then(|machine| region.get(machine).cloned()),
        down: unit.scheduled_on.is_none(),
    });
    snapshot.budgets = Budgets::new(members);
    snapshot
}

/// `snapshot` with priorities (900 for one unit in ten, 10 for three in ten), one machine in
/// twenty tainted `gpu=yes` (one unit in fifty tolerating it) and preemption on.
fn with_priorities_and_taints(mut snapshot: ClusterSnapshot) -> ClusterSnapshot {
    for (n, machine) in snapshot.machines.iter_mut().enumerate() {
        if n % 20 == 0 {
            machine.taints = fleet_core::taint::parse_taints("gpu=yes").expect("a taint");
        }
    }
    for (n, unit) in snapshot.units.iter_mut().enumerate() {
        let mut requirements = (*unit.requirements).clone();
        requirements.priority = match n % 10 {
            0 => 900,
            1..=3 => 10,
            _ => 50,
        };
        if n % 50 == 1 {
            requirements.tolerate =
                fleet_core::requirements::tolerations_of(&["gpu".to_string()]).expect("a toleration");
        }
        unit.requirements = std::sync::Arc::new(requirements);
    }
    ClusterSnapshot { preemption: true, ..snapshot }
}

/// The reservations run's cluster with priorities and taints, on machines of 5 GiB and 5 cores
/// (about full); the units of priority 900 wait while the others are where a first plan put
/// them.
fn contended() -> ClusterSnapshot {
    let mut snapshot = cluster(true);
    for machine in &mut snapshot.machines {
        machine.capacity = Some(Resources { memory: 5 << 30, cpu_millis: 5000 });
    }
    let mut snapshot = with_priorities_and_taints(snapshot);
    let waiting: Vec<bool> = snapshot.units.iter().map(|unit| unit.requirements.priority == 900).collect();
    let others = ClusterSnapshot {
        units: snapshot.units.iter().zip(&waiting).filter(|(_, wait)| !**wait).map(|(unit, _)| unit.clone()).collect(),
        ..snapshot.clone()
    };
    place_as_planned(&mut snapshot, &others);
    snapshot
}

/// Puts each unit of `snapshot` where the plan of `planned` schedules it (unplaced otherwise).
fn place_as_planned(snapshot: &mut ClusterSnapshot, planned: &ClusterSnapshot) {
    let placed: std::collections::HashMap<String, String> = plan(planned)
        .decisions
        .into_iter()
        .filter_map(|decision| match decision {
            Decision::Schedule { unit, machine } => Some((unit, machine)),
            Decision::Unschedule { .. } => None,
        })
        .collect();
    for unit in &mut snapshot.units {
        unit.scheduled_on = placed.get(&unit.name).cloned();
    }
}

fn measure(label: &str, snapshot: &ClusterSnapshot) {
    let started = Instant::now();
    let result = plan(snapshot);
    let elapsed = started.elapsed();
    let count =
        |schedule: bool| result.decisions.iter().filter(|d| matches!(d, Decision::Schedule { .. }) == schedule).count();
    println!(
        "{label}: {} scheduled, {} unscheduled, {} unplaced, {:.3} s",
        count(true),
        count(false),
        result.unplaced.len(),
        elapsed.as_secs_f64()
    );
}

/// Units that wait for units: the index of 100,000 placed units of which 20,000 require one
/// of 1,000 dbs, built; then one db's report changing, looked at as the engine does.
fn dependencies() {
    use fleet_core::dependency::index::DependencyIndex;
    use fleet_core::{SystemdState, UnitState};
    use std::collections::HashMap;
    use std::sync::Arc;
    const DBS: usize = 1_000;
    const WAITING: usize = UNITS / 5;
    let parse = |x_fleet: &str| UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n{x_fleet}")).expect("a unit");
    let plain = parse("");
    let by_name: Vec<UnitFile> = (0..DBS).map(|k| parse(&format!("[X-Fleet]\nRequires=db@{k}.service\n"))).collect();
    let by_pattern = parse("[X-Fleet]\nRequires=db@*.service:2\n");
    let mut units = Vec::with_capacity(UNITS);
    let mut hashes = HashMap::new();
    for n in 0..UNITS {
        let (name, file) = match n {
            n if n < DBS => (format!("db@{n}.service"), &plain),
            n if n < DBS + WAITING - DBS => (format!("app@{n}.service"), &by_name[n % DBS]),
            n if n < DBS + WAITING => (format!("app@{n}.service"), &by_pattern),
            n => (format!("other@{n}.service"), &plain),
        };
        units.push((name, file));
    }
    let mut requirements: HashMap<fleet_core::UnitHash, std::sync::Arc<Requirements>> = HashMap::new();
    let specs: Vec<UnitSpec> = units
        .iter()
        .enumerate()
        .map(|(n, (name, file))| UnitSpec {
            name: name.clone(),
            desired: DesiredState::Launched,
            requirements: requirements
                .entry(file.hash())
                .or_insert_with(|| std::sync::Arc::new(Requirements::from_unit(name, file)))
                .clone(),
            scheduled_on: Some(format!("m{}", n % MACHINES)),
        })
        .collect();
    for (name, file) in &units {
        hashes.insert(name.as_str(), file.hash());
    }
    let state = |k: usize, active: &str| {
        Arc::new(UnitState {
            name: format!("db@{k}.service"),
            machine_id: format!("m{}", k % MACHINES),
            hash: plain.hash(),
            systemd: SystemdState::new("loaded", active, if active == "active" { "running" } else { "failed" }),
            launched: true,
            drift: None,
            health: None,
            secrets: Default::default(),
            run: None,
        })
    };
    let running: Vec<Arc<UnitState>> = (0..DBS).map(|k| state(k, "active")).collect();
    println!("dependencies: {UNITS} units placed, {WAITING} requiring one of {DBS} dbs ({} of them by a pattern)", DBS);
    let started = Instant::now();
    let mut index = DependencyIndex::build(&specs, &hashes, |_| true);
    let built = started.elapsed();
    let started = Instant::now();
    index.stand(&running);
    let evaluated: usize =
        index.dependents().map(|(position, _)| usize::from(index.evaluate(position).waiting.is_none())).sum();
    let stood = started.elapsed();
    println!(
        "  the index built in {:.3} s; every db's report read and every unit evaluated in {:.3} s ({evaluated} may start)",
        built.as_secs_f64(),
        stood.as_secs_f64()
    );
    for run in 1..=3 {
        let mut changed = running.clone();
        changed[7 * run] = state(7 * run, "failed");
        let started = Instant::now();
        let moved = index.stand(&changed);
        let waiting = moved.iter().filter(|&&position| index.evaluate(position).waiting.is_some()).count();
        let elapsed = started.elapsed();
        println!(
            "  run {run}: one db fails: {} units looked at again ({waiting} now wait), {} µs",
            moved.len(),
            elapsed.as_micros()
        );
        index.stand(&running);
    }
}
