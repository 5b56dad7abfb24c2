//! What every fleet.conf option means: the one text behind `fleetd -help`, the fleetd(8)
//! manual and the sample fleet.conf that the install script puts in place. A test checks
//! that it names exactly the options fleetd reads.

/// One option: its name, its default as written in fleet.conf, and what it does.
pub struct OptionDoc {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

const fn doc(name: &'static str, default: &'static str, help: &'static str) -> OptionDoc {
    OptionDoc { name, default, help }
}

pub const OPTION_DOCS: &[OptionDoc] = &[
    doc("machine_id", "/etc/machine-id", "The machine ID, or a file holding it."),
    doc(
        "state_dir",
        "/var/lib/fleet",
        "Where the embedded store (registry.redb), native unit logs and credentials live.",
    ),
    doc(
        "public_ip",
        "",
        "The IP address other machines and fleetctl ssh reach this machine at; the first non-loopback address when empty.",
    ),
    doc(
        "metadata",
        "",
        "This machine's metadata for scheduling, as key=value pairs separated by commas (region=eu,disk=ssd).",
    ),
    doc(
        "taints",
        "",
        "Taints keeping this machine for the units that tolerate them ([X-Fleet] Tolerate=), separated by commas: key or key=value, :evict to move off the units already here that do not (gpu=yes,db:evict). A pull agent announces its own to its manager; fleetctl machine taint sets and removes taints on any machine over these.",
    ),
    doc("etcd_servers", "", "Comma-separated etcd v3 endpoints (http:// or https://); the embedded store when empty."),
    doc("etcd_key_prefix", "/_coreos.com/fleet/", "The keyspace of fleet's data in etcd."),
    doc("etcd_request_timeout", "1.0", "Seconds each etcd request may take."),
    doc("etcd_cafile", "", "The CA of etcd's server certificate (PEM)."),
    doc("etcd_certfile", "", "The client certificate presented to etcd (PEM)."),
    doc("etcd_keyfile", "", "The key of etcd_certfile (PEM)."),
    doc("etcd_username", "", "The etcd user, when etcd has authentication on."),
    doc("etcd_password", "", "That user's password."),
    doc(
        "agent_ttl",
        "30s",
        "How long a machine may stop renewing its presence before the cluster treats it as lost and moves its units.",
    ),
    doc(
        "stop_units_when_cut_off",
        "false",
        "Stop this machine's units once it has been cut off from etcd for agent_ttl, when they may start elsewhere: a unit then runs on two machines for at most a moment, but an etcd outage longer than agent_ttl stops every unit. Off: a cut-off machine keeps its units until it reaches etcd again.",
    ),
    doc(
        "source_credentials_dir",
        "/etc/fleet/source-credentials",
        "Where the engine leader reads git sources' credentials: a source names a file of this directory (USER:PASSWORD, or a token), so that no secret is kept in the registry. Give every machine that may lead the same files, 0600.",
    ),
    doc(
        "capacity_memory",
        "",
        "The memory this machine offers units that reserve some ([X-Fleet] Memory=, or their MemoryMax=): 16G, 512M. When empty, the kernel's total less system_reserved_memory. Set it on machines that share their host.",
    ),
    doc(
        "capacity_cpu",
        "",
        "The cores this machine offers units that reserve some ([X-Fleet] CPU=, or their CPUQuota=): 4, 0.5. When empty, the CPUs fleetd may use less system_reserved_cpu.",
    ),
    doc("system_reserved_memory", "256M", "Memory kept back for the system when capacity_memory is empty."),
    doc("system_reserved_cpu", "0", "Cores kept back for the system when capacity_cpu is empty."),
    doc(
        "placement_strategy",
        "spread",
        "How the engine chooses among the machines a unit fits on: spread (the one with the most room left, then the fewest units) or binpack (the fullest that still fits, keeping whole machines free). The engine leader's setting applies: give every machine that may lead the same.",
    ),
    doc(
        "preemption",
        "off",
        "Whether a unit that fits nowhere may take the room of units of a lower [X-Fleet] Priority= (on or off): the fewest, lowest first, at most 16 in an engine pass; they wait elsewhere, saying who took their room. The engine leader's setting applies: give every machine that may lead the same.",
    ),
    doc(
        "unit_versions_kept",
        "20",
        "How many past versions of each unit the store keeps for fleetctl history and revert (0 to 1000): each change of a unit's content or desired state makes a version. The fleetd that writes a unit applies its own setting: give every machine the same.",
    ),
    doc(
        "events_kept",
        "100000",
        "How many of the cluster's events (fleetctl events, GET /fleet/v1/events) are kept, 1 to 10000000: the engine leader trims the oldest beyond it, whole batches at a time. The engine leader's setting applies.",
    ),
    doc(
        "events_kept_for",
        "24h",
        "How long the cluster's events are kept, from 1m to 2160h: the engine leader trims those older. A reader resuming from an index trimmed away is told so (410) with the oldest index kept.",
    ),
    doc(
        "native_without_cgroups",
        "refuse",
        "What the native unit manager does where no cgroup v2 hierarchy can hold a unit's processes (fleetd mounts one at /run/fleet/cgroup2 when it runs as root and none is mounted): refuse to start, or allow units tracked by process group and environment only. With allow, a process that leaves its unit's session and clears its environment outlives the unit's stop.",
    ),
    doc(
        "source_max_units",
        "10000",
        "The most units one git source may hold, its unit files and the template instances its fleet-desired.conf names together. A source that would hold more is halted (nothing of it changes) and its status names the line that crossed the bound.",
    ),
    doc(
        "engine_reconcile_interval",
        "2",
        "Seconds between the engine's fallback reconciles (it wakes on changes besides).",
    ),
    doc("disable_engine", "false", "Keep this machine out of the engine's leader election."),
    doc("disable_watches", "false", "Accepted and ignored: agents watch only their own schedule."),
    doc("token_limit", "100", "The largest page the API answers a list with."),
    doc("verbosity", "0", "1 or more logs at debug level (FLEETD_LOG overrides it with a tracing filter)."),
    doc(
        "unit_manager",
        "auto",
        "systemd (units handed to systemd over D-Bus), native (the built-in supervisor), or auto: systemd when it runs, native otherwise.",
    ),
    doc(
        "units_directory",
        "/run/fleet/units/",
        "Where the systemd unit manager writes unit files before linking them into systemd's runtime unit path.",
    ),
    doc(
        "systemd_user",
        "false",
        "Drive the user's systemd instance on the session bus instead of the system instance.",
    ),
    doc(
        "unit_log_max_bytes",
        "4M",
        "Native supervisor: a unit's log is rotated at this size (K, M, G suffixes; at least 4096).",
    ),
    doc("unit_log_files", "3", "Native supervisor: how many log files a unit keeps, the current one included."),
    doc(
        "shutdown_timeout",
        "90s",
        "How long a clean shutdown (SIGTERM) waits for units to stop before it kills what is left.",
    ),
    doc(
        "api_listen",
        "unix:///var/run/fleet.sock",
        "Comma-separated unix:///path, http://host:port and https://host:port listeners of the API; sockets passed by systemd take precedence. Plain HTTP is refused off loopback.",
    ),
    doc("api_tls_cert_file", "", "The server certificate (PEM) of https:// listeners; read again on SIGHUP."),
    doc("api_tls_key_file", "", "The key of api_tls_cert_file (PEM)."),
    doc(
        "api_tls_client_ca_file",
        "",
        "Clients may present a certificate this CA signed (mutual TLS): its CN is the identity, its O the role.",
    ),
    doc(
        "api_anonymous_role",
        "none",
        "The role (viewer, operator, admin) of TCP clients without a credential, such as the original fleetctl.",
    ),
    doc(
        "api_max_connections",
        "512",
        "Connections each API listener holds at once (a manager holds one per pull agent).",
    ),
    doc(
        "agent_ca_cert_file",
        "",
        "The cluster's agent CA certificate (PEM): with its key, this fleetd signs certificates for machines that join with a registration token.",
    ),
    doc("agent_ca_key_file", "", "The key of agent_ca_cert_file (PEM)."),
    doc(
        "secrets_key_file",
        "",
        "The cluster's secrets key, the same file on every member (fleetd -make-certificates makes it, 0600): it seals the values of secrets, which no store holds in the clear. Empty: secrets.key beside agent_ca_key_file; on the embedded store without one, the state directory's own, made when the first secret is set.",
    ),
    doc(
        "credentials_dir",
        "/run/fleet/credentials",
        "Where the units' credentials (the values of the secrets they name) are written for them, on a tmpfs: <credentials_dir>/<machine ID>/<unit>, readable by the unit's user alone, removed with the unit.",
    ),
    doc("agent_cert_lifetime", "24h", "How long a joined machine's certificate is valid (renewed at two thirds)."),
    doc(
        "manager_url",
        "",
        "A pull agent's manager (https://host:port): set, this fleetd has no store of its own and pulls its work from it.",
    ),
    doc("manager_ca_file", "", "The CA of the manager's certificate (PEM); the system's roots when empty."),
    doc(
        "agent_heartbeat",
        "5m",
        "How often an idle pull agent beats on its change stream: its connection is watched by the kernels of both ends, so that a lost agent or manager is still noticed within agent_ttl. While a unit of it asks AtMostOnce= (or stop_units_when_cut_off is set) it beats every third of agent_ttl, the proof such a unit runs on.",
    ),
    doc("registration_token", "", "The registration token a pull agent joins with, once."),
    doc("enable_grpc", "false", "Accepted and ignored (the original's experimental gRPC registry)."),
    doc("verify_units", "false", "Accepted for the original's configurations; signed units are not supported."),
    doc("authorized_keys_file", "", "Accepted for the original's configurations; unused."),
];

/// `fleetd -help`: the usage and every option.
pub fn help_text(usage: &str, flags: &[(&str, Option<&str>, &str)]) -> String {
    let mut text = format!(
        "{usage}\n\nfleetd runs the engine, the agent and the HTTP API of a fleet cluster on this machine.\n\
         It reads /etc/fleet/fleet.conf (or -config PATH); FLEET_<OPTION> environment variables override it.\n\nFlags:\n"
    );
    for (flag, value, help) in flags {
        let flag = value.map_or(flag.to_string(), |value| format!("{flag} {value}"));
        text.push_str(&format!("  {flag}\n      {help}\n"));
    }
    text.push_str("\nOptions of fleet.conf:\n");
    for option in OPTION_DOCS {
        let default = if option.default.is_empty() { String::new() } else { format!(" (default {})", option.default) };
        text.push_str(&format!("  {}{default}\n      {}\n", option.name, option.help));
    }
    text
}

/// A fleet.conf with every option commented out at its default, each with its meaning.
pub fn sample_config() -> String {
    let mut text = String::from(
        "# fleetd's configuration. Every option is shown at its default, commented out.\n\
         # FLEET_<OPTION> environment variables override what is set here.\n",
    );
    for option in OPTION_DOCS {
        text.push_str(&format!("\n# {}\n#{} = {}\n", option.help, option.name, option.default));
    }
    text
}
