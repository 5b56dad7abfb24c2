//! What every handler is given: the store, the credentials, and the manager's tables.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use fleet_api_schema::{Journal, RelayedJournal};
use fleet_registry::ApiRegistry;
use fleet_unit_manager::UnitManager;

use crate::auth::Auth;

/// The machine answering, for what only it can tell (its units' logs).
#[derive(Clone)]
pub struct LocalMachine {
    pub machine_id: String,
    pub manager: Arc<dyn UnitManager>,
}

impl LocalMachine {
    /// The last `lines` of `unit`'s log here, and with `with_status` its unit manager's status
    /// report: what `/journal` answers for a unit of this machine, asked here or through
    /// another fleetd.
    pub async fn journal(&self, unit: &str, lines: usize, with_status: bool) -> Result<Journal, String> {
        let text = self.manager.journal(unit, lines).await.map_err(|error| error.to_string())?;
        let status =
            if with_status { self.manager.status(unit).await.map_err(|error| error.to_string())? } else { None };
        Ok(Journal { machine_id: self.machine_id.clone(), name: unit.to_string(), text, status, truncated: false })
    }

    /// What this machine answers another fleetd that relays `unit`'s journal: the journal,
    /// with its newest lines within `fleet_core::journal_relay::MOST_ANSWER_BYTES`, or why it
    /// could not be read.
    pub async fn relayed_journal(&self, unit: &str, lines: usize, with_status: bool) -> RelayedJournal {
        match self.journal(unit, lines, with_status).await {
            Ok(journal) => RelayedJournal::Journal(within_relay_bound(journal)),
            Err(error) => RelayedJournal::Failed { error },
        }
    }
}

/// `journal` with only its newest lines, and at most 16 KiB of its status report, so that its
/// JSON fits a relayed answer.
pub fn within_relay_bound(mut journal: Journal) -> Journal {
    use fleet_core::journal_relay::{MOST_ANSWER_BYTES, newest_lines_within};
    const MOST_STATUS_BYTES: usize = 16 * 1024;
    if let Some(status) = &mut journal.status
        && status.len() > MOST_STATUS_BYTES
    {
        let mut end = MOST_STATUS_BYTES;
        while !status.is_char_boundary(end) {
            end -= 1;
        }
        status.truncate(end);
        journal.truncated = true;
    }
    let text = std::mem::take(&mut journal.text);
    // Room for the other fields, then halved until the encoding (escapes included) fits.
    let mut budget = MOST_ANSWER_BYTES.saturating_sub(MOST_STATUS_BYTES + 4096);
    loop {
        let (kept, cut) = newest_lines_within(&text, budget);
        journal.text = kept.to_string();
        journal.truncated |= cut;
        let size = serde_json::to_vec(&journal).map_or(usize::MAX, |encoded| encoded.len());
        if size <= MOST_ANSWER_BYTES || budget == 0 {
            return journal;
        }
        budget /= 2;
    }
}

#[derive(Clone)]
pub struct ApiState {
    pub registry: Arc<dyn ApiRegistry>,
    /// How many items a page of a list holds (the option `token_limit`).
    pub page_size: PageSize,
    pub local: Option<LocalMachine>,
    /// Who is asking: tokens, and the anonymous opt-in.
    pub auth: Auth,
    /// The agent CA, on a fleetd that signs machine certificates for joining pull agents.
    pub agent_ca: Option<Arc<fleet_tls::agent_ca::AgentCa>>,
    /// The agent's side of the store, on a fleetd that serves pull agents (a manager).
    pub agents: Option<Arc<dyn fleet_registry::AgentRegistry>>,
    /// When each pull agent was last heard from.
    pub agent_presence: Arc<crate::agent_presence::AgentPresence>,
    /// How many pull agents announce themselves a second, for whether one may open its
    /// change stream at once.
    pub announce_pace: Arc<crate::announce_pace::AnnouncePace>,
    /// Journals asked of pull agents through this manager.
    pub journal_relay: Arc<crate::journal_relay::JournalRelay>,
    /// What askers may relay of other machines' journals, and how many at once.
    pub journal_limits: Arc<crate::journal_limits::JournalLimits>,
    /// Rings the open long polls when a machine was revoked.
    pub revocation_bell: Arc<crate::revocation_bell::RevocationBell>,
    /// Unit bodies as the change streams carry them, encoded once for all.
    pub encoded_bodies: Arc<crate::encoded_bodies::EncodedBodies>,
    /// Journals asked of the other machines of the cluster through the store, where the store
    /// carries such questions (etcd).
    pub journal_questions: Option<Arc<dyn fleet_registry::JournalQuestions>>,
    /// The web view's live feed.
    pub live_view: Arc<crate::live_view::LiveView>,
    /// The live feeds each identity holds open.
    pub feed_slots: Arc<crate::feed_slots::FeedSlots>,
    /// Where the lists being followed page by page stopped.
    pub page_cursors: Arc<crate::pagination::PageCursors>,
    /// Where git sources' secrets are read (their push webhooks' shared secrets); `None`:
    /// no webhook is accepted.
    pub source_secrets_dir: Option<std::path::PathBuf>,
    /// How the store is backed up (`GET /fleet/v1/backup`); `None`: not through the API
    /// (etcd's snapshots are etcd's).
    pub backup: Option<crate::Backup>,
    /// The cluster's secrets key, which seals the values set through this API.
    pub secret_keys: Arc<crate::secret_keys::SecretKeys>,
    /// How the engine chooses among machines (`placement_strategy`): plans choose alike.
    pub placement_strategy: fleet_core::schedule::PlacementStrategy,
    /// Whether a unit that fits nowhere may preempt units of a lower priority (`preemption`):
    /// plans preempt alike.
    pub preemption: bool,
    /// How long a machine's presence outlives its last renewal (`agent_ttl`): a unit's
    /// `LostAfter=` may not be shorter.
    pub agent_ttl: std::time::Duration,
    /// How many plans are being worked out (at most `handlers::plans::MOST_PLANS_AT_ONCE`).
    pub plans_under_way: Arc<std::sync::atomic::AtomicUsize>,
    /// The units' requirements as the last plan read them (a plan parses only new content).
    pub plan_requirements: Arc<crate::handlers::plans::requirements_memo::RequirementsMemo>,
    /// Where the audit trail's writes go as events (discarding unless fleetd sets one).
    pub events: fleet_registry::EventSink,
    /// Events as the event streams send them, each encoded once for every follower.
    pub encoded_events: Arc<crate::encoded_events::EncodedEvents>,
    /// What pull agents last reported of their units, for the events their next reports make.
    pub agent_state_events: Arc<crate::agent_state_events::AgentStateEvents>,
    /// Reads git sources as a sync reads them, for plans of a sync; `None`: this fleetd
    /// plans no sync.
    pub source_reader: Option<Arc<dyn fleet_registry::SourceReading>>,
}

impl ApiState {
    /// The API of `registry` with `auth`: a page size of 100, and no local machine, agent CA,
    /// pull agents or source secrets (set those fields where they apply).
    pub fn new(registry: Arc<dyn ApiRegistry>, auth: Auth) -> Self {
        Self {
            registry,
            page_size: PageSize::new(100),
            local: None,
            auth,
            agent_ca: None,
            agents: None,
            agent_presence: Default::default(),
            announce_pace: Default::default(),
            journal_relay: Default::default(),
            journal_limits: Default::default(),
            revocation_bell: Default::default(),
            encoded_bodies: Default::default(),
            journal_questions: None,
            live_view: Default::default(),
            feed_slots: Default::default(),
            page_cursors: Default::default(),
            source_secrets_dir: None,
            backup: None,
            secret_keys: Arc::new(crate::secret_keys::SecretKeys::missing("no secrets key is configured")),
            placement_strategy: Default::default(),
            preemption: false,
            agent_ttl: std::time::Duration::from_secs(30),
            plans_under_way: Default::default(),
            plan_requirements: Default::default(),
            events: fleet_registry::EventSink::discarding(),
            encoded_events: Default::default(),
            agent_state_events: Default::default(),
            source_reader: None,
        }
    }
}

/// The page size (`token_limit`), shared with fleetd so that a reload changes it while the
/// API keeps serving.
#[derive(Clone, Debug)]
pub struct PageSize(Arc<AtomicU16>);

impl PageSize {
    pub fn new(limit: u16) -> Self {
        Self(Arc::new(AtomicU16::new(limit)))
    }

    pub fn get(&self) -> u16 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, limit: u16) {
        self.0.store(limit, Ordering::Relaxed);
    }
}
