//! The D-Bus connection to systemd: made on first use, dropped when it fails, made again on
//! the next call; and a watcher that follows systemd's signals for the units fleet holds.

use fleet_core::Backoff;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{RwLock, watch};
use zbus::{Connection, MatchRule, MessageStream};
use zbus_systemd::systemd1::ManagerProxy;

use super::ending::{LEFT_ACTIVE, MAIN_EXITED, SeenEndings};

/// How long one D-Bus call may take before the connection is considered gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const RECONNECT_MIN: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// systemd answered with an error: the request was refused.
    #[error("{0}")]
    Refused(String),
    /// The bus could not be reached or the call did not complete.
    #[error("D-Bus: {0}")]
    Transport(String),
}

impl From<zbus::Error> for BusError {
    fn from(error: zbus::Error) -> Self {
        match error {
            zbus::Error::MethodError(_, Some(message), _) => Self::Refused(message),
            zbus::Error::MethodError(name, None, _) => Self::Refused(name.to_string()),
            zbus::Error::FDO(error) => Self::Refused(error.to_string()),
            other => Self::Transport(other.to_string()),
        }
    }
}

pub struct Bus {
    user: bool,
    connection: RwLock<Option<Connection>>,
}

impl Bus {
    pub fn new(user: bool) -> Self {
        Self { user, connection: RwLock::new(None) }
    }

    async fn connect(&self) -> Result<Connection, BusError> {
        if let Some(connection) = self.connection.read().await.as_ref() {
            return Ok(connection.clone());
        }
        let mut slot = self.connection.write().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let connecting = if self.user { Connection::session().await } else { Connection::system().await };
        let connection = connecting.map_err(|error| BusError::Transport(error.to_string()))?;
        tracing::info!(user = self.user, "connected to systemd over D-Bus");
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets `connection` if it is still the current one, so the next call reconnects.
    async fn forget(&self, connection: &Connection) {
        let mut slot = self.connection.write().await;
        if slot.as_ref().is_some_and(|current| current.unique_name() == connection.unique_name()) {
            tracing::warn!("lost the D-Bus connection to systemd; reconnecting");
            *slot = None;
        }
    }

    /// Runs one call against systemd's manager object. A transport failure drops the
    /// connection so the next call makes a new one.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, BusError>
    where
        F: FnOnce(ManagerProxy<'static>) -> Fut,
        Fut: Future<Output = zbus::Result<T>>,
    {
        self.on_connection(|connection| async move {
            let proxy = ManagerProxy::new(&connection).await?;
            call(proxy).await
        })
        .await
    }

    /// Runs one exchange with systemd on the current connection (for calls to other objects
    /// than the manager). A transport failure drops the connection.
    pub async fn on_connection<T, F, Fut>(&self, call: F) -> Result<T, BusError>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = zbus::Result<T>>,
    {
        let connection = self.connect().await?;
        let outcome = match tokio::time::timeout(CALL_TIMEOUT, call(connection.clone())).await {
            Ok(result) => result.map_err(BusError::from),
            Err(_) => Err(BusError::Transport("systemd did not answer in time".into())),
        };
        if let Err(BusError::Transport(_)) = &outcome {
            self.forget(&connection).await;
        }
        outcome
    }

    /// Whether systemd answers on the bus.
    pub async fn answers(&self) -> bool {
        self.call(|manager| async move { manager.version().await }).await.is_ok()
    }
}

/// What the signal watcher shares with the manager.
pub struct Watch {
    /// Object paths of the units fleet holds.
    pub watched: Arc<Mutex<HashSet<String>>>,
    /// The end times the watched units announced.
    pub seen: Arc<Mutex<SeenEndings>>,
    pub changes: watch::Sender<u64>,
}

/// Follows systemd's signals for ever: after `Subscribe`, every `PropertiesChanged` of a
/// watched unit's object and every finished job of a watched unit moves `changes`, and the
/// end times a change carries are kept. When the connection drops it reconnects with
/// backoff, and moves `changes` so the states are read afresh.
pub async fn follow_signals(bus: Arc<Bus>, watch: Watch) {
    let Watch { watched, seen, changes } = watch;
    let bump = |changes: &watch::Sender<u64>| changes.send_modify(|count| *count = count.wrapping_add(1));
    let mut backoff = Backoff::new(RECONNECT_MIN, RECONNECT_MAX);
    loop {
        match bus.connect().await {
            Ok(connection) => {
                match follow_one_connection(&bus, &connection, (&watched, &seen), &changes, bump).await {
                    Ok(()) => backoff.reset(),
                    Err(error) => tracing::warn!(%error, "following systemd's signals"),
                }
                bus.forget(&connection).await;
                bump(&changes);
            }
            Err(error) => tracing::warn!(%error, retry_in = ?backoff.peek(), "cannot reach systemd over D-Bus"),
        }
        if changes.is_closed() {
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Keeps the end times a watched unit's `PropertiesChanged` carries.
fn record_end_times(seen: &Mutex<SeenEndings>, path: &str, message: &zbus::Message) {
    type Changed = (String, HashMap<String, zbus::OwnedVariant>, Vec<String>);
    let Ok((_, changed, _)) = message.body().deserialize::<Changed>() else { return };
    let times =
        [MAIN_EXITED, LEFT_ACTIVE].into_iter().filter_map(|name| Some((name, u64::try_from(changed.get(name)?).ok()?)));
    if let Ok(mut seen) = seen.lock() {
        seen.record(path, times);
    }
}

async fn follow_one_connection(
    bus: &Bus,
    connection: &Connection,
    (watched, seen): (&Mutex<HashSet<String>>, &Mutex<SeenEndings>),
    changes: &watch::Sender<u64>,
    bump: impl Fn(&watch::Sender<u64>),
) -> Result<(), BusError> {
    let properties = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.freedesktop.DBus.Properties")
        .member("PropertiesChanged")
        .path_namespace("/org/freedesktop/systemd1/unit")
        .build()?;
    let jobs = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.freedesktop.systemd1.Manager")
        .member("JobRemoved")
        .build()?;
    let properties = MessageStream::for_match_rule(properties, connection, None).await?;
    let jobs = MessageStream::for_match_rule(jobs, connection, None).await?;
    bus.call(|manager| async move { manager.subscribe().await }).await?;
    // States may have moved while nobody listened.
    bump(changes);
    let mut signals = futures_util::stream::select(properties, jobs);
    while let Some(message) = signals.next().await {
        let Ok(message) = message else { continue };
        let header = message.header();
        let relevant = match header.member().map(|member| member.as_str()) {
            Some("PropertiesChanged") => {
                let path = header.path().map(|path| path.as_str().to_string()).unwrap_or_default();
                let relevant = watched.lock().is_ok_and(|watched| watched.contains(&path));
                if relevant {
                    record_end_times(seen, &path, &message);
                }
                relevant
            }
            Some("JobRemoved") => message
                .body()
                .deserialize::<(u32, zbus::OwnedObjectPath, String, String)>()
                .is_ok_and(|(_, _, unit, _): (u32, zbus::OwnedObjectPath, String, String)| {
                    let path = super::paths::unit_object_path(&unit);
                    watched.lock().is_ok_and(|watched| watched.contains(&path))
                }),
            _ => false,
        };
        if relevant {
            bump(changes);
        }
        if changes.is_closed() {
            return Ok(());
        }
    }
    Err(BusError::Transport("the D-Bus connection closed".into()))
}
