//! Telling systemd how fleetd is doing when it runs as `fleet.service` (Type=notify): ready
//! once its API answers, a status line, watchdog pings while the runtime is alive, and
//! reloading and stopping as they happen. Outside systemd (no `NOTIFY_SOCKET`) all of this
//! does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

fn notify(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "cannot notify systemd");
    }
}

/// fleetd serves (its store and its API answered), or serves again after a reload; `serving`
/// says how (`API on …`, `pulling from …`).
pub fn ready(serving: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(&status_line(serving))]);
}

pub fn reloading() {
    // systemd wants the monotonic time with RELOADING=1 (Type=notify-reload); older ones ignore it.
    match sd_notify::NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now, NotifyState::Status("Reloading the configuration")]),
        Err(_) => notify(&[NotifyState::Reloading, NotifyState::Status("Reloading the configuration")]),
    }
}

pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("Stopping units and leaving the cluster")]);
}

/// The status line: what this fleetd does now, from its own metrics.
fn status_line(serving: &str) -> String {
    let metrics = fleet_metrics::metrics();
    let role = if metrics.engine.leader.get() > 0 { "engine leader" } else { "agent" };
    format!("{role}; {} units on this machine; {serving}", metrics.agent.units.get())
}

/// Pings the watchdog at half its period and refreshes the status line, for as long as the
/// runtime runs this task: a wedged runtime stops the pings, and systemd restarts fleetd.
pub async fn keep_alive(serving: String) {
    let watchdog = sd_notify::watchdog_enabled();
    let period = watchdog.map_or(Duration::from_secs(10), |timeout| (timeout / 2).min(Duration::from_secs(10)));
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut tick = tokio::time::interval(period);
    let mut last_status = String::new();
    loop {
        tick.tick().await;
        let status = status_line(&serving);
        match (watchdog.is_some(), status != last_status) {
            (true, true) => notify(&[NotifyState::Watchdog, NotifyState::Status(&status)]),
            (true, false) => notify(&[NotifyState::Watchdog]),
            (false, true) => notify(&[NotifyState::Status(&status)]),
            (false, false) => {}
        }
        last_status = status;
    }
}
