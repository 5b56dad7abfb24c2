//! What the engine's tests against the embedded store share: a machine, the engine of m1
//! running until told to stop, and a machine's report of a unit running.

// Each test binary includes this module and uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_core::MachineState;
use fleet_engine::{Engine, EngineConfig};
use fleet_runtime::Lifecycle;
use fleet_store_embedded::EmbeddedRegistry;
use tokio::sync::watch;

pub fn machine(id: &str) -> MachineState {
    MachineState { id: id.into(), public_ip: "127.0.0.1".into(), metadata: BTreeMap::new(), ..Default::default() }
}

/// The engine of machine m1, running until told to stop.
pub fn start_engine(registry: &EmbeddedRegistry) -> (watch::Sender<Lifecycle>, tokio::task::JoinHandle<()>) {
    start_engine_every(registry, Duration::from_secs(5))
}

/// The engine of machine m1 passing at least once each `interval`, running until told to stop.
pub fn start_engine_every(
    registry: &EmbeddedRegistry,
    interval: Duration,
) -> (watch::Sender<Lifecycle>, tokio::task::JoinHandle<()>) {
    let config = EngineConfig {
        machine_id: "m1".into(),
        reconcile_interval: interval,
        debounce: Duration::from_millis(10),
        agent_ttl: Duration::from_secs(4),
        strategy: Default::default(),
        preemption: false,
    };
    let (stop, stopped) = watch::channel(Lifecycle::Running);
    (stop, tokio::spawn(Engine::new(config, Arc::new(registry.clone())).run(stopped)))
}

/// What a machine's agent reports of `name` (of `file`) running there.
pub fn running_on(name: &str, machine: &str, file: &fleet_core::UnitFile) -> fleet_registry::StateReport {
    fleet_registry::StateReport::Set(fleet_core::UnitState {
        run: None,
        name: name.into(),
        machine_id: machine.into(),
        hash: file.hash(),
        systemd: fleet_core::SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    })
}

/// Where the store has `name` placed.
pub async fn machine_of(registry: &EmbeddedRegistry, name: &str) -> Option<String> {
    fleet_registry::ApiRegistry::unit(registry, name).await.unwrap().and_then(|view| view.machine_id)
}

/// Why the store says `name` waits, if it does.
pub async fn reason(registry: &EmbeddedRegistry, name: &str) -> Option<String> {
    fleet_registry::ApiRegistry::unit(registry, name).await.unwrap().and_then(|view| view.reason)
}
