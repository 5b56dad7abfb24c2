//! fleetctl: the original's commands, flags and output, against the fleet API.

#![forbid(unsafe_code)]

mod commands;
mod context;
mod diff;
mod local_units;
mod manual;
mod output;
mod progress;
mod reservations;
mod ssh;
mod table;
mod tunnel;
mod unit_arguments;
mod wait;

use std::process::ExitCode;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

use fleet_core::secret::Secret;

use crate::context::Context;

#[derive(Parser, Debug)]
#[command(
    name = "fleetctl",
    about = "fleetctl drives a fleet cluster: systemd units scheduled across machines",
    disable_version_flag = true,
    disable_help_flag = true,
    infer_subcommands = true,
    after_help = concat!("VERSION:\n  ", env!("CARGO_PKG_VERSION"))
)]
struct Cli {
    #[command(flatten)]
    global: GlobalFlags,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Args, Debug, Clone)]
pub struct GlobalFlags {
    /// Print this help
    #[arg(short = 'h', long = "help", alias = "h", action = ArgAction::Help, global = true)]
    help: Option<bool>,
    /// Print debug logs to stderr
    #[arg(long, global = true, env = "FLEETCTL_DEBUG")]
    pub debug: bool,
    /// Print the version and exit
    #[arg(short = 'v', long, global = true)]
    pub version: bool,
    /// How to reach the cluster: API
    #[arg(long, global = true, env = "FLEETCTL_DRIVER", default_value = "API")]
    pub driver: String,
    /// Location of the fleet API (unix:///path, http://host:port or https://host:port)
    #[arg(long, global = true, env = "FLEETCTL_ENDPOINT", default_value = "unix:///var/run/fleet.sock")]
    pub endpoint: String,
    /// Keyspace of fleet data in etcd (etcd driver)
    #[arg(long, global = true, env = "FLEETCTL_ETCD_KEY_PREFIX", default_value = "/_coreos.com/fleet/")]
    pub etcd_key_prefix: String,
    /// TLS client key
    #[arg(long, global = true, env = "FLEETCTL_KEY_FILE", default_value = "")]
    pub key_file: String,
    /// TLS client certificate
    #[arg(long, global = true, env = "FLEETCTL_CERT_FILE", default_value = "")]
    pub cert_file: String,
    /// TLS certificate authority
    #[arg(long, global = true, env = "FLEETCTL_CA_FILE", default_value = "")]
    pub ca_file: String,
    /// Bearer token for TCP endpoints (prefer FLEETCTL_TOKEN or --token-file: arguments are
    /// visible to other users of the machine)
    #[arg(long, global = true, env = "FLEETCTL_TOKEN", hide_env_values = true, value_parser = secret, default_value = "")]
    pub token: Secret,
    /// File holding the bearer token
    #[arg(long, global = true, env = "FLEETCTL_TOKEN_FILE", default_value = "")]
    pub token_file: String,
    /// Change or destroy units a git source manages (they become units made by hand, which
    /// the source then leaves alone); with source add: take over units of the same names
    #[arg(long, global = true)]
    pub take_over: bool,
    /// Make the command's first unit write only if the cluster is still as `fleetctl plan`
    /// saw it when it printed this index (refused otherwise: plan again)
    #[arg(long, global = true, value_name = "INDEX")]
    pub if_unchanged: Option<u64>,
    /// SSH known hosts file
    #[arg(long, global = true, env = "FLEETCTL_KNOWN_HOSTS_FILE", default_value = "~/.fleetctl/known_hosts")]
    pub known_hosts_file: String,
    /// Verify SSH host keys
    #[arg(long, global = true, env = "FLEETCTL_STRICT_HOST_KEY_CHECKING", default_value_t = true, action = ArgAction::Set)]
    pub strict_host_key_checking: bool,
    /// SSH connection timeout in seconds
    #[arg(long, global = true, env = "FLEETCTL_SSH_TIMEOUT", default_value_t = 10.0)]
    pub ssh_timeout: f64,
    /// SSH bastion host[:port]
    #[arg(long, global = true, env = "FLEETCTL_TUNNEL", default_value = "")]
    pub tunnel: String,
    /// Seconds to wait for each API request (for a batch of unit writes: per hundred units)
    #[arg(long, global = true, env = "FLEETCTL_REQUEST_TIMEOUT", default_value_t = 3.0)]
    pub request_timeout: f64,
    /// SSH user
    #[arg(long, global = true, env = "FLEETCTL_SSH_USERNAME", default_value = "core")]
    pub ssh_username: String,
    /// Deprecated; has no effect
    #[arg(long, global = true, env = "FLEETCTL_EXPERIMENTAL_API", default_value_t = true, action = ArgAction::Set, hide = true)]
    pub experimental_api: bool,
    /// Deprecated alias of --key-file
    #[arg(long, global = true, env = "FLEETCTL_ETCD_KEYFILE", default_value = "", hide = true)]
    pub etcd_keyfile: String,
    /// Deprecated alias of --cert-file
    #[arg(long, global = true, env = "FLEETCTL_ETCD_CERTFILE", default_value = "", hide = true)]
    pub etcd_certfile: String,
    /// Deprecated alias of --ca-file
    #[arg(long, global = true, env = "FLEETCTL_ETCD_CAFILE", default_value = "", hide = true)]
    pub etcd_cafile: String,
}

fn secret(value: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(value))
}

#[derive(Args, Debug, Clone, Default)]
pub struct BlockFlags {
    /// Wait this many attempts (about 2 s each) for each unit; 0 waits forever
    #[arg(long, default_value_t = 0)]
    pub block_attempts: u32,
    /// Do not wait for the units to reach their state
    #[arg(long)]
    pub no_block: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct CreateFlags {
    /// Replace units in the registry that differ from the local files
    #[arg(long)]
    pub replace: bool,
    /// Deprecated: signed units are no longer supported
    #[arg(long, hide = true)]
    pub sign: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct WaveFlags {
    /// With --replace: running units get their new content as a rollout, at most this many
    /// down at once (a number, or a percentage: 25%); see `fleetctl rollout`
    #[arg(long, requires = "replace")]
    pub max_unavailable: Option<String>,
    /// With --max-unavailable: how long a replaced unit must stay active before the next wave
    #[arg(long, default_value = "10s", requires = "max_unavailable")]
    pub min_ready: String,
}

#[derive(Args, Debug, Clone)]
pub struct ListFlags {
    /// Show full machine IDs and hashes
    #[arg(short = 'l', long = "full", alias = "l")]
    pub full: bool,
    /// Omit the header line
    #[arg(long)]
    pub no_legend: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a unit's normalised file as stored in the cluster
    Cat { units: Vec<String> },
    /// Destroy units: stop, unload and remove them from the cluster
    Destroy {
        #[command(flatten)]
        block: BlockFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Forward standard input and output to a Unix socket (used by --tunnel)
    #[command(hide = true)]
    FdForward { socket: Vec<String> },
    /// Print the log of a unit
    Journal {
        /// Number of recent lines to print
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: usize,
        /// Keep printing new lines as they arrive
        #[arg(short = 'f', long = "follow", alias = "f")]
        follow: bool,
        /// SSH port (unused: logs come through the API)
        #[arg(long, default_value_t = 22)]
        ssh_port: u16,
        /// Read the log with sudo (unused: logs come through the API)
        #[arg(long)]
        sudo: bool,
        /// Output mode: short
        #[arg(long, default_value = "short")]
        output: String,
        units: Vec<String>,
    },
    /// List the machines in the cluster
    ListMachines {
        #[command(flatten)]
        list: ListFlags,
        /// Columns: machine,ip,metadata,units,connection (etcd, embedded or pull),leader (engine on the
        /// machine whose engine leads),capacity,reserved (memory and CPU units may reserve there, and
        /// what they do),drain,taints,state (present, or out of touch since when while units wait
        /// for it),version (of fleet, as the machine's fleetd registered)
        #[arg(long, default_value = "machine,ip,metadata")]
        fields: String,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// List the units in the cluster and their desired and current states
    ListUnitFiles {
        /// Show full machine IDs and hashes
        #[arg(short = 'l', long, alias = "l")]
        full: bool,
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
        /// Columns: budget (DisruptionBudget=),desc,dstate,global,hash,next (when a unit on a calendar runs next),
        /// priority,reason,requires (Requires=, After=),schedule,source,state,sync,target,
        /// terms (reserves, tolerates, lost after, at most once, spread by),tmachine,unit,
        /// version (see `fleetctl history`)
        #[arg(long, default_value = "unit,hash,dstate,state,target")]
        fields: String,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// List the units running in the cluster, one row per machine
    ListUnits {
        #[command(flatten)]
        list: ListFlags,
        /// Columns: active,drift,hash,load,machine,sub,unit
        #[arg(long, default_value = "unit,machine,active,sub")]
        fields: String,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// Schedule units onto machines and load them, without starting them
    Load {
        #[command(flatten)]
        block: BlockFlags,
        #[command(flatten)]
        create: CreateFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Stop and start units again
    Restart {
        /// Wait this many attempts (about 2 s each) for each unit; 0 waits forever
        #[arg(long, default_value_t = 0)]
        block_attempts: u32,
        units: Vec<String>,
    },
    /// Open an SSH session to a machine, or to the machine running a unit, with the system's
    /// ssh; a command after the target (or after --) runs there and gives its exit code
    Ssh {
        /// Forward the SSH agent's connection
        #[arg(short = 'A', long = "forward-agent", alias = "A")]
        forward_agent: bool,
        /// The machine's SSH port
        #[arg(long, default_value_t = 22)]
        ssh_port: u16,
        /// Open the session to this machine (an ID or a unique prefix of one)
        #[arg(long)]
        machine: Option<String>,
        /// Open the session to the machine running this unit
        #[arg(long)]
        unit: Option<String>,
        /// MACHINE|UNIT, then the command to run
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Schedule, load and start units
    Start {
        #[command(flatten)]
        block: BlockFlags,
        #[command(flatten)]
        create: CreateFlags,
        #[command(flatten)]
        waves: WaveFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Start a run now of a started unit on a calendar ([X-Fleet] Schedule=) or of a batch unit
    /// (Batch=true), unless one is running
    Run { unit: String },
    /// Show a unit's calendar ([X-Fleet] Schedule=), when it next runs, and what became of its
    /// runs and elapses
    Runs {
        #[command(flatten)]
        output: output::OutputFlag,
        unit: String,
    },
    /// Show a unit's versions: each change of its content or desired state, when and by whom
    /// (the newest 20 past versions are kept unless fleetd's unit_versions_kept says otherwise)
    History {
        #[command(flatten)]
        output: output::OutputFlag,
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
        unit: String,
    },
    /// Show what happens in the cluster: units placed, moved, unplaced and waiting, their
    /// state and health, machines joined, lost and revoked, drains, rollouts, syncs and every
    /// write through the API (kept: fleetd's events_kept, events_kept_for)
    Events {
        #[command(flatten)]
        output: output::OutputFlag,
        /// Keep printing events as they happen (reconnecting after the last one read)
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only events of units matching this pattern (web@*.service)
        #[arg(long)]
        unit: Option<String>,
        /// Only events of this machine (its ID or the start of it)
        #[arg(long)]
        machine: Option<String>,
        /// Only these kinds, comma-separated: placed, moved, unplaced, waiting, state, health,
        /// machine-joined, machine-lost, machine-revoked, drain, rollout, sync, write
        #[arg(long, value_delimiter = ',')]
        kind: Vec<String>,
        /// Only events after this index (as the INDEX column shows; 0: the oldest kept), or of
        /// the last span of time (10m, 2h, 1d) or from a time on (2026-12-07T06:00:00Z)
        #[arg(long, default_value = "0")]
        since: String,
        /// Show machine IDs in full
        #[arg(long)]
        full: bool,
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
    /// Bring back a version of a unit (see `fleetctl history`): its content and desired state;
    /// a unit that runs gets the old content through a rollout, waited for
    Revert {
        unit: String,
        /// The version to bring back
        #[arg(long)]
        to: u64,
        /// For a running unit: at most this many units down at once (a number, or 25%)
        #[arg(long, default_value = "1")]
        max_unavailable: String,
        /// For a running unit: how long it must stay active for the rollout to be done
        #[arg(long, default_value = "10s")]
        min_ready: String,
    },
    /// Show the status of units
    Status {
        /// SSH port (unused: status comes through the API)
        #[arg(long, default_value_t = 22)]
        ssh_port: u16,
        #[command(flatten)]
        output: output::OutputFlag,
        units: Vec<String>,
    },
    /// Stop units, leaving them loaded
    Stop {
        #[command(flatten)]
        block: BlockFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Send units to the cluster without scheduling them
    Submit {
        #[command(flatten)]
        create: CreateFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Unload units from their machines, leaving them in the cluster
    Unload {
        #[command(flatten)]
        block: BlockFlags,
        #[command(flatten)]
        units: unit_arguments::UnitList,
    },
    /// Deprecated: signed units are no longer supported
    #[command(hide = true)]
    Verify { units: Vec<String> },
    /// Manage the API's bearer tokens (administrators only)
    Token {
        #[command(subcommand)]
        action: TokenCommand,
    },
    /// The cluster's secrets: set (from standard input or a file), list (names only), rm
    Secret {
        #[command(subcommand)]
        action: SecretCommand,
    },
    /// Manage machines: drain, undrain, status (operators); revoke, forget (administrators)
    Machine {
        #[command(subcommand)]
        action: MachineCommand,
    },
    /// Follow unit files in git repositories: add, list, status, pause, resume, sync, remove
    Source {
        #[command(subcommand)]
        action: SourceCommand,
    },
    /// Show what submit, load, start, stop, unload, destroy, `machine drain MACHINE...`,
    /// `rollout FILE`, `revert UNIT --to VERSION` or `source sync NAME` would do, writing
    /// nothing: each unit's action, desired state and machine (or why it would wait), the
    /// units the change would move, what running units that wait for a unit it stops or moves
    /// would do, and the diff of changed unit files
    Plan {
        /// The command to plan
        #[arg(value_enum)]
        command: commands::plan::Planned,
        #[command(flatten)]
        create: CreateFlags,
        /// With `plan rollout`: only the instances whose names match this pattern, as
        /// `rollout start --instances` takes them
        #[arg(long)]
        instances: Option<String>,
        /// With `plan rollout`: the canary (a number of units or a percentage) the rollout
        /// would replace first, as `rollout start --canary` takes it
        #[arg(long)]
        canary: Option<String>,
        /// With `plan revert`: the version to bring back (see `fleetctl history`)
        #[arg(long)]
        to: Option<u64>,
        /// With `plan source sync`: plan a forced sync (`source sync --force`), which rolls
        /// out again a commit whose rollout reverted itself
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        units: unit_arguments::UnitList,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// Roll new content out to running units in waves: start, list, status, pause, resume, undo
    Rollout {
        #[command(subcommand)]
        action: RolloutCommand,
    },
    /// Manage the tokens pull agents join with (administrators only)
    RegistrationToken {
        #[command(subcommand)]
        action: RegistrationTokenCommand,
    },
    /// Save a snapshot of the embedded store to FILE while fleetd runs (administrators only);
    /// fleetd -restore FILE puts it back
    Backup {
        /// Where the snapshot goes (written 0600; an existing file is replaced once the whole
        /// snapshot is in)
        file: std::path::PathBuf,
    },
    /// Take over the units of an original fleet cluster (read from its etcd's v2 keys, which
    /// stay as they are) with the machines they run on, so that each machine's fleetd keeps
    /// them running; one unit refused and nothing is imported (administrators only)
    ImportOriginal {
        #[command(flatten)]
        flags: commands::import_original::ImportFlags,
    },
    /// Print the version
    Version,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(
        after_help = "Bash: fleetctl completion bash > /etc/bash_completion.d/fleetctl\nZsh: fleetctl completion zsh > \"${fpath[1]}/_fleetctl\"\nFish: fleetctl completion fish > ~/.config/fish/completions/fleetctl.fish"
    )]
    Completion { shell: clap_complete::Shell },
    /// Print fleetctl's manual page (roff), or write it and one page per command into a directory
    Manual {
        /// Write fleetctl.1 and fleetctl-COMMAND.1 pages here instead of printing fleetctl.1
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum MachineCommand {
    /// Revoke a machine: its certificate is refused within a second, its units move to other
    /// machines, and it cannot join again
    Revoke { machine: String },
    /// Free a revoked machine's ID for another key: a new machine may join with it (the
    /// revoked key stays refused)
    Forget { machine: String },
    /// Drain a machine: it takes no new units, and its units move to other machines in waves
    /// (global units and units whose MachineID= names it stay); again, to change the budget
    Drain {
        machine: String,
        /// How many of its units may be down at once while they move: a number or a percentage
        #[arg(long)]
        max_unavailable: Option<String>,
    },
    /// End a machine's drain: it takes units again (units that moved stay where they are)
    #[command(visible_alias = "uncordon")]
    Undrain { machine: String },
    /// Taint a machine: it takes only units that tolerate the taint ([X-Fleet] Tolerate=);
    /// KEY=VALUE or KEY, with :evict to also move off the units there that do not tolerate it
    Taint { machine: String, taint: String },
    /// Remove a machine's taint (one set in its fleet.conf too)
    Untaint { machine: String, key: String },
    /// Show where a machine's drain stands: each unit moving (and why one cannot), left, or staying
    Status {
        machine: String,
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum RegistrationTokenCommand {
    /// Make a registration token and print it; it is shown this once
    Create {
        /// How long the token is accepted (e.g. 24h); forever when not given
        #[arg(long)]
        ttl: Option<String>,
        /// How many machines may join with it
        #[arg(long)]
        max_uses: Option<u32>,
        /// Metadata given to the machines that join with it (k=v,k2=v2); they cannot widen it
        #[arg(long, default_value = "")]
        metadata: String,
        /// The machine IDs it may create, as a pattern (edge-*); any when not given
        #[arg(long)]
        machine_ids: Option<String>,
        name: String,
    },
    /// List the registration tokens (never the tokens themselves)
    List {
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
    /// Revoke a registration token: no machine joins with it any more
    Revoke { name: String },
}

#[derive(Subcommand, Debug)]
pub enum SourceCommand {
    /// Add a source, or change one: its unit files become units of the cluster, kept as the
    /// repository has them (administrators only)
    #[command(after_help = SOURCE_HELP)]
    Add(Box<SourceAdd>),
    /// List the sources and how their last sync went
    List {
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
    /// Show a source: where it reads, its last commit, its problems, the units the cluster
    /// holds otherwise than it says and the units that drifted on their machines
    Status {
        /// Also print, for each unit out of sync, how the cluster's unit file differs from
        /// the source's
        #[arg(long)]
        diff: bool,
        name: String,
    },
    /// Stop syncing a source; its units stay as they are
    Pause { name: String },
    /// Sync a paused source again, at once
    Resume { name: String },
    /// Sync a source now
    Sync {
        /// Also roll out once more the commit the source halted on (its rollout reverted
        /// itself there)
        #[arg(long)]
        force: bool,
        name: String,
    },
    /// Remove a source and destroy its units (or keep them, as units made by hand)
    Remove {
        /// Keep the source's units running, as units made by hand
        #[arg(long)]
        keep_units: bool,
        name: String,
    },
}

/// `fleetctl source add`'s arguments.
#[derive(clap::Args, Debug)]
pub struct SourceAdd {
    /// https:// or file:// address of the repository (credentials go in --credentials)
    #[arg(long)]
    repo: String,
    /// The branch to follow (default: the repository's default branch)
    #[arg(long, conflicts_with = "revision")]
    branch: Option<String>,
    /// A fixed commit or tag instead of a branch
    #[arg(long)]
    revision: Option<String>,
    /// A directory of the repository to read (repeatable; default: all of it)
    #[arg(long = "path")]
    paths: Vec<String>,
    /// How often to fetch (e.g. 15s, 5m)
    #[arg(long, default_value = "15s")]
    interval: String,
    /// The name of a file in the syncing machines' source_credentials_dir holding
    /// USER:PASSWORD or a token, for https
    #[arg(long)]
    credentials: Option<String>,
    /// Keep units that are removed from the repository instead of destroying them
    #[arg(long)]
    keep_removed: bool,
    /// The name of a file in source_credentials_dir holding the secret a push webhook
    /// (POST /fleet/v1/sources/NAME/webhook, X-Hub-Signature-256) signs with
    #[arg(long)]
    webhook_secret: Option<String>,
    /// Roll new content out to running units in waves, at most this many down at once
    /// (a number, or a percentage: 25%); all at once when not given
    #[arg(long)]
    max_unavailable: Option<String>,
    /// With --max-unavailable: how long a replaced unit must stay active before the next
    /// wave (e.g. 10s)
    #[arg(long, default_value = "10s")]
    min_ready: String,
    /// With --max-unavailable: how long a replaced unit may take to become active (and
    /// healthy, with a health check) before its rollout's gate fails (e.g. 2m)
    #[arg(long, default_value = "2m")]
    deadline: String,
    #[command(flatten)]
    gates: RolloutGates,
    /// What machines do when a unit of the source is stopped or edited on them
    /// outside fleet: correct (put it back) or report (only say so)
    #[arg(long, default_value = "correct", value_parser = ["correct", "report"])]
    drift: String,
    name: String,
}

const SOURCE_HELP: &str = "Each directory read may hold a fleet-desired.conf of PATTERN = STATE lines \
(inactive, loaded or launched; later lines win; units no line names are launched), e.g.\n  \
batch-*.service = loaded\n  web@{1..12}.service = launched   # instances of web@.service";

#[derive(Subcommand, Debug)]
pub enum RolloutCommand {
    /// Give units new content a few at a time: FILE is a unit file, or a template whose
    /// instances in the cluster all get it; the next wave starts only when the replaced units
    /// are active and stayed so for --min-ready; a unit that does not get there pauses it
    Start {
        /// At most this many units down at once: a number, or a percentage (25%)
        #[arg(long)]
        max_unavailable: String,
        /// How long a replaced unit must stay active before the next wave (e.g. 10s)
        #[arg(long, default_value = "10s")]
        min_ready: String,
        /// How long a replaced unit may take to become active before the rollout pauses
        #[arg(long, default_value = "2m")]
        deadline: String,
        #[command(flatten)]
        gates: RolloutGates,
        /// Only the instances whose names match this pattern (e.g. 'web@1*.service')
        #[arg(long)]
        instances: Option<String>,
        /// The rollout's name (default: the unit or template name without its type, made valid)
        #[arg(long)]
        name: Option<String>,
        file: String,
    },
    /// List the rollouts
    List {
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
    /// Show a rollout, unit by unit (a source's name stands for its rollout, source-NAME)
    Status {
        name: String,
        /// Wait until the rollout is done (exit 0) or paused (exit 1, with why)
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// Start no new wave
    Pause { name: String },
    /// Go on (a failed unit gets a new deadline)
    Resume { name: String },
    /// Take every unit the rollout touched back to its old content, in the same waves; with
    /// --to, back to that version of each (see `fleetctl history`) in a new rollout
    Undo {
        name: String,
        /// The version of each unit to go back to
        #[arg(long)]
        to: Option<u64>,
    },
    /// Let the rest follow a canary that is done, without waiting for its bake time
    Promote { name: String },
}

/// How a rollout proves new content before it goes on (units with a health check count as
/// ready only once healthy).
#[derive(clap::Args, Debug, Default)]
pub struct RolloutGates {
    /// Replace this many units first (a number, or a percentage: 5%) and wait before the rest
    #[arg(long)]
    pub canary: Option<String>,
    /// With --canary: how long the canary must stay well before the rest follow by themselves
    /// (e.g. 5m); without it, the rest wait for `fleetctl rollout promote`
    #[arg(long, requires = "canary")]
    pub bake: Option<String>,
    /// Undo the rollout by itself when a gate fails (a unit down, or unhealthy past its
    /// deadline), instead of pausing it
    #[arg(long)]
    pub auto_revert: bool,
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Set a secret's value (a new version), read from standard input to its end (one
    /// trailing newline dropped) or from --from-file; never from the command line
    ///
    /// The running units that name it are restarted with the new value in waves, by a rollout
    /// (secret-NAME) with the budget and gates of `fleetctl rollout` (25% at once unless
    /// --max-unavailable says); `rollout undo` takes them back to the old value
    Set {
        name: String,
        /// Read the value from this file, as it is
        #[arg(long)]
        from_file: Option<std::path::PathBuf>,
        /// Restart nothing: write the new value where the units read it (under systemd a
        /// unit sees it at its next start)
        #[arg(long, conflicts_with_all = ["max_unavailable", "min_ready", "deadline", "canary", "auto_revert"])]
        no_restart: bool,
        /// At most this many units restarted at once: a number, or a percentage (25%)
        #[arg(long)]
        max_unavailable: Option<String>,
        /// How long a restarted unit must stay active before the next wave (e.g. 10s)
        #[arg(long)]
        min_ready: Option<String>,
        /// How long a restarted unit may take to become active before the rollout pauses
        #[arg(long)]
        deadline: Option<String>,
        #[command(flatten)]
        gates: RolloutGates,
    },
    /// List the secrets: names, versions, sizes, who set them and when (never a value)
    List {
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
        #[command(flatten)]
        output: output::OutputFlag,
    },
    /// Remove a secret (refused while a unit names it)
    Rm { name: String },
    /// Seal every value again under the key that now seals, after `fleetd -rotate-secrets-key`
    /// (administrators only)
    Reseal,
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Make a token and print it; it is shown this once
    Create {
        /// admin, operator or viewer
        #[arg(long)]
        role: String,
        /// Limit an operator to the units whose names match this pattern (e.g. 'web-*')
        #[arg(long)]
        units: Option<String>,
        /// Let an operator set, and name in its units, the secrets whose names match this
        /// pattern (e.g. 'web-*'); an operator without it has none
        #[arg(long)]
        secrets: Option<String>,
        /// How long the token is accepted (e.g. 24h); forever when not given
        #[arg(long)]
        ttl: Option<String>,
        name: String,
    },
    /// List the tokens (never the tokens themselves)
    List {
        /// Omit the header line
        #[arg(long)]
        no_legend: bool,
    },
    /// Revoke a token: every fleetd refuses it within a second
    Revoke { name: String },
}

/// How a command ended: success, a runtime failure (1), bad usage (2), or the exit code of
/// a remote command (`ssh`).
pub enum Outcome {
    Success,
    Failure,
    Usage,
    Exit(u8),
}

fn exit(outcome: Outcome) -> ExitCode {
    match outcome {
        Outcome::Success => ExitCode::SUCCESS,
        Outcome::Failure => ExitCode::from(1),
        Outcome::Usage => ExitCode::from(2),
        Outcome::Exit(code) => ExitCode::from(code),
    }
}

const SIGN_DEPRECATED: &str = "WARNING: The signed/verified units feature is DEPRECATED and cannot be used.";

/// A reader that stops early (`| head`, `| grep -q`) ends fleetctl quietly, with the status
/// of a command a broken pipe killed (141), as it ends other command line tools; Rust's
/// printing panics on it instead (and fleetctl forbids the unsafe code that would restore
/// SIGPIPE). Every other panic is reported as before.
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        let message = panic
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(panic);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    if cli.global.version {
        println!("{}", fleet_build_info::describe("fleetctl"));
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        let _ = Cli::command().print_help();
        return ExitCode::SUCCESS;
    };
    match &command {
        Command::Version => {
            println!("{}", fleet_build_info::describe("fleetctl"));
            return ExitCode::SUCCESS;
        }
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "fleetctl", &mut script);
            // A closed stdout (`| head`) is the reader's choice, not an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            return ExitCode::SUCCESS;
        }
        Command::Manual { dir } => return exit(manual::write(Cli::command(), dir.as_deref())),
        Command::Verify { .. } => {
            eprintln!("Command \"verify\" is deprecated, DEPRECATED - No longer works");
            eprintln!("{SIGN_DEPRECATED}");
            return exit(Outcome::Usage);
        }
        Command::Load { create, .. } | Command::Start { create, .. } | Command::Submit { create, .. }
            if create.sign =>
        {
            eprintln!("{SIGN_DEPRECATED}");
            return exit(Outcome::Usage);
        }
        Command::FdForward { socket } => return exit(commands::remote::fd_forward(socket)),
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("fleetctl: {error}");
            return exit(Outcome::Failure);
        }
    };
    let context = match Context::new(&cli.global) {
        Ok(context) => context,
        Err(message) => {
            eprintln!("{message}");
            return exit(Outcome::Failure);
        }
    };
    let ssh = match &command {
        Command::Ssh { .. } => match context::ssh_options(&cli.global) {
            Ok(ssh) => Some(ssh),
            Err(message) => {
                eprintln!("{message}");
                return exit(Outcome::Usage);
            }
        },
        _ => None,
    };
    exit(runtime.block_on(run(context, command, ssh)))
}

/// Runs `act` on the units `list` names (see [`unit_arguments`]), or says why there are none.
/// A pattern that matches nothing is said, and fails the command (exit 1) once `act` has done
/// the rest.
async fn with_units(
    context: &Context,
    list: &unit_arguments::UnitList,
    act: impl AsyncFnOnce(&[String]) -> Outcome,
) -> Outcome {
    let matched = match commands::lifecycle::named_units(context, list).await {
        Ok(matched) => matched,
        Err(outcome) => return outcome,
    };
    for pattern in &matched.unmatched {
        eprintln!("no unit in the cluster matches {pattern}");
    }
    if matched.unmatched.is_empty() {
        return act(&matched.names).await;
    }
    if matched.names.is_empty() {
        return Outcome::Failure;
    }
    match act(&matched.names).await {
        Outcome::Success => Outcome::Failure,
        other => other,
    }
}

async fn run(context: Context, command: Command, ssh: Option<ssh::SshOptions>) -> Outcome {
    use commands::{
        backup, events, history, import_original, inspect, lifecycle, list, machine, plan, registration_token, remote,
        rollout, runs, secret, source, token,
    };
    match command {
        Command::Ssh { forward_agent, ssh_port, machine, unit, args } => {
            let Some(options) = ssh else {
                return Outcome::Failure;
            };
            let request = remote::SshRequest { machine, unit, forward_agent, port: ssh_port, arguments: args };
            remote::ssh(&context, &options, request).await
        }
        Command::Cat { units } => inspect::cat(&context, &units).await,
        Command::Runs { unit, output } => runs::runs(&context, &unit, output.output).await,
        Command::Events { output, follow, unit, machine, kind, since, full, no_legend } => {
            let (since, from) = match events::since_of(&since, fleet_runtime::wall_clock::now_micros()) {
                Ok(since) => since,
                Err(message) => {
                    eprintln!("{message}");
                    return Outcome::Usage;
                }
            };
            let query = fleet_client::EventQuery { since, from, unit, machine, kinds: kind, follow };
            let asked = events::EventsAsked { query, output: output.output, full, no_legend };
            events::events(&context, &asked).await
        }
        Command::History { unit, output, no_legend } => {
            history::history(&context, &unit, output.output, no_legend).await
        }
        Command::Revert { unit, to, max_unavailable, min_ready } => {
            history::revert(&context, &unit, to, &history::Waves { max_unavailable, min_ready }).await
        }
        Command::Run { unit } => runs::run(&context, &unit).await,
        Command::Status { units, output, .. } => inspect::status(&context, &units, output.output).await,
        Command::Journal { lines, follow, units, .. } => inspect::journal(&context, &units, lines, follow).await,
        Command::ListMachines { list, fields, output } => list::machines(&context, &list, &fields, output.output).await,
        Command::ListUnitFiles { full, no_legend, fields, output } => {
            list::unit_files(&context, &ListFlags { full, no_legend }, &fields, output.output).await
        }
        Command::ListUnits { list, fields, output } => list::units(&context, &list, &fields, output.output).await,
        Command::Submit { create, units } => {
            with_units(&context, &units, async |units| lifecycle::submit(&context, units, &create).await).await
        }
        Command::Load { block, create, units } => {
            with_units(&context, &units, async |units| lifecycle::load(&context, units, &create, &block).await).await
        }
        Command::Start { block, create, waves, units } => {
            let start = async |units: &[String]| lifecycle::start(&context, units, &create, &waves, &block).await;
            with_units(&context, &units, start).await
        }
        Command::Stop { block, units } => {
            with_units(&context, &units, async |units| lifecycle::stop(&context, units, &block).await).await
        }
        Command::Unload { block, units } => {
            with_units(&context, &units, async |units| lifecycle::unload(&context, units, &block).await).await
        }
        Command::Destroy { block, units } => {
            with_units(&context, &units, async |units| lifecycle::destroy(&context, units, &block).await).await
        }
        Command::Restart { block_attempts, units } => lifecycle::restart(&context, &units, block_attempts).await,
        Command::Token { action } => token::run(&context, action).await,
        Command::Secret { action } => secret::run(&context, action).await,
        Command::RegistrationToken { action } => registration_token::run(&context, action).await,
        Command::Source { action } => source::run(&context, action).await,
        Command::Rollout { action } => rollout::run(&context, action).await,
        Command::Plan { command, create, instances, canary, to, force, units, output } => {
            let asked = plan::Asked {
                planned: command,
                create: &create,
                instances: instances.as_deref(),
                canary: canary.as_deref(),
                to,
                force,
            };
            let plan = async |units: &[String]| plan::run(&context, &asked, units, output.output).await;
            with_units(&context, &units, plan).await
        }
        Command::Machine { action } => machine::run(&context, action).await,
        Command::Backup { file } => backup::run(&context, &file).await,
        Command::ImportOriginal { flags } => import_original::run(&context, &flags).await,
        Command::Version
        | Command::Verify { .. }
        | Command::FdForward { .. }
        | Command::Completion { .. }
        | Command::Manual { .. } => Outcome::Success,
    }
}
