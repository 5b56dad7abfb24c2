//! The remote store: the agent's facet of the registry ([`AgentRegistry`]) over a manager's
//! HTTPS API, with the machine's own certificate. Every connection is opened by the agent;
//! changes arrive by long polls that the agent opens too.

use fleet_core::unpoisoned::{Locked, ReadWriteLocked};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;

use crate::jitter::random_sample;
use fleet_api_schema::{
    AgentChanges, AgentDrift, AgentHashedBody, AgentHealth, AgentMachine, AgentRun, AgentStates, AgentStreamAnswer,
    AgentUnit, AgentUnitBodies, AgentUnitBody, AgentUnitState, AgentWork, ErrorBody, MAX_BODIES_PER_REQUEST,
    MAX_STREAM_STATES_LINE,
};
use fleet_core::drift::DriftPolicy;
use fleet_core::{DesiredState, MachineState, StateReport, UnitFile, UnitHash, UnitOption};
use fleet_registry::{AgentRegistry, AssignedUnit, ChangeSignal, MachineWork, RegistryError, Result};
use fleet_runtime::Lifecycle;
use tokio::sync::watch;

use crate::credentials::MachineCredentials;
use crate::disk_copy::DiskCopy;
use crate::leaving::Fault;
use crate::manager::{Manager, ManagerError, without_url};
use crate::tls::ClientTls;
use fleet_api_schema::STREAM_NOW_HEADER;

/// How long the agent asks its manager to hold a long poll when nothing changes: an idle agent
/// costs its manager a quiet connection (pinged by both sides), not a request every few
/// seconds. A manager from before `wait` answers after its own short wait, as it always did.
const POLL_WAIT: Duration = Duration::from_secs(300);
/// How long a starting agent's long poll waits (up to twice as long, at random) before the
/// agent counts as settled and moves to a change stream: its request connection then carries
/// nothing and closes, and the stream is all the agent holds on its manager (a starting agent
/// opens one connection, not two at once). While units are submitted an agent's work changes
/// at every poll, so it moves only once they stop coming: at 15 s (to 30 s) 10,000 agents were
/// on their streams 28 s after their units launched, at 2 s as they launched.
const QUIET_WAIT: Duration = Duration::from_secs(2);
/// The same wait for an agent whose stream ended (its manager restarted, or it moved) and that
/// its manager did not welcome back on a stream at once (`stream_welcomes`): after a restart
/// every agent comes back at once, and streams opened while others still announce themselves
/// slow those down (10,000 agents were all back after 74 s at 2 s, 28 s at 15 s). The spread
/// keeps agents that came back together from moving in the same second.
const QUIET_WAIT_AGAIN: Duration = Duration::from_secs(15);

fn unavailable(error: impl std::fmt::Display) -> RegistryError {
    RegistryError::unavailable("manager", error)
}

/// The agent's facet of the store, reached through a manager.
pub struct RemoteRegistry {
    /// Presents the machine's current certificate; one HTTP/2 connection carries the long
    /// polls and the requests alike, let go when the agent moves to its change stream.
    client: std::sync::RwLock<reqwest::Client>,
    /// Opens the change stream (HTTP/1.1, upgraded), with the same certificate.
    stream_client: std::sync::RwLock<reqwest::Client>,
    /// What the clients are made of (a new client lets the old one's connection go): the
    /// managers, and the TLS of the machine's certificate, by which every client resumes the
    /// sessions the others began.
    manager: Manager,
    tls: std::sync::RwLock<ClientTls>,
    /// How often the change stream beats while the presence must be proven, and while idle.
    heartbeat: Duration,
    idle_heartbeat: Duration,
    /// Since when something this machine runs needs its presence proven (an `AtMostOnce=`
    /// unit, or `stop_units_when_cut_off`), if something does: only an answer to what was
    /// sent since proves it, and the change stream beats at `heartbeat` meanwhile.
    proving: watch::Sender<Option<tokio::time::Instant>>,
    /// The work last read, reused while the change stream says nothing changed.
    kept_work: crate::kept_work::KeptWork,
    /// The bodies a second-version stream carried, of the units of the work it last brought.
    carried_bodies: Mutex<HashMap<UnitHash, UnitFile>>,
    /// Sends states on the change stream while a second-version one is open.
    stream_states: Mutex<Option<tokio::sync::mpsc::Sender<crate::change_stream::StatesToSend>>>,
    /// The manager (its index in `bases`, plus one) that serves no change stream, followed by
    /// long polls instead; 0 for none.
    stream_refused_by: std::sync::atomic::AtomicUsize,
    /// This machine's part of each manager's API (`…/fleet/v1/agents/<machine>`).
    bases: Vec<String>,
    /// The manager in use: the next one is tried when it cannot be reached.
    current: std::sync::atomic::AtomicUsize,
    /// Moves on each time the agent moves to another manager: a change stream open on the
    /// one it left ends, so that its stream and its requests go to one manager (the one
    /// that holds its presence).
    moves: watch::Sender<u64>,
    /// Whether to announce the machine before the next read (a new manager holds no presence
    /// for it yet).
    announce_due: std::sync::atomic::AtomicBool,
    machine_id: String,
    /// The machine as last announced, to announce again if the manager lost it.
    announced: Mutex<Option<MachineState>>,
    /// Moves on with each announce whose manager welcomed a change stream at once (it is not
    /// busy taking many agents back): an agent whose stream ended then opens it again without
    /// waiting for its polls to settle (20 agents whose manager restarted were back on their
    /// streams 29 s after, though announced in 0.5 s).
    stream_welcomes: watch::Sender<u64>,
    changes: watch::Sender<u64>,
    /// Ends the following of changes started without a fleetd's lifecycle, when dropped.
    own_lifecycle: Mutex<Option<watch::Sender<Lifecycle>>>,
    /// The desired state kept on disk, used while the manager cannot be reached.
    copy: Option<DiskCopy>,
    /// Whether the last read came from the copy (to log the change once).
    offline: std::sync::atomic::AtomicBool,
    /// Journal questions the manager relayed, waiting for an answer (`journal_inbox.rs`).
    journal_asks: crate::waiting_asks::WaitingAsks,
    /// When the last request a manager answered was sent: it heard from this machine no
    /// sooner, and holds its presence `agent_ttl` from when it did.
    answered: Mutex<Option<tokio::time::Instant>>,
    /// When the manager in use last answered anything (or when the agent came to it): one
    /// silent for a heartbeat period since is left for another when an exchange fails
    /// ([`Fault::leaves`]).
    last_answer: Mutex<tokio::time::Instant>,
}

/// Why a request to the manager failed.
enum Failure {
    /// No answer: the manager (or the network to it) is down.
    Unreachable(String),
    /// An answer that refuses: not a reason to fall back on the copy.
    Refused { status: u16, text: String },
}

impl From<Failure> for RegistryError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Unreachable(text) | Failure::Refused { text, .. } => unavailable(text),
        }
    }
}

impl Drop for RemoteRegistry {
    fn drop(&mut self) {
        if let Some(lifecycle) = self.own_lifecycle.locked().take() {
            lifecycle.send_replace(Lifecycle::ShuttingDown);
        }
    }
}

/// The unit file `body` holds, if it is the body of `hash`.
fn checked_file(hash: &UnitHash, body: AgentUnitBody) -> Result<UnitFile> {
    let options = body
        .options
        .into_iter()
        .map(|option| UnitOption { section: option.section, name: option.name, value: option.value })
        .collect();
    let file = UnitFile::from_options(options);
    if file.hash() != *hash {
        return Err(unavailable(format!("the body sent for {hash} has another hash")));
    }
    Ok(file)
}

fn assigned(unit: AgentUnit) -> Result<AssignedUnit> {
    let hash = UnitHash::parse_hex(&unit.hash).ok_or_else(|| unavailable(format!("invalid hash for {}", unit.name)))?;
    let desired = DesiredState::from_str(&unit.desired_state)
        .map_err(|_| unavailable(format!("invalid desired state for {}", unit.name)))?;
    let drift = if unit.drift_policy.is_empty() {
        DriftPolicy::Correct
    } else {
        DriftPolicy::parse(&unit.drift_policy).map_err(unavailable)?
    };
    let secrets = fleet_core::secrets::SecretPins { versions: unit.secrets, in_place: unit.secrets_in_place };
    let run = unit.run.map(|ticket| fleet_core::job::global_runs::RunTicket { id: ticket.id, elapse: ticket.elapse });
    let required_at = unit
        .required_at
        .into_iter()
        .map(|place| fleet_core::required_places::RequiredPlace {
            unit: place.unit,
            machine_id: place.machine_id,
            public_ip: place.primary_ip,
        })
        .collect();
    Ok(AssignedUnit { name: unit.name, hash, desired, drift, secrets, run, required_at })
}

impl RemoteRegistry {
    /// A remote store for the machine `credentials` name, through `manager`, keeping its
    /// desired state in `copy` if given.
    pub fn new(
        manager: &Manager,
        credentials: &MachineCredentials,
        copy: Option<DiskCopy>,
    ) -> std::result::Result<Arc<Self>, ManagerError> {
        let tls = manager.tls(Some(credentials))?;
        let registry = Arc::new(Self {
            client: std::sync::RwLock::new(manager.client(&tls)?),
            stream_client: std::sync::RwLock::new(manager.stream_client(&tls)?),
            manager: manager.clone(),
            tls: std::sync::RwLock::new(tls),
            heartbeat: manager.heartbeat(),
            idle_heartbeat: manager.idle_heartbeat(),
            proving: watch::channel(None).0,
            kept_work: crate::kept_work::KeptWork::default(),
            carried_bodies: Mutex::new(HashMap::new()),
            stream_states: Mutex::new(None),
            stream_refused_by: std::sync::atomic::AtomicUsize::new(0),
            bases: manager
                .bases()
                .iter()
                .map(|base| format!("{base}/fleet/v1/agents/{}", credentials.machine_id))
                .collect(),
            // Agents start on a manager of the list at random, so several managers share them.
            current: std::sync::atomic::AtomicUsize::new(random_sample() as usize),
            moves: watch::channel(0).0,
            announce_due: std::sync::atomic::AtomicBool::new(false),
            answered: Mutex::new(None),
            last_answer: Mutex::new(tokio::time::Instant::now()),
            machine_id: credentials.machine_id.clone(),
            announced: Mutex::new(None),
            stream_welcomes: watch::channel(0).0,
            changes: watch::channel(0).0,
            own_lifecycle: Mutex::new(None),
            copy,
            offline: std::sync::atomic::AtomicBool::new(false),
            journal_asks: crate::waiting_asks::WaitingAsks::default(),
        });
        Ok(registry)
    }

    /// Presents `credentials` (a renewed certificate) from the next request on, resuming
    /// no session the old certificate began.
    pub fn use_credentials(&self, credentials: &MachineCredentials) -> std::result::Result<(), ManagerError> {
        let tls = self.manager.tls(Some(credentials))?;
        let client = self.manager.client(&tls)?;
        let stream_client = self.manager.stream_client(&tls)?;
        *self.client.write_locked() = client;
        *self.stream_client.write_locked() = stream_client;
        *self.tls.write_locked() = tls;
        Ok(())
    }

    /// Lets the connection that carried the agent's requests and long polls go (once the
    /// requests in flight on it end): the agent moves to a change stream, and holds nothing
    /// else on its manager until its work changes.
    fn let_request_connection_go(&self) {
        let tls = self.tls.read_locked().clone();
        match self.manager.client(&tls) {
            Ok(client) => *self.client.write_locked() = client,
            Err(error) => tracing::debug!(%error, "cannot make a new client; the old connection idles out"),
        }
    }

    fn client(&self) -> reqwest::Client {
        self.client.read_locked().clone()
    }

    /// This machine's part of the manager in use.
    fn base(&self) -> &str {
        let current = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len();
        &self.bases[current]
    }

    /// The manager a request was sent to (`used`, as [`RemoteRegistry::current`] read then)
    /// failed so (`fault`, `why`): if [`Fault::leaves`] says so, the next request goes to the
    /// next one, which holds no presence for this machine yet. Requests in flight together
    /// that fail together move on once: each moving on would send the agent back to the
    /// manager that failed.
    fn fail_over(&self, used: usize, why: &str, fault: Fault) {
        let silent_for = self.last_answer.locked().elapsed();
        if !fault.leaves(silent_for, self.heartbeat) {
            tracing::debug!(why, "no answer from the manager; it answered lately, so the agent stays");
            return;
        }
        // Whichever manager answers next (another, or this one restarted) may hold no
        // presence for this machine: announce to it first.
        self.announce_due.store(true, std::sync::atomic::Ordering::Relaxed);
        let ordering = std::sync::atomic::Ordering::Relaxed;
        if self.bases.len() > 1 && self.current.compare_exchange(used, used.wrapping_add(1), ordering, ordering).is_ok()
        {
            // The manager moved to is given a whole period before it counts as silent.
            self.answer_heard();
            self.moves.send_modify(|moves| *moves += 1);
            tracing::warn!(manager = self.base(), why, "the manager cannot be reached; trying another");
        }
    }

    /// The manager in use answered (anything: it is there).
    fn answer_heard(&self) {
        *self.last_answer.locked() = tokio::time::Instant::now();
    }

    async fn request(&self, request: reqwest::RequestBuilder) -> std::result::Result<Vec<u8>, Failure> {
        self.exchange(request, None).await.map(|(_, body)| body)
    }

    /// [`RemoteRegistry::request`], with the answer's `header` if asked for and sent.
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        header: Option<&str>,
    ) -> std::result::Result<(Option<reqwest::header::HeaderValue>, Vec<u8>), Failure> {
        let used = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let unreachable = |error: reqwest::Error| {
            // A manager that is gone refuses the connection, or answers nothing for the
            // agent's patience: either moves the agent (`leaving`). A manager that lost the
            // machine says so: its work shows no machine, or its states are refused.
            let text = without_url(&error);
            self.fail_over(used, &text, Fault::of(&error));
            Failure::Unreachable(text)
        };
        let sent = tokio::time::Instant::now();
        let response = request.send().await.map_err(unreachable)?;
        self.answer_heard();
        let status = response.status();
        let header = header.and_then(|name| response.headers().get(name).cloned());
        let bytes = response.bytes().await.map_err(unreachable)?;
        if status.is_success() {
            self.heard_by_manager(sent);
        }
        if !status.is_success() {
            let message =
                serde_json::from_slice::<ErrorBody>(&bytes).map(|body| body.error.message).unwrap_or_default();
            return Err(Failure::Refused { status: status.as_u16(), text: format!("{status}: {message}") });
        }
        Ok((header, bytes.to_vec()))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Vec<u8>> {
        self.request(request).await.map_err(RegistryError::from)
    }

    async fn fetch<T: serde::de::DeserializeOwned>(&self, path: &str) -> std::result::Result<T, Failure> {
        let bytes = self.request(self.client().get(format!("{}{path}", self.base()))).await?;
        serde_json::from_slice(&bytes).map_err(|error| Failure::Refused { status: 200, text: error.to_string() })
    }

    /// The journal questions the manager relayed and this machine has not answered yet.
    pub(crate) fn journal_asks(&self) -> &crate::waiting_asks::WaitingAsks {
        &self.journal_asks
    }

    /// Sends the answer (a `RelayedJournal` in JSON) to journal question `id`.
    pub(crate) async fn post_journal_answer(&self, id: u64, answer: Vec<u8>) -> Result<()> {
        let url = format!("{}/journal/{id}", self.base());
        self.send(self.client().post(url).header("Content-Type", "application/json").body(answer)).await.map(drop)
    }

    /// Announces the machine to the manager in use if it holds no presence for it yet.
    async fn announce_if_due(&self) -> Result<()> {
        if !self.announce_due.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let announced = self.announced.locked().clone();
        let Some(machine) = announced else { return Ok(()) };
        match self.announce(&machine).await {
            Ok(()) => Ok(()),
            Err(error) => {
                self.announce_due.store(true, std::sync::atomic::Ordering::Relaxed);
                Err(error)
            }
        }
    }

    /// Notes whether reads come from the manager or from the copy, logging each change.
    fn note_offline(&self, offline: bool) {
        let was = self.offline.swap(offline, std::sync::atomic::Ordering::Relaxed);
        match (was, offline) {
            (false, true) => {
                tracing::warn!("the manager cannot be reached: running from the desired state kept on disk")
            }
            (true, false) => tracing::info!("the manager is back"),
            _ => {}
        }
    }

    /// The machine's work from the manager, kept on disk; the kept copy while the manager
    /// cannot be reached.
    async fn fetch_work(&self) -> Result<AgentWork> {
        if let Some(work) = self.kept_work.current() {
            return Ok(work);
        }
        let epoch = self.kept_work.before_read();
        match self.fetch::<AgentWork>("/work").await {
            Ok(work) => {
                self.kept_work.keep(&work, epoch);
                self.note_offline(false);
                if let Some(copy) = &self.copy {
                    copy.save_work(&work);
                }
                Ok(work)
            }
            Err(Failure::Unreachable(text)) => match self.copy.as_ref().and_then(DiskCopy::work) {
                Some(work) => {
                    self.note_offline(true);
                    Ok(work)
                }
                None => Err(unavailable(text)),
            },
            Err(refused) => Err(refused.into()),
        }
    }

    pub(crate) fn check_machine(&self, machine_id: &str) -> Result<()> {
        if machine_id == self.machine_id {
            Ok(())
        } else {
            Err(unavailable(format!("this store serves machine {} only", self.machine_id)))
        }
    }

    async fn announce(&self, machine: &MachineState) -> Result<()> {
        let body = AgentMachine {
            public_ip: machine.public_ip.clone(),
            metadata: machine.metadata.clone(),
            version: machine.version.clone(),
            capacity: machine.capacity.map(Into::into),
            taints: fleet_core::taint::written(&machine.taints),
        };
        let body = serde_json::to_string(&body).map_err(unavailable)?;
        let request =
            self.client().put(format!("{}/machine", self.base())).header("Content-Type", "application/json").body(body);
        let (stream_now, _) = self.exchange(request, Some(STREAM_NOW_HEADER)).await.map_err(RegistryError::from)?;
        // A manager of 0.2.0 or earlier sends no such header: no welcome.
        if stream_now.is_some_and(|value| value == "true") {
            self.stream_welcomes.send_modify(|welcomes| *welcomes += 1);
        }
        Ok(())
    }

    /// One round of following the manager's changes: a long poll while the agent is busy
    /// (starting, back from an outage, or its work changing) or its manager serves no stream,
    /// else a change stream from its opening to its end. Holds `self` only while it polls:
    /// a stream holds the weak `registry` alone, so that dropping the registry ends it.
    pub(crate) async fn follow_once(
        self: Arc<Self>,
        registry: &Weak<Self>,
        following: &mut Following,
    ) -> std::result::Result<(), String> {
        let mut moves = self.moves.subscribe();
        moves.borrow_and_update();
        let used = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let refused = self.stream_refused_by.load(std::sync::atomic::Ordering::Relaxed);
        let streams_refused = refused == used % self.bases.len() + 1;
        if streams_refused || !following.quiet {
            // Long polls on the connection its requests use anyway, until one ends with
            // nothing new. Spread, so that agents started (or moved) together do not all move
            // to their streams in the same second.
            let settle = if following.streamed { QUIET_WAIT_AGAIN } else { QUIET_WAIT };
            let quiet = settle + settle.mul_f64(f64::from(random_sample()) / f64::from(u32::MAX));
            let wait = if streams_refused { POLL_WAIT } else { quiet };
            if streams_refused || !following.streamed {
                return self.poll_once(wait, following).await;
            }
            // Back from a stream that ended: an announce welcomed on a stream since ends the
            // polls.
            let mut welcomes = self.stream_welcomes.subscribe();
            let seen = following.stream_welcomes_seen;
            tokio::select! {
                biased;
                Ok(welcomed) = welcomes.wait_for(|welcomes| *welcomes != seen) => {
                    following.stream_welcomes_seen = *welcomed;
                    following.quiet = true;
                    tracing::info!("the manager welcomes this agent's change stream again at once");
                    return Ok(());
                }
                polled = self.poll_once(wait, following) => return polled,
            }
        }
        let (client, url, beats) = self.stream_parts();
        self.let_request_connection_go();
        drop(self);
        let opened = tokio::time::Instant::now();
        let (states_sender, states) = tokio::sync::mpsc::channel(16);
        let followed = crate::change_stream::follow(&client, &url, beats, states, |heard| {
            if let Some(registry) = registry.upgrade() {
                if matches!(heard, crate::change_stream::Heard::Opened { carries_states: true, .. }) {
                    *registry.stream_states.locked() = Some(states_sender.clone());
                }
                registry.heard_on_stream(heard, following);
            }
        });
        // A request that moved the agent to another manager ends the stream here: the
        // manager it left may hold its presence no longer.
        let end = tokio::select! {
            end = followed => end,
            _ = moves.changed() => crate::change_stream::StreamEnd::Moved,
        };
        let Some(registry) = registry.upgrade() else { return Ok(()) };
        *registry.stream_states.locked() = None;
        registry.stream_ended(end, used, opened.elapsed(), following)
    }

    /// A lifecycle for following changes without a fleetd's ([`crate::start`]): it ends when
    /// the registry is dropped. `None` if one was made already.
    pub(crate) fn lifecycle_of_its_own(&self) -> Option<watch::Receiver<Lifecycle>> {
        let mut own = self.own_lifecycle.locked();
        if own.is_some() {
            return None;
        }
        let (sender, lifecycle) = watch::channel(Lifecycle::Running);
        *own = Some(sender);
        Some(lifecycle)
    }

    /// The change stream's client, URL and heartbeats, on the manager in use.
    fn stream_parts(&self) -> (reqwest::Client, String, crate::change_stream::Beats) {
        let client = self.stream_client.read_locked().clone();
        let beats = crate::change_stream::Beats {
            idle: self.idle_heartbeat,
            proving: self.heartbeat,
            proven: self.proving.subscribe(),
            answer_within: self.manager.patience(),
        };
        (client, format!("{}/stream", self.base()), beats)
    }

    /// One long poll for changes.
    async fn poll_once(&self, wait: Duration, following: &mut Following) -> std::result::Result<(), String> {
        let path = match following.after {
            Some(after) => format!("{}/changes?after={after}&wait={}", self.base(), wait.as_secs()),
            None => format!("{}/changes", self.base()),
        };
        let answer = self.send(self.client().get(path).timeout(wait + self.manager.patience())).await;
        let answer = answer.and_then(|bytes| serde_json::from_slice::<AgentChanges>(&bytes).map_err(unavailable));
        match answer {
            Ok(changes) => {
                let unchanged =
                    following.after == Some(changes.revision) && !following.recovering && changes.journal.is_empty();
                self.heard_changes(changes, following);
                following.quiet = unchanged;
                Ok(())
            }
            Err(error) => {
                // A manager restarted may serve the change stream now.
                self.stream_refused_by.store(0, std::sync::atomic::Ordering::Relaxed);
                Err(error.to_string())
            }
        }
    }

    /// What the change stream brought.
    fn heard_on_stream(&self, heard: crate::change_stream::Heard, following: &mut Following) {
        use crate::change_stream::Heard;
        self.answer_heard();
        match heard {
            Heard::Changes(mut changes) => {
                self.kept_work.changes_heard();
                if let Some(work) = changes.work.take() {
                    self.take_carried_work(work, std::mem::take(&mut changes.bodies));
                }
                self.heard_changes(*changes, following);
            }
            Heard::Opened { sent, .. } => {
                self.kept_work.stream_opened();
                self.heard_by_manager(sent);
            }
            Heard::BeatAnswered { sent } => self.heard_by_manager(sent),
        }
    }

    /// Keeps the work a line of changes carried (as a read of it would), and the bodies it
    /// brought; the bodies of units no longer held go. A body that is not its hash's is left
    /// out: the agent reads it.
    fn take_carried_work(&self, work: AgentWork, bodies: Vec<AgentHashedBody>) {
        self.kept_work.keep(&work, self.kept_work.before_read());
        self.note_offline(false);
        let mut carried = self.carried_bodies.locked();
        for body in bodies {
            let Some(hash) = UnitHash::parse_hex(&body.hash) else { continue };
            let body = AgentUnitBody { options: body.options };
            match checked_file(&hash, body.clone()) {
                Ok(file) => {
                    if let Some(copy) = &self.copy {
                        copy.save_body(&hash.to_string(), &body);
                    }
                    carried.insert(hash, file);
                }
                Err(error) => tracing::warn!(%error, "a body the stream carried does not match its hash"),
            }
        }
        let held: std::collections::HashSet<UnitHash> =
            work.scheduled.iter().chain(&work.globals).filter_map(|unit| UnitHash::parse_hex(&unit.hash)).collect();
        carried.retain(|hash, _| held.contains(hash));
        drop(carried);
        if let Some(copy) = &self.copy {
            copy.save_work(&work);
        }
    }

    /// Sends `states` on the change stream, if a second-version one is open: its answer, or
    /// `None` when it must go by request (no such stream, or it ended before answering).
    async fn states_on_stream(&self, states: &str) -> Result<Option<AgentStreamAnswer>> {
        let sender = self.stream_states.locked().clone();
        let Some(sender) = sender else { return Ok(None) };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let sent = tokio::time::Instant::now();
        let to_send = crate::change_stream::StatesToSend { states: states.to_string(), answer };
        if sender.send(to_send).await.is_err() {
            return Ok(None);
        }
        let patience = self.manager.patience();
        // The stream may end just as the states reach it (its channel's room taken before it
        // let go): they then sit there unanswered, and only its end says so.
        let answer = tokio::select! {
            answer = tokio::time::timeout(patience, answered) => answer,
            () = sender.closed() => return Ok(None),
        };
        match answer {
            Ok(Ok(answer)) => {
                self.answer_heard();
                if (200..300).contains(&answer.status) {
                    self.heard_by_manager(sent);
                }
                Ok(Some(answer))
            }
            Ok(Err(_)) => Ok(None),
            Err(_) => Err(unavailable(format!("no answer to the states sent on the stream within {patience:?}"))),
        }
    }

    /// The manager answered what was sent at `sent`: it noted this machine present when that
    /// reached it, no sooner.
    fn heard_by_manager(&self, sent: tokio::time::Instant) {
        let mut answered = self.answered.locked();
        let before = *answered;
        *answered = Some(before.map_or(sent, |before| before.max(sent)));
        drop(answered);
        // The first proof since the presence had to be proven: the agent may now start what
        // waited for it.
        // Copied out first: an `if let` would hold the watch's lock through the send below.
        let proving = *self.proving.borrow();
        if let Some(since) = proving
            && sent >= since
            && before.is_none_or(|before| before < since)
        {
            self.changes.send_modify(|revision| *revision += 1);
        }
    }

    /// What a stream's end means: follow long polls (a manager without streams), open the
    /// next at once (one that lasted), or wait and try again (the manager gone, or refusing).
    fn stream_ended(
        &self,
        end: crate::change_stream::StreamEnd,
        used: usize,
        lasted: Duration,
        following: &mut Following,
    ) -> std::result::Result<(), String> {
        use crate::change_stream::StreamEnd;
        // Whatever a new stream's first line says, the agent looks at its work again then,
        // by long polls until it is quiet again. (Tried: straight back to a stream, 10,000
        // agents whose manager was killed and restarted were all back after 143 s, not 28:
        // each attempt at a stream is a new connection and a full handshake on the fresh
        // manager, where long polls keep one connection through their retries.)
        following.recovering = true;
        following.quiet = false;
        following.streamed = true;
        following.stream_welcomes_seen = *self.stream_welcomes.borrow();
        self.kept_work.stream_ended();
        match end {
            StreamEnd::Unsupported => {
                tracing::info!(manager = self.base(), "the manager serves no change stream; following its long polls");
                self.stream_refused_by.store(used % self.bases.len() + 1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            StreamEnd::Closed if lasted >= self.heartbeat => Ok(()),
            StreamEnd::Moved => {
                tracing::info!(manager = self.base(), "following the changes on the manager the agent moved to");
                Ok(())
            }
            StreamEnd::Closed => Err("the manager closed the change stream".into()),
            StreamEnd::Refused(text) => Err(text),
            StreamEnd::Unreachable { why, fault } => {
                self.fail_over(used, &why, fault);
                Err(why)
            }
        }
    }

    /// A manager's word on this machine's changes, by long poll or stream.
    fn heard_changes(&self, changes: AgentChanges, following: &mut Following) {
        for ask in changes.journal {
            self.journal_asks.heard(ask);
        }
        // Back after an outage: reconcile now (and announce to the manager that answers),
        // whatever changed meanwhile.
        if following.recovering || following.after.is_some_and(|after| after != changes.revision) {
            self.changes.send_modify(|revision| *revision += 1);
        }
        following.recovering = false;
        following.after = Some(changes.revision);
    }
}

/// Where the agent's following of its manager's changes stands.
#[derive(Default)]
pub(crate) struct Following {
    /// The revision of the machine's work last heard.
    pub(crate) after: Option<u64>,
    /// Whether the agent lost its manager since: it reconciles at the next word.
    pub(crate) recovering: bool,
    /// Whether the last long poll waited out its quiet wait with nothing new: the agent
    /// follows its changes on a change stream from then on.
    pub(crate) quiet: bool,
    /// Whether the agent followed a change stream before (its polls then wait longer before
    /// it moves to a stream again).
    pub(crate) streamed: bool,
    /// How many announces had been welcomed on a stream when the last stream ended.
    pub(crate) stream_welcomes_seen: u64,
}

/// The values of a unit's secrets, asked of the manager over this machine's own mTLS
/// channel; the manager opens them, and only for a unit it gave this machine. Never kept on
/// disk here.
#[async_trait]
impl fleet_registry::UnitSecrets for RemoteRegistry {
    async fn unit_secrets(
        &self,
        machine_id: &str,
        unit: &str,
        names: &[String],
        // The manager goes by its own copy of this machine's work.
        _pins: &fleet_core::secrets::SecretPins,
    ) -> std::result::Result<Vec<fleet_registry::DeliveredSecret>, String> {
        use base64::Engine;
        self.check_machine(machine_id).map_err(|error| error.to_string())?;
        let answer = self
            .fetch::<fleet_api_schema::AgentUnitSecrets>(&format!("/secrets/{unit}"))
            .await
            .map_err(|failure| RegistryError::from(failure).to_string())?;
        let mut values = Vec::with_capacity(names.len());
        for secret in answer.secrets.into_iter().filter(|secret| names.contains(&secret.name)) {
            let value = base64::engine::general_purpose::STANDARD
                .decode(secret.value.as_bytes())
                .map_err(|_| format!("the manager sent secret {} not in base64", secret.name))?;
            values.push(fleet_registry::DeliveredSecret { name: secret.name, version: secret.version, value });
        }
        Ok(values)
    }
}

#[async_trait]
impl AgentRegistry for RemoteRegistry {
    async fn register_machine(&self, machine: &MachineState) -> Result<()> {
        self.check_machine(&machine.id)?;
        self.announce(machine).await?;
        *self.announced.locked() = Some(machine.clone());
        Ok(())
    }

    /// Counted by this machine's clock only while something here needs it proven: an idle
    /// agent beats minutes apart, and its last answer's age says nothing then.
    fn presence_renewed(&self, _machine_id: &str) -> fleet_registry::Renewal {
        let Some(since) = *self.proving.borrow() else { return fleet_registry::Renewal::NotLeased };
        match *self.answered.locked() {
            Some(sent) if sent >= since => fleet_registry::Renewal::SentAt(sent),
            _ => fleet_registry::Renewal::NotHeld,
        }
    }

    fn presence_wanted(&self, _machine_id: &str, wanted: bool) {
        self.proving.send_if_modified(|since| match (wanted, since.is_some()) {
            (true, false) => {
                *since = Some(tokio::time::Instant::now());
                true
            }
            (false, true) => {
                *since = None;
                true
            }
            _ => false,
        });
    }

    async fn unregister_machine(&self, machine_id: &str) -> Result<()> {
        self.check_machine(machine_id)?;
        self.send(self.client().delete(format!("{}/machine", self.base()))).await.map(drop)
    }

    async fn machine_work(&self, machine_id: &str) -> Result<MachineWork> {
        self.check_machine(machine_id)?;
        self.announce_if_due().await?;
        let mut work = self.fetch_work().await?;
        let announced = self.announced.locked().clone();
        if let (None, Some(machine)) = (&work.machine, announced) {
            // The cluster lost this machine (it was gone longer than agent_ttl): announce it
            // again, as an etcd machine does with a new lease.
            tracing::info!("the manager no longer knows this machine; announcing it again");
            self.announce(&machine).await?;
            work = self.fetch_work().await?;
        }
        let machine = work.machine.map(|machine| MachineState {
            // Written by the manager from a stored machine: one that cannot be read is left out.
            taints: machine.taints.iter().filter_map(|taint| fleet_core::taint::parse_taint(taint).ok()).collect(),
            id: machine.id,
            public_ip: machine.primary_ip,
            metadata: machine.metadata,
            connection: fleet_core::Connection::Pull,
            ..MachineState::default()
        });
        Ok(MachineWork {
            machine,
            scheduled: work.scheduled.into_iter().map(assigned).collect::<Result<_>>()?,
            globals: work.globals.into_iter().map(assigned).collect::<Result<_>>()?,
        })
    }

    async fn unit_body(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        let hex = hash.to_string();
        let body = match self.fetch::<AgentUnitBody>(&format!("/bodies/{hex}")).await {
            Ok(body) => {
                if let Some(copy) = &self.copy {
                    copy.save_body(&hex, &body);
                }
                body
            }
            Err(Failure::Unreachable(text)) => {
                self.copy.as_ref().and_then(|copy| copy.body(&hex)).ok_or_else(|| unavailable(text))?
            }
            Err(refused) => return Err(refused.into()),
        };
        checked_file(hash, body).map(Some)
    }

    /// All of `hashes` in one request per [`MAX_BODIES_PER_REQUEST`]; a manager from before
    /// that request is asked for each body alone.
    async fn unit_bodies(&self, machine_id: &str, hashes: &[UnitHash]) -> Result<HashMap<UnitHash, UnitFile>> {
        self.check_machine(machine_id)?;
        let mut found = HashMap::new();
        // What the stream carried is not asked for again.
        let mut unread = Vec::new();
        {
            let carried = self.carried_bodies.locked();
            for hash in hashes {
                match carried.get(hash) {
                    Some(file) => drop(found.insert(*hash, file.clone())),
                    None => unread.push(*hash),
                }
            }
        }
        let hashes = unread;
        for chunk in hashes.chunks(MAX_BODIES_PER_REQUEST) {
            let query: Vec<String> = chunk.iter().map(|hash| format!("hash={hash}")).collect();
            match self.fetch::<AgentUnitBodies>(&format!("/bodies?{}", query.join("&"))).await {
                Ok(answer) => {
                    for sent in answer.bodies {
                        let Some(hash) = UnitHash::parse_hex(&sent.hash).filter(|hash| chunk.contains(hash)) else {
                            return Err(unavailable("the manager sent a body that was not asked for"));
                        };
                        let body = AgentUnitBody { options: sent.options };
                        let file = checked_file(&hash, body.clone())?;
                        if let Some(copy) = &self.copy {
                            copy.save_body(&hash.to_string(), &body);
                        }
                        found.insert(hash, file);
                    }
                }
                Err(Failure::Refused { status: 404 | 405, .. }) => {
                    for hash in chunk {
                        if let Some(file) = self.unit_body(hash).await? {
                            found.insert(*hash, file);
                        }
                    }
                }
                Err(Failure::Unreachable(text)) => {
                    for hash in chunk {
                        let kept = self.copy.as_ref().and_then(|copy| copy.body(&hash.to_string()));
                        found.insert(*hash, checked_file(hash, kept.ok_or_else(|| unavailable(text.clone()))?)?);
                    }
                }
                Err(refused) => return Err(refused.into()),
            }
        }
        Ok(found)
    }

    async fn report_states(&self, machine_id: &str, reports: &[StateReport]) -> Result<()> {
        self.check_machine(machine_id)?;
        let mut states = AgentStates::default();
        for report in reports {
            match report {
                StateReport::Set(state) => states.set.push(AgentUnitState {
                    name: state.name.clone(),
                    hash: state.hash.to_string(),
                    systemd_load_state: state.systemd.load.clone(),
                    systemd_active_state: state.systemd.active.clone(),
                    systemd_sub_state: state.systemd.sub.clone(),
                    launched: state.launched,
                    drift: state.drift.as_ref().map(|report| AgentDrift {
                        drift: report.drift.word().to_string(),
                        corrections: report.corrections,
                        correcting: report.correcting,
                        given_up: report.given_up,
                    }),
                    health: state.health.as_ref().map(|report| AgentHealth {
                        status: report.status.word().to_string(),
                        failure: report.failure.clone(),
                        restarts: report.restarts,
                        given_up: report.given_up,
                    }),
                    secrets: state.secrets.clone(),
                    run: state.run.as_ref().map(|run| AgentRun {
                        started: run.started,
                        ended: run.ended,
                        outcome: run.outcome.as_ref().map(|outcome| outcome.word().to_string()),
                        status: match &run.outcome {
                            Some(fleet_core::job::runs::Outcome::Failed { status, .. }) => *status,
                            _ => None,
                        },
                        signal: match &run.outcome {
                            Some(fleet_core::job::runs::Outcome::Failed { signal, .. }) => signal.clone(),
                            _ => None,
                        },
                        log: run.log.clone(),
                        run: run.run,
                    }),
                }),
                StateReport::Remove(name) => states.removed.push(name.clone()),
            }
        }
        let body = serde_json::to_string(&states).map_err(unavailable)?;
        // Room for the line's id around the states.
        if body.len() + 64 <= MAX_STREAM_STATES_LINE {
            match self.states_on_stream(&body).await? {
                Some(answer) if (200..300).contains(&answer.status) => return Ok(()),
                // The manager holds no presence for this machine (it moved here): announce,
                // and send them again by request.
                Some(answer) if answer.status == 409 => {
                    self.announce_due.store(true, std::sync::atomic::Ordering::Relaxed);
                    self.announce_if_due().await?;
                }
                Some(answer) => return Err(unavailable(format!("{}: {}", answer.status, answer.message))),
                None => {}
            }
        }
        let post = || {
            self.client()
                .post(format!("{}/states", self.base()))
                .header("Content-Type", "application/json")
                .body(body.clone())
        };
        match self.request(post()).await {
            Ok(_) => Ok(()),
            // The manager holds no presence for this machine (it moved here): announce, again.
            Err(Failure::Refused { status: 409, .. }) => {
                self.announce_due.store(true, std::sync::atomic::Ordering::Relaxed);
                self.announce_if_due().await?;
                self.send(post()).await.map(drop)
            }
            Err(failure) => Err(failure.into()),
        }
    }

    fn machine_changes(&self, _machine_id: &str) -> ChangeSignal {
        self.changes.subscribe()
    }
}
