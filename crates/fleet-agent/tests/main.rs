//! The agent against the embedded store and a unit manager: each module a behaviour.

mod agent;
mod health;
mod scheduled_runs;
