//! Runs the simulation over many seeds and prints what it found and how fast it went.
//!
//! `fleet-sim [SEEDS] [FIRST]`: SEEDS seeds (default 1,000) from FIRST (default: drawn from
//! the clock, and printed), on every core. `fleet-sim --seed N`: one seed, in full, twice,
//! to show it replays the same. `--scheduled N` (before the rest) adds N units on a calendar to
//! the workload; `--moving N`, N services that move when they fail (each fails on m0);
//! `--prioritized N`, N units with priorities on machines with room for them all only while
//! every machine is up, with preemption on; `--lost-after N`, N units with `LostAfter=`
//! (three times `agent_ttl`, and `never`, in turn); `--budgeted N`, N low-priority instances in
//! one group with `DisruptionBudget=1`, beside the prioritized units; `--dependent N`, N
//! units that wait for N others that faults move. Exits 1 when any seed fails.

use fleet_core::unpoisoned::Locked;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use fleet_sim::{Outcome, SimConfig, run};

const USAGE: &str = "\
usage: fleet-sim [OPTIONS] [SEEDS [FIRST]]
       fleet-sim [OPTIONS] --seed N

Runs the simulated cluster (engines, agents, store and faults on a simulated clock) over SEEDS
seeds (default 1000) from FIRST (default: drawn from the clock, and printed), on every core, and
prints what the judges found. Exits 1 when any seed fails.

  --seed N           one seed, in full, twice, to show it replays the same
                     (FLEET_SIM_TRACE=1: its trace; FLEET_SIM_LOG=debug: the engines' logs)
Workload options (before the rest), each adding N units to the default workload:
  --scheduled N      units on a calendar
  --moving N         services that move when they fail (each fails on m0)
  --prioritized N    units with priorities, room for all only while every machine is up
  --lost-after N     units with LostAfter= (three times agent_ttl, and never, in turn)
  --budgeted N       low-priority instances in one group with DisruptionBudget=1
  --dependent N      units that wait for N others that faults move
";

fn main() -> anyhow::Result<()> {
    let mut arguments: Vec<String> = std::env::args().skip(1).collect();
    if arguments.iter().any(|argument| argument == "--help" || argument == "-h") {
        print!("{USAGE}");
        return Ok(());
    }
    let mut config = SimConfig::default();
    while let Some(
        option @ ("--scheduled" | "--moving" | "--prioritized" | "--lost-after" | "--budgeted" | "--dependent"),
    ) = arguments.first().map(String::as_str)
    {
        let count: usize = arguments
            .get(1)
            .and_then(|count| count.parse().ok())
            .with_context(|| format!("{option} needs a number"))?;
        match option {
            "--scheduled" => config.scheduled = count,
            "--prioritized" => config.prioritized = count,
            "--lost-after" => config.lost_after = count,
            "--budgeted" => config.budgeted = count,
            "--dependent" => config.dependent = count,
            _ => config.moving = count,
        }
        arguments.drain(..2);
    }
    if arguments.first().map(String::as_str) == Some("--seed") {
        // FLEET_SIM_LOG=debug: the engines' and agents' logs, on the simulated clock.
        if let Ok(filter) = std::env::var("FLEET_SIM_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_timer(SimulatedClock(std::sync::OnceLock::new()))
                .init();
        }
        let seed: u64 = arguments.get(1).context("--seed needs a number")?.parse().context("--seed needs a number")?;
        let first = fleet_sim::run_traced(seed, &config, true);
        let again = fleet_sim::run_traced(seed, &config, true);
        if std::env::var_os("FLEET_SIM_TRACE").is_some() {
            for line in &first.trace {
                println!("{line}");
            }
        }
        print!("{first}");
        match first.trace.iter().zip(&again.trace).position(|(one, other)| one != other) {
            None if first.digest == again.digest => println!("  replayed: the same run"),
            None => println!("  replayed: a DIFFERENT run of another length"),
            Some(at) => println!("  replayed: a DIFFERENT run, from\n    {}\n    {}", first.trace[at], again.trace[at]),
        }
        if !first.passed() {
            bail!("seed {seed} failed");
        }
        return Ok(());
    }
    let seeds: u64 = arguments
        .first()
        .map(|text| text.parse())
        .transpose()
        .context("SEEDS must be a number (see fleet-sim --help)")?
        .unwrap_or(1000);
    let first: u64 = match arguments.get(1) {
        Some(text) => text.parse().context("FIRST must be a number")?,
        None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() % 1_000_000_007,
    };
    println!(
        "simulating seeds {first}..{} ({:?} each, {} machines, {} units, {} on a calendar, {} moving on failure, {} prioritized, {} with LostAfter=, {} with a budget, {} waiting for units)",
        first + seeds,
        config.length,
        config.machines,
        config.units,
        config.scheduled,
        config.moving,
        config.prioritized,
        config.lost_after,
        config.budgeted,
        config.dependent
    );
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(first));
    let failed: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let longest = Arc::new(Mutex::new(std::time::Duration::ZERO));
    // Units preempted in all, and of them those with a disruption budget.
    let preempted = Arc::new(Mutex::new((0usize, 0usize)));
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (next, failed, longest, config) = (next.clone(), failed.clone(), longest.clone(), config.clone());
            let preempted = preempted.clone();
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= first + seeds {
                        return;
                    }
                    let outcome = run(seed, &config);
                    let mut longest = longest.locked();
                    *longest = (*longest).max(outcome.longest_double_run);
                    let mut preempted = preempted.locked();
                    preempted.0 += outcome.preempted;
                    preempted.1 += outcome.budgeted_preempted;
                    if !outcome.passed() {
                        print!("{outcome}");
                        failed.locked().push(outcome);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    }
    let took = started.elapsed();
    let failed = failed.locked();
    let (preempted, budgeted) = *preempted.locked();
    let preemptions =
        if preempted > 0 { format!("; {preempted} units preempted ({budgeted} with a budget)") } else { String::new() };
    println!(
        "{seeds} seeds in {:.1} s on {workers} threads: {:.0} seeds per minute, {} failed; longest double run {:?}{preemptions}",
        took.as_secs_f64(),
        seeds as f64 * 60.0 / took.as_secs_f64(),
        failed.len(),
        *longest.locked(),
    );
    if !failed.is_empty() {
        let seeds: Vec<u64> = failed.iter().map(|outcome| outcome.seed).collect();
        bail!("failing seeds (replay with `fleet-sim --seed N`): {seeds:?}");
    }
    Ok(())
}

/// Log times on tokio's clock, from the first line: a replayed seed logs the same times.
struct SimulatedClock(std::sync::OnceLock<tokio::time::Instant>);

impl tracing_subscriber::fmt::time::FormatTime for SimulatedClock {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let start = *self.0.get_or_init(tokio::time::Instant::now);
        write!(w, "{:>9.3}", start.elapsed().as_secs_f64())
    }
}
