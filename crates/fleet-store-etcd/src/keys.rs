//! The etcd key layout, everything under `etcd_key_prefix`:
//!
//! | key | value | lease | writer |
//! |---|---|---|---|
//! | `units/<unit>` | [`fleet_registry::UnitRecord`] | — | API |
//! | `bodies/<hash>` | the unit's options | — | API (content-addressed, written with a unit write that sets the content where it is absent); the engine leader deletes it when no unit has that content |
//! | `global/<unit>` | [`fleet_registry::AssignedUnit`] fields, with the body when the API wrote the content | — | API, for global units |
//! | `global-runs/<unit>` | [`fleet_core::job::global_runs::RunTicket`]: the run every machine of a global unit on a calendar is to run now | — | engine, fenced |
//! | `placement/<unit>` | machine ID | — | engine, fenced; API's import of units it creates (`imports.rs`) |
//! | `schedule/<machine>/<unit>` | [`fleet_registry::AssignedUnit`] fields; the machine's first unit of each content also carries its body; a unit placed with a `required-at/` record names that record's revision (`places_at`) | — | engine (fenced); API on desired-state changes and imports |
//! | `reasons/<unit>` | why it is unplaced | — | engine, fenced |
//! | `destroyed/<bucket>` | the unit destroyed last of those whose names hash to `bucket` (two hex digits, [`destroyed_bucket`]): its revision fences creates read before it (`api.rs::write_conditions`, `imports.rs`); a failed import writes the buckets of what it sent | — | API |
//! | `machines/<machine>` | [`fleet_core::MachineState`] | machine's | agent |
//! | `metadata/<machine>` | runtime metadata overrides | — | API (`PATCH /machines`) |
//! | `drains/<machine>` | [`fleet_core::drain::Drain`] | — | API (starts and ends it), engine leader (steps it) |
//! | `out-of-touch/<machine>` | [`fleet_core::OutOfTouch`]: a machine gone that units wait for | — | engine, fenced |
//! | `silent-departures/<unit>` | [`fleet_registry::SilentDeparture`]: a unit taken off a present machine that had not reported it | — | engine, fenced |
//! | `states/<machine>/<unit>` | [`fleet_core::UnitState`] | machine's | agent |
//! | `engine/leader` | machine ID | engine's | engine |
//! | `revoked/<machine>` | [`fleet_registry::RevokedMachine`] | — | API |
//! | `identities/<machine>` | [`fleet_registry::MachineIdentity`] (a pull agent's key hash and grants) | — | API |
//! | `registrations/<name>` | [`fleet_registry::RegistrationRecord`] (hash only) | its expiry's | API |
//! | `sources/<name>` | [`fleet_registry::SourceRecord`] (no secret: credentials stay in files) | — | API |
//! | `source-status/<name>` | [`fleet_registry::SourceStatus`] | — | engine leader |
//! | `rollouts/<name>` | a [`fleet_registry::RolloutRecord`]'s head: the record without its units' names, contents and bodies, with their steps (`stored_rollouts.rs`) | — | API, engine leader |
//! | `rollouts/<name>/<digest>/<index>` | a slice of at most 512 KiB of the part of that rollout that stays while it runs (names, contents, bodies), written before the first head that names its digest | — | API, engine leader |
//! | `registration-uses/<name>/<writer>` | [`crate::registration_uses::CountedUses`]: the joins one fleetd (a random writer ID a process) admitted through a token without a use limit | the token's | API of that fleetd |
//! | `jobs/<unit>` | [`fleet_core::job::runs::JobRecord`]: a scheduled or run-to-completion unit's runs, replaced whole by compare-and-swap on its revision | — | engine, fenced |
//! | `tokens/<name>` | [`fleet_registry::TokenRecord`] (the token's hash, never the token) | — | API |
//! | `journal/asks/<machine>/<id>` | [`fleet_registry::JournalQuestion`] and the asker's lease | asker's | API of the asking fleetd |
//! | `journal/answers/<id>` | the answer ([`fleet_api_schema`]'s `RelayedJournal` JSON, at most 128 KiB) | asker's | the machine asked |
//! | `events/<micros>-<writer>-<seq>` | a batch of [`fleet_core::events::NewEvent`]s; an event's index is the key's revision × 10,000 + its place | — | any fleetd (`events.rs`); the engine leader trims the oldest |
//! | `events/trimmed` | the highest event index trimmed, in decimal | — | engine leader |
//! | `store-format` | [`fleet_core::store_format::StoredFormat`] (absent in a store of fleet 0.1: format 1) | — | the first fleetd of a format, before anything else |
//!
//! An agent watches `schedule/<itself>/`, `global/`, `global-runs/`, its own `machines/` and `metadata/` keys:
//! a schedule change wakes exactly one agent. The leading engine holds the cluster's cache
//! (units, placements, reasons, machines, metadata, drains, machines out of touch, states and bodies), every engine the
//! leader key's; unit states, which change most, wake nobody but the API's readers and, while a
//! unit waits for the machine it left to stop it, the leading engine.

/// Which of the 256 `destroyed/` records stands for `unit`: FNV-1a over its name, folded to a
/// byte. Part of the store's layout: every member must bucket a name alike.
pub fn destroyed_bucket(unit: &str) -> u8 {
    let hash = unit.bytes().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    hash.to_be_bytes().iter().fold(0, |folded, byte| folded ^ byte)
}

/// Whose work a key's change touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkTouched<'k> {
    Machine(&'k str),
    Everyone,
    Nobody,
}

/// Builds keys under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

/// The end of the range holding every key that starts with `prefix`.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A key range `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: String,
    pub end: Vec<u8>,
}

impl KeyRange {
    pub fn prefix(prefix: String) -> Self {
        let end = prefix_end(&prefix);
        Self { start: prefix, end }
    }

    /// Exactly one key.
    pub fn single(key: String) -> Self {
        let mut end = key.as_bytes().to_vec();
        end.push(0);
        Self { start: key, end }
    }

    pub fn contains(&self, key: &str) -> bool {
        key.as_bytes() >= self.start.as_bytes() && key.as_bytes() < self.end.as_slice()
    }
}

impl Keys {
    /// `prefix` as configured; a missing trailing `/` is added.
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut key = self.prefix.clone();
        key.push_str(&parts.join("/"));
        key
    }

    pub fn units(&self) -> String {
        self.key(&["units", ""])
    }

    /// The prefix of the event batches.
    pub fn events(&self) -> String {
        self.key(&["events", ""])
    }

    /// One batch of events: by the time it was written, so that a range of the oldest is a
    /// range of keys.
    pub fn event_batch(&self, micros: i64, writer: &str, sequence: u64) -> String {
        self.key(&["events", &format!("{micros:016}-{writer}-{sequence:010}")])
    }

    /// The highest event index trimmed so far: under the batches' prefix, so that one watch
    /// brings a trim's mark and its deletes together.
    pub fn events_trimmed(&self) -> String {
        self.key(&["events", "trimmed"])
    }
    pub fn unit(&self, name: &str) -> String {
        self.key(&["units", name])
    }
    pub fn bodies(&self) -> String {
        self.key(&["bodies", ""])
    }
    pub fn body(&self, hash: &str) -> String {
        self.key(&["bodies", hash])
    }
    /// Where versions before the engine collected bodies kept a key per unit and content
    /// (`refs/<hash>/<unit>`); the leading engine deletes what is left there.
    pub fn legacy_refs(&self) -> String {
        self.key(&["refs", ""])
    }
    pub fn globals(&self) -> String {
        self.key(&["global", ""])
    }
    pub fn global(&self, name: &str) -> String {
        self.key(&["global", name])
    }
    pub fn run_tickets(&self) -> String {
        self.key(&["global-runs", ""])
    }
    pub fn run_ticket(&self, name: &str) -> String {
        self.key(&["global-runs", name])
    }
    pub fn placements(&self) -> String {
        self.key(&["placement", ""])
    }
    pub fn placement(&self, name: &str) -> String {
        self.key(&["placement", name])
    }
    /// The record of the last destroy among units whose names share `unit`'s bucket.
    pub fn destroyed(&self, unit: &str) -> String {
        self.key(&["destroyed", &format!("{:02x}", destroyed_bucket(unit))])
    }
    pub fn schedule(&self, machine: &str) -> String {
        self.key(&["schedule", machine, ""])
    }
    pub fn scheduled(&self, machine: &str, unit: &str) -> String {
        self.key(&["schedule", machine, unit])
    }
    pub fn reasons(&self) -> String {
        self.key(&["reasons", ""])
    }
    pub fn reason(&self, name: &str) -> String {
        self.key(&["reasons", name])
    }
    /// Every journal question of the cluster.
    pub fn all_journal_questions(&self) -> String {
        self.key(&["journal", "asks", ""])
    }
    /// The journal questions put to `machine` (each under its asker's lease).
    pub fn journal_questions(&self, machine: &str) -> String {
        self.key(&["journal", "asks", machine, ""])
    }
    pub fn journal_question(&self, machine: &str, id: &str) -> String {
        self.key(&["journal", "asks", machine, id])
    }
    /// The answer to journal question `id` (under its asker's lease).
    pub fn journal_answer(&self, id: &str) -> String {
        self.key(&["journal", "answers", id])
    }
    pub fn store_format(&self) -> String {
        self.key(&["store-format"])
    }
    pub fn machines(&self) -> String {
        self.key(&["machines", ""])
    }
    pub fn machine(&self, id: &str) -> String {
        self.key(&["machines", id])
    }
    pub fn all_metadata(&self) -> String {
        self.key(&["metadata", ""])
    }
    pub fn metadata(&self, id: &str) -> String {
        self.key(&["metadata", id])
    }
    pub fn all_drains(&self) -> String {
        self.key(&["drains", ""])
    }
    pub fn drain(&self, id: &str) -> String {
        self.key(&["drains", id])
    }
    pub fn all_out_of_touch(&self) -> String {
        self.key(&["out-of-touch", ""])
    }
    pub fn out_of_touch(&self, id: &str) -> String {
        self.key(&["out-of-touch", id])
    }
    /// Where what each placed unit requires runs, by machine: `required-at/<machine>/<unit>`.
    pub fn all_required_places(&self) -> String {
        self.key(&["required-at", ""])
    }
    pub fn required_places(&self, machine: &str) -> String {
        self.key(&["required-at", machine, ""])
    }
    pub fn required_place(&self, machine: &str, unit: &str) -> String {
        self.key(&["required-at", machine, unit])
    }
    pub fn all_silent_departures(&self) -> String {
        self.key(&["silent-departures", ""])
    }
    pub fn silent_departure(&self, unit: &str) -> String {
        self.key(&["silent-departures", unit])
    }
    pub fn all_states(&self) -> String {
        self.key(&["states", ""])
    }
    pub fn state(&self, machine: &str, unit: &str) -> String {
        self.key(&["states", machine, unit])
    }
    pub fn leader(&self) -> String {
        self.key(&["engine", "leader"])
    }

    pub fn all_revoked(&self) -> String {
        self.key(&["revoked", ""])
    }

    pub fn revoked(&self, machine: &str) -> String {
        self.key(&["revoked", machine])
    }

    pub fn identity(&self, machine: &str) -> String {
        self.key(&["identities", machine])
    }

    pub fn registrations(&self) -> String {
        self.key(&["registrations", ""])
    }

    pub fn registration(&self, name: &str) -> String {
        self.key(&["registrations", name])
    }

    /// Every counter of uses of every registration token.
    pub fn all_registration_uses(&self) -> String {
        self.key(&["registration-uses", ""])
    }

    /// The counters of uses of the registration token `name`, one per writer.
    pub fn registration_uses(&self, name: &str) -> String {
        self.key(&["registration-uses", name, ""])
    }

    /// The uses of the registration token `name` that `writer` counted.
    pub fn registration_use_counter(&self, name: &str, writer: &str) -> String {
        self.key(&["registration-uses", name, writer])
    }

    pub fn sources(&self) -> String {
        self.key(&["sources", ""])
    }

    pub fn source(&self, name: &str) -> String {
        self.key(&["sources", name])
    }

    pub fn source_statuses(&self) -> String {
        self.key(&["source-status", ""])
    }

    pub fn source_status(&self, name: &str) -> String {
        self.key(&["source-status", name])
    }

    pub fn rollouts(&self) -> String {
        self.key(&["rollouts", ""])
    }

    pub fn rollout(&self, name: &str) -> String {
        self.key(&["rollouts", name])
    }

    /// Every slice of rollout `name`'s fixed parts, whatever their digest.
    pub fn rollout_slices(&self, name: &str) -> String {
        self.key(&["rollouts", name, ""])
    }

    /// The slices of the fixed part of rollout `name` whose digest is `digest`.
    pub fn rollout_slices_of(&self, name: &str, digest: &str) -> String {
        self.key(&["rollouts", name, digest, ""])
    }

    /// Slice `index` of that fixed part (numbered so that key order is slice order).
    pub fn rollout_slice(&self, name: &str, digest: &str, index: usize) -> String {
        self.key(&["rollouts", name, digest, &format!("{index:06}")])
    }

    /// The job records: the runs of scheduled and run-to-completion units.
    pub fn jobs(&self) -> String {
        self.key(&["jobs", ""])
    }

    pub fn job(&self, unit: &str) -> String {
        self.key(&["jobs", unit])
    }

    pub fn tokens(&self) -> String {
        self.key(&["tokens", ""])
    }

    pub fn token(&self, name: &str) -> String {
        self.key(&["tokens", name])
    }

    pub fn secrets(&self) -> String {
        self.key(&["secrets", ""])
    }

    pub fn secret(&self, name: &str) -> String {
        self.key(&["secrets", name])
    }

    /// `schedule/` of every machine.
    pub fn all_schedules(&self) -> String {
        self.key(&["schedule", ""])
    }

    /// Whose work a change to `key` touches: one machine's (its schedule, its record, its
    /// runtime metadata), every machine's (a global unit), or nobody's.
    pub fn work_touched_by<'k>(&self, key: &'k str) -> WorkTouched<'k> {
        let Some(rest) = key.strip_prefix(self.prefix.as_str()) else { return WorkTouched::Nobody };
        let machine = |collection: &str| rest.strip_prefix(collection).and_then(|tail| tail.split('/').next());
        if rest.starts_with("global/") || rest.starts_with("global-runs/") {
            return WorkTouched::Everyone;
        }
        let machine = machine("schedule/")
            .or_else(|| machine("machines/"))
            .or_else(|| machine("metadata/"))
            .or_else(|| machine("required-at/"));
        match machine {
            Some(id) if !id.is_empty() => WorkTouched::Machine(id),
            _ => WorkTouched::Nobody,
        }
    }

    /// The last path element of `key` below `collection` (a key from one of the methods
    /// above that end in `/`).
    pub fn name_in<'k>(&self, collection: &str, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(collection).filter(|name| !name.is_empty() && !name.contains('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sit_under_the_prefix_with_one_slash() {
        let keys = Keys::new("/_coreos.com/fleet");
        assert_eq!(keys.unit("a.service"), "/_coreos.com/fleet/units/a.service");
        assert_eq!(keys.scheduled("m1", "a.service"), "/_coreos.com/fleet/schedule/m1/a.service");
        assert_eq!(keys.schedule("m1"), "/_coreos.com/fleet/schedule/m1/");
        assert_eq!(keys.leader(), "/_coreos.com/fleet/engine/leader");
        assert_eq!(keys.name_in(&keys.units(), &keys.unit("x.service")), Some("x.service"));
    }

    /// The buckets are part of the store's layout: these values must never change.
    #[test]
    fn destroys_are_recorded_in_buckets_every_member_computes_alike() {
        let keys = Keys::new("/p/");
        assert_eq!(keys.destroyed("a.service"), "/p/destroyed/91");
        assert_eq!(keys.destroyed("hello.service"), "/p/destroyed/8f");
        assert_eq!(keys.destroyed("app@1.service"), "/p/destroyed/00");
        let buckets: std::collections::BTreeSet<u8> =
            (0..1000).map(|index| destroyed_bucket(&format!("app@{index}.service"))).collect();
        assert!(buckets.len() > 200, "instances of one template spread: {} buckets", buckets.len());
    }

    #[test]
    fn changes_touch_the_work_of_their_machine_or_of_everyone() {
        let keys = Keys::new("/p/");
        assert_eq!(keys.work_touched_by(&keys.scheduled("m1", "a.service")), WorkTouched::Machine("m1"));
        assert_eq!(keys.work_touched_by(&keys.machine("m2")), WorkTouched::Machine("m2"));
        assert_eq!(keys.work_touched_by(&keys.metadata("m3")), WorkTouched::Machine("m3"));
        assert_eq!(keys.work_touched_by(&keys.global("g.service")), WorkTouched::Everyone);
        assert_eq!(keys.work_touched_by(&keys.run_ticket("g.service")), WorkTouched::Everyone);
        assert_eq!(keys.work_touched_by(&keys.unit("a.service")), WorkTouched::Nobody);
        assert_eq!(keys.work_touched_by("/other/schedule/m1/a"), WorkTouched::Nobody);
    }

    #[test]
    fn a_machine_prefix_does_not_cover_longer_machine_ids() {
        let keys = Keys::new("/p/");
        let range = KeyRange::prefix(keys.schedule("m1"));
        assert!(range.contains(&keys.scheduled("m1", "a.service")));
        assert!(!range.contains(&keys.scheduled("m10", "a.service")));
        let single = KeyRange::single(keys.machine("m1"));
        assert!(single.contains(&keys.machine("m1")));
        assert!(!single.contains(&keys.machine("m10")));
    }

    #[test]
    fn prefix_end_carries_over_0xff() {
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(prefix_end("\u{7f}"), vec![0x80]);
    }
}
