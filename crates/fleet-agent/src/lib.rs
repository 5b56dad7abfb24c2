//! The agent: a reconciler that makes its machine's unit manager hold what the registry
//! says this machine should run, and reports what the manager says back.
//!
//! Decisions come from [`fleet_core::agent_plan`]; this crate only fetches, executes and
//! reports. It wakes on changes to its own machine's work and on unit-state changes, with
//! a periodic reconcile as the fallback. Units that drift (changed on the machine behind
//! fleet's back) are found and put back by [`drift_watch`]; units with a health check are
//! probed by [`health_watch`], and their health travels in their states. Scheduled units are
//! started once per load and their runs reported by [`run_book`].

#![forbid(unsafe_code)]

mod drift_watch;
pub mod health_watch;
mod probe;
mod reconciler;
mod run_book;
mod unreadable_work;

pub use fleet_runtime::Lifecycle;
pub use reconciler::{Agent, AgentConfig};
