//! fleetd's configuration: `fleet.conf` (INI, options at the global level), overridden by
//! `FLEET_<OPTION>` environment variables. Every value is checked at start; a bad one is
//! refused with the option's name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_core::machine::parse_metadata;
use fleet_core::secret::Secret;

pub const DEFAULT_CONFIG: &str = "/etc/fleet/fleet.conf";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitManagerChoice {
    Auto,
    Systemd,
    Native,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub verbosity: u32,
    pub etcd_servers: Vec<String>,
    pub etcd_key_prefix: String,
    pub etcd_request_timeout: Duration,
    pub etcd_username: String,
    pub etcd_password: Secret,
    pub etcd_keyfile: String,
    pub etcd_certfile: String,
    pub etcd_cafile: String,
    pub engine_reconcile_interval: Duration,
    pub public_ip: String,
    pub metadata: BTreeMap<String, String>,
    /// `taints = gpu=yes,db:evict`: this machine takes only the units that tolerate them.
    pub taints: fleet_core::taint::Taints,
    pub agent_ttl: Duration,
    pub units_directory: PathBuf,
    pub systemd_user: bool,
    pub token_limit: u16,
    pub disable_engine: bool,
    pub disable_watches: bool,
    pub verify_units: bool,
    pub authorized_keys_file: String,
    /// The machine ID itself, or a file to read it from.
    pub machine_id: String,
    pub unit_manager: UnitManagerChoice,
    /// `unix:///path`, `http://host:port` (or bare `host:port`) and `https://host:port`
    /// entries, comma-separated.
    pub api_listen: Vec<String>,
    /// The server certificate (PEM) of `https://` listeners...
    pub api_tls_cert_file: String,
    /// ...its private key (PEM)...
    pub api_tls_key_file: String,
    /// ...and the CA whose client certificates are accepted (mutual TLS), if any.
    pub api_tls_client_ca_file: String,
    /// Connections each API listener holds open at once (a manager holds one per pull agent).
    pub api_max_connections: usize,
    /// The role clients without a credential get on TCP listeners; none unless set.
    pub api_anonymous_role: Option<fleet_core::access::Role>,
    /// The cluster's agent CA (PEM): this fleetd signs machine certificates for pull agents
    /// that join with a registration token...
    pub agent_ca_cert_file: String,
    /// ...with this key...
    pub agent_ca_key_file: String,
    /// ...valid for this long.
    pub agent_cert_lifetime: Duration,
    /// The cluster's secrets key (`fleetd -make-certificates` makes it, beside the agent CA
    /// key); empty: the one beside `agent_ca_key_file`, else (embedded store) the state
    /// directory's own.
    pub secrets_key_file: String,
    /// Where the units' credentials (the secrets they name) are written for them, on a tmpfs:
    /// `<credentials_dir>/<machine ID>/<unit>`.
    pub credentials_dir: PathBuf,
    /// A pull agent's manager (`https://manager:4002`): set, this fleetd has no store of its
    /// own and pulls its work from the manager.
    pub manager_url: String,
    /// The CA of the manager's certificate (PEM); the system's roots when empty.
    pub manager_ca_file: String,
    /// How often an idle pull agent beats on its change stream (never more often than a
    /// third of `agent_ttl`, which it beats at while a unit of its asks `AtMostOnce=` or
    /// `stop_units_when_cut_off` is set).
    pub agent_heartbeat: Duration,
    /// The registration token a pull agent joins with, once.
    pub registration_token: Secret,
    pub state_dir: PathBuf,
    /// A native unit's log is rotated when it reaches this size...
    pub unit_log_max_bytes: u64,
    /// ...and this many files are kept per unit, the current one included.
    pub unit_log_files: u32,
    /// How long a clean shutdown waits for units to stop before killing what is left.
    pub shutdown_timeout: Duration,
    /// Stop this machine's units once it has been cut off from the store for `agent_ttl`.
    pub stop_units_when_cut_off: bool,
    /// Where git sources' credentials files are read, by the name a source gives.
    pub source_credentials_dir: PathBuf,
    /// The most units one git source may hold; a source that would hold more is halted.
    pub source_max_units: usize,
    /// Run native units where no cgroup v2 can hold their processes (`allow`), or refuse.
    pub native_without_cgroups: bool,
    /// The memory this machine offers units, in place of the kernel's less the reserve.
    pub capacity_memory: Option<u64>,
    /// The CPU (thousandths of a core) this machine offers units, in place of the kernel's.
    pub capacity_cpu: Option<u64>,
    /// What the kernel's memory keeps back for the system before units reserve any.
    pub system_reserved_memory: u64,
    /// What the kernel's CPUs keep back for the system (thousandths of a core).
    pub system_reserved_cpu: u64,
    /// How the engine chooses among the machines a unit fits on.
    pub placement_strategy: fleet_core::schedule::PlacementStrategy,
    /// `preemption = on`: a unit that fits nowhere may take the room of units of a lower
    /// `Priority=` (the engine leader's setting applies).
    pub preemption: bool,
    /// How many past versions each unit keeps (`fleetctl history`), at most
    /// `unit_history::MOST_KEPT`; the fleetd that writes a unit applies its own.
    pub unit_versions_kept: usize,
    /// How many of the cluster's events are kept (the engine leader trims the rest).
    pub events_kept: usize,
    /// How long the cluster's events are kept.
    pub events_kept_for: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            verbosity: 0,
            etcd_servers: Vec::new(),
            etcd_key_prefix: "/_coreos.com/fleet/".into(),
            etcd_request_timeout: Duration::from_secs(1),
            etcd_username: String::new(),
            etcd_password: Secret::default(),
            etcd_keyfile: String::new(),
            etcd_certfile: String::new(),
            etcd_cafile: String::new(),
            engine_reconcile_interval: Duration::from_secs(2),
            public_ip: String::new(),
            metadata: BTreeMap::new(),
            taints: BTreeMap::new(),
            agent_ttl: Duration::from_secs(30),
            units_directory: "/run/fleet/units/".into(),
            systemd_user: false,
            token_limit: 100,
            disable_engine: false,
            disable_watches: false,
            verify_units: false,
            authorized_keys_file: String::new(),
            machine_id: "/etc/machine-id".into(),
            unit_manager: UnitManagerChoice::Auto,
            api_listen: vec!["unix:///var/run/fleet.sock".into()],
            api_tls_cert_file: String::new(),
            api_tls_key_file: String::new(),
            api_tls_client_ca_file: String::new(),
            api_anonymous_role: None,
            api_max_connections: 512,
            agent_ca_cert_file: String::new(),
            agent_ca_key_file: String::new(),
            agent_cert_lifetime: Duration::from_secs(24 * 3600),
            secrets_key_file: String::new(),
            credentials_dir: "/run/fleet/credentials".into(),
            manager_url: String::new(),
            manager_ca_file: String::new(),
            agent_heartbeat: fleet_pull_agent::DEFAULT_IDLE_HEARTBEAT,
            registration_token: Secret::default(),
            state_dir: "/var/lib/fleet".into(),
            unit_log_max_bytes: 4 * 1024 * 1024,
            unit_log_files: 3,
            shutdown_timeout: Duration::from_secs(90),
            stop_units_when_cut_off: false,
            source_credentials_dir: "/etc/fleet/source-credentials".into(),
            source_max_units: fleet_core::source::content::DEFAULT_MAX_UNITS,
            native_without_cgroups: false,
            capacity_memory: None,
            capacity_cpu: None,
            system_reserved_memory: 256 << 20,
            system_reserved_cpu: 0,
            placement_strategy: fleet_core::schedule::PlacementStrategy::Spread,
            preemption: false,
            unit_versions_kept: fleet_core::unit_history::DEFAULT_KEPT,
            events_kept: fleet_core::events::DEFAULT_KEPT,
            events_kept_for: Duration::from_secs(fleet_core::events::DEFAULT_KEPT_SECONDS),
        }
    }
}

#[derive(Debug)]
pub enum ConfigError {
    Read(PathBuf, std::io::Error),
    NotAFile(PathBuf),
    Syntax { path: PathBuf, line: usize, text: String },
    UnknownOption { source: String, name: String },
    BadValue { name: String, value: String, reason: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(path, error) => {
                write!(f, "cannot read config file {}: {error}", path.display())
            }
            Self::NotAFile(path) => write!(f, "config file {} is not a file", path.display()),
            Self::Syntax { path, line, text } => {
                write!(f, "{}:{line}: expected \"option = value\", found {text:?}", path.display())
            }
            Self::UnknownOption { source, name } => {
                write!(f, "{source}: unknown option {name:?}")?;
                match fleet_core::closest::closest(name, OPTIONS.iter().map(|(known, _)| *known)) {
                    Some(nearest) => write!(f, "; did you mean {nearest:?}?"),
                    None => Ok(()),
                }
            }
            Self::BadValue { name, value, reason } => write!(f, "invalid value {value:?} for option {name}: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A file an option names, which must exist (or be empty: no file).
fn existing_file(name: &str, value: &str) -> Result<String, ConfigError> {
    if !value.is_empty() && !Path::new(value).is_file() {
        return Err(bad(name, value, "no such file"));
    }
    Ok(value.to_string())
}

/// Stores an option's value once it has been read.
fn assign<T>(field: &mut T, value: Result<T, ConfigError>) -> Result<(), ConfigError> {
    *field = value?;
    Ok(())
}

/// How an option's value is read into the configuration.
type Setter = fn(&mut Config, &str, &str) -> Result<(), ConfigError>;

/// Every option, spelled once: its name and how its value is read into the configuration.
/// A name not here is refused rather than ignored.
const OPTIONS: &[(&str, Setter)] = &[
    ("verbosity", |config, name, value| {
        assign(&mut config.verbosity, value.parse().map_err(|_| bad(name, value, "expected a whole number")))
    }),
    ("etcd_servers", |config, name, value| {
        let servers = parse_list(value);
        if let Some(server) =
            servers.iter().find(|server| !(server.starts_with("http://") || server.starts_with("https://")))
        {
            return Err(bad(name, server, "expected http://host:port or https://host:port"));
        }
        config.etcd_servers = servers;
        Ok(())
    }),
    ("etcd_username", |config, _name, value| assign(&mut config.etcd_username, Ok(value.to_string()))),
    ("etcd_password", |config, _name, value| assign(&mut config.etcd_password, Ok(Secret::new(value)))),
    ("etcd_keyfile", |config, name, value| assign(&mut config.etcd_keyfile, existing_file(name, value))),
    ("etcd_certfile", |config, name, value| assign(&mut config.etcd_certfile, existing_file(name, value))),
    ("etcd_cafile", |config, name, value| assign(&mut config.etcd_cafile, existing_file(name, value))),
    ("etcd_key_prefix", |config, _name, value| assign(&mut config.etcd_key_prefix, Ok(value.to_string()))),
    ("etcd_request_timeout", |config, name, value| {
        assign(&mut config.etcd_request_timeout, parse_seconds(name, value))
    }),
    ("engine_reconcile_interval", |config, name, value| {
        assign(&mut config.engine_reconcile_interval, parse_seconds(name, value))
    }),
    ("public_ip", |config, name, value| {
        if !value.is_empty() && value.parse::<std::net::IpAddr>().is_err() {
            return Err(bad(name, value, "expected an IP address"));
        }
        config.public_ip = value.to_string();
        Ok(())
    }),
    ("metadata", |config, _name, value| assign(&mut config.metadata, Ok(parse_metadata(value)))),
    ("taints", |config, name, value| {
        let taints = fleet_core::taint::parse_taints(value).map_err(|error| bad(name, value, &error.to_string()));
        assign(&mut config.taints, taints)
    }),
    ("agent_ttl", |config, name, value| assign(&mut config.agent_ttl, parse_go_duration(name, value))),
    ("units_directory", |config, _name, value| assign(&mut config.units_directory, Ok(value.into()))),
    ("systemd_user", |config, name, value| assign(&mut config.systemd_user, parse_config_bool(name, value))),
    ("token_limit", |config, name, value| {
        assign(
            &mut config.token_limit,
            value
                .parse::<u16>()
                .ok()
                .filter(|limit| *limit > 0)
                .ok_or_else(|| bad(name, value, "expected a whole number from 1 to 65535")),
        )
    }),
    ("disable_engine", |config, name, value| assign(&mut config.disable_engine, parse_config_bool(name, value))),
    ("disable_watches", |config, name, value| assign(&mut config.disable_watches, parse_config_bool(name, value))),
    ("verify_units", |config, name, value| assign(&mut config.verify_units, parse_config_bool(name, value))),
    ("enable_grpc", |_config, name, value| {
        parse_config_bool(name, value)?;
        Ok(())
    }),
    ("authorized_keys_file", |config, _name, value| assign(&mut config.authorized_keys_file, Ok(value.to_string()))),
    ("machine_id", |config, name, value| {
        if value.is_empty() {
            return Err(bad(name, value, "expected a machine ID or the file holding it"));
        }
        config.machine_id = value.to_string();
        Ok(())
    }),
    ("unit_log_max_bytes", |config, name, value| assign(&mut config.unit_log_max_bytes, parse_size(name, value))),
    ("unit_log_files", |config, name, value| {
        assign(
            &mut config.unit_log_files,
            value
                .parse::<u32>()
                .ok()
                .filter(|files| (1..=1000).contains(files))
                .ok_or_else(|| bad(name, value, "expected a whole number from 1 to 1000")),
        )
    }),
    ("shutdown_timeout", |config, name, value| assign(&mut config.shutdown_timeout, parse_go_duration(name, value))),
    ("source_credentials_dir", |config, _name, value| assign(&mut config.source_credentials_dir, Ok(value.into()))),
    ("stop_units_when_cut_off", |config, name, value| {
        assign(&mut config.stop_units_when_cut_off, parse_config_bool(name, value))
    }),
    ("unit_manager", |config, name, value| {
        config.unit_manager = match value {
            "auto" => UnitManagerChoice::Auto,
            "systemd" => UnitManagerChoice::Systemd,
            "native" => UnitManagerChoice::Native,
            _ => return Err(bad(name, value, "expected auto, systemd or native")),
        };
        Ok(())
    }),
    ("api_listen", |config, name, value| {
        let listen = parse_list(value);
        for entry in &listen {
            if fleet_api::listen::ListenAddress::parse(entry).is_none() {
                return Err(bad(name, entry, "expected unix:///path, http://host:port or https://host:port"));
            }
        }
        config.api_listen = listen;
        Ok(())
    }),
    ("api_tls_cert_file", |config, name, value| assign(&mut config.api_tls_cert_file, existing_file(name, value))),
    ("api_tls_key_file", |config, name, value| assign(&mut config.api_tls_key_file, existing_file(name, value))),
    ("api_tls_client_ca_file", |config, name, value| {
        assign(&mut config.api_tls_client_ca_file, existing_file(name, value))
    }),
    ("api_anonymous_role", |config, name, value| {
        let role = match value {
            "" | "none" => None,
            "admin" | "operator" | "viewer" => fleet_core::access::Role::parse(value, None).ok(),
            _ => return Err(bad(name, value, "expected none, viewer, operator or admin")),
        };
        config.api_anonymous_role = role;
        Ok(())
    }),
    // Empty: the kernel's, less the system's reserve.
    ("capacity_memory", |config, name, value| {
        let given = (!value.is_empty()).then(|| parse_resource_size(name, value)).transpose();
        assign(&mut config.capacity_memory, given)
    }),
    ("capacity_cpu", |config, name, value| {
        let given = (!value.is_empty()).then(|| parse_resource_cores(name, value)).transpose();
        assign(&mut config.capacity_cpu, given)
    }),
    ("system_reserved_memory", |config, name, value| {
        assign(&mut config.system_reserved_memory, parse_resource_size(name, value))
    }),
    ("system_reserved_cpu", |config, name, value| {
        assign(&mut config.system_reserved_cpu, parse_resource_cores(name, value))
    }),
    ("preemption", |config, name, value| assign(&mut config.preemption, parse_config_bool(name, value))),
    ("unit_versions_kept", |config, name, value| {
        let kept = fleet_core::unit_history::parse_kept(value).map_err(|error| bad(name, value, &error));
        assign(&mut config.unit_versions_kept, kept)
    }),
    ("events_kept", |config, name, value| {
        let most = fleet_core::events::MOST_KEPT;
        match value.trim().parse::<usize>() {
            Ok(kept) if (1..=most).contains(&kept) => assign(&mut config.events_kept, Ok(kept)),
            _ => Err(bad(name, value, &format!("expected a whole number from 1 to {most}"))),
        }
    }),
    ("events_kept_for", |config, name, value| {
        let kept_for = parse_go_duration(name, value)?;
        if kept_for < Duration::from_secs(60) || kept_for > Duration::from_secs(90 * 86_400) {
            return Err(bad(name, value, "expected a duration from 1m to 2160h (90 days)"));
        }
        assign(&mut config.events_kept_for, Ok(kept_for))
    }),
    ("placement_strategy", |config, name, value| {
        assign(&mut config.placement_strategy, value.parse().map_err(|reason: String| bad(name, value, &reason)))
    }),
    ("native_without_cgroups", |config, name, value| {
        let allow = match value {
            "refuse" => Ok(false),
            "allow" => Ok(true),
            _ => Err(bad(name, value, "expected refuse or allow")),
        };
        assign(&mut config.native_without_cgroups, allow)
    }),
    ("source_max_units", |config, name, value| assign(&mut config.source_max_units, parse_count(name, value))),
    ("api_max_connections", |config, name, value| assign(&mut config.api_max_connections, parse_count(name, value))),
    ("agent_ca_cert_file", |config, name, value| assign(&mut config.agent_ca_cert_file, existing_file(name, value))),
    ("agent_ca_key_file", |config, name, value| assign(&mut config.agent_ca_key_file, existing_file(name, value))),
    ("secrets_key_file", |config, name, value| assign(&mut config.secrets_key_file, existing_file(name, value))),
    ("credentials_dir", |config, _name, value| assign(&mut config.credentials_dir, Ok(value.into()))),
    ("agent_cert_lifetime", |config, name, value| {
        assign(&mut config.agent_cert_lifetime, parse_go_duration(name, value))
    }),
    ("manager_url", |config, name, value| {
        if !value.is_empty() && !value.starts_with("https://") {
            return Err(bad(name, value, "expected https://host:port"));
        }
        assign(&mut config.manager_url, Ok(value.trim_end_matches('/').to_string()))
    }),
    ("manager_ca_file", |config, name, value| assign(&mut config.manager_ca_file, existing_file(name, value))),
    ("agent_heartbeat", |config, name, value| {
        // A manager takes a heartbeat period of whole seconds up to an hour.
        let every = parse_go_duration(name, value)?;
        let longest = Duration::from_secs(fleet_api::schema::LONGEST_STREAM_HEARTBEAT_SECONDS);
        if every < Duration::from_secs(1) || every > longest {
            return Err(bad(name, value, "expected a duration from 1s to 1h"));
        }
        assign(&mut config.agent_heartbeat, Ok(every))
    }),
    ("registration_token", |config, _name, value| assign(&mut config.registration_token, Ok(Secret::new(value)))),
    ("state_dir", |config, _name, value| assign(&mut config.state_dir, Ok(value.into()))),
];

/// Strips one pair of matching quotes.
fn unquote(value: &str) -> &str {
    let value = value.trim();
    for quote in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(quote).and_then(|v| v.strip_suffix(quote)) {
            return inner;
        }
    }
    value
}

/// Reads fleet.conf text into option → value.
pub fn parse_file(path: &Path, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut values = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') || line.starts_with('[') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(ConfigError::Syntax { path: path.to_path_buf(), line: index + 1, text: line.to_string() });
        };
        let name = name.trim().to_string();
        if !OPTIONS.iter().any(|(known, _)| *known == name) {
            return Err(ConfigError::UnknownOption { source: path.display().to_string(), name });
        }
        values.insert(name, unquote(value).to_string());
    }
    Ok(values)
}

/// The original's list syntax: split on `,`, each item trimmed of spaces, quotes and brackets.
fn parse_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|item| item.trim_start_matches([' ', '[', '"']).trim_end_matches([' ', ']', '"']).to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// fleet.conf's boolean grammar (the original's flag parsing): `1 t true yes on` or
/// `0 f false no off` and empty, in any case; anything else is an error naming the option.
/// A count bound from 1 to a million (connections, units).
fn parse_count(name: &str, value: &str) -> Result<usize, ConfigError> {
    let count = value.parse::<usize>().ok().filter(|count| (1..=1_000_000).contains(count));
    count.ok_or_else(|| bad(name, value, "expected a whole number from 1 to 1000000"))
}

fn parse_config_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(bad(name, value, "expected true or false")),
    }
}

fn bad(name: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::BadValue { name: name.to_string(), value: value.to_string(), reason: reason.to_string() }
}

fn parse_seconds(name: &str, value: &str) -> Result<Duration, ConfigError> {
    value
        .parse::<f64>()
        .ok()
        .filter(|seconds| *seconds > 0.0)
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
        .ok_or_else(|| bad(name, value, "expected a positive number of seconds"))
}

/// Go's duration syntax (`30s`, `1m30s`, `500ms`).
pub fn parse_go_duration(name: &str, value: &str) -> Result<Duration, ConfigError> {
    fleet_core::duration::parse_go_duration(value).map_err(|error| bad(name, value, &error.to_string()))
}

/// An amount of memory as units reserve it (`16G`, `512M`, `1.5G`).
fn parse_resource_size(name: &str, value: &str) -> Result<u64, ConfigError> {
    match fleet_core::resources::parse_bytes(value) {
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(bad(name, value, "expected a size such as 16G")),
        Err(error) => Err(bad(name, value, &error.to_string())),
    }
}

/// A number of cores (`4`, `0.5`), in thousandths of a core.
fn parse_resource_cores(name: &str, value: &str) -> Result<u64, ConfigError> {
    fleet_core::resources::parse_cores(value).map_err(|error| bad(name, value, &error.to_string()))
}

/// A size in bytes, with an optional `K`, `M` or `G` (powers of 1024); at least 4 KiB.
fn parse_size(name: &str, value: &str) -> Result<u64, ConfigError> {
    let (digits, scale) = match value.trim().to_ascii_uppercase() {
        text if text.ends_with('K') => (text.trim_end_matches('K').to_string(), 1u64 << 10),
        text if text.ends_with('M') => (text.trim_end_matches('M').to_string(), 1 << 20),
        text if text.ends_with('G') => (text.trim_end_matches('G').to_string(), 1 << 30),
        text => (text, 1),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(scale))
        .filter(|bytes| *bytes >= 4096)
        .ok_or_else(|| bad(name, value, "expected a size of at least 4096 bytes, such as 4M"))
}

impl Config {
    /// Reads the config file (the given one must exist; the default one may not) and the
    /// environment.
    pub fn load(path: Option<&Path>, environment: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut values = BTreeMap::new();
        let (path, required) = match path {
            Some(path) => (path.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        match std::fs::metadata(&path) {
            Ok(metadata) if !metadata.is_file() => return Err(ConfigError::NotAFile(path)),
            Ok(_) => {
                let text = std::fs::read_to_string(&path).map_err(|error| ConfigError::Read(path.clone(), error))?;
                values = parse_file(&path, &text)?;
            }
            Err(error) if required => return Err(ConfigError::Read(path, error)),
            Err(_) => {}
        }
        for (option, _) in OPTIONS {
            if let Some(value) = environment.get(&format!("FLEET_{}", option.to_ascii_uppercase())) {
                values.insert(option.to_string(), value.clone());
            }
        }
        Self::from_values(&values)
    }

    pub fn from_values(values: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for (name, value) in values {
            let Some((_, set)) = OPTIONS.iter().find(|(known, _)| known == name) else {
                return Err(ConfigError::UnknownOption { source: "configuration".into(), name: name.clone() });
            };
            set(&mut config, name, value.trim())?;
        }
        Ok(config)
    }

    /// The machine ID: the value itself, or the first line of the file it names.
    pub fn resolve_machine_id(&self) -> Result<String, ConfigError> {
        let id = if self.machine_id.starts_with('/') {
            std::fs::read_to_string(&self.machine_id)
                .map_err(|error| bad("machine_id", &self.machine_id, &error.to_string()))?
                .trim()
                .to_string()
        } else {
            self.machine_id.clone()
        };
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(bad("machine_id", &id, "unable to determine local machine ID"));
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_documented_once_with_its_true_default() {
        use crate::config_docs::{OPTION_DOCS, sample_config};
        let documented: Vec<&str> = OPTION_DOCS.iter().map(|option| option.name).collect();
        let mut sorted = documented.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let mut read: Vec<&str> = OPTIONS.iter().map(|(name, _)| *name).collect();
        read.sort_unstable();
        assert_eq!(sorted, read, "OPTION_DOCS and OPTIONS name the same options");
        assert_eq!(sorted.len(), documented.len(), "each option is documented once");
        // The sample's options, uncommented, are the defaults.
        let sample = sample_config();
        let uncommented: String = sample
            .lines()
            .map(|line| match line.strip_prefix('#') {
                Some(rest) if rest.contains(" = ") && !rest.starts_with(' ') => rest,
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let values = parse_file(Path::new("fleet.conf"), &uncommented).expect("the sample parses");
        assert_eq!(values.len(), OPTIONS.len(), "{uncommented}");
        assert_eq!(Config::from_values(&values).expect("the defaults are valid"), Config::default());
    }

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn file_environment_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.conf");
        std::fs::write(&path, "# comment\nmetadata=\"region=us-west,az=us-west-1\"\nagent_ttl = \"3s\"\netcd_servers=[\"http://a:2379\",\"http://b:2379\"]\ntoken_limit=5\n").unwrap();
        let environment = values(&[("FLEET_TOKEN_LIMIT", "7"), ("FLEET_STATE_DIR", "/tmp/x"), ("OTHER", "1")]);
        let config = Config::load(Some(&path), &environment).unwrap();
        assert_eq!(config.metadata["az"], "us-west-1");
        assert_eq!(config.agent_ttl, Duration::from_secs(3));
        assert_eq!(config.etcd_servers, vec!["http://a:2379", "http://b:2379"]);
        assert_eq!(config.token_limit, 7, "the environment wins");
        assert_eq!(config.state_dir, PathBuf::from("/tmp/x"));
        assert_eq!(config.engine_reconcile_interval, Duration::from_secs(2));
    }

    #[test]
    fn bad_values_name_the_option() {
        let cases = [
            ("token_limit", "0", "invalid value \"0\" for option token_limit: expected a whole number from 1 to 65535"),
            (
                "unit_versions_kept",
                "1001",
                "invalid value \"1001\" for option unit_versions_kept: expected a whole number from 0 to 1000",
            ),
            ("agent_ttl", "soon", "invalid value \"soon\" for option agent_ttl: expected a duration such as 30s"),
            (
                "events_kept",
                "0",
                "invalid value \"0\" for option events_kept: expected a whole number from 1 to 10000000",
            ),
            (
                "events_kept_for",
                "10s",
                "invalid value \"10s\" for option events_kept_for: expected a duration from 1m to 2160h (90 days)",
            ),
            (
                "agent_heartbeat",
                "2h",
                "invalid value \"2h\" for option agent_heartbeat: expected a duration from 1s to 1h",
            ),
            (
                "unit_manager",
                "docker",
                "invalid value \"docker\" for option unit_manager: expected auto, systemd or native",
            ),
            ("disable_engine", "maybe", "invalid value \"maybe\" for option disable_engine: expected true or false"),
            ("public_ip", "x.y", "invalid value \"x.y\" for option public_ip: expected an IP address"),
            (
                "api_listen",
                "unix://relative",
                "invalid value \"unix://relative\" for option api_listen: expected unix:///path, http://host:port or https://host:port",
            ),
            (
                "api_anonymous_role",
                "root",
                "invalid value \"root\" for option api_anonymous_role: expected none, viewer, operator or admin",
            ),
            (
                "api_max_connections",
                "0",
                "invalid value \"0\" for option api_max_connections: expected a whole number from 1 to 1000000",
            ),
            (
                "manager_url",
                "http://m:1",
                "invalid value \"http://m:1\" for option manager_url: expected https://host:port",
            ),
            (
                "engine_reconcile_interval",
                "-1",
                "invalid value \"-1\" for option engine_reconcile_interval: expected a positive number of seconds",
            ),
            // Regression: a span too large for a Duration panicked fleetd at start.
            (
                "agent_ttl",
                "99999999999999999999999s",
                "invalid value \"99999999999999999999999s\" for option agent_ttl: duration out of range",
            ),
            (
                "etcd_request_timeout",
                "1e300",
                "invalid value \"1e300\" for option etcd_request_timeout: expected a positive number of seconds",
            ),
            (
                "unit_log_max_bytes",
                "12",
                "invalid value \"12\" for option unit_log_max_bytes: expected a size of at least 4096 bytes, such as 4M",
            ),
            (
                "unit_log_max_bytes",
                "99999999999G",
                "invalid value \"99999999999G\" for option unit_log_max_bytes: expected a size of at least 4096 bytes, such as 4M",
            ),
            (
                "unit_log_files",
                "0",
                "invalid value \"0\" for option unit_log_files: expected a whole number from 1 to 1000",
            ),
        ];
        let sizes = Config::from_values(&values(&[("unit_log_max_bytes", "8M"), ("unit_log_files", "5")])).unwrap();
        assert_eq!((sizes.unit_log_max_bytes, sizes.unit_log_files), (8 << 20, 5));
        for (name, value, message) in cases {
            assert_eq!(Config::from_values(&values(&[(name, value)])).unwrap_err().to_string(), message);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.conf");
        std::fs::write(&path, "tokn_limit=5\n").unwrap();
        assert!(
            Config::load(Some(&path), &BTreeMap::new())
                .unwrap_err()
                .to_string()
                .ends_with("unknown option \"tokn_limit\"; did you mean \"token_limit\"?")
        );
        assert!(Config::load(Some(&dir.path().join("missing")), &BTreeMap::new()).is_err());
        assert!(matches!(Config::load(Some(dir.path()), &BTreeMap::new()), Err(ConfigError::NotAFile(_))));
    }

    #[test]
    fn machine_id_from_value_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("machine-id");
        std::fs::write(&file, "abc123\n").unwrap();
        let from_file = Config { machine_id: file.display().to_string(), ..Config::default() };
        assert_eq!(from_file.resolve_machine_id().unwrap(), "abc123");
        let direct = Config { machine_id: "m-1".into(), ..Config::default() };
        assert_eq!(direct.resolve_machine_id().unwrap(), "m-1");
        let empty_file = dir.path().join("empty");
        std::fs::write(&empty_file, "").unwrap();
        assert!(
            Config { machine_id: empty_file.display().to_string(), ..Config::default() }.resolve_machine_id().is_err()
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("x", "1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("x", "500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_go_duration("x", "0s").is_err());
        assert!(parse_go_duration("x", "5").is_err());
    }
}
