//! A lab of the netns topology for the fault tests: a three-member etcd and some fleetds,
//! each in its own network namespace on one bridge, and what runs on each read from their
//! processes.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::lab_etcd::LabEtcd;
use crate::lab_fleet::{LabMember, lab_member, running_sleepers, sleeper_file};
use crate::netlab::NetLab;
use crate::{metric_value, poll_until, unit_processes};

pub struct Lab {
    // Dropped first: the fleetds, then etcd, then the network.
    pub members: Vec<LabMember>,
    pub etcd: LabEtcd,
    pub net: NetLab,
    pub scratch: tempfile::TempDir,
}

pub fn lab(machines: usize) -> Lab {
    lab_with(machines, &[])
}

pub fn lab_with(machines: usize, extra: &[(&str, &str)]) -> Lab {
    let net = NetLab::create();
    let etcd = LabEtcd::start(&net, 3);
    let endpoints = etcd.endpoints();
    let members = (0..machines).map(|index| lab_member(&net, index, &endpoints, extra)).collect();
    Lab { members, etcd, net, scratch: tempfile::tempdir().expect("scratch dir") }
}

impl Lab {
    /// The member whose engine leads, by its own metrics.
    pub fn engine_leader(&self, among: &[usize]) -> Option<usize> {
        among
            .iter()
            .copied()
            .find(|index| metric_value(&self.members[*index].fleetd.metrics(), "fleet_engine_leader") == Some(1.0))
    }

    /// What runs on each member, by member index.
    pub fn running(&self) -> Vec<BTreeSet<usize>> {
        self.members.iter().map(|member| running_sleepers(&member.fleetd.state_dir())).collect()
    }

    /// The unit processes of every member, by member index.
    pub fn processes(&self) -> Vec<BTreeSet<u32>> {
        self.members.iter().map(|member| unit_processes(&member.fleetd.state_dir()).into_iter().collect()).collect()
    }

    pub fn logs(&self) -> String {
        self.members.iter().map(|member| format!("--- {}\n{}", member.node.name, member.fleetd.log())).collect()
    }

    /// Whether each of the sleepers `numbers` runs on exactly one member.
    pub fn each_runs_once(&self, numbers: std::ops::Range<usize>) -> bool {
        let running = self.running();
        numbers.into_iter().all(|n| running.iter().filter(|on| on.contains(&n)).count() == 1)
    }

    /// Waits until each of the sleepers `numbers` runs on exactly one member.
    pub fn wait_each_runs_once(&self, what: &str, numbers: std::ops::Range<usize>) {
        poll_until(
            what,
            Duration::from_secs(30),
            || self.each_runs_once(numbers.clone()),
            || format!("{:?}\n{}", self.running(), self.logs()),
        );
    }

    /// Starts sleepers `numbers` through member `via` and waits until each runs on exactly
    /// one member.
    pub fn start_sleepers(&self, via: usize, numbers: std::ops::Range<usize>) {
        self.start_sleepers_with(via, numbers, "");
    }

    /// As [`Lab::start_sleepers`], with `extra` lines in each unit file.
    pub fn start_sleepers_with(&self, via: usize, numbers: std::ops::Range<usize>, extra: &str) {
        let files: Vec<String> = numbers.clone().map(|n| sleeper_file(self.scratch.path(), n, 0, extra)).collect();
        let mut args = vec!["start", "--no-block"];
        args.extend(files.iter().map(String::as_str));
        self.members[via].fleetd.ok(&args);
        self.wait_each_runs_once("every sleeper runs once", numbers);
    }
}
