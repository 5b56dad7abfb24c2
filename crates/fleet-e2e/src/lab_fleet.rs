//! fleetds on the nodes of a [`NetLab`], and what really runs on each: the units of these
//! tests run `sleep <number>`, so the processes themselves say which unit they are, whatever
//! the store believes.

use std::collections::BTreeSet;
use std::path::Path;

use crate::cluster::{AGENT_TTL_SECONDS, ENGINE_RECONCILE_SECONDS, member_id};
use crate::netlab::{NetLab, Node};
use crate::{Fleetd, Launcher, unit_processes, write_unit};

/// The first argument of the sleepers' `sleep`; sleeper N sleeps `SLEEP_BASE + N` seconds.
const SLEEP_BASE: usize = 700_000;

pub struct LabMember {
    pub node: Node,
    pub fleetd: Fleetd,
}

/// Starts fleetd number `index` in a new node of `lab`, on the etcd at `etcd_servers`, with
/// the cluster tests' short lease and reconcile, then `extra` (which wins).
pub fn lab_member(lab: &NetLab, index: usize, etcd_servers: &str, extra: &[(&str, &str)]) -> LabMember {
    let node = lab.node(&format!("m{index}"));
    let ttl = format!("{AGENT_TTL_SECONDS}s");
    let reconcile = ENGINE_RECONCILE_SECONDS.to_string();
    let metadata = format!("member={index}");
    let mut config: Vec<(&str, &str)> = vec![
        ("etcd_servers", etcd_servers),
        ("public_ip", node.ip.as_str()),
        ("metadata", metadata.as_str()),
        ("agent_ttl", ttl.as_str()),
        ("engine_reconcile_interval", reconcile.as_str()),
        ("etcd_request_timeout", "2"),
        ("unit_manager", "native"),
    ];
    config.extend_from_slice(extra);
    let launcher = Launcher { prefix: node.prefix(), env: Vec::new() };
    let fleetd = Fleetd::start_with(&member_id(index), &config, launcher);
    LabMember { node, fleetd }
}

/// Unit files `sleeper-N.service` for N in `numbers`, each with its own `sleep` argument.
pub fn sleeper_units(dir: &Path, numbers: std::ops::Range<usize>) -> Vec<String> {
    numbers.map(|n| sleeper_file(dir, n, 0, "")).collect()
}

/// The file of sleeper `number` at `version` (a new version is a new unit file, whose process
/// still says which sleeper it is), with `extra` lines appended.
pub fn sleeper_file(dir: &Path, number: usize, version: u32, extra: &str) -> String {
    // `sleep` adds up its arguments: the version changes the file, not the sleeper's number.
    let version = if version == 0 { String::new() } else { format!(" {version}") };
    let text = format!("[Service]\nExecStart=/bin/sleep {}{version}\n{extra}", SLEEP_BASE + number);
    write_unit(dir, &format!("sleeper-{number}.service"), &text)
}

/// The sleepers whose processes run under the fleetd of `state_dir`, by number.
pub fn running_sleepers(state_dir: &Path) -> BTreeSet<usize> {
    unit_processes(state_dir)
        .into_iter()
        .filter_map(|pid| {
            let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let arguments: Vec<&[u8]> = command.split(|byte| *byte == 0).collect();
            let program = std::str::from_utf8(arguments.first()?).ok()?;
            if !program.ends_with("sleep") {
                return None;
            }
            let seconds: usize = std::str::from_utf8(arguments.get(1)?).ok()?.parse().ok()?;
            seconds.checked_sub(SLEEP_BASE)
        })
        .collect()
}
