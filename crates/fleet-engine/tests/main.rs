//! The engine against the embedded store: each module a behaviour of the running engine.

mod common;
mod dependencies;
mod disruption_budgets;
mod engine;
mod global_runs;
mod moving_services;
mod preemption;
mod scheduled_runs;
