//! TLS in one step: `fleetd -make-certificates` makes the cluster's certificates, and the lines
//! it prints are enough for a fleetd to serve HTTPS and for fleetctl to reach it as the
//! administrator; without the CA, fleetctl is told to give `--ca-file`.

use std::process::Command;

use fleet_e2e::{Fleetd, Ran, binary};

use fleet_testkit::free_port;

/// The value of `key = value` among the printed lines.
fn printed<'a>(lines: &'a str, key: &str) -> &'a str {
    lines
        .lines()
        .find_map(|line| line.strip_prefix(key)?.trim_start().strip_prefix('=').map(str::trim))
        .unwrap_or_else(|| panic!("{key} is not among the printed lines:\n{lines}"))
}

#[test]
fn the_printed_lines_make_an_https_fleetd_and_fleetctl_reaches_it_as_the_administrator() {
    let dir = tempfile::tempdir().expect("dir");
    let tls = dir.path().join("tls");
    let made = Ran::from(
        Command::new(binary("fleetd"))
            .args(["-make-certificates", &tls.display().to_string(), "-hosts", "localhost"])
            .output()
            .expect("run fleetd"),
    );
    assert_eq!(made.code, 0, "{made:?}");
    let lines = made.stdout.as_str();
    let port = free_port();
    let config = [
        ("api_listen", format!("unix://{{socket}},https://127.0.0.1:{port}")),
        ("api_tls_cert_file", printed(lines, "api_tls_cert_file").to_string()),
        ("api_tls_key_file", printed(lines, "api_tls_key_file").to_string()),
        ("api_tls_client_ca_file", printed(lines, "api_tls_client_ca_file").to_string()),
        ("agent_ca_cert_file", printed(lines, "agent_ca_cert_file").to_string()),
        ("agent_ca_key_file", printed(lines, "agent_ca_key_file").to_string()),
    ];
    let pairs: Vec<(&str, &str)> = config.iter().map(|(key, value)| (*key, value.as_str())).collect();
    let fleetd = Fleetd::start("e2e0tlsonestep01", &pairs);
    // The fleetctl line printed, pointed at this test's port.
    let command = lines.lines().find(|line| line.starts_with("fleetctl ")).expect("a fleetctl line");
    let flags: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .filter(|word| *word != "list-machines")
        .map(|word| word.replace(":4002", &format!(":{port}")))
        .collect();
    let fleetctl = |flags: &[String]| {
        Ran::from(
            Command::new(binary("fleetctl"))
                .args(flags)
                .arg("list-machines")
                .env_remove("FLEETCTL_ENDPOINT")
                .env_remove("FLEETCTL_TOKEN")
                .output()
                .expect("run fleetctl"),
        )
    };
    let listed = fleetctl(&flags);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("e2e0tlso"), "{listed:?}");
    // Without the CA: told what to give.
    let without_ca: Vec<String> = flags
        .iter()
        .scan(false, |skip, flag| {
            let drop = *skip || flag == "--ca-file";
            *skip = flag == "--ca-file";
            Some((!drop).then(|| flag.clone()))
        })
        .flatten()
        .collect();
    let refused = fleetctl(&without_ca);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("--ca-file"), "{refused:?}");
    // A second run keeps what is there.
    let again = Command::new(binary("fleetd")).args(["-make-certificates", &tls.display().to_string()]).output();
    let again = Ran::from(again.expect("run fleetd"));
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("exists already"), "{again:?}");
    drop(fleetd);
}
