//! The sans-I/O core of fleet.
//!
//! Everything in this crate is plain data and pure functions: no I/O, no clock, no async.
//! The drivers (registry, agent, engine, API) feed it snapshots and carry out what it decides.

#![forbid(unsafe_code)]

pub mod access;
pub mod admission;
pub mod agent_plan;
pub mod backoff;
pub mod calendar;
pub mod civil_time;
pub mod closest;
pub mod dependency;
pub mod desired_units;
pub mod disruption_budget;
pub mod drain;
pub mod drift;
pub mod drift_report;
pub mod duration;
pub mod events;
pub mod glob;
pub mod health;
pub mod job;
pub mod journal_relay;
pub mod lost_after;
pub mod machine;
pub mod max_unavailable;
pub mod metadata_key;
pub mod peer_probing;
pub mod required_places;
pub mod requirements;
pub mod reserved;
pub mod resources;
pub mod rollout;
pub mod schedule;
pub mod secret;
pub mod secret_rotation;
pub mod secrets;
pub mod service_values;
pub mod source;
pub mod state;
pub mod state_report;
pub mod store_format;
pub mod taint;
pub mod unit_file;
pub mod unit_history;
pub mod unit_name;
pub mod unknown_options;
pub mod unpoisoned;

pub use backoff::Backoff;
pub use machine::{Connection, MachineId, MachineState, OutOfTouch};
pub use requirements::Requirements;
pub use resources::Resources;
pub use state::{CurrentState, DesiredState, SystemdState, UnitState};
pub use state_report::StateReport;
pub use unit_file::{UnitFile, UnitHash, UnitOption};
