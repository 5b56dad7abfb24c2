//! fleetd(8), written from the same tables as `fleetd -help`: the flags and every fleet.conf
//! option with its default.

use roff::{Roff, bold, italic, roman};

use crate::config_docs::OPTION_DOCS;

/// fleetd's flags (Go style: one dash, or two) and what they do.
pub const FLAGS: &[(&str, Option<&str>, &str)] = &[
    (
        "-config",
        Some("PATH"),
        "Read the configuration from PATH instead of /etc/fleet/fleet.conf (which may be absent).",
    ),
    ("-version", None, "Print the version and exit."),
    ("-help", None, "Print the usage and every fleet.conf option, and exit."),
    ("-manual", None, "Print this manual page (roff) and exit."),
    ("-sample-config", None, "Print a fleet.conf with every option at its default, commented out, and exit."),
    (
        "-make-certificates",
        Some("DIR"),
        "Make the cluster's TLS certificates in DIR (the API CA, a server certificate, the administrator's \
         client certificate, the agent CA; keys 0600, nothing overwritten), print the fleet.conf lines and \
         fleetctl flags that use them, and exit.",
    ),
    (
        "-hosts",
        Some("NAMES"),
        "With -make-certificates: the comma-separated host names and addresses the API is reached at \
         (localhost and 127.0.0.1 are always included).",
    ),
    (
        "-rotate-secrets-key",
        Some("FILE"),
        "Put a new key in front of the secrets key file FILE (the others kept, to open what they sealed) and \
         exit. Then: copy FILE to every member, SIGHUP them, fleetctl secret reseal, and \
         -rotate-secrets-key FILE -drop-old-keys (copied again) once every value is sealed under the new key.",
    ),
    ("-drop-old-keys", None, "With -rotate-secrets-key: keep only the key that seals, drop the others."),
    (
        "-restore",
        Some("FILE"),
        "Put the snapshot FILE (made by fleetctl backup) in place of the embedded store of the stopped fleetd \
         the configuration names, once it is checked whole; the store it replaces is kept as \
         registry.redb.before-restore. Refused while that fleetd runs, and on etcd (use etcdctl snapshot).",
    ),
];

pub fn manual_page(version: &str) -> String {
    let mut page = Roff::new();
    page.control("TH", ["FLEETD", "8", "", &format!("fleetd {version}"), "fleet"]);
    page.control("SH", ["NAME"])
        .text([roman("fleetd - the fleet daemon: engine, agent and HTTP API on every machine")]);
    page.control("SH", ["SYNOPSIS"]).text([
        bold("fleetd"),
        roman(" ["),
        bold("-config"),
        roman(" "),
        italic("PATH"),
        roman("]"),
    ]);
    page.control("SH", ["DESCRIPTION"]).text([roman(
        "fleetd schedules systemd units across a cluster of machines. Every machine runs one fleetd: its agent runs \
         the units scheduled to the machine, one engine of the cluster decides where units run, and its HTTP API \
         (the original fleet's API v1) serves fleetctl. The cluster's state is in etcd when etcd_servers is set, in \
         an embedded store for a single machine otherwise, or with a manager that a pull agent reaches over HTTPS.",
    )]);
    page.control("SH", ["OPTIONS"]);
    for (flag, value, help) in FLAGS {
        page.control("TP", []);
        match value {
            Some(value) => page.text([bold(*flag), roman(" "), italic(*value)]),
            None => page.text([bold(*flag)]),
        };
        page.text([roman(*help)]);
    }
    page.control("SH", ["CONFIGURATION"]).text([roman(
        "fleet.conf holds one option = value per line; # starts a comment. The variable FLEET_ followed by an \
         option's name in capitals overrides the file. An unknown option or a bad value stops fleetd with the \
         option's name.",
    )]);
    for option in OPTION_DOCS {
        page.control("TP", []);
        if option.default.is_empty() {
            page.text([bold(option.name)]);
        } else {
            page.text([bold(option.name), roman(" (default "), italic(option.default), roman(")")]);
        }
        page.text([roman(option.help)]);
    }
    page.control("SH", ["SIGNALS"]).text([roman(
        "SIGTERM and SIGINT stop fleetd cleanly: its units are stopped (for at most shutdown_timeout) and handed to \
         other machines at once. SIGHUP reads the configuration again (token_limit, the API's TLS certificate). \
         SIGUSR2 upgrades in place: once the binary fleetd was started from (by then the new release) runs, \
         fleetd replaces itself with it, keeping its PID, its machine's presence and its units, which run on \
         under either unit manager.",
    )]);
    page.control("SH", ["SYSTEMD"]).text([roman(
        "Run under systemd as fleet.service (Type=notify): fleetd reports ready once its API answers, keeps a \
         status line, and pings the watchdog when WatchdogSec is set. fleet.socket may pass it its API sockets.",
    )]);
    page.control("SH", ["FILES"]).text([roman("/etc/fleet/fleet.conf, /var/lib/fleet, /var/run/fleet.sock")]);
    page.control("SH", ["SEE ALSO"]).text([bold("fleetctl"), roman("(1), "), bold("systemd.service"), roman("(5)")]);
    page.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manual_names_every_option() {
        let page = manual_page("0.1.0");
        assert!(page.contains(".TH FLEETD 8"), "{page}");
        for option in OPTION_DOCS {
            assert!(page.contains(&format!("\\fB{}\\fR", option.name)), "{} missing", option.name);
        }
        assert!(page.contains("\\fB\\-config\\fR \\fIPATH\\fR"), "{page}");
    }
}
