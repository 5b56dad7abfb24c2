//! Keeps fleetd's long-running components alive: a component that panics is reported as an
//! error and started again, so a machine never keeps its lease with a dead agent or engine.

use std::any::Any;
use std::future::Future;
use std::time::Duration;

use fleet_core::Backoff;

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

    #[test]
    fn panic_messages() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7u8), "a panic without a message");
    }
}
