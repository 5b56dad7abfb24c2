//! Keeps fleetd's long-running components alive: a component that panics is reported as an
//! error and started again, so a machine never keeps its lease with a dead agent or engine.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use fleet_core::Backoff;
use tokio::task::{Id, JoinSet};

const RESTART_MIN: Duration = Duration::from_millis(500);
const RESTART_MAX: Duration = Duration::from_secs(30);

/// Runs the component that `start` makes until it returns. When it panics, the panic is
/// logged and a new one is started after a delay that doubles with each panic in a row.
pub async fn supervise<F, Fut>(component: &'static str, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut delay = Backoff::new(RESTART_MIN, RESTART_MAX);
    loop {
        let started = tokio::time::Instant::now();
        match tokio::spawn(start()).await {
            Ok(()) => return,
            Err(error) if error.is_panic() => {
                // Only panics in a row back off further: one after a long healthy run does not.
                if started.elapsed() > RESTART_MAX {
                    delay.reset();
                }
                let message = panic_message(error.into_panic().as_ref());
                let wait = delay.next_delay();
                tracing::error!(component, panic = %message, restart_in = ?wait, "component panicked; restarting it");
                tokio::time::sleep(wait).await;
            }
            Err(_) => return,
        }
    }
}

/// fleetd's running components, each supervised and known by its name: a stop that waits
/// long on one can say which.
#[derive(Default)]
pub struct ComponentTasks {
    tasks: JoinSet<()>,
    names: BTreeMap<Id, &'static str>,
}

impl ComponentTasks {
    /// Runs `component` under [`supervise`].
    pub fn supervise<F, Fut>(&mut self, component: &'static str, start: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let task = self.tasks.spawn(supervise(component, start));
        self.names.insert(task.id(), component);
    }

    /// Waits until every component ended, saying in the log which ones a stop still waits on
    /// each time it has waited [`SLOW_STOP`] doubled (a component that never ends keeps
    /// fleetd from exiting, and its log said only "Shutting down").
    pub async fn all_ended(&mut self) {
        let began = tokio::time::Instant::now();
        let mut warn_after = SLOW_STOP;
        loop {
            tokio::select! {
                ended = self.tasks.join_next_with_id() => match ended {
                    None => return,
                    Some(Ok((id, ()))) => { self.names.remove(&id); }
                    Some(Err(error)) => { self.names.remove(&error.id()); }
                },
                () = tokio::time::sleep_until(began + warn_after) => {
                    let waiting: Vec<&str> = self.names.values().copied().collect();
                    tracing::warn!(waited = ?warn_after, ?waiting, "components have not stopped yet");
                    warn_after *= 2;
                }
            }
        }
    }
}

/// How long a stop of the components waits before the log names those not yet ended.
const SLOW_STOP: Duration = Duration::from_secs(10);

fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic without a message".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_component_is_started_again() {
        let starts = Arc::new(AtomicUsize::new(0));
        let counter = starts.clone();
        supervise("test", move || {
            let counter = counter.clone();
            async move {
                if counter.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("boom");
                }
            }
        })
        .await;
        assert_eq!(starts.load(Ordering::SeqCst), 3, "started again after each of two panics");
    }

    /// A stop waiting on a component names it until it ends, and returns once all did.
    #[tokio::test(start_paused = true)]
    async fn a_stop_waits_for_every_component_and_names_the_late_ones() {
        let mut tasks = ComponentTasks::default();
        let (release, released) = tokio::sync::watch::channel(false);
        tasks.supervise("quick", || async {});
        tasks.supervise("slow", move || {
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|done| *done).await;
            }
        });
        tokio::select! {
            () = tasks.all_ended() => panic!("ended while one component still ran"),
            () = tokio::time::sleep(SLOW_STOP * 3) => {}
        }
        assert_eq!(tasks.names.values().copied().collect::<Vec<_>>(), ["slow"], "the one still running");
        release.send_replace(true);
        tasks.all_ended().await;
        assert!(tasks.names.is_empty(), "every name is taken off as its component ends: {:?}", tasks.names);
    }

    #[test]
    fn panic_messages() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7u8), "a panic without a message");
    }
}
