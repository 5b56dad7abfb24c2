//! One module per resource.

pub mod agent_facet;
pub mod agent_stream;
pub mod agents;
pub mod backup;
pub mod dependency_cycles;
pub mod discovery;
pub mod drains;
pub mod events;
pub mod imports;
pub mod journal;
pub mod machines;
pub mod metrics;
pub mod plans;
pub mod registration_tokens;
pub mod rollouts;
pub mod runs;
pub mod secret_rotation;
pub mod secrets;
pub mod sources;
pub mod state;
pub mod tokens;
pub mod unit_batch;
pub mod unit_history;
pub mod units;
pub mod web;
