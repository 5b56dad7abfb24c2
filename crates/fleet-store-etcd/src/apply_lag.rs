//! How far etcd is behind in applying what it committed, and the gate that holds the writes
//! that can wait while it is far behind. etcd 3.4 answers a lease renewal only once it has
//! applied what it had committed, and refuses it after a second of waiting: a submission of
//! units, or thousands of machines registering, that commit faster than etcd applies make
//! every lease renewal fail, and past their time to live the leases expire (machines' units
//! move, the engine's leadership moves). A submission's batches and a machine's registration
//! are what can wait.
//!
//! The lag is a linearizable read's time beyond a serializable one's: etcd answers the first
//! once it has applied everything committed when the read came, the second at once; the
//! network and etcd's queue, which both wait on, cancel out.

use std::future::Future;
use std::time::Duration;

use etcd_client::GetOptions;
use tokio::time::Instant;

/// Past this lag bulk writes wait: a quarter of the second after which renewals are refused.
pub const LAG_LIMIT: Duration = Duration::from_millis(250);
/// How long a probe's read is waited for.
const PROBE_LIMIT: Duration = Duration::from_secs(1);
/// A lag measured this recently stands for now.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// A write waits at most this long for the lag to fall: the gate slows a submission, it never
/// stops one. Well inside what a client allows a batch (fleetctl: its request timeout, 3 s
/// by default, per hundred units; a batch transaction is 110, two in flight).
pub const MAX_HOLD: Duration = Duration::from_secs(2);

/// Whether a bulk write that has waited `held` waits on, etcd being `lag` behind.
pub fn holds(lag: Duration, held: Duration) -> bool {
    lag > LAG_LIMIT && held < MAX_HOLD
}

/// How long to wait before measuring again, etcd being `lag` behind: about as long as it
/// needs to catch up, between one probe period and a second.
fn pause(lag: Duration) -> Duration {
    lag.clamp(PROBE_EVERY, Duration::from_secs(1))
}

/// The last lag measured, shared by every bulk write of one store connection: one probe at a
/// time, the others take its answer.
#[derive(Default)]
pub struct ApplyLagGate {
    last: tokio::sync::Mutex<Option<(Instant, Duration)>>,
}

impl ApplyLagGate {
    /// Waits while etcd is further behind than [`LAG_LIMIT`], by `probe` (`None`: no answer,
    /// which holds nothing: the write itself then fails as it would have), for
    /// [`MAX_HOLD`] at most; how long it waited.
    pub async fn admit<F, Fut>(&self, probe: F) -> Duration
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Option<Duration>>,
    {
        let start = Instant::now();
        loop {
            let lag = self.lag(&probe).await;
            if !holds(lag, start.elapsed()) {
                return start.elapsed();
            }
            tracing::debug!(?lag, held = ?start.elapsed(), "etcd is behind in applying: a bulk write waits");
            tokio::time::sleep(pause(lag)).await;
        }
    }

    async fn lag<F, Fut>(&self, probe: &F) -> Duration
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Option<Duration>>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, lag)) = *last
            && at.elapsed() < PROBE_EVERY
        {
            return lag;
        }
        let lag = probe().await.unwrap_or(Duration::ZERO);
        *last = Some((Instant::now(), lag));
        lag
    }
}

impl super::EtcdRegistry {
    /// How far etcd is behind in applying, measured once; `None` when etcd does not answer a
    /// plain read within [`PROBE_LIMIT`] (then nothing is known, and nothing is held).
    pub(super) async fn apply_lag(&self) -> Option<Duration> {
        let connection = self.connection();
        // Any key: it is counted, never read.
        let key = self.keys().leader();
        let client = connection.kv();
        let read = |options: GetOptions| {
            let (mut client, key) = (client.clone(), key.clone());
            async move { client.get(key, Some(options.with_count_only())).await }
        };
        let started = Instant::now();
        connection.within("apply_probe", PROBE_LIMIT, read(GetOptions::new().with_serializable())).await.ok()?;
        let at_once = started.elapsed();
        let started = Instant::now();
        // A linearizable read that does not come back in time: etcd is at least that far behind.
        let waited = match connection.within("apply_probe", PROBE_LIMIT, read(GetOptions::new())).await {
            Ok(_) => started.elapsed(),
            Err(_) => PROBE_LIMIT,
        };
        Some(waited.saturating_sub(at_once))
    }

    /// Holds a write that can wait (a batch of a submission, a machine's registration) while
    /// etcd is far behind in applying ([`ApplyLagGate`]).
    pub(super) async fn wait_while_etcd_is_behind(&self) {
        let held = self.inner.apply_lag.admit(|| self.apply_lag()).await;
        if !held.is_zero() {
            fleet_metrics::metrics().store.writes_held.inc_by(held.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use fleet_core::unpoisoned::Locked;

    use std::sync::Mutex;

    use super::*;

    #[test]
    fn a_write_waits_only_past_the_limit_and_never_past_the_longest_hold() {
        assert!(!holds(LAG_LIMIT, Duration::ZERO), "at the limit it goes");
        assert!(holds(LAG_LIMIT + Duration::from_millis(1), Duration::ZERO));
        assert!(holds(Duration::from_secs(30), MAX_HOLD - Duration::from_millis(1)));
        assert!(!holds(Duration::from_secs(30), MAX_HOLD), "a submission is slowed, never stopped");
        assert_eq!(pause(Duration::ZERO), PROBE_EVERY);
        assert_eq!(pause(Duration::from_millis(400)), Duration::from_millis(400));
        assert_eq!(pause(Duration::from_secs(9)), Duration::from_secs(1));
    }

    /// A probe that measures the lags of `lags` in turn (the last one for ever after).
    fn scripted(lags: &[u64]) -> impl Fn() -> std::future::Ready<Option<Duration>> {
        let lags: Vec<Duration> = lags.iter().map(|ms| Duration::from_millis(*ms)).collect();
        let made = Mutex::new(0usize);
        move || {
            let mut made = made.locked();
            let lag = lags[(*made).min(lags.len() - 1)];
            *made += 1;
            std::future::ready(Some(lag))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_while_etcd_is_behind_and_goes_once_it_caught_up() {
        let (gate, probe) = (ApplyLagGate::default(), scripted(&[900, 600, 300, 50]));
        let held = gate.admit(&probe).await;
        // 900 ms, then 600, then 300 behind: it waited about that long each time, then went.
        assert_eq!(held, Duration::from_millis(1800));
        // Measured a moment ago: the next write takes that answer and goes at once.
        assert_eq!(gate.admit(&probe).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_goes_after_the_longest_hold_however_far_behind_etcd_stays() {
        let (gate, probe) = (ApplyLagGate::default(), scripted(&[3000]));
        let held = gate.admit(&probe).await;
        assert!((MAX_HOLD..MAX_HOLD + Duration::from_secs(1)).contains(&held), "{held:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_holds_nothing() {
        let gate = ApplyLagGate::default();
        assert_eq!(gate.admit(|| std::future::ready(None)).await, Duration::ZERO);
    }
}
