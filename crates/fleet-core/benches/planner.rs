//! Benchmark: the pure engine planner placing 100,000 units onto 10,000 machines.
//! 70% of the units are unconstrained, 20% carry `MachineMetadata=`, 10% carry a
//! `Conflicts=` glob over their own service's instances. Prints its numbers.
//!
//! Run: `cargo bench -p fleet-core --bench planner`

use std::time::Instant;

use fleet_core::machine::MachineState;
use fleet_core::schedule::{ClusterSnapshot, Decision, UnitSpec, plan};
use fleet_core::{DesiredState, Requirements, UnitFile};

const MACHINES: usize = 10_000;
const UNITS: usize = 100_000;
const REGIONS: [&str; 4] = ["us-east", "us-west", "eu", "asia"];

fn snapshot() -> ClusterSnapshot {
    let machines = (0..MACHINES)
        .map(|n| MachineState {
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
            let (name, x_fleet) = match n % 10 {
                0 | 1 => (
                    format!("db-{n}.service"),
                    format!("MachineMetadata=region={}\nMachineMetadata=disk=ssd\n", REGIONS[n % REGIONS.len()]),
                ),
                // Instances of one service, ten to a group, kept on distinct machines.
                2 => (format!("web-{}@{n}.service", n / 100), format!("Conflicts=web-{}@*.service\n", n / 100)),
                _ => (format!("app-{n}.service"), String::new()),
            };
            let file = UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n\n[X-Fleet]\n{x_fleet}"))
                .expect("benchmark units parse");
            UnitSpec {
                requirements: Requirements::from_unit(&name, &file),
                name,
                desired: DesiredState::Launched,
                scheduled_on: None,
            }
        })
        .collect();
    ClusterSnapshot { machines, units }
}

fn main() {
    let snapshot = snapshot();
    println!("planner: {UNITS} units onto {MACHINES} machines (70% free, 20% MachineMetadata, 10% Conflicts)");
    for run in 1..=3 {
        let started = Instant::now();
        let result = plan(&snapshot);
        let elapsed = started.elapsed();
        let placed = result.decisions.iter().filter(|d| matches!(d, Decision::Schedule { .. })).count();
        println!("run {run}: placed {placed}, unplaced {}, {:.3} s", result.unplaced.len(), elapsed.as_secs_f64());
    }
    // The steady state: every unit already placed, nothing to change.
    let mut settled = snapshot.clone();
    let placed: std::collections::HashMap<String, String> = plan(&snapshot)
        .decisions
        .into_iter()
        .filter_map(|decision| match decision {
            Decision::Schedule { unit, machine } => Some((unit, machine)),
            Decision::Unschedule { .. } => None,
        })
        .collect();
    for spec in &mut settled.units {
        spec.scheduled_on = placed.get(&spec.name).cloned();
    }
    let started = Instant::now();
    let idle = plan(&settled);
    println!("steady state (all placed): {} decisions, {:.3} s", idle.decisions.len(), started.elapsed().as_secs_f64());
}
