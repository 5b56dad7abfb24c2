//! A reconciler and the loop that runs it.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use fleet_core::Backoff;
use tokio::sync::watch;

use crate::failure_log::FailureLog;
use crate::{Lifecycle, Triggers};

/// When a pass wants the next one at the latest (a trigger may bring it sooner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// After this long: a fallback period, or the moment something is due.
    After(Duration),
    /// Only when a trigger moves.
    OnChange,
    /// Never: the reconciler's work is done (a join that succeeded). The loop ends, and
    /// finishes it with `Lifecycle::Running`.
    Done,
}

/// The error policy: after a failed pass, the next one runs after a delay that doubles with
/// each failure in a row, from `min` to `max` (a trigger brings it sooner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub min: Duration,
    pub max: Duration,
}

/// Something that looks at what it watches and acts on it, one pass at a time.
pub trait Reconciler: Send {
    type Error: Display + Send;
    /// Names it in the log: "`NAME` failed".
    const NAME: &'static str;
    const RETRY: Retry = Retry { min: Duration::from_millis(250), max: Duration::from_secs(30) };
    /// Whether a stop cuts a pass in progress short (a pass whose writes are idempotent and
    /// whose store calls may wait out their timeouts when the store is gone); otherwise the
    /// pass completes first.
    const STOP_CUTS_PASS: bool = false;

    /// One pass; says when the next one is due at the latest.
    fn pass(&mut self) -> impl Future<Output = Result<Next, Self::Error>> + Send;

    /// What wakes it between passes.
    fn triggers(&mut self) -> &mut Triggers;

    /// How long a burst of changes is gathered after a wake, given how long the last pass
    /// took.
    fn settle(&mut self, took: Duration) -> Duration {
        let _ = took;
        Duration::ZERO
    }

    /// How soon something is due whatever happens (a deadline of the reconciler's own): a
    /// failed pass is retried by then at the latest, however long the backoff.
    fn due_within(&self) -> Option<Duration> {
        None
    }

    /// A random sample that spreads a failed pass's wait over half to all of the backoff, for
    /// a reconciler that runs on many machines at once (pull agents that lost their manager
    /// together do not come back in the same instant); `None` waits the backoff exactly,
    /// which keeps a simulated run the same from one replay to the next.
    fn retry_spread(&mut self) -> Option<u32> {
        None
    }

    /// What a failed pass leaves as it is, for the log ("running units are left alone").
    fn on_failure(&self) -> &'static str {
        "trying again"
    }

    /// Runs once the loop ended, told how fleetd is ending it.
    fn finish(self, ending: Lifecycle) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        let _ = ending;
        async {}
    }
}

/// How long a pass runs before the log says so (again at twice, four times as long…): a pass
/// waiting on a call that never answers would otherwise leave a loop silent while the rest of
/// fleetd, its presence among it, looks well.
pub const SLOW_PASS: Duration = Duration::from_secs(30);

/// Runs `pass` to its end, warning each time it has run for [`SLOW_PASS`] doubled.
async fn watched<T>(name: &str, pass: impl Future<Output = T>) -> T {
    crate::slow::telling_when_late(SLOW_PASS, pass, |running_for| {
        tracing::warn!(?running_for, "{name}: one pass has not ended");
    })
    .await
}

/// Runs `reconciler` until `lifecycle` leaves [`Lifecycle::Running`], then finishes it.
pub async fn run<R: Reconciler>(mut reconciler: R, mut lifecycle: watch::Receiver<Lifecycle>) {
    let mut retry = Backoff::new(R::RETRY.min, R::RETRY.max);
    let mut failures = FailureLog::default();
    let ending = loop {
        if let Some(ending) = ended(&lifecycle) {
            break ending;
        }
        let started = tokio::time::Instant::now();
        let outcome = if R::STOP_CUTS_PASS {
            tokio::select! {
                biased;
                _ = lifecycle.wait_for(|state| *state != Lifecycle::Running) => continue,
                outcome = watched(R::NAME, reconciler.pass()) => outcome,
            }
        } else {
            watched(R::NAME, reconciler.pass()).await
        };
        let took = started.elapsed();
        let next = match outcome {
            Ok(Next::Done) => break Lifecycle::Running,
            Ok(next) => {
                retry.reset();
                failures.recovered();
                next
            }
            Err(error) => {
                let backoff = match reconciler.retry_spread() {
                    Some(sample) => retry.next_delay_jittered(sample),
                    None => retry.next_delay(),
                };
                let wait = reconciler.due_within().map_or(backoff, |due| due.min(backoff));
                if failures.warns(&error.to_string(), tokio::time::Instant::now()) {
                    tracing::warn!(%error, retry_in = ?wait, "{} failed; {}", R::NAME, reconciler.on_failure());
                } else {
                    tracing::debug!(%error, retry_in = ?wait, "{} failed again", R::NAME);
                }
                Next::After(wait)
            }
        };
        // In this order when several are ready: a run is the same every time (the
        // simulation replays a seed bit for bit), and a stop is never put off.
        tokio::select! {
            biased;
            _ = lifecycle.wait_for(|state| *state != Lifecycle::Running) => continue,
            () = reconciler.triggers().changed() => {}
            () = after(next) => {}
        }
        // The gathering of a burst is cut by a stop too: the engine's lasts as long as its last
        // plan took (seconds at 100,000 units), and a stopping fleetd waited it out.
        tokio::select! {
            biased;
            _ = lifecycle.wait_for(|state| *state != Lifecycle::Running) => continue,
            () = tokio::time::sleep(reconciler.settle(took)) => {}
        }
        reconciler.triggers().mark_seen();
    };
    reconciler.finish(ending).await;
}

fn ended(lifecycle: &watch::Receiver<Lifecycle>) -> Option<Lifecycle> {
    let state = *lifecycle.borrow();
    (state != Lifecycle::Running).then_some(state)
}

async fn after(next: Next) {
    match next {
        Next::After(wait) => tokio::time::sleep(wait).await,
        Next::OnChange | Next::Done => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its passes; fails the first `failures` of them.
    struct Counting {
        passes: watch::Sender<usize>,
        failures: usize,
        next: Next,
        triggers: Triggers,
        finished: std::sync::Arc<std::sync::Mutex<Option<Lifecycle>>>,
        spread: Option<u32>,
        /// How long it gathers a burst after a wake.
        settling: Duration,
    }

    impl Reconciler for Counting {
        type Error = String;
        const NAME: &'static str = "counting";

        async fn pass(&mut self) -> Result<Next, String> {
            let pass = *self.passes.borrow();
            self.passes.send_replace(pass + 1);
            if pass < self.failures { Err(format!("failure {pass}")) } else { Ok(self.next) }
        }

        fn triggers(&mut self) -> &mut Triggers {
            &mut self.triggers
        }

        fn retry_spread(&mut self) -> Option<u32> {
            self.spread
        }

        fn settle(&mut self, _took: Duration) -> Duration {
            self.settling
        }

        async fn finish(self, ending: Lifecycle) {
            *self.finished.lock().expect("lock") = Some(ending);
        }
    }

    struct Harness {
        passes: watch::Receiver<usize>,
        finished: std::sync::Arc<std::sync::Mutex<Option<Lifecycle>>>,
        lifecycle: watch::Sender<Lifecycle>,
        running: tokio::task::JoinHandle<()>,
    }

    fn start(failures: usize, next: Next, triggers: Triggers) -> Harness {
        start_spread(failures, next, triggers, None)
    }

    fn start_spread(failures: usize, next: Next, triggers: Triggers, spread: Option<u32>) -> Harness {
        start_with(Counting { failures, next, triggers, spread, ..counting() })
    }

    /// A reconciler that never fails, asks for nothing and gathers no burst; its counter.
    fn counting() -> Counting {
        Counting {
            passes: watch::channel(0).0,
            failures: 0,
            next: Next::OnChange,
            triggers: Triggers::none(),
            finished: std::sync::Arc::new(std::sync::Mutex::new(None)),
            spread: None,
            settling: Duration::ZERO,
        }
    }

    fn start_with(reconciler: Counting) -> Harness {
        let (counter, passes) = watch::channel(0);
        let finished = std::sync::Arc::new(std::sync::Mutex::new(None));
        let reconciler = Counting { passes: counter, finished: finished.clone(), ..reconciler };
        let (lifecycle, watch) = watch::channel(Lifecycle::Running);
        let running = tokio::spawn(run(reconciler, watch));
        Harness { passes, finished, lifecycle, running }
    }

    async fn passes_reach(passes: &watch::Receiver<usize>, count: usize) {
        passes.clone().wait_for(|passes| *passes >= count).await.expect("the loop runs");
    }

    /// What a test's log says, written by a `tracing` subscriber into memory.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
        }
        fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
            let log = self.clone();
            tracing_subscriber::fmt().with_ansi(false).with_writer(move || log.clone()).finish()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_does_not_end_is_named_in_the_log_at_growing_intervals() {
        let log = Captured::default();
        let _logging = tracing::subscriber::set_default(log.subscriber());
        let stuck = watched("stuck loop", std::future::pending::<()>());
        let gave_up = tokio::time::timeout(SLOW_PASS * 3, stuck).await;
        assert!(gave_up.is_err(), "the pass never ends");
        let text = log.text();
        // At 30 s and 60 s; the next would be at 120 s.
        assert_eq!(text.matches("stuck loop: one pass has not ended").count(), 2, "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_ends_in_time_leaves_the_log_alone() {
        let log = Captured::default();
        let _logging = tracing::subscriber::set_default(log.subscriber());
        let answer = watched("quick loop", async {
            tokio::time::sleep(SLOW_PASS - Duration::from_millis(1)).await;
            7
        })
        .await;
        assert_eq!(answer, 7);
        assert_eq!(log.text(), "");
    }

    /// A stop does not wait for the gathering of a burst after a wake (the engine's lasts as
    /// long as its last plan took).
    #[tokio::test(start_paused = true)]
    async fn a_stop_cuts_the_gathering_after_a_wake() {
        let (signal, watch) = watch::channel(0u64);
        let hour = Duration::from_secs(3600);
        let harness = start_with(Counting { triggers: Triggers::none().with(watch), settling: hour, ..counting() });
        passes_reach(&harness.passes, 1).await;
        signal.send_replace(1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stopping = tokio::time::Instant::now();
        harness.lifecycle.send_replace(Lifecycle::ShuttingDown);
        harness.running.await.expect("the loop ends");
        assert!(stopping.elapsed() < Duration::from_secs(1), "stopped {:?} later", stopping.elapsed());
        assert_eq!(*harness.finished.lock().expect("lock"), Some(Lifecycle::ShuttingDown));
        assert_eq!(*harness.passes.borrow(), 1, "no pass after the stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_runs_again_when_it_asked() {
        let harness = start(0, Next::After(Duration::from_secs(10)), Triggers::none());
        passes_reach(&harness.passes, 1).await;
        let first = tokio::time::Instant::now();
        passes_reach(&harness.passes, 2).await;
        assert!(first.elapsed() >= Duration::from_secs(10), "not before it asked");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_brings_the_next_pass_sooner() {
        let (signal, watch) = watch::channel(0u64);
        let harness = start(0, Next::OnChange, Triggers::none().with(watch));
        passes_reach(&harness.passes, 1).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(*harness.passes.borrow(), 1, "nothing moved and nothing was due");
        signal.send_replace(1);
        passes_reach(&harness.passes, 2).await;
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_a_success_resets_the_backoff() {
        let harness = start(3, Next::OnChange, Triggers::none());
        let began = tokio::time::Instant::now();
        passes_reach(&harness.passes, 4).await;
        // 250 ms, 500 ms, 1 s after the three failures.
        assert!(began.elapsed() >= Duration::from_millis(1750), "{:?}", began.elapsed());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(*harness.passes.borrow(), 4, "a success waits for a change");
    }

    /// A spread backoff waits between half and all of each delay: at the smallest sample,
    /// half (125 ms, 250 ms, 500 ms after three failures).
    #[tokio::test(start_paused = true)]
    async fn a_spread_backoff_waits_from_half_of_each_delay() {
        let harness = start_spread(3, Next::OnChange, Triggers::none(), Some(0));
        let began = tokio::time::Instant::now();
        passes_reach(&harness.passes, 4).await;
        let took = began.elapsed();
        assert!(took >= Duration::from_millis(875) && took < Duration::from_millis(1750), "{took:?}");
    }

    /// A pass that says its work is done ends the loop, after the failures before it were
    /// retried.
    #[tokio::test(start_paused = true)]
    async fn a_pass_whose_work_is_done_ends_the_loop() {
        let harness = start(2, Next::Done, Triggers::none());
        harness.running.await.expect("ended by itself");
        assert_eq!(*harness.passes.borrow(), 3, "two failures, then the pass that was done");
        assert_eq!(*harness.finished.lock().expect("lock"), Some(Lifecycle::Running));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_loop_and_finishes_with_how_it_ended() {
        let harness = start(0, Next::OnChange, Triggers::none());
        passes_reach(&harness.passes, 1).await;
        harness.lifecycle.send_replace(Lifecycle::Reloading);
        harness.running.await.expect("ended");
        assert_eq!(*harness.finished.lock().expect("lock"), Some(Lifecycle::Reloading));
    }
}
