//! The API's JSON entities. Field order is alphabetical and empty fields are omitted, as the
//! original's encoder does; clients must ignore fields they do not know (e.g. `reason`).
//!
//! A crate of its own, on serde alone, so that clients (fleetctl, fleet-client) build without
//! the server, its stores or its unit managers.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

fn is_empty(text: &Option<String>) -> bool {
    text.as_deref().is_none_or(str::is_empty)
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitOption {
    pub name: String,
    pub section: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unit {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub current_state: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state: Option<String>,
    #[serde(rename = "machineID", default, skip_serializing_if = "is_empty")]
    pub machine_id: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    /// Why the engine could not place the unit (our addition).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub reason: Option<String>,
    /// The git source that owns the unit; absent for a unit made by hand (our addition).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub source: Option<String>,
    /// For a placed unit with `Requires=` or `After=`, in `GET /units/{name}`: where the
    /// instances it names that are up run, as its machine's file says (our addition).
    #[serde(rename = "requiredAt", default, skip_serializing_if = "Vec::is_empty")]
    pub required_at: Vec<RequiredPlace>,
    /// Its current version, as `GET /units/{name}/history` numbers them, from the second on
    /// (absent: the first, so that a unit never changed reads as the original's; our addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// Where one running instance of what a unit requires runs (our addition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequiredPlace {
    pub unit: String,
    #[serde(rename = "machineID")]
    pub machine_id: String,
    #[serde(rename = "primaryIP", default, skip_serializing_if = "String::is_empty")]
    pub primary_ip: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitState {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "String::is_empty")]
    pub machine_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(rename = "systemdActiveState", default, skip_serializing_if = "String::is_empty")]
    pub systemd_active_state: String,
    #[serde(rename = "systemdLoadState", default, skip_serializing_if = "String::is_empty")]
    pub systemd_load_state: String,
    #[serde(rename = "systemdSubState", default, skip_serializing_if = "String::is_empty")]
    pub systemd_sub_state: String,
    /// How the unit drifted on its machine from what fleet made it, and what the machine
    /// did about it (our addition).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub drift: String,
    /// What the unit's health check says while it runs: `healthy`, `unhealthy` or `unknown`;
    /// empty for a unit without a check, or not running (our addition).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health: String,
    /// The last failure of an unhealthy unit, short (our addition).
    #[serde(rename = "healthFailure", default, skip_serializing_if = "String::is_empty")]
    pub health_failure: String,
    /// Restarts its machine made for its health within the restart budget's window (our
    /// addition).
    #[serde(rename = "healthRestarts", default, skip_serializing_if = "is_zero")]
    pub health_restarts: usize,
    /// Restarted too often for its health: left as it is (our addition).
    #[serde(rename = "healthGivenUp", default, skip_serializing_if = "std::ops::Not::not")]
    pub health_given_up: bool,
    /// Since when its machine is out of touch, RFC 3339: the unit waits for it
    /// (`LostAfter=`), its states `unknown` (our addition; listed only when asked).
    #[serde(rename = "outOfTouchSince", default, skip_serializing_if = "String::is_empty")]
    pub out_of_touch_since: String,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(rename = "primaryIP", default, skip_serializing_if = "String::is_empty")]
    pub primary_ip: String,
    /// How the machine is connected: `etcd`, `embedded` or `pull` (our addition).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub connection: String,
    /// Whether the machine's engine leads the cluster (our addition).
    #[serde(rename = "engineLeader", default, skip_serializing_if = "std::ops::Not::not")]
    pub engine_leader: bool,
    /// What units may reserve on the machine in all, when it says (our addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// The machine's drain, while it is drained (our addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<MachineDrain>,
    /// The machine's taints as written (`gpu=yes`, `db:evict`), in key order: it takes only
    /// the units that tolerate them (our addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// Since when the machine is out of touch, RFC 3339: gone, with units that wait for it
    /// (our addition; listed only when asked).
    #[serde(rename = "outOfTouchSince", default, skip_serializing_if = "String::is_empty")]
    pub out_of_touch_since: String,
    /// The version of fleet its fleetd runs, as it registered (our addition; what a rolling
    /// upgrade follows).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

/// A machine's drain and where it stands (our addition): it takes no new units, and its units
/// move off in waves of at most `maxUnavailable` down at once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineDrain {
    /// `draining` while units are left to move or moving, `drained` once none are.
    pub state: String,
    /// A number of units, or a percentage (`25%`).
    pub max_unavailable: String,
    /// When it began, in seconds since the Unix epoch.
    pub started: u64,
    /// How many units moved off and run elsewhere.
    pub moved: u64,
    /// Units let go that do not run elsewhere yet; `reason` says why one cannot leave.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving: Vec<DrainingUnit>,
    /// Units still to go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    /// Units that stay on the machine, each with why (`reason`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stays: Vec<DrainingUnit>,
    /// Why the next unit waits though the drain's own max-unavailable has room: the
    /// disruption budget of its group (`[X-Fleet] DisruptionBudget=`) that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainingUnit {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `PUT /machines/{id}/drain` (our addition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainRequest {
    /// A number of units, or a percentage (`25%`); 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

/// Memory and CPU a machine offers units (our addition).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    pub memory_bytes: u64,
    /// Thousandths of a core.
    pub cpu_millicores: u64,
}

impl From<fleet_core::Resources> for Capacity {
    fn from(resources: fleet_core::Resources) -> Self {
        Self { memory_bytes: resources.memory, cpu_millicores: resources.cpu_millis }
    }
}

impl From<Capacity> for fleet_core::Resources {
    fn from(capacity: Capacity) -> Self {
        Self { memory: capacity.memory_bytes, cpu_millis: capacity.cpu_millicores }
    }
}

/// A page of a list. The pages' items are the schema's types; a server may send them already
/// encoded (`Item` a raw JSON value), which reads the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitPage<Item = Unit> {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Item>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatePage<Item = UnitState> {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<Item>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachinePage<Item = Machine> {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<Item>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: Option<String>,
}

/// The error body: `{"error":{"code":404,"message":"unit does not exist"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: u16,
    pub message: String,
}

/// A unit's log lines, served for units on the answering machine (our addition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    pub machine_id: String,
    pub name: String,
    pub text: String,
    /// The unit manager's status report (`systemctl status`), when asked for with
    /// `?status=true` and the manager has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Older lines were left out: the journal came from another machine, and a relayed
    /// answer carries at most 128 KiB (the newest lines).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// A journal as another machine answers it for a relay (through the store, or from a pull
/// agent to its manager): the journal, or why that machine could not read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RelayedJournal {
    Failed { error: String },
    Journal(Journal),
}

/// `POST /fleet/v1/tokens`: a new bearer token (our addition; administrators only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    pub name: String,
    /// `admin`, `operator` or `viewer`.
    pub role: String,
    /// The unit pattern an operator token is limited to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units: Option<String>,
    /// The secrets an operator token may set and name in its units (a pattern); none when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
    /// How long the token is accepted, in seconds; forever when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// A bearer token as the API shows it. `token` is present once, in the answer to its
/// creation, and never again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    pub name: String,
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
    /// Seconds since the Unix epoch.
    pub created: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `GET /fleet/v1/tokens`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenList {
    #[serde(default)]
    pub tokens: Vec<Token>,
}

/// `PUT /fleet/v1/secrets/{name}`: a secret's new value (our addition), base64 in JSON so that
/// any bytes may be one.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretValue {
    /// The value, base64 (standard alphabet, padded).
    pub value: String,
    /// How a new value reaches the running units that name the secret: restarted in waves by
    /// a rollout (`secret-<name>`) with these settings, as `PUT /rollouts/{name}` takes them
    /// (a quarter of them at once when `maxUnavailable` is absent)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_revert: bool,
    /// …or written where they read it, none restarted (under systemd a unit sees it at its
    /// next start).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_restart: bool,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(redacted)")
    }
}

/// A secret as the API shows it: never its value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    pub name: String,
    pub version: u64,
    /// The value's length in bytes.
    pub size: usize,
    /// Who set this version, as the audit trail names them.
    pub set_by: String,
    /// When, in seconds since the Unix epoch.
    pub set_at: u64,
    /// Older versions kept for units still pinned to them (a rotation under way, or undone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<u64>,
    /// The rollout that takes this value to the running units that name it, when a set
    /// started one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    /// The units that name it and were given this value by the set (those not running, or
    /// all of them with `noRestart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<usize>,
}

/// `POST /fleet/v1/secrets-reseal`: every value sealed again under the key that now seals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretsResealed {
    /// Values sealed again now.
    pub resealed: usize,
    /// Values already sealed under it.
    pub already: usize,
    /// The id of the key that seals (nothing of the key itself).
    pub sealing_key: String,
}

/// `GET /fleet/v1/secrets`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretList {
    #[serde(default)]
    pub secrets: Vec<SecretInfo>,
}

/// `POST /fleet/v1/registration-tokens`: a token pull agents join with (our addition;
/// administrators only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationTokenRequest {
    pub name: String,
    /// How long the token is accepted, in seconds; forever when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// How many machines may join with it; any number when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Metadata given to the machines that join with it (they cannot widen it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The machine IDs it may create, as a pattern (`edge-*`); any when absent.
    #[serde(default, rename = "machineIDs", skip_serializing_if = "Option::is_none")]
    pub machine_ids: Option<String>,
}

/// A registration token as the API shows it; `token` only in the answer to its creation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationToken {
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    #[serde(default)]
    pub uses: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, rename = "machineIDs", skip_serializing_if = "Option::is_none")]
    pub machine_ids: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `GET /fleet/v1/registration-tokens`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationTokenList {
    #[serde(default)]
    pub registration_tokens: Vec<RegistrationToken>,
}

/// `POST /fleet/v1/agents/join` (with `Authorization: Bearer <registration token>`): a pull
/// agent asks for a certificate of its own (our addition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentJoinRequest {
    #[serde(rename = "machineID")]
    pub machine_id: String,
    /// A PEM certificate signing request over the agent's own key pair.
    pub csr: String,
}

/// `POST /fleet/v1/agents/renew` (with the machine's certificate): a new certificate over a
/// new key pair, for the same machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRenewRequest {
    pub csr: String,
}

/// A machine certificate, as a join or a renewal answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCertificate {
    #[serde(rename = "machineID")]
    pub machine_id: String,
    /// PEM.
    pub certificate: String,
    /// The agent CA's certificate (PEM).
    pub ca_certificate: String,
    /// Seconds since the Unix epoch.
    pub expires: u64,
    /// Metadata the registration token gives the machine (joins only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// A header of the answer to a pull agent's announce, `true` when an agent whose change
/// stream ended may open it again at once: the manager is not busy taking many agents back.
/// A manager of 0.2.0 or earlier does not send it.
pub const STREAM_NOW_HEADER: &str = "x-fleet-stream-now";

/// `PUT /fleet/v1/agents/{machine}/machine`: a pull agent announces itself (our addition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentMachine {
    #[serde(rename = "publicIP", default)]
    pub public_ip: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub version: String,
    /// What the machine offers units (the kernel's, less the system's reserve, or its
    /// fleet.conf's); an agent without it limits nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Its fleet.conf's taints, as written (`gpu=yes`, `db:evict`): a machine may keep itself
    /// for some units, never widen what it is given (our addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

/// A unit a machine should hold: its name, body hash and desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUnit {
    pub name: String,
    pub hash: String,
    pub desired_state: String,
    /// `report` when the machine must not put the unit back if it drifts; empty: correct.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub drift_policy: String,
    /// The version of each secret it is to run with, where not the newest (a rotation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, u64>,
    /// A moved version is written where the unit reads it, the unit left running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secrets_in_place: bool,
    /// For a global unit on a calendar: the run every machine is to run now (its number and
    /// elapse, microseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<AgentRunTicket>,
    /// For a unit with `Requires=` or `After=`: where the instances it names that are up run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_at: Vec<RequiredPlace>,
}

/// The run every machine of a global unit on a calendar is to run now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRunTicket {
    pub id: u64,
    pub elapse: i64,
}

/// `GET /fleet/v1/agents/{machine}/work`: what the machine should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentWork {
    /// The machine as the cluster sees it (runtime metadata included); absent while it is
    /// not registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    #[serde(default)]
    pub scheduled: Vec<AgentUnit>,
    #[serde(default)]
    pub globals: Vec<AgentUnit>,
}

/// One unit's state as its machine reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentUnitState {
    pub name: String,
    pub hash: String,
    pub systemd_load_state: String,
    pub systemd_active_state: String,
    pub systemd_sub_state: String,
    #[serde(default)]
    pub launched: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<AgentDrift>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AgentHealth>,
    /// The version of each secret it was given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, u64>,
    /// The run of a unit that runs to completion (fleet_core's `RunReport`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<AgentRun>,
}

/// What a pull agent says of the run of a unit that runs to completion: times in microseconds
/// since the epoch by its clock; `outcome` one of `succeeded`, `failed`, `lost` once it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRun {
    pub started: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The exit status of a failed run that exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// The signal that killed a failed run (`SIGKILL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// The last lines of the unit's log once the run ended (at most 20 lines, 2,048 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// The number of the run, for a global unit on a calendar (its ticket's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u64>,
}

/// What a pull agent's health check says of a unit that runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentHealth {
    /// `healthy`, `unhealthy` or `unknown`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failure: String,
    #[serde(default)]
    pub restarts: usize,
    #[serde(default)]
    pub given_up: bool,
}

/// How a unit drifted on a pull agent's machine and what the machine did about it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentDrift {
    /// `stopped`, `started`, `changed` or `removed`.
    pub drift: String,
    pub corrections: usize,
    pub correcting: bool,
    pub given_up: bool,
}

/// `POST /fleet/v1/agents/{machine}/states`: state changes of the machine's own units.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentStates {
    #[serde(default)]
    pub set: Vec<AgentUnitState>,
    #[serde(default)]
    pub removed: Vec<String>,
}

/// `GET /fleet/v1/agents/{machine}/bodies/{hash}`: a unit body the machine was given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentUnitBody {
    pub options: Vec<UnitOption>,
}

/// `GET /fleet/v1/agents/{machine}/secrets/{unit}`: the values of the secrets a unit the
/// machine runs names, base64, by secret name (only ever over the machine's own mTLS channel).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentUnitSecrets {
    pub secrets: Vec<AgentSecret>,
}

#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSecret {
    pub name: String,
    #[serde(default)]
    pub version: u64,
    /// The value, base64.
    pub value: String,
}

impl std::fmt::Debug for AgentUnitSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|secret| secret.name.as_str()).collect();
        write!(f, "AgentUnitSecrets({names:?})")
    }
}

/// At most this many hashes in one `GET /fleet/v1/agents/{machine}/bodies` (the request line
/// stays a few kilobytes).
pub const MAX_BODIES_PER_REQUEST: usize = 100;

/// `GET /fleet/v1/agents/{machine}/bodies?hash=H&hash=H…`: the unit bodies among those asked
/// for that exist, each the body of a unit the machine was given; one request for all the
/// content new to an agent in a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentUnitBodies {
    pub bodies: Vec<AgentHashedBody>,
}

/// One body of [`AgentUnitBodies`], with its hash (hex).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHashedBody {
    pub hash: String,
    pub options: Vec<UnitOption>,
}

/// `GET /fleet/v1/agents/{machine}/changes?after=N`: answers when the machine's work may have
/// changed since revision `N` (or after a while with the same revision), or when someone asks
/// for the journal of one of its units.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentChanges {
    pub revision: u64,
    /// Journals asked for through the manager, to answer at `POST …/journal/{id}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub journal: Vec<JournalAsk>,
    /// On a [`CHANGE_STREAM_PROTOCOL_V2`] stream: the machine's work as of `revision`, what
    /// `GET …/work` answers (absent when it would make the line too long: the agent reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<AgentWork>,
    /// With `work`: the bodies of its units the stream has not carried before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bodies: Vec<AgentHashedBody>,
    /// On a [`CHANGE_STREAM_PROTOCOL_V2`] stream: the answer to the agent's states line of
    /// this `id`; such a line carries nothing else, and the revision last sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<AgentStreamAnswer>,
}

/// The manager's answer to an [`AgentStreamStates`] line: the status `POST …/states` would
/// have answered, and its error's message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStreamAnswer {
    pub id: u64,
    pub status: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A line an agent writes on a [`CHANGE_STREAM_PROTOCOL_V2`] stream: state changes of its
/// units, as `POST …/states` takes them; the manager answers with the same `id`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStreamStates {
    pub id: u64,
    pub states: AgentStates,
}

/// `GET /fleet/v1/agents/{machine}/stream` with `Connection: upgrade` and this `Upgrade:`
/// over HTTP/1.1: the manager answers `101 Switching Protocols` and the connection carries
/// the machine's changes from then on. The manager writes one [`AgentChanges`] as a line of
/// JSON at once and again whenever the machine's work may have changed or a journal is asked
/// of it, an empty line to answer each heartbeat, and a line `?` to ask for one when the agent
/// has been silent for longer than it beats at ([`CHANGE_STREAM_HEARTBEAT_HEADER`]; half of
/// its `agent_ttl` if it did not say); the agent writes heartbeats, each a lone `\n`, and
/// nothing else. While the stream is open the machine is present.
pub const CHANGE_STREAM_PROTOCOL: &str = "fleet-changes/1";

/// The second version of the change stream, asked for beside the first (two `Upgrade:`
/// values; the manager's `101` names the one it chose, and a manager from before it chooses
/// the first). Everything of the first holds, and the stream carries a change whole: the
/// manager's line of changes brings the machine's work and the bodies new to the stream (one
/// line, at most [`MAX_CHANGE_STREAM_LINE`]; the agent reads what a line leaves out), and the
/// agent may write [`AgentStreamStates`] lines (at most [`MAX_STREAM_STATES_LINE`]), each
/// answered by a line with its `answer`. A change then reaches an agent on its stream, and its
/// states come back on it, with no connection opened.
pub const CHANGE_STREAM_PROTOCOL_V2: &str = "fleet-changes/2";

/// A header of the change stream's request: the longest the agent goes between heartbeats,
/// in whole seconds (it beats that rarely while idle, and every third of its `agent_ttl`
/// while a unit it runs needs its presence proven). The manager then asks for a beat only
/// after that much silence, and counts the agent lost when it stays silent half as long
/// again, or at once when the connection ends (a kernel's keepalive finds a peer gone without
/// a word). Without it, the manager expects a beat within half of its `agent_ttl`.
pub const CHANGE_STREAM_HEARTBEAT_HEADER: &str = "fleet-heartbeat";

/// The longest heartbeat period a manager takes from [`CHANGE_STREAM_HEARTBEAT_HEADER`].
pub const LONGEST_STREAM_HEARTBEAT_SECONDS: u64 = 3600;

/// The longest line of a change stream an agent reads.
pub const MAX_CHANGE_STREAM_LINE: usize = 256 * 1024;

/// The longest states line a manager reads on a change stream (the API's request body limit).
pub const MAX_STREAM_STATES_LINE: usize = 1024 * 1024;

/// A journal someone asked a manager for, of a unit on a pull agent it cannot reach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalAsk {
    pub id: u64,
    pub unit: String,
    pub lines: usize,
    #[serde(default)]
    pub status: bool,
}

/// A git source (our addition): `PUT /fleet/v1/sources/{name}` stores it (administrators
/// only); reads add its `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    #[serde(default)]
    pub name: String,
    /// `https://…` or `file://…`.
    pub repo: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Directories read; the whole repository when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// How often the source is fetched; 15 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<u64>,
    /// The name of a file in the syncing machines' `source_credentials_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub keep_removed: bool,
    #[serde(default)]
    pub take_over: bool,
    /// The name of a file in `source_credentials_dir` holding the push webhook's shared
    /// secret; no webhook without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
    /// New content for running units goes out in waves with at most this many down (`2`,
    /// `25%`); all at once when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
    /// How long a unit its rollout replaced must stay active before the next wave; 10 when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<u64>,
    /// How long a unit its rollout replaced may take to become active and healthy before the
    /// gate fails; 120 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    /// Its rollouts' canary (`1`, `5%`), bake time and auto-revert, as a rollout request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_revert: bool,
    /// What machines do when the source's units drift there: `correct` (put them back, the
    /// default) or `report`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<String>,
    /// Only in answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SourceStatus>,
}

/// What a source's last sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub attempted_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub problems: Vec<String>,
    #[serde(default)]
    pub owned_elsewhere: Vec<String>,
    /// Units the cluster holds otherwise than the source says, after the last sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub out_of_sync: Vec<SourceOutOfSync>,
    #[serde(default)]
    pub units: usize,
    #[serde(default)]
    pub changes: usize,
    /// Whether the last sync attempt is of the source as it now stands.
    #[serde(default)]
    pub current: bool,
    /// Why the source rolls nothing out: its rollout reverted itself on the commit it is at.
    /// A new commit, or a forced sync, ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
}

/// A unit the cluster holds otherwise than its source says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceOutOfSync {
    pub unit: String,
    pub why: String,
    /// The unit file the source has for it, when it reads and is small enough to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<String>,
}

/// `GET /fleet/v1/sources`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceList {
    #[serde(default)]
    pub sources: Vec<Source>,
}

/// `PUT /fleet/v1/rollouts/{name}` (our addition): new content for running units, in waves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutRequest {
    /// The units to move to the new content (each must exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    /// The new content, as unit options (a template's, for its instances).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    /// Instead of `units` and `options`: each unit with its own new content.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, Vec<UnitOption>>,
    /// A number of units, or a percentage (`25%`).
    pub max_unavailable: String,
    /// How long a replaced unit must stay active before the next wave; 10 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<u64>,
    /// How long a replaced unit may take to become active before the rollout pauses; 120
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    /// Replace this many units first (`1`, `5%`) and wait: for `bakeSeconds` of them staying
    /// well, or for a promotion (`POST /rollouts/{name}/promote`) without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_seconds: Option<u64>,
    /// A failed gate (a unit down, or unhealthy past its deadline) undoes the rollout by itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_revert: bool,
}

/// A rollout as the API shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    pub name: String,
    /// `running`, `paused` (by hand), `failed` (paused by a unit that did not get there), `done`, or
    /// `undone` (an undo that finished).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub max_unavailable: String,
    pub min_ready_seconds: u64,
    /// Every unit with its step; left out when asked for (`?units=false`: a client that
    /// follows a rollout of many units reads `steps` instead). A rollout has at least one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<RolloutUnit>,
    /// How many units are at each step (`waiting`, `replacing`, ...), steps with none left out.
    #[serde(default)]
    pub steps: BTreeMap<String, usize>,
    pub created: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<RolloutCanary>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_revert: bool,
    /// Why it undid itself: the gate that failed (an undo begun by `autoRevert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<String>,
    /// Why its next unit waits though its max-unavailable has room: the disruption budget of
    /// the unit's group (`[X-Fleet] DisruptionBudget=`) that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// For a rollout of a secret's new value: the secret, and the version it takes units to
    /// (back from, on an undo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_version: Option<u64>,
}

/// A rollout's canary, as the API shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCanary {
    /// How many of the rollout's first units it holds.
    pub count: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_seconds: Option<u64>,
    /// When all its units were done (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_since: Option<u64>,
    pub promoted: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutUnit {
    pub name: String,
    /// `waiting`, `replacing`, `ready`, `done` or `failed`.
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// `GET /fleet/v1/rollouts`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutList {
    #[serde(default)]
    pub rollouts: Vec<Rollout>,
}

/// `POST /fleet/v1/units` (our addition): many unit writes in one request. Each unit is what
/// a `PUT /fleet/v1/units/{name}` would take, with its name and desired state always given:
/// with options it is created or replaced; without, only its desired state changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitBatch {
    pub units: Vec<Unit>,
}

/// The answer to a [`UnitBatch`]: one result per unit, in the order asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitBatchResults {
    pub units: Vec<UnitBatchResult>,
}

/// What became of one unit of a batch: the status a `PUT` of it alone would have answered
/// (201 created or replaced, 204 desired state set, 404, 409, 503), with the error's message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitBatchResult {
    pub name: String,
    pub code: u16,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub message: Option<String>,
}

/// `POST /fleet/v1/plans` (our addition): what a command's unit writes would do, asked before
/// they are made; nothing is written. `units` are the writes, each as a [`UnitBatch`]'s unit
/// (its options given, or named by a key of `contents`, so that the instances of a template
/// carry it once); `destroy` names the units the command would destroy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRequest {
    #[serde(default)]
    pub units: Vec<PlanUnit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destroy: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub contents: BTreeMap<String, Vec<UnitOption>>,
    /// Machines (IDs or short IDs) drained: every unit on them let go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain: Vec<String>,
    /// A source synced now (its name): what its branch holds now against the cluster. Given
    /// alone: the sync's own writes are the plan's.
    #[serde(default, rename = "sourceSync", skip_serializing_if = "is_empty")]
    pub source_sync: Option<String>,
    /// The sync planned is forced (`source sync --force`): a commit its rollout reverted is
    /// rolled out again.
    #[serde(default, rename = "sourceSyncForce", skip_serializing_if = "std::ops::Not::not")]
    pub source_sync_force: bool,
}

/// One write of a [`PlanRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanUnit {
    pub name: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    /// The key in the request's `contents` of this unit's options.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub content: Option<String>,
}

/// The answer to a [`PlanRequest`]: the store's index the plan was made at (a later write
/// moves it) and every unit the change names or moves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub index: u64,
    pub units: Vec<PlannedUnit>,
    /// For a plan of a source's sync: what the sync read and what it leaves alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PlannedSync>,
}

/// What a planned sync of a source read, and what of it the sync would not write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedSync {
    pub name: String,
    /// The commit its branch (or revision) points at now.
    pub commit: String,
    /// Why the sync would write nothing: the source is paused, or halted after its rollout
    /// reverted itself, or a desired-state file does not read.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub halted: Option<String>,
    /// Files that do not read (`path:line: problem`): their units keep what they have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Units the source names that another owner holds (`unit (owner)`): left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned_elsewhere: Vec<String>,
    /// The rollout that new content for the source's running units would go out in
    /// (`source-NAME`), when the source rolls out in waves and some unit's content changes.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub rollout: Option<String>,
    /// The units whose new content would go out in that rollout, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled: Vec<String>,
    /// The source's file of each unit whose content the sync would change, for a diff
    /// (files over 64 KiB, and past 4 MiB in all, are left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub contents: BTreeMap<String, String>,
}

/// One unit of a [`Plan`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedUnit {
    pub name: String,
    /// `create`, `change` (new content), `set` (desired state only), `unchanged`, `destroy`,
    /// `missing` (named, but no such unit), `moved` (moved by the change: a unit it does not
    /// name, or one on a machine it drains), `stays` (on a machine it drains, with why) or
    /// `affected` (a running unit that waits for one the change takes down or moves:
    /// [`PlannedUnit::on_required`]).
    pub action: String,
    /// The content's hash now and after (absent: no unit).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash_before: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state_before: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state: Option<String>,
    /// Its machine now (or the one the engine is about to give it) and after.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub machine_before: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub machine: Option<String>,
    /// Why the engine would leave it unplaced after the change.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub waiting: Option<String>,
    /// A unit on a calendar or a batch unit: placed only for a run, and when that is
    /// (`runs on *-*-* 02:00:00, next at 2026-12-05T02:00:00Z`).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub runs: Option<String>,
    /// A running unit that waits for units (`[X-Fleet] Requires=`, `After=`) the change takes
    /// down or moves: what it then does (`taken off if db.service is not up again within 30s
    /// (RequiresGrace=)`, `restarted once db.service is up on 3f2a1b0c`). Its row's action is
    /// `affected` when the change does nothing else to it.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub on_required: Option<String>,
    /// The unit's version now and after (`fleetctl history`): a change of content or desired
    /// state makes the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_before: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// `POST /fleet/v1/imports` (ours): units taken over from the original fleet's registry
/// (`fleetctl import-original`), each with the machine the original runs it on. Contents are
/// carried once under keys of `contents`, as in a [`PlanRequest`]. Administrators only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportRequest {
    pub units: Vec<ImportUnit>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub contents: BTreeMap<String, Vec<UnitOption>>,
    /// Report what the import would do; write nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// One unit of an [`ImportRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportUnit {
    pub name: String,
    pub desired_state: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    /// The key in the request's `contents` of this unit's options.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub content: Option<String>,
    /// The machine the original runs it on (none: not scheduled there).
    #[serde(default, rename = "machineID", skip_serializing_if = "is_empty")]
    pub machine_id: Option<String>,
}

/// The answer to an [`ImportRequest`]: every unit and what the import does with it;
/// `written` once it is stored (never with a unit refused: an import is all or nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReport {
    pub written: bool,
    pub units: Vec<ImportedUnitReport>,
}

/// One unit of an [`ImportReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedUnitReport {
    pub name: String,
    /// `adopt` (placed on the machine it runs on, which takes it over as it runs), `global`
    /// (every machine that runs it takes it over), `place` (the engine places it: it was not
    /// scheduled) or `refused` (with why).
    pub action: String,
    pub desired_state: String,
    #[serde(default, rename = "machineID", skip_serializing_if = "is_empty")]
    pub machine_id: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub reason: Option<String>,
}

/// `GET /fleet/v1/units/{name}/runs` (our addition): the calendar of a unit that runs on one,
/// whether it is a batch unit, and what became of its elapses and runs. Times are RFC 3339, in
/// UTC.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitRuns {
    pub name: String,
    /// `[X-Fleet] Schedule=` in its normalized form; absent for a unit without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// When it next elapses; absent when it never does again (or has no schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_elapse: Option<String>,
    /// An elapse waiting for the run before it to end (`Overlap=queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<String>,
    /// `[X-Fleet] Batch=true`: each start of the unit is one run.
    #[serde(default)]
    pub batch: bool,
    /// `[X-Fleet] Retries=`: how often a failed run is tried again.
    #[serde(default)]
    pub retries: u32,
    /// When the latest run, failed, is tried again; absent when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// Oldest first, at most the number a unit keeps.
    #[serde(default)]
    pub runs: Vec<UnitRun>,
    /// The latest ranges of elapses skipped, oldest first.
    #[serde(default)]
    pub skipped: Vec<SkippedElapses>,
}

/// One run of a unit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitRun {
    pub id: u64,
    /// The elapse it ran for; absent for a run not for an elapse (a batch unit's start, or one
    /// started by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapse: Option<String>,
    /// 1 for a first run, one more for each retry of it.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    pub claimed: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// `waiting` (claimed, not started), `running`, `succeeded`, `failed`, `lost` or `stopped`;
    /// `global` for a global unit's run, which every machine runs (see `machines`).
    pub state: String,
    /// The exit status of a failed run that exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// The signal that killed a failed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Why a lost run is not known to have ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The last lines of its log when it ended (at most 20 lines, 2,048 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// A global unit's run (`state` is `global`): how it ended on the machines that reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines: Option<RunMachines>,
}

/// How a global unit's run ended on the machines, each counted once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMachines {
    pub succeeded: u32,
    pub failed: u32,
    pub lost: u32,
    pub stopped: u32,
    /// The first machines it failed or was lost on (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<MachineFailure>,
}

/// One machine a global unit's run failed or was lost on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineFailure {
    #[serde(rename = "machineID")]
    pub machine_id: String,
    /// `failed` or `lost`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

fn first_attempt() -> u32 {
    1
}

/// A range of elapses skipped for one reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedElapses {
    pub first: String,
    pub last: String,
    pub why: String,
}

/// A unit's versions, oldest first, the current one last (our addition:
/// `GET /units/{name}/history`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitHistory {
    pub name: String,
    pub versions: Vec<UnitVersion>,
}

/// One version of a unit: what its content and desired state were, since when, by whom.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitVersion {
    pub version: u64,
    /// The content's hash, as `list-unit-files` shows it in full.
    pub hash: String,
    pub desired_state: String,
    /// RFC 3339, UTC; absent for the version a unit had before fleet kept versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<String>,
    #[serde(default, skip_serializing_if = "fleet_core::unit_history::ChangedBy::is_unknown")]
    pub changed_by: fleet_core::unit_history::ChangedBy,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub current: bool,
    /// The unit file of this version: in `GET /units/{name}/history/{version}` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
}

/// One event of `GET /fleet/v1/events` (each server-sent event's data; its id is the index).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEvent {
    /// Where it stands in the one stream: larger is later; not dense.
    pub index: u64,
    /// RFC 3339, UTC, by the clock of the fleetd that made it.
    pub time: String,
    /// `placed`, `moved`, `unplaced`, `waiting`, `state`, `health`, `machine-joined`,
    /// `machine-lost`, `machine-revoked`, `drain`, `rollout`, `sync`, `write`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The units of an event about several (a write of a batch of units), when `unit` is
    /// absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    #[serde(rename = "machineID", default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The identity that asked, for what one asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub message: String,
}
