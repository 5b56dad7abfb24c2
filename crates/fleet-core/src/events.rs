//! What happens in the cluster, as a stream of events: units placed, moved and left unplaced
//! with the engine's reasons, their state and health changing, machines joining and lost,
//! drains, rollouts' steps, sources' syncs, and every write of the audit trail.
//!
//! An event is stored in a batch with the events written together; its index is the position
//! of its batch in the store's one order (etcd's revision, the embedded store's counter) times
//! [`PER_BATCH`], plus its place in the batch. Indexes only grow, so a reader resumes from the
//! last index it saw; they are not dense. Pure: the clock is read by whoever makes an event.

use serde::{Deserialize, Serialize};

use crate::access::Role;
use crate::glob::Glob;

mod engine_events;
mod state_changes;
pub use engine_events::{machine_events, placement_events, waiting_events};
pub use state_changes::state_changes;

/// The most events one stored batch holds; an index is `batch × PER_BATCH + place`.
pub const PER_BATCH: u64 = 10_000;

/// The longest message an event keeps; longer ones are cut where they are made.
pub const LONGEST_MESSAGE: usize = 1024;

/// The most units one event names (the units of one batch write at most).
pub const MOST_UNITS_NAMED: usize = 1000;

/// How many events are kept unless configured otherwise.
pub const DEFAULT_KEPT: usize = 100_000;

/// The most events a cluster may be configured to keep.
pub const MOST_KEPT: usize = 10_000_000;

/// How long events are kept unless configured otherwise, in seconds (a day).
pub const DEFAULT_KEPT_SECONDS: u64 = 86_400;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The engine placed a unit on a machine.
    Placed,
    /// The engine took a unit off one machine and placed it on another.
    Moved,
    /// The engine took a unit off its machine and placed it nowhere.
    Unplaced,
    /// A unit cannot be placed now, and why (a new reason each time it changes).
    Waiting,
    /// A unit's state on its machine changed (active and sub state).
    State,
    /// A checked unit's health changed.
    Health,
    /// A machine joined the cluster (or came back).
    MachineJoined,
    /// A machine's presence went away.
    MachineLost,
    /// A machine's identity was revoked.
    MachineRevoked,
    /// A drain began, let a unit go, finished or was ended.
    Drain,
    /// A rollout began, stepped, paused, finished or failed.
    Rollout,
    /// A source was synced (or its sync failed).
    Sync,
    /// A write through the API, allowed or refused: the audit trail.
    Write,
}

impl EventKind {
    pub const ALL: [EventKind; 13] = [
        EventKind::Placed,
        EventKind::Moved,
        EventKind::Unplaced,
        EventKind::Waiting,
        EventKind::State,
        EventKind::Health,
        EventKind::MachineJoined,
        EventKind::MachineLost,
        EventKind::MachineRevoked,
        EventKind::Drain,
        EventKind::Rollout,
        EventKind::Sync,
        EventKind::Write,
    ];

    /// The name the API and fleetctl use: `placed`, `machine-joined`, ...
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Placed => "placed",
            EventKind::Moved => "moved",
            EventKind::Unplaced => "unplaced",
            EventKind::Waiting => "waiting",
            EventKind::State => "state",
            EventKind::Health => "health",
            EventKind::MachineJoined => "machine-joined",
            EventKind::MachineLost => "machine-lost",
            EventKind::MachineRevoked => "machine-revoked",
            EventKind::Drain => "drain",
            EventKind::Rollout => "rollout",
            EventKind::Sync => "sync",
            EventKind::Write => "write",
        }
    }

    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// One event as it is made and stored (its index is given by where its batch lands).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewEvent {
    /// Microseconds since the Unix epoch, by the clock of the fleetd that made it.
    pub at: i64,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The units of an event about several (a batch write), each once, when `unit` names none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The identity that asked, for what an identity asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub message: String,
}

impl NewEvent {
    pub fn new(at: i64, kind: EventKind, message: impl Into<String>) -> Self {
        let message = bounded(message.into(), LONGEST_MESSAGE);
        Self { at, kind, unit: None, units: Vec::new(), machine: None, by: None, message }
    }

    pub fn of_unit(mut self, unit: &str) -> Self {
        self.unit = Some(bounded(unit.to_string(), 256));
        self
    }

    /// An event about several units: one named alone is the event's `unit`. At most
    /// [`MOST_UNITS_NAMED`] are kept (a batch write carries no more).
    pub fn of_units<'a>(mut self, units: impl IntoIterator<Item = &'a str>) -> Self {
        let mut named: Vec<String> =
            units.into_iter().take(MOST_UNITS_NAMED).map(|unit| bounded(unit.to_string(), 256)).collect();
        if named.len() == 1 {
            self.unit = named.pop();
        } else {
            self.units = named;
        }
        self
    }

    /// Every unit the event names (`unit`, or `units`).
    pub fn named_units(&self) -> impl Iterator<Item = &str> {
        self.unit.iter().chain(&self.units).map(String::as_str)
    }

    pub fn on_machine(mut self, machine: &str) -> Self {
        self.machine = Some(bounded(machine.to_string(), 256));
        self
    }

    pub fn by(mut self, identity: &str) -> Self {
        self.by = Some(bounded(identity.to_string(), 256));
        self
    }
}

/// An event as it is read back, with its index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub index: u64,
    #[serde(flatten)]
    pub event: NewEvent,
}

/// The index of the event at `place` in the batch stored at `batch`.
pub fn index_of(batch: u64, place: usize) -> u64 {
    batch.saturating_mul(PER_BATCH).saturating_add(place as u64)
}

/// The batch an index belongs to.
pub fn batch_of(index: u64) -> u64 {
    index / PER_BATCH
}

/// Events after `after`, read from a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// The highest index of any event ever trimmed away (0: none): a reader resuming after
    /// an index below it has missed events.
    pub trimmed_through: u64,
    /// The index of the oldest event kept, if any is.
    pub oldest: Option<u64>,
    /// Whether more events after the last one given are kept (a page was full).
    pub more: bool,
}

impl EventPage {
    /// Whether a reader that last saw `after` missed events trimmed since. A reader from 0
    /// asks for what is kept, from its oldest, and misses nothing it asked for.
    pub fn missed_after(&self, after: u64) -> bool {
        after != 0 && after < self.trimmed_through
    }
}

/// What a reader asks to see: a unit pattern, a machine (ID or a prefix of it), kinds, and
/// events from a moment on.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    pub unit: Option<Glob>,
    pub machine: Option<String>,
    /// Empty: every kind.
    pub kinds: Vec<EventKind>,
    /// Only events of this moment or later (microseconds since the epoch, as the
    /// event's `at`: the clock of the fleetd that wrote it).
    pub from: Option<i64>,
}

impl EventFilter {
    pub fn admits(&self, event: &NewEvent) -> bool {
        if !self.kinds.is_empty() && !self.kinds.contains(&event.kind) {
            return false;
        }
        if self.from.is_some_and(|from| event.at < from) {
            return false;
        }
        if let Some(unit) = &self.unit
            && !event.named_units().any(|name| unit.matches(name))
        {
            return false;
        }
        if let Some(machine) = &self.machine
            && !event.machine.as_deref().is_some_and(|id| id.starts_with(machine.as_str()))
        {
            return false;
        }
        true
    }
}

/// Whether `role` may see an event: one about units, when it sees each of them; one about
/// no unit (machines, drains, sources, writes of no unit), when it sees every unit.
pub fn visible_to(role: &Role, event: &NewEvent) -> bool {
    if event.unit.is_some() || !event.units.is_empty() {
        return event.named_units().all(|unit| role.sees_unit(unit));
    }
    matches!(role.name(), "admin" | "operator" | "viewer") && role.scope().is_none()
}

/// Which of `kept` events to trim: those older than `oldest_at` (microseconds), and all but
/// the newest `most`. `kept` is in index order, each with its time; returns how many from
/// the front go.
fn to_trim(kept: &[(u64, i64)], most: usize, oldest_at: i64) -> usize {
    let over = kept.len().saturating_sub(most);
    let old = kept.iter().take_while(|(_, at)| *at < oldest_at).count();
    over.max(old)
}

/// What a trim takes from the front of a log: whole batches, each once all its events are due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trim {
    /// How many batches go, from the oldest.
    pub batches: usize,
    /// How many events they hold.
    pub events: usize,
    /// The index of the last event that goes, if any does.
    pub through: Option<u64>,
}

/// The trim of a log kept as `batches` (in index order: each its number and its events'
/// times, microseconds) to its newest `most` events and those made from `oldest_at` on.
pub fn batches_to_trim(batches: &[(u64, Vec<i64>)], most: usize, oldest_at: i64) -> Trim {
    let kept: Vec<(u64, i64)> = batches
        .iter()
        .flat_map(|(batch, times)| times.iter().enumerate().map(|(place, at)| (index_of(*batch, place), *at)))
        .collect();
    let going = to_trim(&kept, most, oldest_at);
    let mut trim = Trim::default();
    for (batch, times) in batches {
        if trim.events + times.len() > going {
            break;
        }
        trim.batches += 1;
        trim.events += times.len();
        trim.through = Some(index_of(*batch, times.len().saturating_sub(1)));
    }
    trim
}

fn bounded(mut text: String, longest: usize) -> String {
    if text.len() > longest {
        let mut end = longest;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests;
