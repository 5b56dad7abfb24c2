//! The systemd unit manager: unit files written to `units_directory`, linked into systemd's
//! runtime unit path and driven over D-Bus (`zbus_systemd`), as the original's agent did.
//! States come in bulk (`ListUnitsByNames`) when the agent asks, and systemd's signals say
//! when to ask again.

mod bus;
mod control_group;
mod ending;
mod fence_timer;
pub mod paths;
mod read_back;
mod units_directory;
mod watchdog;

use fleet_core::unpoisoned::Locked;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use fleet_core::drift::FileOnMachine;
use fleet_core::{SystemdState, UnitFile, UnitHash};
use tokio::sync::watch;

use self::bus::{Bus, BusError};
use self::paths::{
    CREDENTIALS_DROP_IN, RESERVATION_DROP_IN, credentials_drop_in, has_install_section, reservation_drop_in,
    runtime_unit_dir, unit_object_path,
};
use crate::{HeldUnit, Result, UnitManager, UnitManagerError};

pub struct SystemdOptions {
    /// Use the calling user's instance on the session bus instead of the system instance.
    pub user: bool,
    /// Where fleet writes the unit files it links into systemd.
    pub units_directory: PathBuf,
    /// Where the units' credentials go (`<credentials_dir>/<unit>`, on a tmpfs), for systemd
    /// to load.
    pub credentials_dir: PathBuf,
}

pub struct SystemdManager {
    user: bool,
    units_directory: PathBuf,
    credentials: crate::credentials::CredentialDirs,
    bus: Arc<Bus>,
    /// The units fleet holds and their hashes; read from `units_directory` on first use.
    held: tokio::sync::Mutex<Option<BTreeMap<String, UnitHash>>>,
    /// Unit files another writer left in `units_directory` (the original fleet's agent), read
    /// with `held`: never stopped nor reported, adopted as they run once scheduled here.
    foreign: Mutex<BTreeMap<String, UnitHash>>,
    /// Object paths of the held units, for the signal watcher.
    watched: Arc<Mutex<HashSet<String>>>,
    /// The end times the held units announced, kept by the signal watcher.
    seen: Arc<Mutex<ending::SeenEndings>>,
    /// Units systemd refused to start, with its reason: they report `failed`.
    refused: Mutex<HashMap<String, String>>,
    /// The unit files fleet wrote, read back for drift.
    read_back: read_back::ReadBack,
    changes: watch::Sender<u64>,
    /// The fence of `AtMostOnce=` units, checked before each start.
    fence: Mutex<crate::fence::Fence>,
    /// The timers systemd holds for it.
    fence_timers: tokio::sync::Mutex<fence_timer::FenceTimers>,
    /// When this manager last asked each unit to start, on systemd's monotonic clock: a run
    /// ended once its main process exited after that.
    started: Mutex<HashMap<String, u64>>,
}

impl SystemdManager {
    /// Prepares `units_directory` and starts following systemd's signals. Reaching systemd
    /// is not required yet: every call connects when it needs to.
    pub fn new(options: SystemdOptions) -> Result<Arc<Self>> {
        fleet_fs::create_private_dir(&options.units_directory).map_err(|source| UnitManagerError::Io {
            context: format!("creating {}", options.units_directory.display()),
            source,
        })?;
        let bus = Arc::new(Bus::new(options.user));
        let (changes, _) = watch::channel(0);
        let manager = Arc::new(Self {
            user: options.user,
            units_directory: options.units_directory,
            credentials: crate::credentials::CredentialDirs::new(options.credentials_dir),
            bus: bus.clone(),
            held: tokio::sync::Mutex::new(None),
            foreign: Mutex::default(),
            watched: Arc::new(Mutex::new(HashSet::new())),
            seen: Arc::new(Mutex::new(ending::SeenEndings::default())),
            refused: Mutex::new(HashMap::new()),
            started: Mutex::new(HashMap::new()),
            read_back: read_back::ReadBack::default(),
            changes: changes.clone(),
            fence: Mutex::default(),
            fence_timers: tokio::sync::Mutex::default(),
        });
        let watch = bus::Watch { watched: manager.watched.clone(), seen: manager.seen.clone(), changes };
        tokio::spawn(bus::follow_signals(bus, watch));
        Ok(manager)
    }

    /// Whether a systemd instance answers on the bus this manager would use.
    pub async fn answers(user: bool) -> bool {
        Bus::new(user).answers().await
    }

    fn unit_path(&self, name: &str) -> PathBuf {
        self.units_directory.join(name)
    }

    /// Writes, or removes when there is nothing to add, the drop-in that hands systemd the
    /// unit's reservation as limits where the unit set none of its own.
    fn write_reservation_drop_in(&self, name: &str, file: &UnitFile) -> Result<()> {
        let Some(dir) = self.runtime_link(&format!("{name}.d")) else { return Ok(()) };
        let path = dir.join(RESERVATION_DROP_IN);
        match reservation_drop_in(fleet_core::requirements::reservation_limits(file.options())) {
            Some(text) => {
                fleet_fs::create_private_dir(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
                fleet_fs::write_private(&path, text.as_bytes()).map_err(io_error(format!("writing {}", path.display())))
            }
            None => {
                self.remove_reservation_drop_in(name);
                Ok(())
            }
        }
    }

    /// The drop-in that hands systemd the unit's credentials (`credentials`, in `dir`), or
    /// removes it when there are none.
    fn write_credentials_drop_in(
        &self,
        name: &str,
        dir: Option<&Path>,
        credentials: &[crate::credentials::Credential],
    ) -> Result<()> {
        let Some(drop_ins) = self.runtime_link(&format!("{name}.d")) else { return Ok(()) };
        let path = drop_ins.join(CREDENTIALS_DROP_IN);
        let names: Vec<&str> = credentials.iter().map(|credential| credential.name.as_str()).collect();
        match dir.and_then(|dir| credentials_drop_in(self.user, dir, &names)) {
            Some(text) => {
                fleet_fs::create_private_dir(&drop_ins)
                    .map_err(io_error(format!("creating {}", drop_ins.display())))?;
                fleet_fs::write_private(&path, text.as_bytes()).map_err(io_error(format!("writing {}", path.display())))
            }
            None => {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_dir(&drop_ins);
                Ok(())
            }
        }
    }

    fn remove_reservation_drop_in(&self, name: &str) {
        if let Some(dir) = self.runtime_link(&format!("{name}.d")) {
            let _ = std::fs::remove_file(dir.join(RESERVATION_DROP_IN));
            let _ = std::fs::remove_dir(&dir);
        }
    }

    fn runtime_link(&self, name: &str) -> Option<PathBuf> {
        let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
        runtime_unit_dir(self.user, xdg.as_deref()).map(|dir| dir.join(name))
    }

    /// The held units, reading `units_directory` the first time (a restarted fleetd adopts
    /// what the previous one loaded).
    async fn held(&self) -> tokio::sync::MutexGuard<'_, Option<BTreeMap<String, UnitHash>>> {
        let mut held = self.held.lock().await;
        if held.is_none() {
            let found = units_directory::scan(&self.units_directory);
            self.set_watched(&found.fleets);
            *self.foreign.locked() = found.foreign;
            *held = Some(found.fleets);
        }
        held
    }

    /// Takes a unit file another writer left from the foreign ones: its hash, if there is one.
    async fn take_foreign(&self, name: &str) -> Option<UnitHash> {
        drop(self.held().await);
        self.foreign.locked().remove(name)
    }

    /// Makes the unit another writer left, running as `file` says, fleet's own as it runs: no
    /// stop, no start, no rewrite of its file (which becomes private, as fleet's files are).
    async fn adopt(&self, name: &str, file: &UnitFile) -> Result<()> {
        let path = self.unit_path(name);
        fleet_fs::make_private(&path).map_err(io_error(format!("making {} private", path.display())))?;
        self.fence.locked().loaded(name, file);
        self.hold(name, file).await;
        tracing::info!(unit = name, "adopted a unit left running by another fleet agent, as it runs");
        Ok(())
    }

    /// Whether `name` may have been enabled when it was loaded: its file, as fleet wrote it,
    /// has an `[Install]` section, or cannot be read to tell. Disabling asks systemd to look
    /// through every unit path for links to the unit, the slowest call of an unload: a unit
    /// fleet never enabled is not asked about.
    fn may_be_enabled(&self, name: &str) -> bool {
        std::fs::read_to_string(self.unit_path(name))
            .ok()
            .and_then(|text| UnitFile::parse(&text).ok())
            .is_none_or(|file| has_install_section(&file))
    }

    /// Counts `name`, loaded from `file`, among the units fleet holds.
    async fn hold(&self, name: &str, file: &UnitFile) {
        let mut held = self.held().await;
        let units = held.get_or_insert_with(BTreeMap::new);
        units.insert(name.to_string(), file.hash());
        self.watched.locked().insert(unit_object_path(name));
        drop(held);
        self.remember_refusal(name, None);
    }

    /// Watches the signals of every unit in `held` (read from `units_directory`), and no other.
    /// A load or unload after adds or takes its own unit alone: rebuilt on each, the set cost
    /// a pass of n loads n² paths.
    fn set_watched(&self, held: &BTreeMap<String, UnitHash>) {
        *self.watched.locked() = held.keys().map(|name| unit_object_path(name)).collect();
    }

    fn remember_refusal(&self, name: &str, reason: Option<String>) {
        if let Ok(mut refused) = self.refused.lock() {
            match reason {
                Some(reason) => refused.insert(name.to_string(), reason),
                None => refused.remove(name),
            };
        }
    }

    fn refused(&self, name: &str, error: BusError) -> UnitManagerError {
        UnitManagerError::Refused { unit: name.to_string(), reason: error.to_string() }
    }
}

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> UnitManagerError {
    move |source| UnitManagerError::Io { context, source }
}

/// Runs `program` (`systemctl` or `journalctl`, with `--user` for a user instance) and
/// returns what it printed; their exit codes say things like "inactive", not failure.
async fn run_tool(program: &str, user: bool, args: &[&str]) -> Result<String> {
    let mut command = tokio::process::Command::new(program);
    if user {
        command.arg("--user");
    }
    let output = command.args(args).output().await.map_err(io_error(format!("running {program}")))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

impl SystemdManager {
    /// `journalctl -n LINES -u NAME`, from `since` (microseconds since the epoch) when given.
    async fn journal_lines(&self, name: &str, lines: usize, since: Option<i64>) -> Result<String> {
        let lines = lines.to_string();
        let mut args = vec!["--no-pager", "--quiet", "-n", lines.as_str(), "-u", name];
        // `@SECONDS.MICROS`: systemd.time(7)'s reading of a time since the epoch.
        let since =
            since.map(|micros| format!("@{}.{:06}", micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000)));
        if let Some(since) = &since {
            args.extend(["--since", since.as_str()]);
        }
        let text = run_tool("journalctl", self.user, &args).await?;
        // A user instance run by root logs to the system journal, not to a user journal.
        if self.user && text.is_empty() {
            return run_tool("journalctl", false, &args).await;
        }
        Ok(text)
    }
}

#[async_trait]
impl UnitManager for SystemdManager {
    fn kind(&self) -> &'static str {
        "systemd"
    }

    async fn load(&self, name: &str, file: &UnitFile) -> Result<()> {
        match self.take_foreign(name).await {
            Some(hash) if hash == file.hash() => return self.adopt(name, file).await,
            // Other content than fleet's for it: what runs stops before fleet's takes its place.
            Some(_) => {
                tracing::info!(unit = name, "replacing a unit left by another fleet agent with other content");
                self.stop(name).await?;
            }
            None => {}
        }
        self.fence.locked().loaded(name, file);
        let path = self.unit_path(name);
        fleet_fs::write_private(&path, file.serialize().as_bytes())
            .map_err(io_error(format!("writing {}", path.display())))?;
        // Before systemd reads the unit (linking it loads it), so that it starts with its limits.
        self.write_reservation_drop_in(name, file)?;
        self.hold(name, file).await;
        let target = path.display().to_string();
        self.bus
            .call(|manager| async move { manager.link_unit_files(vec![target], true, true).await })
            .await
            .map_err(|error| self.refused(name, error))?;
        if has_install_section(file) {
            let unit = name.to_string();
            self.bus
                .call(|manager| async move { manager.enable_unit_files(vec![unit], true, true).await })
                .await
                .map_err(|error| self.refused(name, error))?;
        }
        Ok(())
    }

    async fn unload(&self, name: &str) -> Result<()> {
        self.fence.locked().unloaded(name);
        self.started.locked().remove(name);
        let (unit, mode) = (name.to_string(), "replace".to_string());
        // A unit systemd no longer knows has nothing to stop.
        if let Err(BusError::Transport(reason)) =
            self.bus.call(|manager| async move { manager.stop_unit(unit, mode).await }).await
        {
            return Err(UnitManagerError::Refused { unit: name.to_string(), reason });
        }
        if self.may_be_enabled(name) {
            let unit = name.to_string();
            let _ = self.bus.call(|manager| async move { manager.disable_unit_files(vec![unit], true).await }).await;
        }
        let unit = name.to_string();
        let _ = self.bus.call(|manager| async move { manager.reset_failed_unit(unit).await }).await;
        if let Some(link) = self.runtime_link(name)
            && std::fs::read_link(&link).is_ok_and(|target| target.starts_with(&self.units_directory))
        {
            std::fs::remove_file(&link).map_err(io_error(format!("removing {}", link.display())))?;
        }
        self.remove_reservation_drop_in(name);
        let _ = self.write_credentials_drop_in(name, None, &[]);
        self.credentials.remove(name);
        let path = self.unit_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(format!("removing {}", path.display()))(error)),
        }
        let mut held = self.held().await;
        if let Some(units) = held.as_mut() {
            units.remove(name);
        }
        self.watched.locked().remove(&unit_object_path(name));
        drop(held);
        self.remember_refusal(name, None);
        self.read_back.forget(name);
        self.seen.locked().forget(&unit_object_path(name));
        Ok(())
    }

    /// Writes the credentials (root's alone: systemd copies them into the unit's own
    /// `$CREDENTIALS_DIRECTORY`) and the drop-in that loads them, before the unit is loaded.
    fn delivers_credentials(&self) -> bool {
        true
    }

    fn delivered_credential(&self, name: &str, credential: &str) -> Option<crate::credentials::Credential> {
        self.credentials.read(name, credential)
    }

    async fn provide_credentials(
        &self,
        name: &str,
        _file: &UnitFile,
        credentials: &[crate::credentials::Credential],
    ) -> Result<()> {
        let dir = self
            .credentials
            .write(name, credentials, None)
            .map_err(|source| UnitManagerError::Io { context: format!("writing the credentials of {name}"), source })?;
        self.write_credentials_drop_in(name, dir.as_deref(), credentials)
    }

    async fn reload_unit_files(&self) -> Result<()> {
        self.bus
            .call(|manager| async move { manager.reload().await })
            .await
            .map_err(|error| UnitManagerError::Refused { unit: "daemon-reload".to_string(), reason: error.to_string() })
    }

    async fn start(&self, name: &str) -> Result<()> {
        self.fence.locked().check_start(name, tokio::time::Instant::now())?;
        self.started.locked().insert(name.to_string(), watchdog::now());
        let (unit, mode) = (name.to_string(), "replace".to_string());
        match self.bus.call(|manager| async move { manager.start_unit(unit, mode).await }).await {
            Ok(_) => {
                self.remember_refusal(name, None);
                Ok(())
            }
            Err(error) => {
                if let BusError::Refused(reason) = &error {
                    tracing::warn!(unit = name, %reason, "systemd refused to start the unit");
                    self.remember_refusal(name, Some(reason.clone()));
                    self.changes.send_modify(|count| *count = count.wrapping_add(1));
                }
                Err(self.refused(name, error))
            }
        }
    }

    async fn stop(&self, name: &str) -> Result<()> {
        let (unit, mode) = (name.to_string(), "replace".to_string());
        self.remember_refusal(name, None);
        self.bus
            .call(|manager| async move { manager.stop_unit(unit, mode).await })
            .await
            .map(|_| ())
            .map_err(|error| self.refused(name, error))
    }

    async fn reload(&self, name: &str) -> Result<()> {
        let (unit, mode) = (name.to_string(), "replace".to_string());
        self.bus
            .call(|manager| async move { manager.reload_unit(unit, mode).await })
            .await
            .map(|_| ())
            .map_err(|error| self.refused(name, error))
    }

    async fn units(&self) -> Result<BTreeMap<String, HeldUnit>> {
        let held: BTreeMap<String, UnitHash> = self.held().await.clone().unwrap_or_default();
        if held.is_empty() {
            return Ok(BTreeMap::new());
        }
        let names: Vec<String> = held.keys().cloned().collect();
        let listed = self.bus.call(|manager| async move { manager.list_units_by_names(names).await }).await.map_err(
            |error| UnitManagerError::Refused { unit: "ListUnitsByNames".into(), reason: error.to_string() },
        )?;
        let refused = self.refused.lock().map(|refused| refused.clone()).unwrap_or_default();
        let mut units = BTreeMap::new();
        for (name, _description, load, active, sub, ..) in listed {
            let Some(hash) = held.get(&name) else { continue };
            let state = if refused.contains_key(&name) && active != "active" {
                SystemdState::new(&load, "failed", "failed")
            } else {
                SystemdState::new(&load, &active, &sub)
            };
            units.insert(name, HeldUnit { hash: *hash, state });
        }
        Ok(units)
    }

    fn state_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn file_on_machine(&self, name: &str, hash: UnitHash) -> FileOnMachine {
        self.read_back.compare(name, &self.unit_path(name), hash)
    }

    async fn run_end(&self, name: &str) -> Result<Option<fleet_core::job::runs::Outcome>> {
        let Some(started) = self.started.locked().get(name).copied() else { return Ok(None) };
        let path = unit_object_path(name);
        let live =
            self.bus.on_connection(|connection| ending::read(connection, path.clone())).await.unwrap_or_default();
        let seen = self.seen.lock().map(|seen| seen.get(&path)).unwrap_or_default();
        let times = if live.known() { live } else { seen };
        if times.main_exited_at <= started {
            return Ok(None);
        }
        let read = self.bus.on_connection(|connection| ending::read_outcome(connection, path.clone())).await;
        Ok(Some(read.unwrap_or_else(|_| fleet_core::job::runs::Outcome::Lost {
            why: "it ended, and systemd forgot how before fleet read it".to_string(),
        })))
    }

    async fn ended_by_itself(&self, name: &str) -> Result<bool> {
        if !name.ends_with(".service") {
            return Ok(false);
        }
        let file = self.unit_path(name);
        let Some(file) = std::fs::read_to_string(&file).ok().and_then(|text| UnitFile::parse(&text).ok()) else {
            return Ok(false);
        };
        let path = unit_object_path(name);
        let live =
            self.bus.on_connection(|connection| ending::read(connection, path.clone())).await.unwrap_or_default();
        let seen = self.seen.lock().map(|seen| seen.get(&path)).unwrap_or_default();
        Ok(ending::Ending::of(&file, live, seen).by_itself())
    }

    /// The service's own cgroup, as systemd names it (`ControlGroup`), where fleetd may write
    /// into it: a check's command is then one of the service's processes, which systemd stops
    /// with it.
    async fn check_cgroup(&self, name: &str) -> Option<crate::cgroup_procs::CgroupProcs> {
        if !name.ends_with(".service") {
            return None;
        }
        let path = unit_object_path(name);
        let group = self.bus.on_connection(|connection| control_group::control_group(connection, path)).await.ok()?;
        let group = group.trim_start_matches('/');
        if group.is_empty() {
            return None;
        }
        let dir = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(|mount| std::path::Path::new(mount).join(group))
            .find(|dir| dir.join("cgroup.procs").is_file())?;
        crate::cgroup_procs::CgroupProcs::of_dirs([dir.as_path()]).ok()
    }

    async fn watchdog_trouble(&self, name: &str) -> Result<Option<String>> {
        let path = unit_object_path(name);
        let reading = self
            .bus
            .on_connection(|connection| watchdog::read(connection, path))
            .await
            .map_err(|error| UnitManagerError::Refused { unit: name.to_string(), reason: error.to_string() })?;
        Ok(watchdog::trouble(&reading, watchdog::now()))
    }

    async fn journal(&self, name: &str, lines: usize) -> Result<String> {
        self.journal_lines(name, lines, None).await
    }

    async fn run_log(&self, name: &str, since: i64, lines: usize) -> Result<String> {
        self.journal_lines(name, lines, Some(since)).await
    }

    async fn status(&self, name: &str) -> Result<Option<String>> {
        run_tool("systemctl", self.user, &["status", "--no-pager", "--full", "-n", "10", name]).await.map(Some)
    }

    async fn stop_all(&self) -> Result<()> {
        let names: Vec<String> =
            self.held().await.as_ref().map(|units| units.keys().cloned().collect()).unwrap_or_default();
        let mut first_error = None;
        for name in names {
            if let Err(error) = self.stop(&name).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Has systemd kill the units at the deadline through a transient timer of its own, which
    /// outlives a frozen or killed fleetd.
    async fn fence(&self, deadline: tokio::time::Instant, units: &[String]) -> Result<bool> {
        self.fence_timers.lock().await.arm(self.user, deadline, units).await?;
        self.fence.locked().arm(deadline, units);
        Ok(true)
    }
}
