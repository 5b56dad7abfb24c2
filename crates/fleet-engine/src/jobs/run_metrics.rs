//! The metrics of runs: each end by result (each machine's, for a global unit's run) with how
//! long it ran, and the elapses skipped by why.

use fleet_core::job::runs::{self, JobRecord};

/// Counts the runs `after` shows ended that `before` did not, by result, with how long they ran.
pub(super) fn count_ends(before: &JobRecord, after: &JobRecord) {
    let engine = &fleet_metrics::metrics().engine;
    for run in &after.runs {
        if let Some(tally) = run.tally.as_deref() {
            // A global unit's run: each machine's end, as it is counted.
            let seen = before.runs.iter().find(|seen| seen.id == run.id).and_then(|seen| seen.tally.clone());
            let seen = seen.unwrap_or_default();
            let counts = [
                ("succeeded", tally.succeeded, seen.succeeded),
                ("failed", tally.failed, seen.failed),
                ("lost", tally.lost, seen.lost),
                ("stopped", tally.stopped, seen.stopped),
            ];
            for (result, now, was) in counts {
                engine
                    .runs
                    .get_or_create(&fleet_metrics::RunLabels { result })
                    .inc_by(u64::from(now.saturating_sub(was)));
            }
            continue;
        }
        let Some(outcome) = &run.outcome else { continue };
        if before.runs.iter().any(|seen| seen.id == run.id && seen.outcome.is_some()) {
            continue;
        }
        tracing::info!(run = run.id, result = outcome.word(), "run ended");
        engine.runs.get_or_create(&fleet_metrics::RunLabels { result: outcome.word() }).inc();
        if let (Some(started), Some(ended)) = (run.started, run.ended) {
            engine.run_duration.observe(ended.saturating_sub(started).max(0) as f64 / 1e6);
        }
    }
}

/// Counts elapses skipped, by why.
pub(super) fn count_skips(skipped: &[runs::SkipReason]) {
    let engine = &fleet_metrics::metrics().engine;
    for why in skipped {
        engine.elapses_skipped.get_or_create(&fleet_metrics::SkipLabels { why: why.word() }).inc();
    }
}
